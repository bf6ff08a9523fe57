"""Escape from the origin saddle of a bias-free deep ReLU MLP (docs/theory/saddle-to-saddle.md; Bantzis, Simon, Jacot).

Rows are samples throughout: ``X`` is ``N x d_in`` and the output ``Y_θ`` is ``N x d_out``.
The paper writes ``G ∈ R^{d_out×N}`` (columns); here ``G`` is ``N x d_out``, the same shape as ``Y_θ``, so the
localized loss ``L0(θ) = Tr[Gᵀ Y_θ] = Σ_ij G_ij (Y_θ)_ij`` is the same number in both conventions.

`weights` is ``[W_1, ..., W_L]`` with ``W_ℓ`` of shape ``n_ℓ x n_{ℓ-1}`` (the usual ``out x in``), or a
bias-free ReLU `MLP` (``MLP(..., bias=0.0)``). Layer ℓ computes ``Z_ℓ = Zσ_{ℓ-1} W_ℓᵀ`` and
``Zσ_ℓ = relu(Z_ℓ)`` (σ'(0) = 0, Part 4 §8.4); ``Y_θ = Z_L``. The search routines accept a leading
restart dimension (``R x n_ℓ x n_{ℓ-1}``) and run all restarts as one batched computation.

Contents: localized loss and speed (§2, §3.1), the projected-GD and rank-one searches (A1, A2), the
per-layer ratios r_W, r_Z, lin (§3.2), the Thm 3.1 bound (§3.3), Props 3.4, 3.3, 3.2 (§3.4-3.6) and the
corrected Prop 2.2 escape-time formulas (§2). Everything is computed in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..checks import as_matrix, int_at_least, non_negative, nonempty, positive
from ..errors import FeaturelabError
from ..models.mlp import MLP
from ..models.weights import weight_list
from ..results import Check, Result
from .ranks import singular_values, stable_rank


# ------------------------------------------------------------------------------ inputs
def as_weights(weights, X: torch.Tensor | None = None, batched: bool = False) -> list[torch.Tensor]:
    """``[W_1..W_L]`` as float64 tensors (autograd graph kept), checked to chain ``d_in -> ... -> d_out``.

    weights: a bias-free ReLU `MLP` or a list of ``n_ℓ x n_{ℓ-1}`` matrices (with ``batched=True``
    each may carry the same leading restart dimension R). X: ``N x d_in`` (rows are samples) to check
    W_1 against. Raises a one-line `FeaturelabError` for biases, L < 2 or shapes that do not chain.
    """
    if isinstance(weights, MLP):
        if weights.bias:
            raise FeaturelabError(
                f"weights is an MLP with bias={weights.bias!r}; the localized loss of "
                "docs/theory/saddle-to-saddle.md needs a bias-free ReLU MLP (bias=0.0)"
            )
        if weights.leak != 0.0 or weights.activation != "leaky_relu" or weights.linear_tail:
            raise FeaturelabError(
                "weights is an MLP that is not a plain ReLU net (leak=0, activation='leaky_relu', "
                "linear_tail=0), as docs/theory/saddle-to-saddle.md needs"
            )
    Ws = weight_list(weights, batched=batched)
    if len(Ws) < 2:
        raise FeaturelabError(f"weights has depth {len(Ws)}; docs/theory/saddle-to-saddle.md needs depth L >= 2")
    if X is not None and Ws[0].shape[-1] != X.shape[1]:
        hint = (
            " (it looks like it has a bias column: Part 4 nets are bias-free)"
            if Ws[0].shape[-1] == X.shape[1] + 1
            else ""
        )
        raise FeaturelabError(f"weights[0] has {Ws[0].shape[-1]} columns but X has d_in={X.shape[1]}{hint}")
    return Ws


def as_data(X, G, d_out: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """X (``N x d_in``) and G (``N x d_out``, rows are samples) as float64, with matching rows."""
    X, G = as_matrix("X", X), as_matrix("G", G)
    if G.shape[0] != X.shape[0] or (d_out is not None and G.shape[1] != d_out):
        want = f"{X.shape[0]} x {d_out if d_out is not None else 'd_out'}"
        raise FeaturelabError(
            f"G has shape {tuple(G.shape)}; it must be N x d_out = {want} (rows are samples, "
            "the shape of the outputs Y_θ; the paper's G is its transpose)"
        )
    return X, G


# ---------------------------------------------------------------------- forward and L0
def forward(Ws: list[torch.Tensor], X: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every layer of the bias-free ReLU net: ``(pre, act)`` with pre = [Z_1..Z_L], act = [Zσ_0 = X, Zσ_1..Zσ_{L-1}].

    Ws: checked weights (see `as_weights`), optionally ``R x n_ℓ x n_{ℓ-1}``; X: ``N x d_in``.
    Each Z is ``N x n_ℓ`` (``R x N x n_ℓ`` when batched). docs/theory/saddle-to-saddle.md §1, rows for samples.
    """
    a, pre, act = X, [], [X]
    for l, W in enumerate(Ws, start=1):
        z = a @ W.transpose(-1, -2)
        pre.append(z)
        if l < len(Ws):
            a = torch.relu(z)
            act.append(a)
    return pre, act


