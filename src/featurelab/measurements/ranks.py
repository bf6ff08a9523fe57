"""Spectral summaries of a matrix: singular values and the rank notions the papers use.

All take any 2-D matrix (no samples convention needed: ranks are transpose-invariant) and compute
in float64.
"""

from __future__ import annotations

import torch

from ..checks import as_matrix, non_negative, renamed


def singular_values(M, k: int | None = None) -> torch.Tensor:
    """Singular values of M in decreasing order (float64), the top `k` if given."""
    s = torch.linalg.svdvals(as_matrix("M", M))
    return s if k is None else s[:k]


def stable_rank(M) -> float:
    """sr_op(M) = ‖M‖²_F / ‖M‖²_op (docs/theory/leaky-resnets.md §3.6); 0 for the zero matrix."""
    s = singular_values(M)
    return float((s**2).sum() / s[0] ** 2) if s.numel() and s[0] > 0 else 0.0


def nuclear_rank(M) -> float:
    """sr_*(M) = ‖M‖²_* / ‖M‖²_F (Part 1 Prop. 1; sr_op <= sr_* <= rank M); 0 for the zero matrix."""
    s = singular_values(M)
    return float(s.sum() ** 2 / (s**2).sum()) if s.numel() and s[0] > 0 else 0.0


@renamed(rel="rtol")
def effective_rank(M, *, rtol: float = 0.1) -> int:
    """#{i : s_i >= rtol·s_1} (Part 1 §3.6, the "k* large singular values" count); 0 for the zero matrix."""
    non_negative("rtol", rtol)
    s = singular_values(M)
    return int((s >= rtol * s[0]).sum()) if s.numel() and s[0] > 0 else 0


@renamed(tol="rtol")
def numerical_rank(M, *, rtol: float = 1e-3, atol: float = 0.0) -> int:
    """#{i : s_i > max(rtol·s_1, atol)} (Part 2 §3.2-3.3: relative for Jacobians; ``rtol=0, atol=t`` is the
    absolute count #{s_i > t})."""
    non_negative("rtol", rtol)
    non_negative("atol", atol)
    s = singular_values(M)
    if not s.numel() or s[0] == 0:
        return 0
    return int((s > max(rtol * float(s[0]), atol)).sum())
