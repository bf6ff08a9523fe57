"""WeightWatcher's per-layer columns, reproduced from its definitions (WeightWatcher 0.7.7, CPU path).

Martin & Mahoney, "Implicit self-regularization in deep neural networks", JMLR 22 (2021), arXiv 1810.01075,
and "Predicting trends in the quality of state-of-the-art neural networks without access to training or
testing data", Nature Communications 12 (2021), arXiv 2002.06716: the empirical spectral density (ESD) of a
layer and the power-law exponent of its tail. The rules below are those of WeightWatcher's
``analyze()`` with its defaults (read from its source, ``weightwatcher.py`` and ``WW_powerlaw.py``):

- **Eigenvalues.** A Linear or Embedding ``W``: λ_i = s_i(W)², not divided by N (its ``normalize`` option
  is off by default). A Conv2d kernel ``out x in/G x k_h x k_w``: the k_h·k_w slices ``W[:, :, i, j]`` are
  read as matrices, each scaled by √(1/2) (its default ``conv2d_norm``), and their squared singular values
  pooled: λ = s(W_ij)²/2. WeightWatcher lists a layer only when min(out, in/G)·k_h·k_w >= 8 (``min_evals``),
  <= 15000 (``max_evals``) and max(out, in/G) <= 50000 (``max_N``); it reads Conv1d layers not at all.
- **Fit.** The eigenvalues above 1e-5 (``EVALS_THRESH``), sorted, x_1 <= ... <= x_n. With n >= 20
  (``SMALL_N_CUTOFF``), every x_i but the largest is a candidate x_min; its tail has n_i = n − i + 1 values,
  α_i = 1 + n_i / Σ_{j>=i} ln(x_j/x_i) (the maximum-likelihood estimate, Clauset, Shalizi & Newman, SIAM
  Review 51, 2009, eq. (3.1)) and D_i = max_j |1 − (x_j/x_i)^(1−α_i) − (j − i)/n_i| (the Kolmogorov–Smirnov
  distance to the fitted law, its eq. (3.5)), D_i = 1 when α_i <= 1; the fit is the first candidate of
  smallest D_i. Below 20 eigenvalues it switches estimator: only tails of at least 8 values are
  candidates, with α_i = 1 + (n_i − 1) / Σ ln(x_j/x_i) (bias-corrected), again the first of smallest D_i (its
  small-sample routine also ranks them by D_i − 0.868/√n_i, but the caller overwrites that choice with the
  smallest D_i; without any candidate the whole sample is the tail).
  sigma = (α − 1)/√n_tail (standard error, eq. (3.2) there); num_pl_spikes = #{λ >= x_min}.
- **Norm columns.** norm = Σλ, log_norm = log10 norm, spectral_norm = max λ, log_spectral_norm, stable_rank =
  Σλ / max λ, alpha_weighted = α·log10(max λ), log_alpha_norm = log10 Σ λ^α, matrix_rank = #{√λ >
  √λ_max·N·ε} (N of `sides`), entropy = −Σ p log p / log(matrix_rank), p = λ/Σλ + 1e-10;
  warning: "over-trained" for α < 2, "under-trained" for α > 6.

`columns(evals, N)` returns all of them as ``ww_<WeightWatcher's name>``. The fit columns are NaN when fewer
than `min_fit` eigenvalues exceed 1e-5: `analyze` uses `MIN_FIT` = 20, where WeightWatcher itself stops
trusting the maximum-likelihood fit; below it a tail of at most 19 values has a standard error of at least
(α − 1)/√19 ≈ 0.23·(α − 1) and the two estimators differ by a factor (n − 1)/n and their choice of x_min.
``min_fit=0`` gives WeightWatcher's own numbers, small-sample estimator included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .spectra import tail_candidates

EVALS_THRESH = 1e-5  # eigenvalues fitted: λ > EVALS_THRESH
SMALL_N = 20  # below this many fitted eigenvalues WeightWatcher uses its small-sample estimator
SMALL_N_TAIL = 8  # the small-sample estimator's shortest tail
CONV2D_SCALE = 0.5  # a Conv2d slice's eigenvalues are scaled by this (its default conv2d_norm)
MIN_FIT = SMALL_N  # analyze's fit columns are NaN below this many fitted eigenvalues
FIT_COLUMNS = ("alpha", "alpha_weighted", "log_alpha_norm", "sigma", "xmin", "xmax", "D", "num_pl_spikes")


def esd(W: torch.Tensor, conv2d: bool) -> np.ndarray:
    """WeightWatcher's eigenvalues of the stored weight `W` (module docstring), unsorted: for a Conv2d kernel
    out x in/G x k_h x k_w the squared singular values of its k_h·k_w slices, scaled by `CONV2D_SCALE`; for any
    other matrix (rows x rest) its squared singular values."""
    if conv2d:
        evals = gram_eigenvalues(W.permute(2, 3, 0, 1).reshape(-1, W.shape[0], W.shape[1])) * CONV2D_SCALE
    else:
        evals = gram_eigenvalues(W.reshape(1, W.shape[0], -1))
    return evals.reshape(-1).numpy()


def gram_eigenvalues(M: torch.Tensor) -> torch.Tensor:
    """The min(n, m) eigenvalues of the smaller Gram matrix of each n x m matrix in the batch M (the squared
    singular values, to an absolute c·ε·λ_max), clamped at 0."""
    G = M @ M.transpose(1, 2) if M.shape[1] <= M.shape[2] else M.transpose(1, 2) @ M
    return torch.linalg.eigvalsh(G).clamp_min(0)


def sides(W: torch.Tensor, conv2d: bool) -> tuple[int, int]:
    """WeightWatcher's (N, M) of a layer: (max, min) of a matrix's sides; for a Conv2d kernel out x in/G x k_h x k_w
    its slice loop swaps (out, in/G) once per slice when out < in/G, so they end swapped after an odd number of
    slices (a 3x3 kernel: (in/G, out)) and unswapped after an even one (a 2x2 kernel: (out, in/G))."""
    if not conv2d:
        return max(W.shape[0], W[0].numel()), min(W.shape[0], W[0].numel())
    out, inp = W.shape[0], W.shape[1]
    swapped = out < inp and W.shape[2] * W.shape[3] % 2 == 1
    return (inp, out) if swapped else (out, inp)


def listed(W: torch.Tensor, conv2d: bool) -> bool:
    """Whether WeightWatcher's ``analyze()`` lists a layer with this weight: M·rf in 8..15000 and N <= 50000
    (`sides`; rf = k_h·k_w for a Conv2d, else 1)."""
    N, M = sides(W, conv2d)
    count = M * (W.shape[2] * W.shape[3] if conv2d else 1)
    return 8 <= count <= 15000 and N <= 50000


@dataclass(frozen=True)
class PowerLawTail:
    """WeightWatcher's power-law fit of an ESD: alpha on the tail λ >= xmin (xmax its largest value), D the KS
    distance, sigma the standard error (alpha − 1)/√n_tail, n the number of eigenvalues fitted, small whether
    the small-sample estimator was used."""

    alpha: float
    xmin: float
    xmax: float
    D: float
    sigma: float
    n_tail: int
    n: int
    small: bool


def fit(evals) -> PowerLawTail:
    """WeightWatcher's fit of the eigenvalues above `EVALS_THRESH` (module docstring); needs at least two."""
    x = np.sort(np.asarray(evals, dtype=np.float64).ravel())
    x = x[x > EVALS_THRESH]
    n = len(x)
    if n < 2:
        raise ValueError(f"a power-law fit needs at least 2 eigenvalues above {EVALS_THRESH}, got {n}")
    small = n < SMALL_N
    counts, spread, alphas, D = tail_candidates(x, correction=1.0 if small else 0.0)
    D = np.where(np.isnan(D), 1.0, D)
    if small:  # tails shorter than SMALL_N_TAIL are no candidates (D = 1); none left: the whole sample
        D = np.where((counts >= SMALL_N_TAIL) & (spread > 1e-12), D, 1.0)
    best = int(np.argmin(D))
    alpha = float(alphas[best])
    sigma = float((alpha - 1) / np.sqrt(counts[best]))
    return PowerLawTail(alpha, float(x[best]), float(x[-1]), float(D[best]), sigma, n - best, n, small)


