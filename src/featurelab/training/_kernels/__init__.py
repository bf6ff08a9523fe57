"""Fused CPU kernels of the models' formulas, and the one place that decides when they run.

The models (`featurelab.models`) hold the papers' formulas in plain torch; the training core calls them through
`forward`, `penalty` and `pullback` here, which take a hand-written kernel where one applies and the model's own
formula everywhere else:

- the stacked MLP (``M x ...`` weights of the leaky-ReLU family, float32/64, on the CPU) as one autograd node
  (`mlp.StackedForward`), and its pullback chained without an autograd graph (`pullback`);
- the MLP's λ Σ_l ‖W_l‖²_F as one node (`mlp.WeightDecay`);
- the Leaky ResNet's L residual steps as one node under autograd on the CPU (`leaky_resnet.ResidualSteps`);
- large float32 CPU products through oneDNN where MKL runs AVX2 code (`gemm.product`).

Each is checked against plain autograd of the model's formula to 1e-12 in float64 (tests/test_mlp_fused.py,
tests/test_leaky_fused.py, tests/test_stacked_step.py, tests/test_gemm.py). Under a ``torch.func`` transform or
a torch function mode (`watched`), and on CUDA, the formula runs. docs/scale.md ("Batched ensembles").
"""

from __future__ import annotations

import torch
from torch import nn

from ...models.leaky_resnet import LeakyResNet
from ...models.mlp import MLP
from . import leaky_resnet, mlp
from .context import DirectContext, watched

__all__ = ["DirectContext", "forward", "has_pullback", "penalty", "pullback", "watched"]


def forward(model: nn.Module, X: torch.Tensor) -> torch.Tensor:
    """``model(X)``: through a fused kernel where one applies (module docstring), else the model's formula."""
    if isinstance(model, MLP) and mlp.applies(model, X, list(model.weights)):
        return mlp.forward(model, X)
    if isinstance(model, LeakyResNet):
        A0 = X @ model.U_in.mT
        if leaky_resnet.applies(model, A0, model.rho):
            return leaky_resnet.forward(model, A0)
    return model(X)


def penalty(model: nn.Module, lam) -> torch.Tensor:
    """``model.penalty(lam)``: the MLP's λ Σ_l ‖W_l‖²_F as one node unless `watched`, else the model's formula."""
    if isinstance(model, MLP) and not watched():
        return mlp.WeightDecay.apply(lam, *model.weights)
    return model.penalty(lam)  # type: ignore[operator]


def pullback(model: nn.Module, X: torch.Tensor, Ws: list[torch.Tensor]):
    """The stacked forward pass with the weights `Ws` (``M x ...``, every parameter of `model` in
    ``named_parameters`` order) and its pullback, called directly without an autograd graph:
    ``(output, pullback)``, the output ``M x N x d_out`` and ``pullback(G)`` the gradients of ⟨G, output⟩
    with respect to `Ws` (call it with gradients off). None where no kernel applies (the step then takes
    autograd)."""
    if isinstance(model, MLP) and mlp.applies(model, X, Ws):
        return mlp.pullback(model, X, Ws)
    return None


def has_pullback(model: nn.Module) -> bool:
    """Whether `pullback` has a kernel for `model`'s class (it may still decline for given inputs)."""
    return isinstance(model, MLP)
