"""`weight_list`: the one converter from a model or a list of matrices to ``[W_1, ..., W_L]`` in float64."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import FeaturelabError


def weight_list(model_or_weights, *, batched: bool = False, name: str = "weights") -> list[torch.Tensor]:
    """``[W_1, ..., W_L]`` as float64 tensors (the autograd graph is kept), checked to chain
    ``W_ℓ: n_ℓ x n_(ℓ-1)`` (the usual ``out x in``, so layer ℓ maps rows ``a ↦ a W_ℓᵀ``).

    model_or_weights: a model with ``weight_matrices()`` (an `MLP` gives its matrices without the bias
    column), or a list/tuple of matrices (arrays or tensors). With ``batched=True`` every matrix may carry
    the same leading dimension R (``R x n_ℓ x n_(ℓ-1)``). Raises a one-line `FeaturelabError` naming
    `name` for an empty list, a non-matrix, shapes that do not chain, NaN or inf.
    """
    if isinstance(model_or_weights, nn.Module) and hasattr(model_or_weights, "weight_matrices"):
        model_or_weights = model_or_weights.weight_matrices()  # pyright: ignore[reportCallIssue]
    if not isinstance(model_or_weights, (list, tuple)) or not model_or_weights:
        raise FeaturelabError(
            f"{name} must be a model with weight_matrices() or a non-empty list of matrices, "
            f"got {type(model_or_weights).__name__}"
        )
    Ws = [torch.as_tensor(W).to(torch.float64) for W in model_or_weights]
    ndim = 3 if batched and Ws[0].ndim == 3 else 2
    for l, W in enumerate(Ws, start=1):
        if W.ndim != ndim or W.shape[:-2] != Ws[0].shape[:-2]:
            raise FeaturelabError(
                f"{name}[{l - 1}] has shape {tuple(W.shape)}; every W_l must be "
                f"{'R x ' if ndim == 3 else ''}n_l x n_(l-1) with the same leading dimensions"
            )
        if l > 1 and W.shape[-1] != Ws[l - 2].shape[-2]:
            raise FeaturelabError(
                f"{name}[{l - 1}] has shape {tuple(W.shape)} but W_{l - 1} has {Ws[l - 2].shape[-2]} "
                f"rows; W_l must be n_l x n_(l-1)"
            )
        if not torch.isfinite(W).all():
            raise FeaturelabError(f"{name}[{l - 1}] contains NaN or inf")
    return Ws
