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

from ..checks import as_matrix, int_at_least, non_negative, nonempty, renamed
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


def _depth_fit_inputs(depths, sq_norms) -> tuple[np.ndarray, np.ndarray]:
    """(L, ‖θ‖²) as float64 vectors, checked: equal lengths, finite norms, depths >= 1, >= 2 distinct depths."""
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
    return L, y


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
    L, y = _depth_fit_inputs(depths, sq_norms)
    distinct = np.unique(L).size
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


# ------------------------------------------------------------- complete positivity (Theorem 3 item 3, Prop. 5)
def _orthonormal_basis(basis, rtol: float) -> torch.Tensor:
    """`basis` (d x k) checked to have orthonormal columns (‖VᵀV − I‖_max <= rtol), as float64."""
    V = as_matrix("basis", basis)
    if V.shape[1] == 0 or V.shape[1] > V.shape[0]:
        raise FeaturelabError(f"basis must be d x k with 1 <= k <= d (one column per vector), got {tuple(V.shape)}")
    err = float((V.T @ V - torch.eye(V.shape[1], dtype=V.dtype, device=V.device)).abs().max())
    if err > rtol:
        raise FeaturelabError(f"basis must have orthonormal columns: max|VᵀV − I| = {err:.3g} > rtol={rtol:g}")
    return V


@dataclass(frozen=True)
class CompletePositivity(Result):
    """Whether samples lie in the non-negative cone of an orthonormal basis (Jacot 2023, Prop. 5 and Theorem 3
    item 3; docs/theory/bottleneck-rank.md §2.5).

    passed: every sample x has u_iᵀx >= −rtol·max‖x‖ for every basis vector u_i, and lies in the span of the
        basis to rtol·max‖x‖.
    min_coordinate: min over samples and basis vectors of u_iᵀx / max‖x‖ (>= 0 for a CP set).
    span_residual: max over samples of ‖x − VVᵀx‖ / max‖x‖ (0 when the samples lie in span V).
    planar_rank: numerical rank of the samples (#{s_i > rtol·s_1}); Prop. 5's k-planar means it equals k.
    k: the number of basis vectors.
    """

    passed: bool
    min_coordinate: float
    span_residual: float
    planar_rank: int
    k: int


def complete_positivity(X, basis, *, rtol: float = 1e-10) -> CompletePositivity:
    """Check complete positivity of a sample set Ω in a given basis: Ω ⊂ span V and Vᵀx >= 0 for x ∈ Ω
    (Jacot 2023, arXiv 2305.19008, Prop. 5: a k-planar Ω is completely positive when some orthonormal basis
    u_1..u_k of its span has u_iᵀx >= 0 on Ω; docs/theory/bottleneck-rank.md §2.5).

    X: ``N x d`` samples (rows); basis: V, ``d x k`` with orthonormal columns. This checks one candidate
    basis; a set is CP when some basis passes. Tolerances are relative to max‖x‖.
    """
    X = nonempty("X", as_matrix("X", X))
    non_negative("rtol", rtol)
    V = _orthonormal_basis(basis, max(rtol, 1e-12))
    if V.shape[0] != X.shape[1]:
        raise FeaturelabError(f"basis has {V.shape[0]} rows but X has {X.shape[1]} columns; both must be d")
    scale = float(X.norm(dim=1).max())
    if scale == 0:
        raise FeaturelabError("X has only zero rows: its span is {0}, so complete positivity is undefined")
    C = X @ V
    min_coord = float(C.min()) / scale
    residual = float((X - C @ V.T).norm(dim=1).max()) / scale
    s = singular_values(X)
    rank = int((s > rtol * s[0]).sum())
    return CompletePositivity(min_coord >= -rtol and residual <= rtol, min_coord, residual, rank, V.shape[1])


