"""Data costs and error rates (docs/theory/conventions.md: mean over samples, sum over output coordinates).

Rows are samples: `out` is ``N x d_out``; targets are ``N x d_out`` floats (regression), ``N`` int64
labels (classification), or ``N`` / ``N x 1`` labels in {-1, +1} for the logistic loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import FeaturelabError
from ._kernels.context import DirectContext, watched

OBJECTIVES = ("mse", "cross_entropy", "logistic")
PULLBACKS = ("cross_entropy",)  # the objectives `cost_pullback` differentiates without autograd


def _as_targets(out: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    if Y.dtype in (torch.int64, torch.int32):
        return F.one_hot(Y.long(), out.shape[-1]).to(out.dtype)
    return Y.reshape(out.shape if Y.numel() == out.numel() else out.shape[-2:]).to(out.dtype)


LOG2_E = 1 / math.log(2)


def _label_positions(labels: torch.Tensor, N: int) -> torch.Tensor:
    """Where each sample's label logit sits in one member's ``C x N`` logits, flattened: ``(N,)`` for shared
    labels ``(N,)``, ``(M, N)`` for per-member labels ``(M, N)``."""
    return torch.add(torch.arange(N, device=labels.device), labels, alpha=N)


def _at_labels(flat: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The label entries ``M x N`` of ``M x (C·N)`` logits-shaped `flat` (`_label_positions` `pos`)."""
    return flat.index_select(1, pos) if pos.dim() == 1 else flat.gather(1, pos)


def _add_at_labels(flat: torch.Tensor, pos: torch.Tensor, values: torch.Tensor) -> None:
    """``flat[label entries] += values`` (``M x N``), in place (`_label_positions` `pos`)."""
    flat.scatter_add_(1, pos.expand(values.shape), values)


