"""Data costs and error rates (docs/theory/conventions.md: mean over samples, sum over output coordinates).

Rows are samples: `out` is ``N x d_out``; targets are ``N x d_out`` floats (regression), ``N`` int64
labels (classification), or ``N`` / ``N x 1`` labels in {-1, +1} for the logistic loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import FeaturelabError

OBJECTIVES = ("mse", "cross_entropy", "logistic")


def _as_targets(out: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    if Y.dtype in (torch.int64, torch.int32):
        return F.one_hot(Y.long(), out.shape[-1]).to(out.dtype)
    return Y.reshape(out.shape if Y.numel() == out.numel() else out.shape[-2:]).to(out.dtype)


def data_cost(objective: str, out: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """C = (1/N) Σ_i ℓ(f(x_i), y_i).

    mse: (1/N)‖Y - f(X)‖²_F (sum over outputs, NOT torch's MSELoss, which also divides by d_out);
    cross_entropy: mean softmax cross-entropy against int labels;
    logistic: mean log(1 + exp(-y f)) for y ∈ {±1} and scalar f (via logaddexp, exact for large margins).
    A leading member axis (`out` ``M x N x d_out``, `Y` shared or stacked) gives one cost per member, ``(M,)``.
    """
    if objective == "mse":
        if out.dim() == 1:  # one output per sample
            out = out[:, None]
        return ((out - _as_targets(out, Y)) ** 2).sum((-2, -1)) / out.shape[-2]
    if objective == "cross_entropy":
        if Y.dtype not in (torch.int64, torch.int32):
            raise FeaturelabError("objective='cross_entropy' needs integer class labels as targets")
        # classes along dim 1 of an (M x) C x N view: on a CPU torch's kernel then runs along the samples, about
        # twice faster than over 10 contiguous classes per row
        stacked = out if out.dim() == 3 else out[None]
        cost = F.cross_entropy(stacked.mT, Y.long().expand(stacked.shape[:-1]), reduction="none").mean(-1)
        return cost if out.dim() == 3 else cost[0]
    if objective == "logistic":
        f = out.reshape(*out.shape[:-2], -1) if out.dim() >= 2 else out
        margin = Y.to(out.dtype).reshape(f.shape if Y.numel() == f.numel() else f.shape[-1:]) * f
        return torch.logaddexp(torch.zeros_like(margin), -margin).mean(-1)
    raise FeaturelabError(f"objective={objective!r} is not allowed; choose one of: {', '.join(OBJECTIVES)}")


def error_rate(objective: str, out: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """Misclassified fraction for labels (argmax, or sign for logistic); ‖Y - f‖²/‖Y‖² for regression."""
    if objective == "logistic":
        return (torch.sign(out.reshape(-1)) != Y.reshape(-1).to(out.dtype)).to(out.dtype).mean()
    if Y.dtype in (torch.int64, torch.int32):
        return (out.argmax(dim=1) != Y).to(out.dtype).mean()
    return ((out - Y.to(out.dtype)) ** 2).sum() / (Y.to(out.dtype) ** 2).sum().clamp_min(1e-30)
