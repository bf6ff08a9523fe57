"""Linearly separable data with a margin (docs/theory/invariances.md §6; Le & Jegelka, ICLR 2022).

x ~ N(0, I_d), y = sgn⟨w*, x⟩ with w* uniform on the unit sphere [ours: the norm of w* is not given];
samples with |⟨w*, x⟩| <= margin are redrawn. Rows are samples; labels are ±1 floats ``N x 1`` for the
trainer's ``objective="logistic"`` (or "mse", the squared loss).
"""

from __future__ import annotations

import numpy as np

from ..checks import int_at_least, non_negative
from .dataset import Dataset


def separable(n_train: int = 200, n_test: int = 200, d: int = 10, margin: float = 0.1, seed: int = 0) -> Dataset:
    """Separable ±1 data (Part 5 §6): X ``N x d`` float64, Y ``N x 1`` in {-1, +1}; meta holds w*."""
    int_at_least("n_train", n_train, 1)
    int_at_least("n_test", n_test, 0)
    int_at_least("d", d, 1)
    non_negative("margin", margin)
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    w /= np.linalg.norm(w)
    X = np.empty((0, d))
    while len(X) < n_train + n_test:
        x = rng.normal(size=(2 * (n_train + n_test), d))
        X = np.concatenate([X, x[np.abs(x @ w) > margin]])
    X = X[: n_train + n_test]
    Y = np.sign(X @ w)[:, None]
    return Dataset.split(
        X,
        Y,
        n_train,
        {"kind": "separable", "d": d, "margin": margin, "seed": seed, "w_star": w.tolist()},
    )
