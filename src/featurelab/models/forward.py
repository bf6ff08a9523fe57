"""`Forward`: every layer of one forward pass, the one return type of ``model(X, return_layers=True)``."""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

import torch

Layers = TypeVar("Layers")


class Forward(NamedTuple, Generic[Layers]):
    """Every layer of one forward pass (rows are samples).

    output: the network output, ``N x d_out``.
    pre:    the pre-activations, the tensors σ is applied to, one ``N x n`` tensor per layer.
    act:    the activations, the inputs of the next layer.

    `MLP` and `LeakyResNet` index layers by position (lists); `HomogeneousNet` by ``(stage, tag)``
    with tag "out" or "hidden" (dicts), since a residual block holds two unit layers.
    """

    output: torch.Tensor
    pre: Layers
    act: Layers
