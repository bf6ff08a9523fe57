"""Leaky ResNets with layer steps (docs/theory/leaky-resnets.md §1-§2; Jacot & Kaiser, arXiv 2405.17573 §2, §4).

Rows are samples. With ``A_l`` the ``N x w`` representation after step l and
``σ(A) = [ReLU(A), 1]`` (``N x (w+1)``), the network is the explicit Euler scheme

    A_0 = X U_inᵀ,   A_l = (1 - ρ_l L̃) A_{l-1} + ρ_l σ(A_{l-1}) W_lᵀ   (l = 1..L),   Ŷ = A_L V_outᵀ,

with ``W_l`` of shape ``w x (w+1)`` (last column = bias), steps ``ρ_l > 0`` (normally Σρ = 1), and
effective depth L̃. Its regularizer is ``R = λ/(2L̃) Σ_l ρ_l ‖W_l‖²_F`` (+ ``(λ/2)(‖U_in‖² + ‖V_out‖²)``
when the io maps are learned). The paper writes samples as columns; every tensor here is the transpose. The
training core runs the steps through a fused CPU kernel where it applies (`featurelab.training._kernels`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..checks import int_at_least, one_of, positive
from ..errors import FeaturelabError
from .forward import Forward

STEP_SCHEMES = ("equidistant", "irregular", "adaptive")
IO_MODES = ("fixed", "learned")
INITS = ("identity", "small")


# ------------------------------------------------------------------------------ step schemes
def equidistant_steps(L: int) -> torch.Tensor:
    """ρ_l = 1/L (Part 1 §2.1), float64 tensor of shape (L,)."""
    return torch.full((L,), 1.0 / L, dtype=torch.float64)


def irregular_steps(L: int, a: float = 0.5) -> torch.Tensor:
    """ρ_l = 1/L + (a/L)(1/4 - |l/L - 1/2|), l = 1..L, divided by its sum (Part 1 §2.2), a ∈ [0, 1)."""
    if not 0 <= a < 1:
        raise FeaturelabError(f"irregular_a={a!r} is not allowed: it must be in [0, 1)")
    l = torch.arange(1, L + 1, dtype=torch.float64)
    rho = 1.0 / L + (a / L) * (0.25 - (l / L - 0.5).abs())
    return rho / rho.sum()


def project_steps(rho: torch.Tensor, low: float, high: float, max_iter: int = 100) -> torch.Tensor:
    """Project ρ onto ``{low <= ρ_l <= high, Σρ = 1}`` by clip-and-rescale (Part 1 §2.3).

    Clips to the box, then rescales the entries that are not at a bound so the sum is 1, and repeats
    until nothing moves. Raises when the set is empty (``L·low > 1`` or ``L·high < 1``).
    """
    L = rho.numel()
    if L * low > 1 + 1e-12 or L * high < 1 - 1e-12:
        raise FeaturelabError(
            f"steps cannot satisfy {low:.4g} <= rho_l <= {high:.4g} with sum 1 for L={L}; "
            "the adaptive scheme needs L >= effective_depth/0.9"
        )
    rho = rho.clone().to(torch.float64)
    for _ in range(max_iter):
        rho = rho.clamp(low, high)
        free = (rho > low) & (rho < high)
        excess = 1.0 - rho.sum()
        if abs(float(excess)) < 1e-15 or not free.any():
            break
        rho[free] = rho[free] * (1.0 + excess / rho[free].sum())
    return rho


def adaptive_update(rho: torch.Tensor, reps: list[torch.Tensor]) -> torch.Tensor:
    """One adaptive-ρ update (Part 1 §2.3), before projection.

    ``c̃_l = ρ_l ‖A_l‖ / max(‖A_l - A_{l-1}‖, 1e-12)``, returns ``c̃ / Σc̃``. `reps` is ``[A_0..A_L]``.
    Equal relative increments ``‖A_l - A_{l-1}‖/‖A_l‖`` are its fixed point.
    """
    c = torch.stack(
        [
            rho[l - 1] * reps[l].norm() / torch.clamp((reps[l] - reps[l - 1]).norm(), min=1e-12)
            for l in range(1, len(reps))
        ]
    ).to(torch.float64)
    return c / c.sum()


def _haar(n: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


# --------------------------------------------------------------------------- residual steps
def sigma(A: torch.Tensor) -> torch.Tensor:
    """σ(A) = [ReLU(A), 1] (N x (w+1), or M x N x (w+1))."""
    return torch.cat([torch.relu(A), torch.ones_like(A[..., :1])], dim=-1)


def euler_steps(A0: torch.Tensor, W: torch.Tensor, rho: torch.Tensor, effective_depth) -> list[torch.Tensor]:
    """``[A_0, ..., A_L]`` of ``A_l = (1 − ρ_l L̃) A_{l−1} + ρ_l σ(A_{l−1}) W_lᵀ`` (arXiv 2405.17573 §4, the
    discretization of §2's ODE).

    A0: ``N x w`` with W ``L x w x (w+1)`` and ρ ``(L,)``, or stacked members: A0 ``M x N x w``, W
    ``M x L x w x (w+1)``, ρ ``M x L``, L̃ a float or ``(M,)``.
    """
    A, reps = A0, [A0]
    for l, W_l in enumerate(W.unbind(-3)):  # unbind: one backward, not L full-size select_backward
        r = rho[..., l].to(A.dtype)  # 0-d, or (M,) for stacked members
        skip = (1 - r * effective_depth)[..., None, None]
        A = skip * A + r[..., None, None] * (sigma(A) @ W_l.mT)
        reps.append(A)
    return reps


# ------------------------------------------------------------------------------------ model
class LeakyResNet(nn.Module):
    """Leaky ResNet of width w with L steps and effective depth L̃ (Part 1 §1).

    Args:
        d_in, d_out, width: dimensions; ``width >= max(d_in, d_out)``.
        depth: L, the number of steps.
        effective_depth: L̃ > 0.
        steps: "equidistant", "irregular", "adaptive" (starts equidistant), or a tensor of L positive ρ_l.
        irregular_a: the a of the irregular scheme (default 0.5, Part 1 §6.15).
        io: "fixed" (seeded Haar isometries, default) or "learned" (same init, trainable, penalized).
        init: "identity" (``W_l = L̃[I | 0] + N(0, 0.01/(w+1))``) or "small" (noise only).
        allow_invalid_steps: permit ρ_l·L̃ >= 1 (the skip factor 1 - ρ_l L̃ then is <= 0).
        seed: seed of the init and io maps.
        dtype: float32 (default) or float64.

    Attributes: ``W`` (Parameter, L x w x (w+1)), ``rho`` (buffer, float64, L), ``U_in`` (w x d_in),
    ``V_out`` (d_out x w), ``rho_history`` (list of ρ vectors after each adaptive update).

    ``forward`` and ``penalty`` also run on every tensor stacked along a leading member axis (``W``
    ``M x L x w x (w+1)``, ``rho`` ``M x L``, L̃ a float or ``(M,)``), as the training engine's ensembles
    pass them: inputs ``N x d_in`` or ``M x N x d_in``, outputs ``M x N x d_out``, penalties ``(M,)``.
    """

    rho: torch.Tensor
    U_in: torch.Tensor
    V_out: torch.Tensor
    member_floats = ("effective_depth", "irregular_a")  # may differ in a stacked forward

    def __init__(
        self,
        d_in: int,
        d_out: int,
        width: int,
        depth: int,
        effective_depth: float,
        steps: str | torch.Tensor = "equidistant",
        irregular_a: float = 0.5,
        io: str = "fixed",
        init: str = "identity",
        allow_invalid_steps: bool = False,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        int_at_least("depth", depth, 1)
        int_at_least("width", width, 1)
        positive("effective_depth", effective_depth)
        one_of("io", io, IO_MODES)
        one_of("init", init, INITS)
        if width < max(d_in, d_out):
            raise FeaturelabError(f"width={width} is not allowed: it must be >= max(d_in, d_out) = {max(d_in, d_out)}")
        self.d_in, self.d_out, self.width, self.depth = d_in, d_out, width, depth
        self.effective_depth = float(effective_depth)
        self.io, self.allow_invalid_steps = io, allow_invalid_steps
        if isinstance(steps, torch.Tensor):
            rho, self.scheme = steps.detach().to(torch.float64).flatten(), "custom"
            if rho.numel() != depth or (rho <= 0).any():
                raise FeaturelabError(f"steps must be {depth} positive numbers, got shape {tuple(steps.shape)}")
        else:
            one_of("steps", steps, STEP_SCHEMES)
            self.scheme = steps
            rho = irregular_steps(depth, irregular_a) if steps == "irregular" else equidistant_steps(depth)
        self.irregular_a = irregular_a
        self.register_buffer("rho", rho)
        self.check_steps()
        self.rho_history: list[list[float]] = []

        gen = torch.Generator().manual_seed(seed)
        W = torch.randn(depth, width, width + 1, generator=gen, dtype=torch.float64) * (0.01 / (width + 1)) ** 0.5
        if init == "identity":
            W[:, :, :width] += self.effective_depth * torch.eye(width, dtype=torch.float64)
        self.W = nn.Parameter(W.to(dtype))
        U = _haar(width, gen)[:, :d_in].to(dtype)
        V = _haar(width, gen)[:, :d_out].T.contiguous().to(dtype)
        if io == "learned":
            self.U_in, self.V_out = nn.Parameter(U), nn.Parameter(V)
        else:
            self.register_buffer("U_in", U)
            self.register_buffer("V_out", V)

    # ------------------------------------------------------------------------------- steps
    def check_steps(self, rho: torch.Tensor | None = None) -> None:
        """Raise unless ρ_l·L̃ < 1 for every l (skipped with ``allow_invalid_steps=True``)."""
        rho = self.rho if rho is None else rho
        worst = float((rho * self.effective_depth).max())
        if worst >= 1 and not self.allow_invalid_steps:
            raise FeaturelabError(
                f"steps: max rho_l*effective_depth = {worst:.4g} >= 1 (scheme {self.scheme!r}, L={self.depth}, "
                f"effective_depth={self.effective_depth:g}); use more steps (depth), a smaller effective_depth, "
                "or allow_invalid_steps=True"
            )

    @property
    def positions(self) -> torch.Tensor:
        """``p_0 = 0, p_l = ρ_1 + ... + ρ_l`` (float64, L+1)."""
        return torch.cat([torch.zeros(1, dtype=torch.float64, device=self.rho.device), torch.cumsum(self.rho, 0)])

    @torch.no_grad()
    def adapt_steps(self, X: torch.Tensor) -> torch.Tensor:
        """The adaptive-ρ update on inputs X (N x d_in), projected onto ``[0.1/L, 0.9/L̃]`` (Part 1 §2.3).

        Weights are unchanged; the new ρ is stored, appended to `rho_history` and returned.
        """
        reps = [a.to(torch.float64) for a in self.representations(X)]
        rho = adaptive_update(self.rho, reps)
        rho = project_steps(rho, 0.1 / self.depth, 0.9 / self.effective_depth)
        self.rho.copy_(rho)
        self.rho_history.append(rho.tolist())
        return rho

    # ----------------------------------------------------------------------------- forward
    sigma = staticmethod(sigma)

    def representations(
        self, X: torch.Tensor, rho: torch.Tensor | None = None, A0: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """``[A_0, ..., A_L]``, each N x w. `rho` overrides the stored steps (any positive values,
        e.g. a leaf tensor for ∂𝓛/∂ρ); `A0` overrides ``X U_inᵀ`` (e.g. a leaf for ∂C/∂A_0)."""
        rho = self.rho if rho is None else rho
        A0 = X @ self.U_in.mT if A0 is None else A0
        return euler_steps(A0, self.W, rho, self.effective_depth)

    def forward(self, X: torch.Tensor, return_layers: bool = False, rho: torch.Tensor | None = None):
        """X: N x d_in -> Ŷ = A_L V_outᵀ: N x d_out (arXiv 2405.17573 §4); with ``return_layers=True`` a `Forward`
        with ``output`` Ŷ, ``pre = [A_0, ..., A_L]`` (the representations, N x w) and
        ``act = [σ(A_0), ..., σ(A_{L-1})]`` (N x (w+1), the inputs of the W_l)."""
        reps = self.representations(X, rho=rho)
        out = reps[-1] @ self.V_out.mT
        return Forward(out, reps, [sigma(A) for A in reps[:-1]]) if return_layers else out

    # -------------------------------------------------------------------------- parameters
    def layer_matrices(self) -> list[torch.Tensor]:
        """``[W_1, ..., W_L]`` (each w x (w+1), bias column included, since W_l acts on ``σ(A) = [ReLU(A), 1]``):
        the spectra Part 1 plots. `MLP.layer_matrices` leaves its bias column out."""
        return list(self.W)

    def penalty(self, lam: float, rho: torch.Tensor | None = None) -> torch.Tensor:
        """R = λ/(2L̃) Σ_l ρ_l ‖W_l‖²_F (+ (λ/2)(‖U_in‖² + ‖V_out‖²) if io is learned), the regularized
        cost of arXiv 2405.17573 §4."""
        rho = self.rho if rho is None else rho
        R = lam / (2 * self.effective_depth) * (rho.to(self.W.dtype) * (self.W**2).sum(dim=(-2, -1))).sum(-1)
        if self.io == "learned":
            R = R + lam / 2 * ((self.U_in**2).sum((-2, -1)) + (self.V_out**2).sum((-2, -1)))
        return R

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, width={self.width}, depth={self.depth}, "
            f"effective_depth={self.effective_depth:g}, steps={self.scheme!r}, io={self.io!r}"
        )