def _sq_norm(Ws: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([(W**2).sum((-2, -1)) for W in Ws]).sum(0)


def _L0(Ws: list[torch.Tensor], X: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    return (G * forward(Ws, X)[0][-1]).sum((-2, -1))


def localized_loss(weights, X, G) -> torch.Tensor:
    """L0(θ) = Tr[Gᵀ Y_θ] = Σ_ij G_ij (Y_θ)_ij (docs/theory/saddle-to-saddle.md §2), a float64 scalar (differentiable).

    weights: bias-free ReLU `MLP` or list of ``n_ℓ x n_{ℓ-1}`` matrices. X: ``N x d_in``. G: ``N x d_out``
    (rows are samples; the papers' ``d_out x N`` G transposed), e.g. ``-Y*`` for ½‖Y-Y*‖² or
    ``(1/K - onehot)/N`` for mean cross-entropy. L0 is L-homogeneous: L0(λθ) = λ^L L0(θ) for λ > 0.
    """
    X = as_matrix("X", X)
    Ws = as_weights(weights, X)
    X, G = as_data(X, G, Ws[-1].shape[0])
    return _L0(Ws, X, G)


def _speed(Ws: list[torch.Tensor], X: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    L = len(Ws)
    return -(L ** (L / 2)) * _L0(Ws, X, G) / _sq_norm(Ws) ** (L / 2)


def escape_speed(weights, X, G) -> float:
    """speed(θ) = -L^{L/2} L0(θ)/‖θ‖^L: minus L0 at the rescaled point √L θ/‖θ‖ on the √L-sphere
    (docs/theory/saddle-to-saddle.md §3.1). At an escape direction ρ (∇L0(ρ) = -sρ, ‖ρ‖² = L) it is the speed s.

    weights, X (``N x d_in``), G (``N x d_out``): as in `localized_loss`. Returns a float.
    """
    X = as_matrix("X", X)
    Ws = [W.detach() for W in as_weights(weights, X)]
    X, G = as_data(X, G, Ws[-1].shape[0])
    if float(_sq_norm(Ws)) == 0:
        raise FeaturelabError("weights are all zero; the speed is defined for θ != 0")
    return float(_speed(Ws, X, G))


def eig_residual(weights, X, G) -> float:
    """‖∇L0(ρ) + sρ‖/‖∇L0(ρ)‖ at ρ = √L θ/‖θ‖ with s = speed (Part 4 §3.1): 0 at a differentiable escape
    direction. Meaningless where a pre-activation sits on the ReLU kink (§5, §8.4): test values instead."""
    X = as_matrix("X", X)
    Ws = [W.detach() for W in as_weights(weights, X)]
    X, G = as_data(X, G, Ws[-1].shape[0])
    L = len(Ws)
    scale = math.sqrt(L) / float(_sq_norm(Ws)) ** 0.5
    rho = [(W * scale).requires_grad_(True) for W in Ws]
    l0 = _L0(rho, X, G)
    grads = torch.autograd.grad(l0, rho)
    s = -float(l0.detach())
    num = sum(float(((g + s * r.detach()) ** 2).sum()) for g, r in zip(grads, rho))
    den = sum(float((g**2).sum()) for g in grads)
    return math.sqrt(num / den) if den > 0 else float("nan")


# ------------------------------------------------------------------ A1 / A2: the searches
@dataclass(frozen=True)
class EscapeSearch(Result):
    """Result of `find_escape_directions`: R restarts, all on the √L-sphere ‖θ‖² = L.

    speeds: ``R`` final speeds -L0(θ_K).   weights: ``[W_1..W_L]``, each ``R x n_ℓ x n_{ℓ-1}``.
    trace: ``(K+1) x R`` speed after each step (row 0 = start).   converged: ``R`` bools, speed moved
    < 1e-7 over the last 500 steps (Part 4 A1).
    """

    speeds: torch.Tensor
    weights: list[torch.Tensor]
    trace: torch.Tensor
    converged: torch.Tensor

    def run(self, i: int) -> list[torch.Tensor]:
        """The weights ``[W_1..W_L]`` of restart `i` (unbatched)."""
        return [W[i] for W in self.weights]

    def best(self) -> tuple[float, list[torch.Tensor]]:
        """(speed, weights) of the fastest restart."""
        i = int(torch.argmax(self.speeds))
        return float(self.speeds[i]), self.run(i)


def _widths(width, depth: int) -> list[int]:
    widths = list(width) if isinstance(width, (list, tuple)) else [width] * (depth - 1)
    if len(widths) != depth - 1 or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
        raise FeaturelabError(
            f"width={width!r} is not allowed for depth={depth}: give an int >= 1 or a list of {depth - 1} ints >= 1"
        )
    return widths


def _to_sphere(Ws: list[torch.Tensor], L: int) -> list[torch.Tensor]:
    scale = (L / _sq_norm(Ws)).sqrt()[..., None, None]
    return [W * scale for W in Ws]


def find_escape_directions(
    X,
    G,
    depth: int,
    width,
    restarts: int = 50,
    steps: int = 4000,
    rank_one: bool = False,
    seed: int = 0,
    lr: float | None = None,
    init=None,
    tail: int = 500,
) -> EscapeSearch:
    """Search the √L-sphere for optimal escape directions, all restarts batched in one tensor computation.

    Default (docs/theory/saddle-to-saddle.md A1): projected (Riemannian) GD on ‖θ‖² = L from Gaussian starts rescaled
    to the sphere: ``g = ∇L0(θ)``, ``θ <- θ - η_k (g - (gᵀθ/L)θ)``, ``θ <- √L θ/‖θ‖``, with the decaying
    step ``η_k = lr(1 + cos(πk/K))/2`` (lr = 0.05 by default; a constant step chatters across kinks).
    ``rank_one=True`` (A2): ``W_ℓ = a_ℓ b_ℓᵀ``, maximise ``-L0(W)(L/Σ_ℓ‖a_ℓ‖²‖b_ℓ‖²)^{L/2}`` with Adam
    (lr = 0.01 by default), the same cosine decay of its step (ours: sharper optima than a constant one).

    X: ``N x d_in``; G: ``N x d_out`` (rows are samples). depth: L >= 2. width: hidden width (int) or
    list of L-1 widths. restarts: R. steps: K. init: optional starting weights ``[W_ℓ]`` (each
    ``n_ℓ x n_{ℓ-1}`` or ``R x n_ℓ x n_{ℓ-1}``) for PGD, e.g. a warm start from `extend_depth` (A1);
    width is then ignored. tail: the window (steps) of the convergence flag.
    Returns an `EscapeSearch` (speeds, weights on the sphere, per-step trace, convergence flags).
    """
    X = nonempty("X", as_matrix("X", X))
    X, G = as_data(X, G)
    int_at_least("depth", depth, 2)
    int_at_least("restarts", restarts, 1)
    int_at_least("steps", steps, 1)
    int_at_least("tail", tail, 1)
    L = depth
    gen = torch.Generator().manual_seed(seed)
    if init is not None:
        if rank_one:
            raise FeaturelabError("init is only used by the projected-GD search (rank_one=False)")
        Ws = _checked_init(init, X, G, L, restarts)
    elif rank_one:
        dims = [X.shape[1], *_widths(width, L), G.shape[1]]
        Ws, trace = _rank_one_search(dims, X, G, restarts, steps, positive("lr", 0.01 if lr is None else lr), gen)
    else:
        dims = [X.shape[1], *_widths(width, L), G.shape[1]]
        Ws = [
            torch.randn(restarts, n, m, generator=gen, dtype=torch.float64).to(X.device)
            for n, m in zip(dims[1:], dims[:-1])
        ]
    if not rank_one:
        Ws, trace = _pgd_search(Ws, X, G, steps, positive("lr", 0.05 if lr is None else lr))
    speeds = _speed(Ws, X, G)
    last = trace[-min(tail, steps) - 1 :]
    converged = (last.max(0).values - last.min(0).values) < 1e-7
    return EscapeSearch(speeds, Ws, trace, converged)


def _checked_init(init, X: torch.Tensor, G: torch.Tensor, L: int, restarts: int) -> list[torch.Tensor]:
    """The starting weights `init` of the projected-GD search, checked against depth L and G, one per restart."""
    Ws = as_weights(init, X, batched=True)
    if len(Ws) != L or Ws[-1].shape[-2] != G.shape[1]:
        raise FeaturelabError(
            f"init has {len(Ws)} weight matrices with d_out={Ws[-1].shape[-2]}; "
            f"it needs depth={L} and d_out = G's {G.shape[1]} columns"
        )
    if Ws[0].ndim == 2:
        return [W.expand(restarts, *W.shape).clone() for W in Ws]
    if Ws[0].shape[0] != restarts:
        raise FeaturelabError(f"init has {Ws[0].shape[0]} restarts but restarts={restarts}")
    return Ws


def _rank_one_search(dims, X, G, restarts: int, steps: int, lr: float, gen) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A2: ``W_ℓ = a_ℓ b_ℓᵀ`` (R restarts, Gaussian a, b), Adam with a cosine-decayed step on minus the speed;
    returns the weights on the √L-sphere and the (K+1) x R trace of the speed."""
    a = [
        torch.randn(restarts, n, generator=gen, dtype=torch.float64).to(X.device).requires_grad_(True) for n in dims[1:]
    ]
    b = [
        torch.randn(restarts, m, generator=gen, dtype=torch.float64).to(X.device).requires_grad_(True)
        for m in dims[:-1]
    ]
    opt = torch.optim.Adam(a + b, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: (1 + math.cos(math.pi * k / steps)) / 2)
    trace = torch.empty(steps + 1, restarts, dtype=torch.float64, device=X.device)
    Ws: list[torch.Tensor] = []
    for k in range(steps + 1):
        Ws = [ai[:, :, None] * bi[:, None, :] for ai, bi in zip(a, b)]
        speed = _speed(Ws, X, G)
        trace[k] = speed.detach()
        if k == steps:
            break
        opt.zero_grad(set_to_none=True)
        (-speed.sum()).backward()
        opt.step()
        sched.step()
    return _to_sphere([W.detach() for W in Ws], len(dims) - 1), trace


def _pgd_search(Ws: list[torch.Tensor], X, G, steps: int, lr: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A1: projected (Riemannian) GD on ‖θ‖² = L from the R x n_ℓ x n_{ℓ-1} weights `Ws` (rescaled to the
    sphere first), step ``lr(1 + cos(πk/K))/2``; returns the final weights and the (K+1) x R trace of −L0."""
    L = len(Ws)
    Ws = _to_sphere([W.detach().to(X.device) for W in Ws], L)
    trace = torch.empty(steps + 1, Ws[0].shape[0], dtype=torch.float64, device=X.device)
    for k in range(steps + 1):
        Ws = [W.requires_grad_(True) for W in Ws]
        l0 = _L0(Ws, X, G)
        trace[k] = -l0.detach()
        if k == steps:
            break
        grads = torch.autograd.grad(l0.sum(), Ws)
        eta = lr * (1 + math.cos(math.pi * k / steps)) / 2
        with torch.no_grad():
            radial = torch.stack([(g * W).sum((-2, -1)) for g, W in zip(grads, Ws)]).sum(0)[:, None, None] / L
            Ws = _to_sphere([W - eta * (g - radial * W) for g, W in zip(grads, Ws)], L)
    return [W.detach() for W in Ws], trace


# ------------------------------------------------------------------- §3.2 per-layer ratios
def tail_ratio(M) -> float:
    """r(M) = Σ_{i>=2} s_i² / Σ_i s_i² = 1 - ‖M‖²_op/‖M‖²_F (docs/theory/saddle-to-saddle.md §3.2, over all nonzero
    singular values); 0 for a rank-one or zero matrix. Transpose-invariant."""
    sr = stable_rank(M)
    return 1.0 - 1.0 / sr if sr > 0 else 0.0


def layer_diagnostics(weights, X, top: int = 10) -> dict[str, list]:
    """Per-layer low-rank diagnostics of docs/theory/saddle-to-saddle.md §3.2.

    float64; X is ``N x d_in``, rows are samples.

    Returns lists indexed by position (the layer index is in the name):
      r_W[ℓ-1]  = r(W_ℓ), ℓ = 1..L;        r_Z[ℓ] = r(Zσ_ℓ), ℓ = 0..L-1 (ℓ = 0 is X);
      lin[ℓ-1]  = ‖Zσ_ℓ - Z_ℓ‖²_F/‖Z_ℓ‖²_F, ℓ = 1..L-1 (0 for a zero Z_ℓ);
      s2_s1[ℓ-1] = s_2(W_ℓ)/s_1(W_ℓ);      singular_values[ℓ-1] = top-`top` singular values of W_ℓ.
    """
    X = as_matrix("X", X)
    Ws = [W.detach() for W in as_weights(weights, X)]
    pre, act = forward(Ws, X)
    svals = [singular_values(W) for W in Ws]
    lin = []
    for z, a in zip(pre[:-1], act[1:]):
        nz = float((z**2).sum())
        lin.append(float(((a - z) ** 2).sum()) / nz if nz > 0 else 0.0)
    return {
        "r_W": [tail_ratio(W) for W in Ws],
        "r_Z": [tail_ratio(a) for a in act],
        "lin": lin,
        "s2_s1": [float(s[1] / s[0]) if s.numel() > 1 and s[0] > 0 else 0.0 for s in svals],
        "singular_values": [s[:top].tolist() for s in svals],
    }


# --------------------------------------------------------------------------- §3.3 Thm 3.1
@dataclass(frozen=True)
class Theorem31Bound(Result):
    """Thm 3.1's bound: ``c = (‖X‖‖G‖/s*)·sqrt(2 log(‖X‖‖G‖/s*))`` and ``bounds = [B(1), ..., B(L)]``
    (B = inf where it is vacuous)."""

    c: float
    bounds: list[float]


def theorem31_bound(X, G, s_star: float, depth: int) -> Theorem31Bound:
    """Thm 3.1 (docs/theory/saddle-to-saddle.md §3.3): at an optimal escape direction of speed s* every r_W(ℓ), r_Z(ℓ),
    lin(ℓ) is at most ``B(ℓ) = 8cℓ^{-1/2}/(1 - cℓ^{-1/2})`` with ``c = (‖X‖‖G‖/s*)·sqrt(2 log(‖X‖‖G‖/s*))``.

    X: ``N x d_in``, G: ``N x d_out`` (rows are samples); s_star > 0 (the paper's min is negative: §8.2).
    Returns a `Theorem31Bound` (c, [B(1), ..., B(L)]) with B = inf where cℓ^{-1/2} >= 1 (vacuous; Example 1:
    c ≈ 37.68).
    """
    X, G = as_data(X, G)
    positive("s_star", s_star)
    int_at_least("depth", depth, 2)
    ratio = float(torch.linalg.norm(X) * torch.linalg.norm(G)) / s_star
    if ratio < 1 - 1e-12:
        raise FeaturelabError(f"s_star={s_star!r} exceeds ‖X‖‖G‖ = {ratio * s_star:.6g}, the upper bound of any speed")
    c = ratio * math.sqrt(2 * math.log(max(ratio, 1.0)))
    bounds = []
    for l in range(1, depth + 1):
        q = c / math.sqrt(l)
        bounds.append(8 * q / (1 - q) if q < 1 else math.inf)
    return Theorem31Bound(c, bounds)


def second_singular_bound(r_bound: float) -> float:
    """s_2/s_1 <= sqrt(r/(1 - r)) for any matrix with r = Σ_{i>=2} s_i²/Σ s_i² <= r_bound (s_2² <= Σ_{i>=2} s_i²
    = s_1² r/(1-r)); inf for r_bound >= 1. With Thm 3.1's B(ℓ) ~ 8cℓ^{-1/2} this is the abstract's
    "s_2 is O(ℓ^{-1/4}) times s_1": sqrt(B/(1-B)) ~ sqrt(8c) ℓ^{-1/4} (docs/theory/saddle-to-saddle.md §3.3)."""
    return math.sqrt(r_bound / (1 - r_bound)) if r_bound < 1 else math.inf


@dataclass(frozen=True, kw_only=True)
class Theorem31Check(Check):
    """Thm 3.1 as a `Check`: measured = the largest excess of a measured ratio over its bound (over the layers
    and the ratios r_W, max(r_Z, lin) and s_2/s_1; -inf where every bound is infinite), bound = 0, atol 1e-12.

    c, s_star: the theorem's constant and the speed used. B: [B(1)..B(L)]; s2_s1_bound: the bound on
    s_2/s_1(W_ℓ) from B(ℓ); r_W, s2_s1 (ℓ = 1..L), r_Z, lin (ℓ = 1..L-1): the measured ratios;
    informative: the layers with B(ℓ) < 1."""

    c: float
    s_star: float
    B: list[float]
    s2_s1_bound: list[float]
    r_W: list[float]
    r_Z: list[float]
    lin: list[float]
    s2_s1: list[float]
    informative: list[int]


def theorem31_check(weights, X, G, s_star: float | None = None) -> Theorem31Check:
    """Thm 3.1 (docs/theory/saddle-to-saddle.md §3.3) evaluated on a net θ, e.g. one found by projected GD or
    training: every r_W(ℓ), r_Z(ℓ), lin(ℓ) against B(ℓ), and s_2/s_1(W_ℓ) against `second_singular_bound`.

    s_star: the optimal speed; default speed(θ), which is s* when θ is an optimal escape direction (the
    theorem's hypothesis; for any other θ it is only a reading, and a smaller s gives a weaker bound).
    weights, X (``N x d_in``), G (``N x d_out``) as in `localized_loss`.
    Returns a `Theorem31Check` (passed when every ratio is within its bound).
    """
    X = as_matrix("X", X)
    Ws = [W.detach() for W in as_weights(weights, X)]
    X, G = as_data(X, G, Ws[-1].shape[0])
    L = len(Ws)
    s = float(_speed(Ws, X, G)) if s_star is None else s_star
    bound = theorem31_bound(X, G, s, L)
    c, B = bound.c, bound.bounds
    diag = layer_diagnostics(Ws, X)
    r_Z, lin = diag["r_Z"][1:], diag["lin"]
    excess = [diag["r_W"][l] - B[l] for l in range(L)]
    excess += [max(r_Z[l], lin[l]) - B[l] for l in range(L - 1)]
    excess += [diag["s2_s1"][l] - second_singular_bound(B[l]) for l in range(L)]
    worst = max(excess)
    return Theorem31Check(
        passed=Check.holds(worst, 0.0, atol=1e-12),
        measured=worst,
        bound=0.0,
        atol=1e-12,
        c=c,
        s_star=s,
        B=list(B),
        s2_s1_bound=[second_singular_bound(b) for b in B],
        r_W=diag["r_W"],
        r_Z=r_Z,
        lin=lin,
        s2_s1=diag["s2_s1"],
        informative=[l + 1 for l in range(L) if B[l] < 1],
    )


# --------------------------------------------------------------------------- §3.4 Prop 3.4
@dataclass(frozen=True, kw_only=True)
class Prop34Check(Check):
    """Prop 3.4's sum form as a `Check`: measured = Σ_ℓ log(‖Zσ_ℓ‖²_F/‖Zσ_ℓ‖²_op) <= bound =
    2 log(‖X‖‖G‖/s0); and its count form: `count` indices with r_Z(ℓ) > `threshold`, `count_passed`
    when count <= pL. s0: the speed of θ."""

    threshold: float
    count: int
    count_passed: bool
    s0: float


def prop34_check(weights, X, G, p: float = 0.5) -> Prop34Check:
    """Prop 3.4 (docs/theory/saddle-to-saddle.md §3.4) at any θ with L0(θ) < 0, evaluated on the √L-sphere (the
    ratios are scale-free and s0 = speed(θ) is the largest -L0 on the ray, so this is the tightest case).

    Sum form: ``Σ_{ℓ=0}^{L-1} log(‖Zσ_ℓ‖²_F/‖Zσ_ℓ‖²_op) <= 2 log(‖X‖‖G‖/s0)``.
    Count form: at most pL indices ℓ ∈ {0..L-1} have ``r_Z(ℓ) > 2 log(‖X‖‖G‖/s0)/(pL)``, p ∈ (0, 1).
    weights, X (``N x d_in``), G (``N x d_out``) as in `localized_loss`.
    Returns a `Prop34Check` (measured = the sum, bound = 2 log(‖X‖‖G‖/s0), atol 1e-12; and the count form).
    """
    X = as_matrix("X", X)
    Ws = [W.detach() for W in as_weights(weights, X)]
    X, G = as_data(X, G, Ws[-1].shape[0])
    if not 0 < p < 1:
        raise FeaturelabError(f"p={p!r} is not allowed: it must be in (0, 1)")
    L = len(Ws)
    s0 = float(_speed(Ws, X, G)) if float(_sq_norm(Ws)) > 0 else 0.0
    if not s0 > 0:
        raise FeaturelabError(f"Prop 3.4 needs L0(θ) < 0 (speed > 0); this θ has speed {s0:.3g}")
    act = forward(Ws, X)[1]
    lhs = sum(math.log(stable_rank(a)) for a in act)
    rhs = 2 * math.log(float(torch.linalg.norm(X) * torch.linalg.norm(G)) / s0)
    threshold = rhs / (p * L)
    count = sum(tail_ratio(a) > threshold for a in act)
    return Prop34Check(
        passed=Check.holds(lhs, rhs, atol=1e-12),
        measured=lhs,
        bound=rhs,
        atol=1e-12,
        threshold=threshold,
        count=int(count),
        count_passed=count <= p * L,
        s0=s0,
    )


# --------------------------------------------------------------------------- §3.5 Prop 3.3
def rank_one_chain(u, v, G, depth: int, width: int) -> list[torch.Tensor]:
    """The optimal chain of Prop 3.3 (docs/theory/saddle-to-saddle.md §3.5) for a rank-one input ``X = v uᵀ``
    (rows are samples, ``N x d_in``; the papers' ``u vᵀ``): ``W_1 = e_1 ûᵀ``, ``W_ℓ = e_1 e_1ᵀ`` (1<ℓ<L),
    ``W_L = -(Gᵀv/‖Gᵀv‖) e_1ᵀ``, hidden width `width`.

    u: length d_in, v: length N (both >= 0 entrywise); G: ``N x d_out``. Then ‖θ‖² = L and
    L0 = -‖Gᵀv‖‖u‖, the optimum for E = 0.
    """
    G = as_matrix("G", G)
    u = torch.as_tensor(u, dtype=torch.float64, device=G.device).reshape(-1)
    v = torch.as_tensor(v, dtype=torch.float64, device=G.device).reshape(-1)
    int_at_least("depth", depth, 2)
    int_at_least("width", width, 1)
    if G.shape[0] != v.numel():
        raise FeaturelabError(f"G has shape {tuple(G.shape)} but v has length {v.numel()}; G must be N x d_out")
    Gv = G.T @ v
    if float(torch.linalg.norm(Gv)) == 0 or float(torch.linalg.norm(u)) == 0:
        raise FeaturelabError("rank_one_chain needs u != 0 and Gᵀv != 0")
    e1 = torch.zeros(width, dtype=torch.float64, device=G.device)
    e1[0] = 1
    Ws = [e1[:, None] * (u / torch.linalg.norm(u))[None, :]]
    Ws += [e1[:, None] * e1[None, :] for _ in range(depth - 2)]
    Ws.append(-(Gv / torch.linalg.norm(Gv))[:, None] * e1[None, :])
    return Ws


@dataclass(frozen=True, kw_only=True)
class Prop33Check(Check):
    """Prop 3.3 as a `Check`: measured = the largest of r_W, r_Z, lin <= bound = 8‖G‖eps/(s - ‖G‖eps);
    `passed` is also True when the precondition fails (the proposition then says nothing).
    precondition: ‖θ‖² <= L and s = -Tr[Gᵀ Y_θ(X)] >= ‖Gᵀv‖‖u‖ - ‖G‖eps > 0.  r_W, r_Z, lin: per layer."""

    precondition: bool
    s: float
    r_W: list[float]
    r_Z: list[float]
    lin: list[float]


def prop33_check(weights, X, G, u, v, eps: float) -> Prop33Check:
    """Prop 3.3 (docs/theory/saddle-to-saddle.md §3.5) for a nearly rank-one input ``X = v uᵀ + E`` (rows are samples,
    ``N x d``; u, v >= 0 entrywise, ``‖E‖_F <= eps``).

    Precondition: ``‖θ‖² <= L`` and ``Tr[Gᵀ Y_θ(X)] <= -‖Gᵀv‖‖u‖ + ‖G‖_F eps`` with s = -Tr[...] > ‖G‖eps.
    Then every r_W(ℓ), r_Z(ℓ), lin(ℓ) is at most ``8‖G‖eps/(s - ‖G‖eps)``.
    Returns a `Prop33Check` (passed is True when the precondition fails) with the ratios.
    """
    X = as_matrix("X", X)
    Ws = [W.detach() for W in as_weights(weights, X)]
    X, G = as_data(X, G, Ws[-1].shape[0])
    non_negative("eps", eps)
    u = torch.as_tensor(u, dtype=torch.float64, device=X.device).reshape(-1)
    v = torch.as_tensor(v, dtype=torch.float64, device=X.device).reshape(-1)
    L = len(Ws)
    s = -float(_L0(Ws, X, G))
    geps = float(torch.linalg.norm(G)) * eps
    target = float(torch.linalg.norm(G.T @ v) * torch.linalg.norm(u))
    pre = float(_sq_norm(Ws)) <= L * (1 + 1e-12) and s >= target - geps and s > geps
    bound = 8 * geps / (s - geps) if s > geps else math.inf
    diag = layer_diagnostics(Ws, X)
    ratios = diag["r_W"] + diag["r_Z"] + diag["lin"]
    worst = max(ratios)
    return Prop33Check(
        passed=(not pre) or worst <= bound,
        measured=worst,
        bound=bound,
        precondition=pre,
        s=s,
        r_W=diag["r_W"],
        r_Z=diag["r_Z"],
        lin=diag["lin"],
    )


# --------------------------------------------------------------------------- §3.6 Prop 3.2
def extend_depth(weights, X, G, k: int, rescale: bool = True) -> list[torch.Tensor]:
    """Prop 3.2 depth extension (docs/theory/saddle-to-saddle.md §3.6): a depth-(L+k) net θ' with L0(θ') <= L0(θ).

    With ``H = Zσ_{L-2}`` (H = X for L = 2), a_i = ‖W_L[:,i]‖, b_i = ‖W_{L-1}[i,:]‖ and
    ``τ_i = Tr[Gᵀ (W_L[:,i]/a_i) σ(W_{L-1}[i,:]/b_i · H)]`` (rows: ``Σ_n G[n]·(W_L[:,i]/a_i) σ(H[n]·w_i)``),
    L0(θ) = Σ_i a_i b_i τ_i. With i* = argmin τ_i, M = Σ a_i b_i: W'_ℓ = W_ℓ (ℓ <= L-2),
    ``W'_{L-1} = √M e_1 W_{L-1}[i*,:]/b_{i*}``, ``W'_ℓ = e_1e_1ᵀ`` (ℓ = L..L+k-1, n_{L-1} x n_{L-1}),
    ``W'_{L+k} = √M (W_L[:,i*]/a_{i*}) e_1ᵀ``; then ‖θ'‖² <= ‖θ‖² + k.
    rescale: put θ' on the sphere ‖θ'‖² = L + k (then speed(θ') >= speed(θ) when ‖θ‖² = L).
    weights, X (``N x d_in``), G (``N x d_out``) as in `localized_loss`; k >= 0. Returns ``[W'_1..W'_{L+k}]``.
    """
    X = as_matrix("X", X)
    Ws = [W.detach() for W in as_weights(weights, X)]
    X, G = as_data(X, G, Ws[-1].shape[0])
    int_at_least("k", k, 0)
    L = len(Ws)
    H = forward(Ws, X)[1][L - 2]
    A, B = Ws[-1], Ws[-2]
    a, b = torch.linalg.norm(A, dim=0), torch.linalg.norm(B, dim=1)
    alive = (a * b) > 0
    if not alive.any():
        raise FeaturelabError("extend_depth needs a unit of layer L-1 with nonzero in- and out-weights (L0 = 0 here)")
    safe_a, safe_b = torch.where(alive, a, 1.0), torch.where(alive, b, 1.0)
    unit_out = torch.relu(H @ (B / safe_b[:, None]).T)  # N x n_{L-1}: σ(H w_i/b_i)
    tau = ((G @ (A / safe_a[None, :])) * unit_out).sum(0)  # τ_i
    tau = torch.where(alive, tau, torch.inf)
    i = int(torch.argmin(tau))
    M = float((a * b).sum())
    n = B.shape[0]
    e1 = torch.zeros(n, dtype=torch.float64, device=B.device)
    e1[0] = 1
    new = Ws[:-2] + [math.sqrt(M) * e1[:, None] * (B[i] / b[i])[None, :]]
    new += [e1[:, None] * e1[None, :] for _ in range(k)]
    new.append(math.sqrt(M) * (A[:, i] / a[i])[:, None] * e1[None, :])
    return _to_sphere(new, L + k) if rescale else new


# ------------------------------------------------------------------ §2 Prop 2.2 (corrected)
def _kappa(speed: float, depth: int) -> float:
    positive("speed", speed)
    int_at_least("depth", depth, 2)
    return speed * depth ** (-depth / 2)


def escape_norm(t, norm0: float, speed: float, depth: int):
    """‖θ(t)‖ of gradient flow on L0 started at θ(0) = norm0·ρ/√L, ρ an escape direction of speed s
    (docs/theory/saddle-to-saddle.md §2, Prop 2.2 corrected: κ = s L^{-L/2}, the unit-sphere speed).

    L = 2: ``norm0 e^{s t}``; L > 2: ``(norm0^{2-L} - (L-2)Lκ t)^{1/(2-L)}``, inf from the blow-up time on.
    t: float or tensor of times >= 0. Returns the same type.
    """
    positive("norm0", norm0)
    kappa = _kappa(speed, depth)
    t_ = torch.as_tensor(t, dtype=torch.float64)
    L = depth
    if L == 2:
        out = norm0 * torch.exp(2 * kappa * t_)
    else:
        base = norm0 ** (2 - L) - (L - 2) * L * kappa * t_
        out = torch.where(base > 0, base.clamp_min(1e-300) ** (1 / (2 - L)), torch.inf)
    return float(out) if out.ndim == 0 else out


def blowup_time(norm0: float, speed: float, depth: int) -> float:
    """Time at which ‖θ‖ blows up, ``norm0^{2-L}/((L-2)Lκ)`` for L > 2, inf for L = 2 (Part 4 §2, Prop 2.2)."""
    positive("norm0", norm0)
    kappa = _kappa(speed, depth)
    return math.inf if depth == 2 else norm0 ** (2 - depth) / ((depth - 2) * depth * kappa)


def escape_time(norm0: float, radius: float, speed: float, depth: int) -> float:
    """Time for ‖θ‖ to grow from norm0 to `radius` along an escape direction (Part 4 §2, Prop 2.2 corrected):
    ``(norm0^{2-L} - r^{2-L})/((L-2)Lκ)`` for L > 2, ``log(r/norm0)/(2κ)`` for L = 2. Until then
    ‖Y_θ‖_F <= (r/√L)^L ‖X‖_F."""
    positive("norm0", norm0)
    positive("radius", radius)
    kappa = _kappa(speed, depth)
    if radius < norm0:
        raise FeaturelabError(f"radius={radius!r} is not allowed: it must be >= norm0={norm0!r}")
    if depth == 2:
        return math.log(radius / norm0) / (2 * kappa)
    return (norm0 ** (2 - depth) - radius ** (2 - depth)) / ((depth - 2) * depth * kappa)


def cross_entropy_gradient(Y: torch.Tensor, n_classes: int) -> torch.Tensor:
    """G = ∇C(0) of mean K-class cross-entropy, ``N x K`` (rows are samples): ``(1/K - onehot(y))/N``
    (docs/theory/saddle-to-saddle.md §2, transposed). Y: ``N`` int64 labels."""
    onehot = torch.nn.functional.one_hot(Y, n_classes).to(torch.float64)
    return (1.0 / n_classes - onehot) / len(Y)


# ---------------------------------------------------------------------- §5 Example 1 closed forms
def rank_one_curve(phi: np.ndarray, n_points: int = 8) -> np.ndarray:
    """S(φ) = |Σ_j (-1)^j σ(sin(2πj/N + φ))|: the speed of W_1 = [cos φ, sin φ], W_2 = [1], W_3 = [±1]
    on Example 1 (docs/theory/saddle-to-saddle.md §5)."""
    j = np.arange(1, n_points + 1)
    return np.abs((((-1.0) ** j) * np.maximum(np.sin(2 * np.pi * j[None, :] / n_points + phi[:, None]), 0)).sum(1))


def eq6_curve(phi: np.ndarray) -> np.ndarray:
    """The paper's Eq. (6): |cos(ξ+π/4) - cos ξ + cos(ξ-π/4) - cos(ξ-π/2)|, ξ = φ mod π/4 (N = 8)."""
    xi = np.mod(phi, np.pi / 4)
    return np.abs(np.cos(xi + np.pi / 4) - np.cos(xi) + np.cos(xi - np.pi / 4) - np.cos(xi - np.pi / 2))
