"""The stacked MLP's fused CPU kernels: its forward pass ``Z_l = [Zσ_{l-1}, β·1] W_lᵀ`` for every member at once
as one autograd node with the chain rule written out (`StackedForward`), and the weight decay λ Σ_l ‖W_l‖²_F as one
node (`WeightDecay`). The formulas are `featurelab.models.mlp.MLP`'s; tests/test_mlp_fused.py checks both against
plain autograd of them to 1e-12 in float64.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ...models.mlp import MLP
from .context import DirectContext, watched
from .gemm import product


def _activate_(z: torch.Tensor, slope: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(σ_slope(z), z or None)``: σ in place on the fresh pre-activation `z` where σ' can be read off
    σ(z) (slope >= 0: σ(z) > 0 exactly where z > 0), else out of place, keeping `z` for the backward."""
    if slope == 1.0:
        return z, None
    if slope == 0.0:
        return z.clamp_min_(0), None  # torch.relu's kernel
    if slope > 0:
        return torch.nn.functional.leaky_relu_(z, slope), None
    return torch.nn.functional.leaky_relu(z, slope), z


def _activate_backward(g: torch.Tensor, a: torch.Tensor, z: torch.Tensor | None, slope: float, out: torch.Tensor):
    """``out = g ⊙ σ'_slope(Z)`` with σ' = 1 for Z > 0 and slope otherwise (σ'(0) = slope, as torch's ReLU
    and leaky ReLU), read off ``a = σ(Z)`` or, for a negative slope, off ``z = Z``."""
    if slope == 1.0:
        out.copy_(g)
    elif slope == 0.0:
        torch.ops.aten.threshold_backward.grad_input(g, a, 0, grad_input=out)
    elif z is None:
        torch.ops.aten.leaky_relu_backward.grad_input(g, a, slope, True, grad_input=out)
    else:
        torch.ops.aten.leaky_relu_backward.grad_input(g, z, slope, False, grad_input=out)


def _input_rows(X: torch.Tensor, beta: float) -> torch.Tensor:
    """The shared input ``N x d`` with samples as columns and the bias row, ``[Xᵀ; β·1ᵀ]`` (``(d+1) x N``, a
    transposed view); ``Xᵀ`` when β = 0."""
    return (torch.cat([X, X.new_full((X.shape[0], 1), beta)], 1) if beta > 0 else X).mT


def _affine_columns(aT: torch.Tensor, W: torch.Tensor, beta: float) -> torch.Tensor:
    """``W[i] @ [aT[i]; β·1ᵀ]`` for every member i, samples as columns: W ``M x m x (n+1)`` (``n`` when
    β = 0), aT ``M x n x N``, or the shared input with its bias row (`_input_rows`, ``(n+1) x N``: one
    ``(M·m) x N`` product for all members, `gemm.product`); ``M x m x N``."""
    M, m, n = W.shape[0], W.shape[1], aT.shape[-2]
    if aT.dim() == 2:
        return product(W.reshape(M * m, -1), aT).view(M, m, -1)
    if beta > 0:
        return torch.baddbmm(W[..., n:], W[..., :n], aT, beta=beta)
    return torch.bmm(W, aT)


def _with_bias_grad(dW: torch.Tensor, gT: torch.Tensor, beta: float) -> torch.Tensor:
    """The gradient of a stored weight: ``[dW, β·Σ_samples G]`` (the bias column) when β > 0; `gT` holds
    ``Gᵀ``, samples along its last dim."""
    if beta == 0:
        return dW
    g_sum = gT.sum(-1, keepdim=True)
    return torch.cat([dW, g_sum if beta == 1 else g_sum.mul_(beta)], -1)


