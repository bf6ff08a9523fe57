"""Example 1 of Bantzis, Simon, Jacot: N points on the unit circle with alternating gradients
(docs/theory/saddle-to-saddle.md §5)."""

from __future__ import annotations

import math

import torch

from ..checks import int_at_least
from .dataset import Dataset

SNAP = 1e-12


def circle_dataset(N: int = 8, flip: bool = False) -> Dataset:
    """Example 1 (docs/theory/saddle-to-saddle.md §5) as a float64 `Dataset` (no test split), rows are samples.

    X_train: ``N x 2`` with row j-1 = ``(sin(2πj/N), cos(2πj/N))``, j = 1..N, every |entry| < 1e-12 snapped
    to exactly 0 (otherwise sin(π) = 1.2e-16 switches a ReLU on at a kink and corrupts the gradients).
    Y_train: ``N x 1`` targets Y* whose squared loss ½‖Y - Y*‖² has gradient ``G = -Y*`` at the origin, the
    G of the escape tools: ``G_j = (-1)^j`` (the papers' 1 x N G transposed), so ``y_j = (-1)^{j+1}``;
    ``flip=True`` gives ``y_j = (-1)^j`` and ``G_j = (-1)^{j+1}`` (§8.3).
    For N = 8: ‖X‖_F = ‖G‖_F = 2√2, optimal speed 1/2 at depth 3, √2 - 1 for rank-one nets.
    Use ``X, G = data.X_train, -data.Y_train``.
    """
    int_at_least("N", N, 2)
    j = torch.arange(1, N + 1, dtype=torch.float64)
    angle = 2 * math.pi * j / N
    X = torch.stack([torch.sin(angle), torch.cos(angle)], dim=1)
    X = torch.where(X.abs() < SNAP, torch.zeros_like(X), X)
    G = ((-1.0) ** (j + (1 if flip else 0)))[:, None]
    empty = X[:0]
    return Dataset(X, -G, empty, -G[:0], None, {"name": "circle", "N": N, "flip": flip})