def columns(evals: np.ndarray, N: int, min_fit: int = MIN_FIT) -> dict[str, float | str]:
    """WeightWatcher's columns of one layer from its eigenvalues `evals` (`esd`) and its N (`sides`) (module
    docstring), as ``ww_<name>``; the fit columns (`FIT_COLUMNS`, and warning) are NaN (and
    "") when fewer than max(`min_fit`, 2) eigenvalues exceed `EVALS_THRESH`."""
    evals = np.asarray(evals, dtype=np.float64)
    norm, top = float(evals.sum()), float(evals.max())
    sv = np.sqrt(evals)
    rank = int(np.count_nonzero(sv > sv.max() * N * np.finfo(np.float64).eps))
    p = evals / norm + 1e-10 if norm > 0 else np.full(len(evals), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        out: dict[str, float | str] = {
            "ww_norm": norm,
            "ww_log_norm": float(np.log10(norm)),
            "ww_spectral_norm": top,
            "ww_log_spectral_norm": float(np.log10(top)),
            "ww_stable_rank": norm / top if top > 0 else np.nan,
            "ww_num_evals": len(evals),
            "ww_matrix_rank": rank,
            "ww_entropy": float(-(p * np.log(p)).sum() / np.log(rank + 1e-10)),
        }
    out |= {f"ww_{c}": np.nan for c in FIT_COLUMNS} | {"ww_warning": ""}
    if int((evals > EVALS_THRESH).sum()) < max(min_fit, 2):
        return out
    tail = fit(evals)
    with np.errstate(divide="ignore"):
        log_alpha_norm = float(np.log10((evals**tail.alpha).sum()))
    warning = "over-trained" if tail.alpha < 2 else "under-trained" if tail.alpha > 6 else ""
    return out | {
        "ww_alpha": tail.alpha,
        "ww_alpha_weighted": tail.alpha * float(np.log10(top)),
        "ww_log_alpha_norm": log_alpha_norm,
        "ww_sigma": tail.sigma,
        "ww_xmin": tail.xmin,
        "ww_xmax": tail.xmax,
        "ww_D": tail.D,
        "ww_num_pl_spikes": int((evals >= tail.xmin).sum()),
        "ww_warning": warning,
    }