class StackedForward(torch.autograd.Function):
    """The stacked leaky-ReLU MLP (``Z_l = [Zσ_{l-1}, β·1] @ W_lᵀ`` for every member at once) as one autograd
    node with the chain rule written out: for the incoming gradient ``G = ∂C/∂Z_l`` (``N x n_l`` per member),
    ``∂C/∂W_l = [Gᵀ Zσ_{l-1}, β·Gᵀ1]`` and ``∂C/∂Zσ_{l-1} = G W_l[:, :n_{l-1}]``, then
    ``∂C/∂Z_{l-1} = ∂C/∂Zσ_{l-1} ⊙ σ'(Z_{l-1})``. Inside, samples are columns (``M x n x N``): a CPU's
    batched products and the cross-entropy over classes run faster on that layout.

    X: ``N x d_in`` (shared: the first layer is one matrix product for all members, its bias column's
    gradient included, and ∂C/∂X sums over them) or ``M x N x d_in``; Ws: ``M x n_l x (n_{l-1}+1)``
    (``n_{l-1}`` when β = 0); slopes: the slope a of σ after each hidden layer (1 inside a linear tail).
    Output ``M x N x d_out`` (a transposed view). First order only (`once_differentiable`: a double backward
    raises instead of going wrong).
    """

    @staticmethod
    def forward(ctx, X, beta: float, slopes: tuple[float, ...], *Ws):
        acts, pre, aT = [], [], (X.mT if X.dim() == 3 else _input_rows(X, beta))
        for l, W in enumerate(Ws):
            acts.append(aT)
            zT = _affine_columns(aT, W, beta)
            if l == len(Ws) - 1:
                break
            aT, kept = _activate_(zT, slopes[l])
            pre.append(kept)
        ctx.save_for_backward(X, *Ws)
        ctx.acts, ctx.pre, ctx.beta, ctx.slopes = acts, pre, beta, slopes
        return zT.mT

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        X, *Ws = ctx.saved_tensors
        M, N, beta = Ws[0].shape[0], X.shape[-2], ctx.beta
        grads: list[torch.Tensor | None] = [None] * len(Ws)
        gX, gT = None, g.mT
        for l in reversed(range(len(Ws))):
            W, aT = Ws[l], ctx.acts[l]
            m, n = W.shape[1], aT.shape[-2]
            if aT.dim() == 2:  # the shared input: one product for all members, the bias column's too
                flat = gT.reshape(M * m, N)
                grads[0] = product(flat, aT.mT).view(M, m, -1)
                if ctx.needs_input_grad[0]:
                    gX = flat.mT @ W.reshape(M * m, -1)[:, : X.shape[-1]]
                break
            grads[l] = _with_bias_grad(torch.bmm(gT, aT.mT), gT, beta)
            if l == 0:
                if ctx.needs_input_grad[0]:
                    gX = torch.bmm(gT.mT, W[..., :n])
                break
            gaT = torch.bmm(W[..., :n].mT, gT)
            _activate_backward(gaT, aT, ctx.pre[l - 1], ctx.slopes[l - 1], out=gaT)
            gT = gaT
        return (gX, None, None, *grads)


class WeightDecay(torch.autograd.Function):
    """``λ Σ_l ‖W_l‖²_F`` (``(M,)`` for stacked ``M x ...`` weights with λ a float or ``(M,)``; 0-d for one net)
    as one autograd node: one dot product per layer forward, ``∂/∂W_l = 2λ·g·W_l`` backward, written with
    differentiable ops (a double backward, as Hessian-vector products take, differentiates them)."""

    @staticmethod
    def forward(ctx, lam, *Ws):
        ctx.save_for_backward(*Ws)
        ctx.lam = lam
        total = torch.linalg.vecdot(Ws[0].flatten(-2), Ws[0].flatten(-2))
        for W in Ws[1:]:
            total = total + torch.linalg.vecdot(W.flatten(-2), W.flatten(-2))
        return lam * total

    @staticmethod
    def backward(ctx, g):
        scale = (2 * ctx.lam * g)[..., None, None]
        return (None, *(W * scale for W in ctx.saved_tensors))


def slopes(model: MLP) -> tuple[float, ...]:
    """The slope a of σ after each hidden layer (1 inside the linear tail)."""
    return tuple(1.0 if l > model.depth - model.linear_tail else model.leak for l in range(1, model.depth))


def applies(model: MLP, X: torch.Tensor, Ws: list[torch.Tensor]) -> bool:
    """Stacked ``M x ...`` weights `Ws` on the CPU (the kernel has not run on a GPU: CUDA keeps the formula, which
    its checks cover), X ``N x d`` or ``M x N x d`` of their dtype (float32/64) and device, σ the leaky-ReLU
    family, and no torch.func transform or torch function mode watching."""
    W0 = Ws[0]
    return (
        model.activation == "leaky_relu"
        and W0.dim() == 3
        and W0.device.type == "cpu"
        and X.dim() in (2, 3)
        and (X.dim() == 2 or X.shape[0] == W0.shape[0])
        and X.dtype in (torch.float32, torch.float64)
        and all(W.dim() == 3 and W.dtype == X.dtype and W.device == X.device for W in Ws)
        and not watched()
    )


def forward(model: MLP, X: torch.Tensor) -> torch.Tensor:
    """The stacked output ``M x N x d_out`` (`applies` holds): one node under autograd, its forward alone (samples
    as columns) where there is no gradient to take."""
    Ws = list(model.weights)
    if torch.is_grad_enabled() and (X.requires_grad or any(W.requires_grad for W in Ws)):
        return StackedForward.apply(X, model.bias, slopes(model), *Ws)
    return StackedForward.forward(DirectContext(3 + len(Ws)), X, model.bias, slopes(model), *Ws)


def pullback(model: MLP, X: torch.Tensor, Ws: list[torch.Tensor]):
    """``(output, pullback)`` of `StackedForward` called directly with the weights `Ws` (`applies` holds)."""
    ctx = DirectContext(3 + len(Ws))
    out = StackedForward.forward(ctx, X, model.bias, slopes(model), *Ws)
    return out, lambda g: list(StackedForward.backward(ctx, g)[3:])
