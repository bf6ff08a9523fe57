"""Minimum-norm least squares: the SVD route (used off the CPU) equals LAPACK's gelsd and the normal equations."""

import torch

from featurelab.measurements.ranks import min_norm_lstsq, svd_lstsq


def _rank_deficient(n=9, m=6, r=3, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, r, generator=g, dtype=torch.float64) @ torch.randn(r, m, generator=g, dtype=torch.float64)
    return A, torch.randn(n, k, generator=g, dtype=torch.float64)


def test_svd_route_equals_gelsd_on_a_rank_deficient_matrix():
    A, B = _rank_deficient()
    X = svd_lstsq(A, B, 1e-10)
    torch.testing.assert_close(X, min_norm_lstsq(A, B, 1e-10), rtol=1e-10, atol=1e-12)


def test_solution_is_least_squares_and_minimum_norm():
    A, B = _rank_deficient()
    X = svd_lstsq(A, B, 1e-10)
    # normal equations Aᵀ(AX − B) = 0, and X lies in the row space of A (orthogonal to its null space)
    torch.testing.assert_close(A.T @ (A @ X - B), torch.zeros_like(X), rtol=0, atol=1e-10)
    null = torch.linalg.svd(A)[2][3:]  # rank 3: the last 3 right singular vectors span ker A
    torch.testing.assert_close(null @ X, torch.zeros(3, B.shape[1], dtype=torch.float64), rtol=0, atol=1e-10)
