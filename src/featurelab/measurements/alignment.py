"""Low-rank alignment of the last layers and the bounds of Theorem 2 (docs/theory/invariances.md §4; Le & Jegelka,
ICLR 2022, Theorem 2, eqs. (13)-(15)).

For each parameter stage k of a `HomogeneousNet` (or bias-free `MLP`) with output-side matrix B_k
(W, B(K), [V_2, V_3]; Part 5 §1):

    ratio_k = ‖B_k‖²_op / ‖B_k‖²_F ∈ [1/rank, 1],
    alignment_k = |⟨v_{k+1}, u_k⟩|,  u_k the top left singular vector of B_k, v_{k+1} the top right
                  singular vector of the next stage's input-side A_{k+1} (both indexed by the junction units).

Derived bound (Part 5 §4 steps 1-5) for stages whose outputs and all later stages are linear (FC, conv,
linear ResNetFree), with constants frozen at a reference point (the init):

    ratio_k(t) >= ρ_k - (E_k + ρ_k f_k) / ‖B_k(t)‖²_F,    ρ_k = Π_{k<j<N} 1/r_j,
    E_k = Σ_j ‖C_j‖_op + c_j propagated through 1/r_j,  f_k = ‖B_k‖²_F - ‖w‖²  (Lemma 3),

with switch costs r_j = 1 (FC), min(c, S) (FC after a conv), min(c_in, k_h k_w) (conv), 2 (ResNetFree,
c_j = ½‖V_2ᵀV_2 - V_1V_1ᵀ‖_op). The paper-style bound uses r = 1 (FC, also after a conv), k_h k_w (conv)
and 8 (ResNetFree) instead [L]. For an all-FC tail this is ratio_k >= 1 - D_k/‖W_k‖²_F (step 6).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.conv import Conv
from ..models.residual import Dense, Flatten, ResBlock, as_homogeneous
from ..results import Result
from .invariances import PARAM, invariants
from .ranks import singular_values, stable_rank


def _op(M: torch.Tensor) -> float:
    return float(singular_values(M, 1)[0])


def layer_ratios(model) -> list[float]:
    """‖B_k‖²_op/‖B_k‖²_F for every parameter stage k (float64), Part 5 §4 (15)."""
    net = as_homogeneous(model)
    out = []
    with torch.no_grad():
        for B in net.weight_matrices():
            out.append(1.0 / stable_rank(B.detach().double()))
    return out


def _top_vectors(M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    U, _, Vh = torch.linalg.svd(M.detach().double(), full_matrices=False)
    return U[:, 0], Vh[0]


def adjacent_alignment(model) -> dict[str, float]:
    """|⟨v_{k+1}, u_k⟩| for every junction with learnable sides (Part 5 §4 (15)), keyed by junction name."""
    found = invariants(model)
    out = {}
    with torch.no_grad():
        for jn in found.junctions:
            u, _ = _top_vectors(jn.B(PARAM))
            _, v = _top_vectors(jn.A(PARAM))
            out[jn.name] = float((u @ v).abs())
    return out


@dataclass(frozen=True)
class TailConstants(Result):
    """Constants of the derived and paper-style Theorem 2 bounds for one stage k, frozen at a reference."""

    stage: int
    rho: float
    E: float
    rho_paper: float
    E_paper: float
    f: float


def _switch(net, i: int) -> tuple[float, float, float] | None:
    """(r, r_paper, c) for switching from B_i to A_i inside stage i, or None if Theorem 2 does not cover it."""
    s = net.stages[i]
    after_conv = i > 0 and isinstance(net.stages[i - 1], Flatten)
    if isinstance(s, Dense):
        if not bool((s.leak == 1.0).all()):
            return None
        if after_conv:
            shape = net.shapes[i - 1]  # the image the Flatten reads
            c = shape[0] if isinstance(shape, tuple) else 1
            return float(min(c, s.weight.shape[1] // c)), 1.0, 0.0
        return 1.0, 1.0, 0.0
    if isinstance(s, Conv):
        if not bool((s.leak == 1.0).all()):
            return None
        _, _, kh, kw = s.weight.shape
        return float(s.switch_factor), float(kh * kw), 0.0
    if isinstance(s, ResBlock) and s.kind == "free" and s.leak_in == 1.0 and s.leak_out == 1.0 and not after_conv:
        V1, V2 = s.V1.detach().double(), s.V2.detach().double()
        return 2.0, 8.0, 0.5 * _op(V2.T @ V2 - V1 @ V1.T)
    return None


def theorem2_constants(model) -> list[TailConstants]:
    """Constants of the Theorem 2 bounds (Part 5 §4 steps 1-5) for every stage k of the linear tail,
    computed at the model's current parameters (call at init). Stages are numbered as in `invariants`."""
    net = as_homogeneous(model)
    found = invariants(net)
    C_op = {}
    with torch.no_grad():
        for jn in found.junctions:
            if jn.full and bool((jn.leak == 1.0).all()) and jn.key[1] == "out":
                C_op[jn.key[0]] = _op(jn.C(PARAM).double())
        mats = net.weight_matrices()
        param_stages = [i for i, s in enumerate(net.stages) if not isinstance(s, Flatten)]
        w2 = float((mats[-1].detach().double() ** 2).sum())
        last = param_stages[-1]
        out = [TailConstants(last, 1.0, 0.0, 1.0, 0.0, 0.0)]
        rho, E, rho_p, E_p = 1.0, 0.0, 1.0, 0.0
        for pos in range(len(param_stages) - 2, -1, -1):
            k, nxt = param_stages[pos], param_stages[pos + 1]
            sw = _switch(net, nxt)
            if sw is None or k not in C_op:
                break
            r, r_p, c = sw
            rho, E = rho / r, E / r + c + C_op[k]
            rho_p, E_p = rho_p / r_p, E_p / r_p + c + C_op[k]
            f = float((mats[pos].detach().double() ** 2).sum()) - w2
            out.append(TailConstants(k, rho, E, rho_p, E_p, f))
    return out[::-1]


