"""The Leaky ResNet's L residual steps ``A_l = (1 − ρ_l L̃) A_{l−1} + ρ_l σ(A_{l−1}) W_lᵀ`` as one autograd node with
the chain rule written out (`ResidualSteps`), the fused CPU kernel of `featurelab.models.leaky_resnet.euler_steps`
(Jacot & Kaiser, arXiv 2405.17573 §4); tests/test_leaky_fused.py checks it against plain autograd of the formula to
1e-12 in float64.
"""

from __future__ import annotations

import torch

from ...models.leaky_resnet import LeakyResNet, euler_steps
from .context import watched
from .gemm import product


def _step_factors(rho: torch.Tensor, effective_depth, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """ρ_l and the skip factors ``1 − ρ_l L̃`` in `dtype`, shaped to scale step l's matrices: ``L x 1 x 1``, or
    ``M x L x 1 x 1`` for stacked members (ρ ``M x L``, L̃ a float or ``(M,)``)."""
    r = rho.to(dtype)[..., None, None]
    if isinstance(effective_depth, torch.Tensor):
        effective_depth = effective_depth.to(dtype)[:, None, None, None]
    return r, 1 - r * effective_depth


class ResidualSteps(torch.autograd.Function):
    """The L steps ``A_0 ↦ A_L`` of `euler_steps` as one autograd node with the chain rule written out.

    Inside, samples are columns (``Aᵀ``, ``w x N``): σ(A_{l−1})ᵀ is written into rows ``:w`` of a
    ``(w+1) x N`` buffer whose last row is ones (the bias), and each step scales Aᵀ by ``1 − ρ_l L̃`` and adds
    the product ``(ρ_l W_l) σ(A_{l−1})ᵀ`` to it (one product, `gemm.product`: oneDNN's on CPUs where it beats
    torch's BLAS). For ``Gᵀ = (∂C/∂A_l)ᵀ`` the backward is
    ``∂C/∂W_l = ρ_l Gᵀ σ(A_{l−1})`` and ``(∂C/∂A_{l−1})ᵀ = (1 − ρ_l L̃) Gᵀ + (ρ_l W_l[:, :w])ᵀ Gᵀ ⊙ 1[A_{l−1} > 0]``
    (ReLU'(0) = 0, as torch's). Stacked members run as batched products, each with its own ρ and L̃. The
    factors stay tensors (no value is read on the host, as in the plain path).

    A0: ``N x w`` or ``M x N x w``; W, ρ, L̃ as in `euler_steps` (ρ and L̃ constants). Output: A_L, a
    transposed view of the same shape as A0. A second derivative (backward under ``create_graph``)
    differentiates `euler_steps` recomputed from the saved inputs.
    """

    @staticmethod
    def forward(ctx, A0, W, rho, effective_depth):
        r, skip = _step_factors(rho, effective_depth, W.dtype)
        N, w = A0.shape[-2:]
        S = []  # σ(A_{l-1})ᵀ per step; L buffers, not one, so the allocator reuses their memory between calls
        AT = A0.mT.clone(memory_format=torch.contiguous_format)
        for l, W_l in enumerate(W.unbind(-3)):
            S.append(W.new_empty(*W.shape[:-3], w + 1, N))
            S[l][..., w, :].fill_(1)
            torch.clamp_min(AT, 0, out=S[l][..., :w, :])
            AT = product(W_l * r[..., l, :, :], S[l], add=AT.mul_(skip[..., l, :, :]))
        ctx.save_for_backward(A0, W, rho)
        ctx.effective_depth, ctx.r, ctx.skip, ctx.S = effective_depth, r, skip, S
        return AT.mT

    @staticmethod
    def backward(ctx, g):
        A0, W, rho = ctx.saved_tensors
        need_A0, need_W = ctx.needs_input_grad[:2]
        if torch.is_grad_enabled():  # create_graph: differentiate the plain formula
            A_L = euler_steps(A0, W, rho, ctx.effective_depth)[-1]
            wanted = [t for t, need in ((A0, need_A0), (W, need_W)) if need]
            grads = iter(torch.autograd.grad(A_L, wanted, g, create_graph=True))
            return (next(grads) if need_A0 else None), (next(grads) if need_W else None), None, None
        return *_steps_backward(ctx, g, W, need_A0, need_W), None, None


def _steps_backward(ctx, g: torch.Tensor, W: torch.Tensor, need_A0: bool, need_W: bool):
    """`ResidualSteps`' first-order backward: ``(∂C/∂A_0, ∂C/∂W)`` (None where not needed) for
    ``g = ∂C/∂A_L`` (``N x w`` or ``M x N x w``)."""
    w = W.shape[-2]
    GT = g.mT.clone(memory_format=torch.contiguous_format)
    gW = torch.empty_like(W) if need_W else None
    for l in reversed(range(W.shape[-3])):
        r_l, S_l = ctx.r[..., l, :, :], ctx.S[l]
        if gW is not None:
            torch.mul(product(GT, S_l.mT), r_l, out=gW[..., l, :, :])
        if l == 0 and not need_A0:
            break
        scratch = product((W[..., l, :, :w] * r_l).mT, GT)
        torch.ops.aten.threshold_backward.grad_input(scratch, S_l[..., :w, :], 0, grad_input=scratch)
        GT = scratch.addcmul_(GT, ctx.skip[..., l, :, :])
    return (GT.mT if need_A0 else None), gW


def applies(model: LeakyResNet, A0: torch.Tensor, rho: torch.Tensor) -> bool:
    """A0 and W on the CPU (the kernel has not run on a GPU: CUDA keeps the formula, which its checks cover),
    float32/64 alike, A0 ``N x w`` for one net or ``M x N x w`` for M stacked members, ρ and L̃ constants (a leaf
    ρ for ∂𝓛/∂ρ takes the formula), a gradient to take, and no torch.func transform or torch function mode
    watching."""
    W, Lt = model.W, model.effective_depth
    return (
        W.device.type == "cpu"
        and A0.device == W.device
        and W.dtype in (torch.float32, torch.float64)
        and A0.dtype == W.dtype
        and A0.dim() == W.dim() - 1
        and A0.shape[:-2] == W.shape[:-3]
        and not rho.requires_grad
        and not (isinstance(Lt, torch.Tensor) and Lt.requires_grad)
        and torch.is_grad_enabled()
        and (A0.requires_grad or W.requires_grad)
        and not watched()
    )


def forward(model: LeakyResNet, A0: torch.Tensor) -> torch.Tensor:
    """Ŷ = A_L V_outᵀ (``N x d_out``, or ``M x N x d_out``) from ``A_0 = X U_inᵀ`` with the steps as one node
    (`applies` holds)."""
    return ResidualSteps.apply(A0, model.W, model.rho, model.effective_depth) @ model.V_out.mT
