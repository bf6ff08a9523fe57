"""Representation cost of deep L2-regularized networks: the exact linear case, pseudo-determinants,
and the large-depth fit ‖θ‖² ≈ L·R⁽⁰⁾ + R⁽¹⁾ + R⁽²⁾/L (docs/theory/bottleneck-rank.md §2.1-§2.2, §3.4-§3.5).

A matrix ``A`` here is a linear map written like a weight matrix: ``d_out x d_in``, acting on a sample
``x`` (a column) as ``A x``; on a data matrix with one row per sample it acts as ``X @ A.T``. Every
quantity below is transpose-invariant except the factorization, whose product ``W_L ⋯ W_1`` equals A.
All computations are in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..checks import as_matrix, int_at_least, non_negative, renamed
from ..errors import FeaturelabError
from ..results import Result
from .ranks import numerical_rank, singular_values


def _rank(name: str, M: torch.Tensor, rank: int | None, rtol: float) -> int:
    """`rank` checked against M's shape, or M's numerical rank #{s_i > rrtol·s_1}."""
    if rank is None:
        return numerical_rank(M, rtol=rtol)
    int_at_least(name, rank, 0)
    if rank > min(M.shape):
        raise FeaturelabError(
            f"{name}={rank} is not allowed for a {tuple(M.shape)} matrix: it must be <= {min(M.shape)}"
        )
    return rank


@renamed(tol="rtol")
def log_pdet(M, rank: int | None = None, *, rtol: float = 1e-3) -> float:
    """log|M|_+ = Σ_{i<=k} log s_i(M), the log pseudo-determinant (docs/theory/bottleneck-rank.md §2.2, §3.3).

    M: any 2-D matrix (no samples convention; the value is transpose-invariant).
    rank: k, the number of singular values kept; default the numerical rank #{s_i > rtol·s_1}
        (relative, as Part 2 §3.2 prescribes for Jacobians).
    Raises a one-line error when M has no nonzero singular value or s_k(M) = 0.
    """
    M = as_matrix("M", M)
    non_negative("rtol", rtol)
    s = singular_values(M)
    if not s.numel() or s[0] == 0:
        raise FeaturelabError(f"M (shape {tuple(M.shape)}) has no nonzero singular value, so log|M|_+ is undefined")
    k = _rank("rank", M, rank, rtol)
    if k and s[k - 1] == 0:
        raise FeaturelabError(f"rank={k} is not allowed: M has only {int((s > 0).sum())} nonzero singular values")
    return float(torch.log(s[:k]).sum())


@renamed(tol="rtol")
def pdet(M, rank: int | None = None, *, rtol: float = 1e-3) -> float:
    """|M|_+ = Π_{i<=k} s_i(M), the pseudo-determinant (Part 2 §2.2); arguments as `log_pdet`."""
    return math.exp(log_pdet(M, rank, rtol=rtol))


@renamed(tol="rtol")
def pseudo_log(P, *, rtol: float = 1e-10) -> torch.Tensor:
    """Log_+ P: the pseudo-logarithm of a symmetric PSD matrix P (n x n, Part 2 §2.2).

    Maps each eigenvalue μ > rtol·μ_max to log μ and the (numerical) kernel to 0, keeping eigenvectors;
    ``‖Log_+(AᵀA)‖²_F = 4 Σ_i (log s_i(A))²``. Computed with `torch.linalg.eigh` in float64.
    """
    P = as_matrix("P", P)
    if P.shape[0] != P.shape[1] or not torch.allclose(P, P.T, rtol=1e-10, atol=1e-12 * float(P.abs().max())):
        raise FeaturelabError(f"P must be a symmetric square matrix, got shape {tuple(P.shape)}")
    mu, V = torch.linalg.eigh(P)
    if (mu < -1e-8 * mu.abs().max()).any():
        raise FeaturelabError(f"P must be positive semi-definite; its smallest eigenvalue is {float(mu.min()):.3g}")
    keep = mu > rtol * mu.max()
    logs = torch.where(keep, torch.log(mu.clamp_min(torch.finfo(mu.dtype).tiny)), torch.zeros_like(mu))
    return (V * logs) @ V.T


@renamed(tol="rtol")
def linear_representation_cost(A, L: int, *, rtol: float = 1e-10) -> float:
    """R(A; L) = L Σ_i s_i(A)^{2/L} = L‖A‖_{2/L}^{2/L}: the minimal ‖θ‖² of a depth-L bias-free linear
    network computing A (docs/theory/bottleneck-rank.md §2.2; exact for every L >= 1). A: ``d_out x d_in``.

    Singular values <= rtol·s_1 count as zero: rounding leaves ~1e-16 where A has none, and s^{2/L} of
    that is not small at large L (1e-16^{2/7} ≈ 3e-5)."""
    A = as_matrix("A", A)
    int_at_least("L", L, 1)
    non_negative("rtol", rtol)
    s = singular_values(A)
    s = s[s > rtol * s[0]] if s.numel() else s
    return float(L * (s ** (2.0 / L)).sum())