def _exponentials(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For logits `out` (``M x N x C``): ``(zT, top, e, s)`` with zT the logits as ``M x C x N`` (contiguous),
    top their maximum over classes ``M x 1 x N``, ``e = exp(zT − top)`` and ``s = Σ_c e`` (``M x 1 x N``).

    The exponential is taken as ``2^((z − top)·log₂e)``: torch's ``exp`` runs Intel's VML on x86 builds,
    which on AMD CPUs is 4x slower than torch's own ``exp2`` and over 50x slower where the result underflows
    (the wrong classes of a confident net, z − top < −88 in float32); ``exp2`` is rounded like ``exp``
    to within a few units in the last place."""
    zT = out.mT.contiguous()
    top = zT.amax(1, keepdim=True)
    e = torch.sub(zT, top).mul_(LOG2_E).exp2_()
    return zT, top, e, e.sum(1, keepdim=True)


def _mean_cost(zT, top, s, pos) -> torch.Tensor:
    """``(M,)``: the mean over samples of ``log s + top − z_label`` (the log-sum-exp minus the label logit)."""
    M, C, N = zT.shape
    return torch.sub(s.log().add_(top).view(M, N), _at_labels(zT.view(M, C * N), pos)).mean(-1)


class _CrossEntropy(torch.autograd.Function):
    """Each member's mean softmax cross-entropy ``C = (1/N) Σ_n [log Σ_c exp z_{nc} − z_{n,y_n}]`` as one
    autograd node, computed with classes along dim 1 of ``M x C x N`` logits (on a CPU the reductions then
    run along the samples; the stacked MLP's output is a view of such logits already), shifted by their
    maximum over classes (`_exponentials`). Backward: ``∂C/∂z_{nc} = (softmax(z_n)_c − 1[c = y_n]) / N``
    times the incoming gradient, from the forward's exponentials; under ``create_graph`` from the saved
    logits with differentiable ops, so Hessian-vector products see the second derivative.

    out: ``M x N x C`` logits; labels: ``(N,)`` shared or ``(M, N)`` int64. Returns ``(M,)``; called directly
    with ``value=False`` (`cost_pullback`), None: the cost is not computed, only what the backward needs.
    """

    @staticmethod
    def forward(ctx, out, labels, value: bool = True):
        zT, top, e, s = _exponentials(out)
        pos = _label_positions(labels, zT.shape[-1])
        ctx.save_for_backward(out, labels)
        ctx.e, ctx.s, ctx.pos = e, s, pos
        return _mean_cost(zT, top, s, pos) if value else None

    @staticmethod
    def backward(ctx, g, *_):
        M, C, N = ctx.e.shape
        w = g / N
        if torch.is_grad_enabled():  # a differentiable gradient (double backward)
            out, labels = ctx.saved_tensors
            onehot = F.one_hot(labels, C).to(out.dtype)
            return (torch.softmax(out, -1) - onehot) * w[:, None, None], None, None
        scale = w[:, None, None] / ctx.s
        grad = ctx.e.mul_(scale) if getattr(ctx, "once", False) else ctx.e * scale  # a direct call runs once
        _add_at_labels(grad.view(M, C * N), ctx.pos, (-w)[:, None].expand(M, N))
        return grad.mT, None, None


def cross_entropy(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each member's mean softmax cross-entropy, ``(M,)``, of logits `out` (``M x N x C``) against int64
    `labels` (``(N,)`` shared, or ``(M, N)``): one autograd node (`_CrossEntropy`), or torch's
    ``F.cross_entropy`` where a torch.func transform or a torch function mode watches."""
    if watched():
        return F.cross_entropy(out.mT, labels.expand(out.shape[:-1]), reduction="none").mean(-1)
    return _CrossEntropy.apply(out, labels)


def cost_pullback(objective: str, out: torch.Tensor, Y: torch.Tensor, value: bool = True):
    """The stacked cost of `out` (``M x N x d_out``, as `data_cost`) and its pullback, called directly (no
    autograd graph; the training step chains them itself): ``(cost (M,), pullback)`` with ``pullback(g)``
    the gradient of ⟨g, cost⟩ with respect to `out` (call it with gradients off); the cost is None without
    `value` (a step that only needs the gradient). For the objectives in `PULLBACKS` (cross-entropy:
    `_CrossEntropy`); None for the others."""
    if objective not in PULLBACKS:
        return None
    ctx = DirectContext(3)
    cost = _CrossEntropy.forward(ctx, out, _class_labels(Y), value)
    return cost, lambda g: _CrossEntropy.backward(ctx, g)[0]


def _class_labels(Y: torch.Tensor) -> torch.Tensor:
    """Y as int64 class labels; a one-line error for other targets."""
    if Y.dtype not in (torch.int64, torch.int32):
        raise FeaturelabError("objective='cross_entropy' needs integer class labels as targets")
    return Y.long()


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
        stacked = out if out.dim() == 3 else out[None]
        cost = cross_entropy(stacked, _class_labels(Y))
        return cost if out.dim() == 3 else cost[0]
    if objective == "logistic":
        f = out.reshape(*out.shape[:-2], -1) if out.dim() >= 2 else out
        margin = Y.to(out.dtype).reshape(f.shape if Y.numel() == f.numel() else f.shape[-1:]) * f
        return torch.logaddexp(torch.zeros_like(margin), -margin).mean(-1)
    raise FeaturelabError(f"objective={objective!r} is not allowed; choose one of: {', '.join(OBJECTIVES)}")


def error_rate(objective: str, out: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """Misclassified fraction for labels (argmax, or sign for logistic); ‖Y - f‖²/‖Y‖² for regression.
    A leading member axis (`out` ``M x N x d_out``, `Y` shared or stacked) gives one rate per member, ``(M,)``."""
    stacked = out.dim() == 3
    if objective == "logistic":
        f = out.reshape(len(out), -1) if stacked else out.reshape(-1)
        y = Y.to(out.dtype).reshape(f.shape if Y.numel() == f.numel() else f.shape[-1:])
        return (torch.sign(f) != y).to(out.dtype).mean(-1)
    if Y.dtype in (torch.int64, torch.int32):
        return (out.contiguous().argmax(dim=-1) != Y).to(out.dtype).mean(-1)  # argmax on strided classes is slow

    def total(t: torch.Tensor) -> torch.Tensor:
        return t.flatten(1).sum(1) if t.dim() == 3 else t.sum()

    return total((out - Y.to(out.dtype)) ** 2) / total(Y.to(out.dtype) ** 2).clamp_min(1e-30)
