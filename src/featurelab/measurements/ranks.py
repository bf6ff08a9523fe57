"""Spectral summaries of a matrix: singular values and the rank notions the papers use.

All take any 2-D matrix (no samples convention needed: ranks are transpose-invariant) and compute
in float64. `spectrum_ranks` computes all of them from one SVD.
"""

from __future__ import annotations

import math

import torch

from ..checks import as_matrix, non_negative, renamed


def singular_values(M, k: int | None = None) -> torch.Tensor:
    """Singular values of M in decreasing order (float64), the top `k` if given."""
    s = torch.linalg.svdvals(as_matrix("M", M))
    return s if k is None else s[:k]


def min_norm_lstsq(A: torch.Tensor, B: torch.Tensor, rcond: float) -> torch.Tensor:
    """The minimum-norm least-squares solution X of ``A X ≈ B`` (A: ``n x m``, B: ``n x k``; X: ``m x k``),
    singular values below ``rcond · s_max`` treated as zero: LAPACK's gelsd on the CPU; on other devices,
    whose ``lstsq`` has no rank-revealing driver, the same solution from a thin SVD of A
    (``X = V diag(1/s) Uᵀ B`` over the kept singular values)."""
    if A.device.type == "cpu":
        return torch.linalg.lstsq(A, B, rcond=rcond, driver="gelsd").solution
    return svd_lstsq(A, B, rcond)


def svd_lstsq(A: torch.Tensor, B: torch.Tensor, rcond: float) -> torch.Tensor:
    """`min_norm_lstsq` through a thin SVD of A, on any device."""
    U, s, Vh = torch.linalg.svd(A, full_matrices=False)
    return svd_solve(U, s, Vh, B, rcond)


def svd_solve(U: torch.Tensor, s: torch.Tensor, Vh: torch.Tensor, B: torch.Tensor, rcond: float) -> torch.Tensor:
    """``A⁺B = V diag(1/s) UᵀB`` from the thin SVD ``A = U diag(s) Vh`` (U: ``n x r``, s: ``r``, Vh: ``r x m``),
    singular values below ``rcond · s_max`` treated as zero: `min_norm_lstsq` for a factorised A."""
    keep = s > rcond * s[0] if s.numel() else s > 0
    return Vh[keep].mT @ ((U[:, keep].mT @ B) / s[keep, None])


def _zero(s: torch.Tensor) -> bool:
    return not s.numel() or bool(s[0] <= 0)


def _stable(s: torch.Tensor) -> float:
    return 0.0 if _zero(s) else float(((s / s[0]) ** 2).sum())  # s/s_1: no overflow of s²


def _nuclear(s: torch.Tensor) -> float:
    if _zero(s):
        return 0.0
    s = s / s[0]  # scale-invariant; avoids overflow of s²
    return float(s.sum() ** 2 / (s**2).sum())


def _count(s: torch.Tensor, rel: float) -> int:
    return 0 if _zero(s) else int((s >= rel * s[0]).sum())


def _entropy(s: torch.Tensor) -> float:
    if _zero(s):
        return 0.0
    p = s[s > 0] / s.sum()
    return math.exp(float(-(p * torch.log(p)).sum()))


def _numerical(s: torch.Tensor, rtol: float, atol: float) -> int:
    return 0 if _zero(s) else int((s > max(rtol * float(s[0]), atol)).sum())


def stable_rank(M) -> float:
    """sr_op(M) = ‖M‖²_F / ‖M‖²_op (docs/theory/leaky-resnets.md §3.6); 0 for the zero matrix."""
    return _stable(singular_values(M))


def nuclear_rank(M) -> float:
    """sr_*(M) = ‖M‖²_* / ‖M‖²_F (Part 1 Prop. 1; sr_op <= sr_* <= rank M); 0 for the zero matrix."""
    return _nuclear(singular_values(M))


@renamed(rel="rtol")
def effective_rank(M, *, rtol: float = 0.1) -> int:
    """#{i : s_i >= rtol·s_1} (Part 1 §3.6, the "k* large singular values" count); 0 for the zero matrix.

    A threshold count; for the entropy effective rank of Roy & Vetterli see `entropy_rank`."""
    non_negative("rtol", rtol)
    return _count(singular_values(M), rtol)


def entropy_rank(M) -> float:
    """exp(H(p)), p_i = s_i / Σ_j s_j, H(p) = −Σ p_i log p_i: the entropy effective rank of Roy & Vetterli
    ("The effective rank: a measure of effective dimensionality", EUSIPCO 2007, Def. 1). It lies in
    [1, rank M], equals r for r equal nonzero singular values, and is 0 for the zero matrix (our convention)."""
    return _entropy(singular_values(M))


@renamed(tol="rtol")
def numerical_rank(M, *, rtol: float = 1e-3, atol: float = 0.0) -> int:
    """#{i : s_i > max(rtol·s_1, atol)} (Part 2 §3.2-3.3: relative for Jacobians; ``rtol=0, atol=t`` is the
    absolute count #{s_i > t})."""
    non_negative("rtol", rtol)
    non_negative("atol", atol)
    return _numerical(singular_values(M), rtol, atol)


def spectrum_ranks(s: torch.Tensor, *, effective_rtol: float = 0.1, numerical_rtol: float = 1e-3) -> dict[str, float]:
    """Every rank above from one vector of singular values `s` (decreasing, as `singular_values` returns):
    stable_rank, nuclear_rank, effective_rank (threshold `effective_rtol`), entropy_rank and numerical_rank
    (relative threshold `numerical_rtol`)."""
    non_negative("effective_rtol", effective_rtol)
    non_negative("numerical_rtol", numerical_rtol)
    return {
        "stable_rank": _stable(s),
        "nuclear_rank": _nuclear(s),
        "effective_rank": _count(s, effective_rtol),
        "entropy_rank": _entropy(s),
        "numerical_rank": _numerical(s, numerical_rtol, 0.0),
    }
