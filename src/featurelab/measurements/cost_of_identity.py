"""The cost of identity and the kernel norms it is made of (THEORY.md Part 1 §0, §3.4, §3.7;
Jacot & Kaiser, arXiv 2405.17573 §2.2-2.3, Prop. 1-2).

Rows are samples: a representation ``A`` is ``N x w`` (THEORY.md's ``Aᵀ``), ``σ(A) = [ReLU(A), 1]`` is
``N x (w+1)`` (``σ̄(A) = ReLU(A)`` without the bias column), and the kernel is ``K = σ(A) σ(A)ᵀ`` (N x N).
For ``M, M'`` of shape ``N x w`` the kernel inner product of Part 1 §0 reads
``⟨M, M'⟩_(K+γI) = Tr[Mᵀ (K+γI)⁻¹ M']``.

Everything is float64 and nothing forms an inverse: for γ > 0 one Cholesky factor ``K + γI = CCᵀ`` whitens,
``Z = C⁻¹M`` (triangular solve), so ``⟨M, M'⟩ = Σ Z ⊙ Z'``; for γ = 0 the pseudo-inverse norm uses the
minimum-norm least-squares solution ``Z = σ(A)⁺M`` (``lstsq``, driver gelsd, explicit rcond), for which
``Tr[Mᵀ K⁺ M'] = Σ Z ⊙ Z'`` as well.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import as_matrix, non_negative, one_of

GAMMA_MODES = ("relative", "absolute")
RCOND = 1e-10  # explicit rcond of the γ = 0 least-squares path (§3.4)
OUTSIDE_IMAGE_TOL = 1e-8  # ‖σ(A)Z - A‖ > tol·‖A‖ means A is outside the image: COI = inf (§3.4)


def features(A: torch.Tensor, bias: bool = True) -> torch.Tensor:
    """σ(A) = [ReLU(A), 1] (``N x (w+1)``) or, with ``bias=False``, σ̄(A) = ReLU(A) (``N x w``); Part 1 §0."""
    relu = torch.relu(A)
    return torch.cat([relu, torch.ones_like(A[:, :1])], dim=1) if bias else relu


@dataclass
class KernelMetric:
    """The inner product ``⟨M, M'⟩_(K+γI)`` of one representation's kernel (Part 1 §0, §3.7).

    S: the features σ(A) (``N x m``), K = S Sᵀ.  gamma: the absolute γ used.  chol: lower Cholesky factor
    of ``K + (γ + jitter) I`` (None when γ = 0).  jitter: what was added after a failed factorisation
    (``1e-12 Tr(K)/N``, else 0).  eigenvalues: the nonzero spectrum of K (ascending, from the smaller Gram
    matrix) for the conditioning.
    """

    S: torch.Tensor
    gamma: float
    chol: torch.Tensor | None
    jitter: float
    eigenvalues: torch.Tensor

    def whiten(self, M: torch.Tensor) -> torch.Tensor:
        """Z with ``⟨M, M'⟩ = Σ Z ⊙ Z'``: ``C⁻¹M`` (γ > 0) or ``σ(A)⁺M`` (γ = 0). M: ``N x k``."""
        if self.chol is not None:
            return torch.linalg.solve_triangular(self.chol, M, upper=False)
        return torch.linalg.lstsq(self.S, M, rcond=RCOND, driver="gelsd").solution

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


def kernel_metric(A, bias: bool = True, gamma: float = 0.0, gamma_mode: str = "relative") -> KernelMetric:
    """The kernel inner product of representation A (``N x w``, rows are samples); Part 1 §3.4, §3.7.

    gamma_mode "relative": γ = gamma·‖K‖_op (THEORY.md Part 1 §6.3); "absolute": γ = gamma.
    γ > 0 factorises ``K + γI`` once (Cholesky; on failure adds jitter ``1e-12 Tr(K)/N`` and records it);
    γ = 0 uses the pseudo-inverse through least squares.
    """
    A = as_matrix("A", A)
    non_negative("gamma", gamma)
    one_of("gamma_mode", gamma_mode, GAMMA_MODES)
    S = features(A, bias)
    gram = S.T @ S if S.shape[0] >= S.shape[1] else S @ S.T
    eig = torch.linalg.eigvalsh(gram)
    g = gamma * float(eig[-1]) if gamma_mode == "relative" else float(gamma)
    if g <= 0:
        return KernelMetric(S, 0.0, None, 0.0, eig)
    K = S @ S.T
    eye = torch.eye(K.shape[0], dtype=K.dtype, device=K.device)
    chol, info = torch.linalg.cholesky_ex(K + g * eye)
    jitter = 0.0
    if int(info) != 0:
        jitter = 1e-12 * float(torch.trace(K)) / K.shape[0]
        chol = torch.linalg.cholesky(K + (g + jitter) * eye)
    return KernelMetric(S, g, chol, jitter, eig)


def cost_of_identity(A, bias: bool = True, gamma: float = 0.0, gamma_mode: str = "relative",
                     projected: bool = False) -> float:
    """The cost of identity of representation A (``N x w``, rows are samples); THEORY.md Part 1 §3.4.

    gamma = 0: the exact ``COI(A) = ‖Aᵀ σ(A)ᵀ⁺‖² = Tr[Aᵀ K⁺ A]`` (paper §2.2; THEORY.md writes
    ``‖A σ(A)⁺‖²`` in columns), ``COĪ`` with ``bias=False``; by the paper's convention ``inf`` when A is
    outside the image of σ(A) (``‖σ(A)Z − A‖ > 1e-8‖A‖`` for the min-norm solution Z), unless
    ``projected=True``, which returns the finite pseudo-inverse value ``‖Z‖²``. Unstable: use on synthetic
    matrices only.
    gamma > 0: the γ-stable ``COI_γ(A) = Tr[Aᵀ (K+γI)⁻¹ A]`` with γ = gamma·‖K‖_op ("relative", default,
    THEORY.md Part 1 §6.3) or γ = gamma ("absolute").
    """
    metric = kernel_metric(A, bias, gamma, gamma_mode)
    A = as_matrix("A", A)
    Z = metric.whiten(A)
    if metric.chol is None and not projected:
        if torch.linalg.norm(metric.S @ Z - A) > OUTSIDE_IMAGE_TOL * torch.linalg.norm(A):
            return float("inf")
    return float((Z**2).sum())
