"""Datasets with known optimal networks, graph helpers and the 1-D generator (docs/theory/sparsity.md §4).

Rows are samples. the papers write ``X = I_N`` and targets as columns; here ``X_train = I_N`` (N x N) and
``Y_train`` is ``N x d_out``. The optimal networks are float64 ReLU `MLP`s with β = 0 and depth 2.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..checks import int_at_least, non_negative, one_of
from ..errors import FeaturelabError
from ..models.mlp import MLP
from .dataset import Dataset


class Construction(NamedTuple):
    """A dataset, a network that is optimal for it, and its known numbers.

    data: the `Dataset` (X = I_N, test split empty). model: the optimal float64 `MLP`.
    sq_norm: the optimal ‖θ‖² (the representation cost R). cp_rank: the cp-rank of ``M_Y = (YᵀY)^½``
    (the papers' columns; our ``(Y Yᵀ)^½``, N x N), which lower-bounds the width of any optimal net.
    """

    data: Dataset
    model: MLP
    sq_norm: float
    cp_rank: int


# -------------------------------------------------------------------------------- graphs
def complete_bipartite_edges(a: int, b: int) -> list[tuple[int, int]]:
    """Edges of K_{a,b} on vertices 0..a-1 and a..a+b-1 (a·b edges)."""
    return [(i, a + j) for i in range(a) for j in range(b)]


def cycle_edges(n: int) -> list[tuple[int, int]]:
    """Edges of the cycle C_n (n >= 3)."""
    int_at_least("n", n, 3)
    return [(i, (i + 1) % n) for i in range(n)]


def path_edges(n: int) -> list[tuple[int, int]]:
    """Edges of the path P_n on n vertices (n - 1 edges)."""
    int_at_least("n", n, 2)
    return [(i, i + 1) for i in range(n - 1)]


def incidence_matrix(edges: list[tuple[int, int]], n: int) -> torch.Tensor:
    """B ∈ {0,1}^{n x M}: column e has ones at the two endpoints of edge e (float64)."""
    B = torch.zeros(n, len(edges), dtype=torch.float64)
    for e, (i, j) in enumerate(edges):
        if i == j or not (0 <= i < n and 0 <= j < n):
            raise FeaturelabError(f"edge {(i, j)!r} is not allowed: give two distinct vertices in [0, {n})")
        B[i, e] = B[j, e] = 1.0
    return B


def adjacency_matrix(edges: list[tuple[int, int]], n: int) -> torch.Tensor:
    """The n x n adjacency matrix (float64)."""
    B = incidence_matrix(edges, n)
    return B @ B.T - torch.diag((B @ B.T).diagonal())


def is_triangle_free(adjacency: torch.Tensor) -> bool:
    """True when the graph has no triangle: Tr(Adj³) = 6·#triangles = 0."""
    return bool(torch.trace(adjacency @ adjacency @ adjacency).abs() < 0.5)


# ------------------------------------------------------------------------------ constructions
def bipartite(N: int) -> Construction:
    """docs/theory/sparsity.md §4 `bipartite(N)` (Prop. 13-14): X = I_N, Y = Q = B Bᵀ = Deg + Adj of K_{N/2,N/2}.

    Q = [[(N/2)I, J], [J, (N/2)I]] is completely positive with cp-rank N²/4 (the graph is triangle-free),
    so every representation-cost minimizer needs N²/4 hidden neurons. The optimal net has one neuron per
    edge: ``W_1 = Bᵀ`` (N²/4 x N) and ``W_2 = B`` (N x N²/4), ‖θ‖² = N² = 2 Tr Q. N must be even, >= 2.
    """
    int_at_least("N", N, 2)
    if N % 2:
        raise FeaturelabError(f"N={N!r} is not allowed: bipartite(N) needs an even N >= 2")
    B = incidence_matrix(complete_bipartite_edges(N // 2, N // 2), N)
    X = torch.eye(N, dtype=torch.float64)
    Y = B @ B.T
    model = MLP(N, N, B.shape[1], 2, bias=0.0, dtype=torch.float64)
    with torch.no_grad():
        model.weights[0].copy_(B.T)
        model.weights[1].copy_(B)
    data = Dataset(X, Y, X[:0], Y[:0], None, {"name": "bipartite", "N": N})
    return Construction(data, model, float(N * N), N * N // 4)


def onehot_identity(sizes: list[int]) -> Construction:
    """docs/theory/sparsity.md §4 `onehot_identity(sizes)`: X = I_N, Y = one-hot labels of C classes of the given
    sizes (N x C). ``M_Y = blockdiag(J_{N_c}/√N_c)`` has cp-rank C; the optimal net has C neurons, neuron c
    with incoming weights ``N_c^{-1/4}`` on its class's inputs and outgoing weight ``N_c^{1/4}`` to output c,
    so ``Z_1 Z_1ᵀ = M_Y`` and ‖θ‖² = 2 Σ_c √N_c."""
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise FeaturelabError(f"sizes={sizes!r} is not allowed: give a non-empty list of integers >= 1")
    N, C = sum(sizes), len(sizes)
    labels = torch.repeat_interleave(torch.arange(C), torch.tensor(sizes))
    Y = torch.nn.functional.one_hot(labels, C).to(torch.float64)
    X = torch.eye(N, dtype=torch.float64)
    n_c = torch.tensor(sizes, dtype=torch.float64)
    model = MLP(N, C, C, 2, bias=0.0, dtype=torch.float64)
    with torch.no_grad():
        model.weights[0].copy_(Y.T * n_c[:, None] ** -0.25)
        model.weights[1].copy_(torch.diag(n_c**0.25))
    data = Dataset(X, Y, X[:0], Y[:0], None, {"name": "onehot_identity", "sizes": list(sizes)})
    return Construction(data, model, float(2 * n_c.sqrt().sum()), C)


# ------------------------------------------------------------------------------ 1-D generator
TARGETS = {
    "sin": lambda x: np.sin(3 * x),
    "abs": np.abs,
    "square": lambda x: x**2,
    "step": lambda x: (x > 0).astype(np.float64),
}


def oned(N: int, f: str = "sin", noise: float = 0.0, n_test: int = 200, seed: int = 0) -> Dataset:
    """Scalar regression for Prop. 15 (Part 3 §4): sorted x_i ~ U[-1, 1], y = f(x) + noise·ε, ε ~ N(0, 1).

    f: "sin" (sin 3x), "abs", "square" or "step". Returns X_train (N x 1, sorted), Y_train (N x 1) and a
    noiseless sorted test grid of `n_test` points.
    """
    int_at_least("N", N, 1)
    int_at_least("n_test", n_test, 0)
    non_negative("noise", noise)
    one_of("f", f, tuple(TARGETS))
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(-1.0, 1.0, N))
    y = TARGETS[f](x) + noise * rng.normal(size=N)
    xt = np.linspace(-1.0, 1.0, n_test)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).reshape(-1, 1)
    return Dataset(
        t(x),
        t(y),
        t(xt),
        t(TARGETS[f](xt)),
        None,
        {
            "name": "oned",
            "f": f,
            "noise": noise,
            "seed": seed,
            "n_train": N,
            "n_test": n_test,
            "pattern_bound": 4 * N - 2,
        },
    )
