"""Spectral summaries of a matrix: singular values and the rank notions the papers use.

All take any 2-D matrix (no samples convention needed: ranks are transpose-invariant) and compute
in float64.
"""

from __future__ import annotations

import torch

from ..checks import as_matrix, non_negative


def singular_values(M, k: int | None = None) -> torch.Tensor:
    """Singular values of M in decreasing order (float64), the top `k` if given."""
    s = torch.linalg.svdvals(as_matrix("M", M))
    return s if k is None else s[:k]


def stable_rank(M) -> float:
    """sr_op(M) = ‖M‖²_F / ‖M‖²_op (docs/theory/leaky-resnets.md §3.6); 0 for the zero matrix."""
    s = singular_values(M)
    return float(((s / s[0]) ** 2).sum()) if s.numel() and s[0] > 0 else 0.0  # s/s_1: no overflow of s²


def nuclear_rank(M) -> float:
    """sr_*(M) = ‖M‖²_* / ‖M‖²_F (Part 1 Prop. 1; sr_op <= sr_* <= rank M); 0 for the zero matrix."""
    s = singular_values(M)
    if not (s.numel() and s[0] > 0):
        return 0.0
    s = s / s[0]  # scale-invariant; avoids overflow of s²
    return float(s.sum() ** 2 / (s**2).sum())


def effective_rank(M, rel: float = 0.1) -> int:
    """#{i : s_i >= rel·s_1} (Part 1 §3.6, the "k* large singular values" count); 0 for the zero matrix."""
    non_negative("rel", rel)
    s = singular_values(M)
    return int((s >= rel * s[0]).sum()) if s.numel() and s[0] > 0 else 0


def numerical_rank(M, tol: float = 1e-3, relative: bool = True) -> int:
    """#{i : s_i > tol·s_1} (relative) or #{i : s_i > tol} (absolute) (Part 2 §3.2-3.3)."""
    non_negative("tol", tol)
    s = singular_values(M)
    if not s.numel() or s[0] == 0:
        return 0
    return int((s > (tol * s[0] if relative else tol)).sum())