def theorem2_bounds(model, constants: list[TailConstants] | None = None) -> dict[int, tuple[float, float, float]]:
    """{stage: (ratio, derived bound, paper-style bound)} at the model's current parameters, with
    bound = ρ_k - (E_k + ρ_k f_k)/‖B_k‖²_F (Part 5 §4 step 5; paper-style: ρ, E from (13)'s factors).

    constants: `theorem2_constants` computed at initialisation (the bound holds along the flow from there);
    default: computed at the current parameters, i.e. taking them as the start."""
    net = as_homogeneous(model)
    constants = theorem2_constants(net) if constants is None else constants
    mats = dict(zip([i for i, s in enumerate(net.stages) if not isinstance(s, Flatten)], net.weight_matrices()))
    out = {}
    with torch.no_grad():
        for tc in constants:
            B = mats[tc.stage].detach().double()
            F2 = float((B**2).sum())
            out[tc.stage] = (
                _op(B) ** 2 / F2,
                tc.rho - (tc.E + tc.rho * tc.f) / F2,
                tc.rho_paper - (tc.E_paper + tc.rho_paper * tc.f) / F2,
            )
    return out


def linear_tail_constants(tail: list[torch.Tensor]) -> list[float]:
    """D_k = Σ_{j>=k} (‖C_j‖_op - tr C_j), C_j = W_{j+1}ᵀW_{j+1} - W_jW_jᵀ, for a bias-free all-FC linear tail
    ``[W_k, ..., W_N]`` (each ``n_out x n_in``, W_N the output row), k = first .. N-1 (Part 5 §4 step 6).

    Only the tail enters: C_j is conserved by gradient flow whenever the units between W_j and W_{j+1} are
    linear and unbiased, whatever feeds W_k (Theorem 2's g may be non-homogeneous, e.g. tanh with biases).
    Compute at a reference point (the init); then ratio_k(t) >= 1 - D_k/‖W_k(t)‖²_F along the flow.
    """
    Ws = [W.detach().double() for W in tail]
    C = [Ws[j + 1].T @ Ws[j + 1] - Ws[j] @ Ws[j].T for j in range(len(Ws) - 1)]
    terms = [_op(c) - float(c.trace()) for c in C]
    return [sum(terms[k:]) for k in range(len(terms))]


def linear_tail_bounds(constants: list[float], tail: list[torch.Tensor]) -> list[tuple[float, float]]:
    """[(ratio_k, 1 - D_k/‖W_k‖²_F)] for the tail's stages k = first .. N-1 (`linear_tail_constants`)."""
    out = []
    for D, W in zip(constants, tail):
        W = W.detach().double()
        F2 = float((W**2).sum())
        out.append((_op(W) ** 2 / F2, 1 - D / F2))
    return out


def linear_tail_alignment(tail: list[torch.Tensor]) -> list[float]:
    """|⟨v_{k+1}, u_k⟩| for consecutive tail matrices: u_k the top left singular vector of W_k, v_{k+1} the top
    right one of W_{k+1} (Part 5 §4 (15)); any network, no homogeneity needed."""
    out = []
    for W, W_next in zip(tail[:-1], tail[1:]):
        u, _ = _top_vectors(W)
        _, v = _top_vectors(W_next)
        out.append(float((u @ v).abs()))
    return out
