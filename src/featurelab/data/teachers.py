"""Bottleneck teachers: compositions of random networks through small inner dimensions.

docs/theory/leaky-resnets.md §5.1. ``f* = g_k ∘ ... ∘ g_1`` through dimensions ``dims = (d_0, d_1, ..., d_k)``;
the smallest inner dimension is the bottleneck rank k* of the task. Each piece is

    FCNN:    g(x) = W2 ReLU(W1 x),          W1 ~ N(0, 2/a), W2 ~ N(0, 1/hidden)
    ResNet:  g(x) = M x + W2 ReLU(W1 x),    plus the projection shortcut M ~ N(0, 1/a)

with a the input dimension of the piece. Inputs x ~ N(0, I). X and Y are standardised per coordinate
with statistics pooled over train and test together, then split. Teacher, data and (elsewhere) model
have separate seeds.
"""

from __future__ import annotations

import numpy as np

from ..checks import int_at_least, one_of
from ..errors import FeaturelabError
from .dataset import Dataset

KINDS = ("fcnn", "resnet")


def _piece(rng: np.random.Generator, a: int, b: int, hidden: int, kind: str):
    W1 = rng.normal(0.0, np.sqrt(2.0 / a), size=(hidden, a))
    W2 = rng.normal(0.0, np.sqrt(1.0 / hidden), size=(b, hidden))
    M = rng.normal(0.0, np.sqrt(1.0 / a), size=(b, a)) if kind == "resnet" else None

    def g(x: np.ndarray) -> np.ndarray:  # rows are samples
        out = np.maximum(x @ W1.T, 0.0) @ W2.T
        return out + x @ M.T if M is not None else out

    return g


def bottleneck_teacher(
    dims: tuple[int, ...] = (20, 5, 20),
    kind: str = "fcnn",
    hidden: int = 100,
    n_train: int = 1000,
    n_test: int = 1000,
    teacher_seed: int = 0,
    data_seed: int = 1,
) -> Dataset:
    """Regression data from a random bottleneck teacher (Part 1 §5.1), float64, rows are samples.

    Fig. 1: ``dims=(20, 5, 20), kind="fcnn"`` (k* = 5); Fig. 2: ``dims=(30, 6, 3, 30), kind="resnet"``
    (k* = 3). Returns X_train (n_train x d_0), Y_train (n_train x d_k) and the test split.
    """
    if len(dims) < 2 or any(not isinstance(d, int) or d < 1 for d in dims):
        raise FeaturelabError(f"dims={dims!r} is not allowed: give at least two positive integers")
    one_of("kind", kind, KINDS)
    int_at_least("n_train", n_train, 1)
    int_at_least("n_test", n_test, 0)
    int_at_least("hidden", hidden, 1)
    trng = np.random.default_rng(teacher_seed)
    pieces = [_piece(trng, a, b, hidden, kind) for a, b in zip(dims[:-1], dims[1:])]
    drng = np.random.default_rng(data_seed)
    X = drng.normal(size=(n_train + n_test, dims[0]))
    Y = X
    for g in pieces:
        Y = g(Y)
    X = (X - X.mean(0)) / X.std(0)
    Y = (Y - Y.mean(0)) / np.maximum(Y.std(0), 1e-12)
    return Dataset.split(
        X,
        Y,
        n_train,
        {
            "name": "bottleneck_teacher",
            "dims": list(dims),
            "kind": kind,
            "hidden": hidden,
            "bottleneck_rank": min(dims[1:-1]) if len(dims) > 2 else min(dims),
            "teacher_seed": teacher_seed,
            "data_seed": data_seed,
        },
    )