def _cp_factors(A, basis, rtol: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, s, V) with A V = U diag(s), s > rtol·max s, for a basis V of right singular vectors of A on span V."""
    A = as_matrix("A", A)
    V = _orthonormal_basis(basis, max(rtol, 1e-12))
    if V.shape[0] != A.shape[1]:
        raise FeaturelabError(f"basis has {V.shape[0]} rows but A has {A.shape[1]} columns (d_in); they must agree")
    M = A @ V
    G = M.T @ M
    s = torch.sqrt(torch.diagonal(G).clamp_min(0))
    if not float(s.max()) > 0:
        raise FeaturelabError("A vanishes on span(basis): the zero map has no compact SVD to factorize (its cost is 0)")
    off = G - torch.diag(torch.diagonal(G))
    if float(off.abs().max()) > max(rtol, 1e-12) * float(s.max()) ** 2:
        raise FeaturelabError(
            f"basis is not a set of right singular vectors of A: (AV)ᵀ(AV) has off-diagonal entries up to "
            f"{float(off.abs().max()):.3g} (relative to s_max² = {float(s.max()) ** 2:.3g})"
        )
    keep = s > rtol * s.max()
    return M[:, keep] / s[keep], s[keep], V[:, keep]


def cp_linear_representation(A, basis, L: int, *, rtol: float = 1e-10) -> list[torch.Tensor]:
    """Weights ``[W_1, ..., W_L]`` (zero biases) of a depth-L ReLU network that computes x ↦ Ax on every x with
    Vᵀx >= 0 in span V, with ‖θ‖² = L Σ_i s_i^{2/L} (Jacot 2023, arXiv 2305.19008, Theorem 3 item 3 and
    Prop. 5; docs/theory/bottleneck-rank.md §2.5).

    A: ``d_out x d_in``; basis: V, ``d_in x k`` orthonormal columns that are right singular vectors of A
    restricted to span V, i.e. A V = U S with U orthonormal (checked: (AV)ᵀ(AV) diagonal to rtol·s_max²).
    Columns with s_i <= rtol·s_max are dropped. With r kept columns: W_1 = S^{1/L}Vᵀ (r x d_in),
    W_ℓ = S^{1/L} (r x r, ℓ = 2..L−1), W_L = U S^{1/L} (d_out x r); for L = 1 the single weight is U S Vᵀ.
    Every hidden representation S^{ℓ/L}Vᵀx is >= 0 on the CP cone, so the ReLU acts as the identity there.
    """
    int_at_least("L", L, 1)
    non_negative("rtol", rtol)
    U, s, V = _cp_factors(A, basis, rtol)
    if L == 1:
        return [(U * s) @ V.T]
    root = s ** (1.0 / L)
    return [root[:, None] * V.T] + [torch.diag(root) for _ in range(L - 2)] + [U * root]


def cp_linear_cost(A, basis, L: int, *, rtol: float = 1e-10) -> float:
    """R(f; Ω, L) = L Σ_i s_i(A P_Ω)^{2/L} for f(x) = Ax on a completely positive domain Ω spanning span V with
    Vᵀx >= 0 (V = `basis`, right singular vectors of A on span V): exact for ReLU networks with biases
    (Jacot 2023, arXiv 2305.19008, Theorem 3 item 3; docs/theory/bottleneck-rank.md §2.5). The construction
    `cp_linear_representation` attains it; the bound ‖θ‖² >= L Σ_i s_i(Jf_θ(x))^{2/L} at a relative interior
    point of Ω gives the matching lower bound. Arguments as `cp_linear_representation`.
    """
    int_at_least("L", L, 1)
    non_negative("rtol", rtol)
    _, s, _ = _cp_factors(A, basis, rtol)
    return float(L * (s ** (2.0 / L)).sum())


def shrinkage_corrected_cost(sq_norm: float, train_mse: float, lam: float) -> float:
    """‖θ‖² + 2C/λ: a first-order estimate of R(f*; Ω, L) for the target f* from a network θ trained to a
    minimum of C(f_θ) + λ‖θ‖² with C = (1/N) Σ_i ‖f_θ(x_i) − y_i‖² (docs/theory/bottleneck-rank.md §3.11, ours).

    At such a minimum f_θ minimises C(f) + λR(f), so along f_t = f_θ + t(y − f_θ) the first-order condition
    gives R(f*) ≈ R(f_θ) − (1/λ) dC(f_t)/dt|₀ = ‖θ‖² + 2C/λ; comparing only the end points gives the bound
    R(f*) >= ‖θ‖² + C/λ at a global minimum. sq_norm: ‖θ‖²; train_mse: C (sum over outputs, mean over
    samples); lam: λ > 0.
    """
    non_negative("sq_norm", sq_norm)
    non_negative("train_mse", train_mse)
    if not isinstance(lam, (int, float)) or not math.isfinite(lam) or lam <= 0:
        raise FeaturelabError(f"lam={lam!r} is not allowed: it must be a finite number > 0")
    return float(sq_norm + 2.0 * train_mse / lam)


@dataclass(frozen=True)
class KnownRankFit(Result):
    """The depth fit with the slope fixed to a known R⁽⁰⁾ = k (docs/theory/bottleneck-rank.md §3.5).

    R1: intercept of ‖θ‖² − kL ≈ R⁽¹⁾ + R⁽²⁾/L.  R2: the 1/L coefficient.  R1_se: standard error of R1 from
    the residuals (n − 2 degrees of freedom; nan when n <= 2).  residual: root-mean-square residual.
    rank: k.  depths, sq_norms: the data fitted.
    """

    R1: float
    R2: float
    R1_se: float
    residual: float
    rank: int
    depths: list
    sq_norms: list


def estimate_r1_given_rank(depths, sq_norms, rank: int) -> KnownRankFit:
    """Least-squares fit ‖θ‖² − kL ≈ R⁽¹⁾ + R⁽²⁾/L over networks of one rank class k = R⁽⁰⁾ (Jacot 2023,
    arXiv 2305.19008, the expansion R = L·R⁽⁰⁾ + R⁽¹⁾ + R⁽²⁾/L + o(1/L); docs/theory/bottleneck-rank.md §3.5).

    With the slope known, the 1/L term costs one parameter, not two: on the exact costs of a linear map with
    s = (3, 1.5) at L ∈ {4, 6, 8, 10, 12} the intercept is 2.95 against R⁽¹⁾ = 3.01 (the free 3-term fit of
    `estimate_representation_cost`: 2.85, and it amplifies noise in ‖θ‖² 6 times more; the median of ‖θ‖² − kL:
    3.38, biased by R⁽²⁾/L). depths: one per network (repeats allowed, >= 2 distinct); sq_norms: same length.
    """
    int_at_least("rank", rank, 0)
    L, y = _depth_fit_inputs(depths, sq_norms)
    design = np.stack([np.ones_like(L), 1.0 / L], axis=1)
    target = y - rank * L
    coef, *_ = np.linalg.lstsq(design, target, rcond=1e-12)
    res = design @ coef - target
    se = float("nan")
    if L.size > 2:
        var = float(res @ res) / (L.size - 2)
        se = float(np.sqrt(var * np.linalg.solve(design.T @ design, np.array([1.0, 0.0]))[0]))
    return KnownRankFit(
        float(coef[0]), float(coef[1]), se, float(np.sqrt(np.mean(res**2))), int(rank), L.tolist(), y.tolist()
    )
