"""The cost of identity and the kernel norms it is made of (docs/theory/leaky-resnets.md §0, §3.4, §3.7;
Jacot & Kaiser, arXiv 2405.17573 §2.2-2.3, Prop. 1-2).

Rows are samples: a representation ``A`` is ``N x w`` (the papers' ``Aᵀ``), ``σ(A) = [ReLU(A), 1]`` is
``N x (w+1)`` (``σ̄(A) = ReLU(A)`` without the bias column), and the kernel is ``K = σ(A) σ(A)ᵀ`` (N x N).
For ``M, M'`` of shape ``N x w`` the kernel inner product of Part 1 §0 reads
``⟨M, M'⟩_(K+γI) = Tr[Mᵀ (K+γI)⁻¹ M']``.

Everything is float64 and nothing forms an inverse; every path "whitens", returning Z with
``⟨M, M'⟩ = Σ Z ⊙ Z'``:
- γ > 0, N <= w+1 ("cholesky", §3.7): one Cholesky factor ``K + γI = CCᵀ``, ``Z = C⁻¹M`` (triangular solve);
- γ > 0, N > w+1 ("woodbury", the optional (w+1)-dimensional path of §3.7, in a cancellation-free form): with
  the thin SVD ``σ(A) = U diag(s) Vᵀ``, ``K + γI = U diag(s²+γ) Uᵀ + γ(I − UUᵀ)``, so
  ``Z = [diag(s²+γ)^{-1/2} UᵀM ; (M − UUᵀM)/√γ]``; O(N w²) instead of O(N³), tested against "cholesky";
- γ = 0: the pseudo-inverse norm through the minimum-norm least-squares solution ``Z = σ(A)⁺M`` (from the
  thin SVD of σ(A) when N > w+1, which the "auto" method computes anyway; else ``lstsq``, driver gelsd; both
  with an explicit rcond), for which ``Tr[Mᵀ K⁺ M'] = Σ Z ⊙ Z'``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import as_matrix, non_negative, nonempty, one_of
from ..errors import FeaturelabError
from ..results import Result
from .ranks import min_norm_lstsq, svd_solve

GAMMA_MODES = ("relative", "absolute")
METHODS = ("auto", "cholesky", "woodbury")
RCOND = 1e-10  # explicit rcond of the γ = 0 least-squares path (§3.4)
SAFE_SCALE = (1e-100, 1e100)  # largest |A_ij| with which the kernel σ(A)σ(A)ᵀ stays inside float64's range
OUTSIDE_IMAGE_TOL = 1e-8  # ‖σ(A)Z - A‖ > tol·‖A‖ means A is outside the image: COI = inf (§3.4)


def features(A: torch.Tensor, bias: bool = True) -> torch.Tensor:
    """σ(A) = [ReLU(A), 1] (``N x (w+1)``) or, with ``bias=False``, σ̄(A) = ReLU(A) (``N x w``); Part 1 §0."""
    relu = torch.relu(A)
    return torch.cat([relu, torch.ones_like(A[:, :1])], dim=1) if bias else relu


@dataclass(frozen=True)
class KernelMetric(Result):
    """The inner product ``⟨M, M'⟩_(K+γI)`` of one representation's kernel (Part 1 §0, §3.7).

    S: the features σ(A) (``N x m``), K = S Sᵀ.  gamma: the absolute γ used.  method: "cholesky", "woodbury"
    or "pinv" (γ = 0).  factor: the Cholesky factor of ``K + (γ + jitter)I``, or ``(U, s, Vh)`` of the thin
    SVD ``S = U diag(s) Vh`` (woodbury, and pinv when N > m), or None.  jitter: what was added after a failed
    Cholesky factorisation (``1e-12 Tr(K)/N``, else 0).
    eigenvalues: the nonzero spectrum of K (ascending) for the conditioning.
    """

    S: torch.Tensor
    gamma: float
    method: str
    factor: torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    jitter: float
    eigenvalues: torch.Tensor

    def whiten(self, M: torch.Tensor) -> torch.Tensor:
        """Z with ``⟨M, M'⟩ = Σ Z ⊙ Z'`` (see the module docstring). M: ``N x k``."""
        if self.method == "cholesky":
            assert isinstance(self.factor, torch.Tensor)
            return torch.linalg.solve_triangular(self.factor, M, upper=False)
        if self.method == "woodbury":
            assert isinstance(self.factor, tuple)
            U, s, _ = self.factor
            C = U.T @ M
            return torch.cat([C / torch.sqrt(s**2 + self.gamma)[:, None], (M - U @ C) / self.gamma**0.5])
        return self.pinv(M)

    def pinv(self, M: torch.Tensor) -> torch.Tensor:
        """σ(A)⁺M (``m x k``), the minimum-norm least-squares solution X of ``σ(A) X ≈ M`` (M: ``N x k``; singular
        values below RCOND·s_1 count as zero), whatever γ: from the thin SVD this metric holds, else by
        `min_norm_lstsq`."""
        if isinstance(self.factor, tuple):
            U, s, Vh = self.factor
            return svd_solve(U, s, Vh, M, RCOND)
        return min_norm_lstsq(self.S, M, RCOND)

    def sq_norm(self, M: torch.Tensor) -> float:
        """``‖M‖²_(K+γI) = Tr[Mᵀ (K+γI)⁻¹ M]`` (pseudo-inverse when γ = 0)."""
        return float((self.whiten(M) ** 2).sum())

    @property
    def op_norm(self) -> float:
        """‖K‖_op = ‖σ(A)‖²_op."""
        return float(self.eigenvalues[-1]) if self.eigenvalues.numel() else 0.0

    @property
    def condition(self) -> float:
        """Condition number of ``K + γI`` (inf when γ = 0 and K is singular)."""
        N = self.S.shape[0]
        low = float(self.eigenvalues[0]) if self.eigenvalues.numel() == N else 0.0
        low = max(low, 0.0) + self.gamma + self.jitter
        return (self.op_norm + self.gamma + self.jitter) / low if low > 0 else float("inf")


def kernel_metric(
    A, bias: bool = True, gamma: float = 0.0, gamma_mode: str = "relative", method: str = "auto"
) -> KernelMetric:
    """The kernel inner product of representation A (``N x w``, rows are samples); Part 1 §3.4, §3.7.

    gamma_mode "relative": γ = gamma·‖K‖_op (docs/theory/leaky-resnets.md §6.3); "absolute": γ = gamma.
    method (γ > 0): "cholesky" factorises ``K + γI`` (N x N; on failure adds jitter ``1e-12 Tr(K)/N`` and
    records it); "woodbury" works in the (w+1) feature dimensions; "auto" takes "woodbury" when N > w+1.
    γ = 0 uses the pseudo-inverse through least squares.
    """
    A = as_matrix("A", A)
    non_negative("gamma", gamma)
    one_of("gamma_mode", gamma_mode, GAMMA_MODES)
    one_of("method", method, METHODS)
    S = features(A, bias)
    if method == "woodbury" or (method == "auto" and S.shape[0] > S.shape[1]):
        U, s, Vh = torch.linalg.svd(S, full_matrices=False)
        eig = (s**2).flip(0)
        g = gamma * float(eig[-1]) if gamma_mode == "relative" else float(gamma)
        return KernelMetric(S, g, "woodbury" if g > 0 else "pinv", (U, s, Vh), 0.0, eig)
    else:
        gram = S.T @ S if S.shape[0] >= S.shape[1] else S @ S.T
        eig = torch.linalg.eigvalsh(gram)
        g = gamma * float(eig[-1]) if gamma_mode == "relative" else float(gamma)
    if g <= 0:
        return KernelMetric(S, 0.0, "pinv", None, 0.0, eig)
    K = S @ S.T
    eye = torch.eye(K.shape[0], dtype=K.dtype, device=K.device)
    chol, info = torch.linalg.cholesky_ex(K + g * eye)
    jitter = 0.0
    if int(info) != 0:
        jitter = 1e-12 * float(torch.trace(K)) / K.shape[0]
        chol = torch.linalg.cholesky(K + (g + jitter) * eye)
    return KernelMetric(S, g, "cholesky", chol, jitter, eig)


def cost_of_identity(
    A,
    bias: bool = True,
    gamma: float = 0.0,
    gamma_mode: str = "relative",
    projected: bool = False,
    method: str = "auto",
) -> float:
    """The cost of identity of representation A (``N x w``, rows are samples); docs/theory/leaky-resnets.md §3.4.

    gamma = 0: the exact ``COI(A) = ‖Aᵀ σ(A)ᵀ⁺‖² = Tr[Aᵀ K⁺ A]`` (paper §2.2; the paper writes
    ``‖A σ(A)⁺‖²`` in columns), ``COĪ`` with ``bias=False``; by the paper's convention ``inf`` when A is
    outside the image of σ(A) (``‖σ(A)Z − A‖ > 1e-8‖A‖`` for the min-norm solution Z), unless
    ``projected=True``, which returns the finite pseudo-inverse value ``‖Z‖²``. Unstable: use on synthetic
    matrices only.
    gamma > 0: the γ-stable ``COI_γ(A) = Tr[Aᵀ (K+γI)⁻¹ A]`` with γ = gamma·‖K‖_op ("relative", default,
    docs/theory/leaky-resnets.md §6.3) or γ = gamma ("absolute"); method: see `kernel_metric`.

    Without the bias column COI is scale-invariant, ``COI(cA) = COI(A)`` (and ``COI_γ`` with relative γ;
    absolute γ becomes γ/c²), so A is divided by its largest entry when the kernel's entries would
    over- or underflow float64; with ``bias=True`` such an A is a one-line error.
    """
    A = nonempty("A", as_matrix("A", A))
    scale = float(A.abs().max())
    if scale > 0 and not SAFE_SCALE[0] <= scale <= SAFE_SCALE[1]:
        if bias:
            raise FeaturelabError(
                f"A has entries of size {scale:.3g}, where σ(A)σ(A)ᵀ over- or underflows float64, and with "
                "bias=True COI is not scale-invariant; rescale A (or use bias=False)"
            )
        A = A / scale
        if gamma_mode == "absolute":
            gamma = gamma / scale / scale
    metric = kernel_metric(A, bias, gamma, gamma_mode, method)
    Z = metric.whiten(A)
    if metric.method == "pinv" and not projected:
        if torch.linalg.norm(metric.S @ Z - A) > OUTSIDE_IMAGE_TOL * torch.linalg.norm(A):
            return float("inf")
    return float((Z**2).sum())


def constant_coi_path(A, ts) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The constant-COI path of Jacot & Kaiser's Prop. 3 (proof of Prop. 7 there) from representation A
    (``N x w``, rows are samples; neuron i is column ``a_i``).

    Carathéodory for cones: a vertex ``c >= 0`` of ``{c : Σ_i c_i (a_i a_iᵀ, σ̄(a_i)σ̄(a_i)ᵀ) = (AAᵀ, σ̄(A)σ̄(A)ᵀ)}``
    (scipy's HiGHS dual simplex) has at most N(N+1) nonzero entries. Scaling column i by ``√((1−t) + t c_i)`` keeps
    both kernels, hence every COI and COI_γ, constant in t, while at t = 1 the columns with ``c_i = 0`` vanish
    (at least w − N(N+1) of them). ts: the times in [0, 1]. Returns ``([A_t for t in ts], c)``.
    """
    from scipy.optimize import linprog

    A = as_matrix("A", A)
    N, w = A.shape
    rows, cols = torch.triu_indices(N, N)
    pairs = [torch.einsum("ni,mi->inm", M, M)[:, rows, cols] for M in (A, torch.relu(A))]  # w x N(N+1)/2 each
    basis = torch.cat(pairs, dim=1).T.cpu().numpy()  # N(N+1) x w: column i is neuron i's kernel pair
    lp = linprog(basis.sum(0), A_eq=basis, b_eq=basis.sum(1), bounds=(0, None), method="highs-ds")
    if lp.status != 0:  # c = 1 is always feasible, so only a numerical failure gets here
        raise FeaturelabError(f"A: the Carathéodory linear program failed ({lp.message})")
    c = torch.as_tensor(lp.x, dtype=A.dtype, device=A.device).clamp_min(0)
    return [A * torch.sqrt((1 - float(t)) + float(t) * c) for t in ts], c