@renamed(tol="rtol")
def balanced_factorization(A, L: int, rank: int | None = None, *, rtol: float = 1e-10) -> list[torch.Tensor]:
    """Weights ``[W_1, ..., W_L]`` with ``W_L ⋯ W_1 = A`` and Σ‖W_ℓ‖²_F = R(A; L) (Part 2 §2.2).

    With the compact SVD A = U S Vᵀ (k = rank terms): W_1 = S^{1/L}Vᵀ (k x d_in), W_ℓ = S^{1/L} (k x k),
    W_L = U S^{1/L} (d_out x k); for L = 1 the single weight is A itself. A: ``d_out x d_in`` (the
    weight-matrix convention of `MLP`: a sample row x maps to ``x @ A.T``). rank defaults to the
    numerical rank #{s_i > rtol·s_1}.
    """
    A = as_matrix("A", A)
    int_at_least("L", L, 1)
    k = _rank("rank", A, rank, rtol)
    if k == 0:
        raise FeaturelabError("A has rank 0: the zero map has no compact SVD to factorize (its cost is 0)")
    if L == 1:
        return [A.clone()]
    U, s, Vh = torch.linalg.svd(A, full_matrices=False)
    root = s[:k] ** (1.0 / L)
    return [root[:, None] * Vh[:k]] + [torch.diag(root) for _ in range(L - 2)] + [U[:, :k] * root]


@dataclass(frozen=True)
class ExpansionTerms(Result):
    """The large-depth expansion of the linear cost, R(A;L) = L·rank + r1 + r2/L + r3/L² + O(L⁻³)
    (Part 2 §2.2): rank; r1 = 2 log|A|_+; r2 = ½‖Log_+AᵀA‖²_F = 2Σ(log s_i)²; r3 = (4/3)Σ(log s_i)³."""

    rank: int
    r1: float
    r2: float
    r3: float

    def cost(self, L: int) -> float:
        """The expansion truncated after the 1/L term: L·rank + r1 + r2/L."""
        return L * self.rank + self.r1 + self.r2 / L


@renamed(tol="rtol")
def linear_expansion(A, rank: int | None = None, *, rtol: float = 1e-10) -> ExpansionTerms:
    """R⁽⁰⁾ = Rank A, R⁽¹⁾ = 2 log|A|_+, R⁽²⁾ = ½‖Log_+AᵀA‖²_F of a linear map A (Part 2 §2.2), and the
    next coefficient (4/3)Σ(log s_i)³. rank defaults to the numerical rank #{s_i > rtol·s_1}."""
    A = as_matrix("A", A)
    k = _rank("rank", A, rank, rtol)
    if k == 0:
        return ExpansionTerms(0, 0.0, 0.0, 0.0)
    logs = torch.log(singular_values(A, k))
    return ExpansionTerms(k, float(2 * logs.sum()), float(2 * (logs**2).sum()), float(4 / 3 * (logs**3).sum()))


@dataclass(frozen=True)
class RepresentationCostFit(Result):
    """The depth fit of one rank class (Part 2 §3.5).

    R0: slope of ‖θ‖² in L (estimates R⁽⁰⁾).  R1: intercept (estimates R⁽¹⁾).
    R2: coefficient of 1/L (estimates R⁽²⁾; nan for the 2-term fit).  terms: 2 or 3.
    R1_given_rank: median(‖θ‖² − kL) when the class rank k was given, else nan.
    residual: root-mean-square residual of the fit.  depths, sq_norms: the data fitted.
    """

    R0: float
    R1: float
    R2: float
    terms: int
    R1_given_rank: float
    residual: float
    depths: list
    sq_norms: list


def estimate_representation_cost(
    depths, sq_norms, rank: int | None = None, terms: int | None = None
) -> RepresentationCostFit:
    """Least-squares fit ‖θ‖² ≈ L·R⁽⁰⁾ + R⁽¹⁾ (+ R⁽²⁾/L) over trained networks of one rank class
    (docs/theory/bottleneck-rank.md §2.1, §3.5). Fit one class at a time: minima of different ranks lie on lines of
    different slopes.

    depths: the depths L (one per network, repeats allowed); sq_norms: their final ‖θ‖², same length.
    terms: 2 or 3; default 3 when there are >= 4 distinct depths (the 2-term fit is biased at small L),
        else 2. At least 2 distinct depths (3 for the 3-term fit) are needed.
    rank: the class's rank k, if known: also report the robust R̂⁽¹⁾ = median(‖θ‖² − kL).
    """
    L = np.asarray(depths, dtype=np.float64).ravel()
    y = np.asarray(sq_norms, dtype=np.float64).ravel()
    if L.size != y.size:
        raise FeaturelabError(f"depths has {L.size} entries but sq_norms has {y.size}; give one norm per depth")
    if not np.all(np.isfinite(y)):
        raise FeaturelabError(f"sq_norms={y.tolist()} contains NaN or inf; all squared norms must be finite")
    if not np.all(np.isfinite(L)) or np.any(L < 1):
        raise FeaturelabError(f"depths={L.tolist()} is not allowed: every depth must be a finite number >= 1")
    distinct = np.unique(L).size
    if distinct < 2:
        raise FeaturelabError(f"depths={L.tolist()} has {distinct} distinct depth(s); the fit needs at least 2")
    if terms is None:
        terms = 3 if distinct >= 4 else 2
    if terms not in (2, 3) or distinct < terms:
        raise FeaturelabError(
            f"terms={terms!r} is not allowed with {distinct} distinct depths: "
            "choose 2, or 3 with at least 3 distinct depths"
        )
    cols = [L, np.ones_like(L)] + ([1.0 / L] if terms == 3 else [])
    design = np.stack(cols, axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=1e-12)
    residual = float(np.sqrt(np.mean((design @ coef - y) ** 2)))
    r1_k = float(np.median(y - rank * L)) if rank is not None else float("nan")
    return RepresentationCostFit(
        float(coef[0]),
        float(coef[1]),
        float(coef[2]) if terms == 3 else float("nan"),
        terms,
        r1_k,
        residual,
        L.tolist(),
        y.tolist(),
    )
