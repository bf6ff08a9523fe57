"""docs/theory/sparsity.md §7 checks 3 (bipartite, onehot_identity constructions: exact balance) and 6 (graphs)."""

import pytest
import torch

from featurelab.data.constructions import (
    adjacency_matrix,
    bipartite,
    complete_bipartite_edges,
    cycle_edges,
    incidence_matrix,
    is_triangle_free,
    onehot_identity,
    path_edges,
)
from featurelab.measurements import cp_rank_bounds, layer_forces, representation_loss


@pytest.mark.parametrize("N", [4, 6, 8])
def test_bipartite_construction(N):
    """Check 3: reconstruction <= 1e-12, ‖θ‖² = N² = 2 Tr Q, W_2 = B, N²/4 neurons, exact balance."""
    c = bipartite(N)
    X, Y = c.data.X_train, c.data.Y_train
    B = incidence_matrix(complete_bipartite_edges(N // 2, N // 2), N)
    assert (c.model(X) - Y).abs().max() <= 1e-12
    assert (
        float(c.model.sq_norm().detach()) == pytest.approx(N * N, abs=1e-12) == c.sq_norm == 2 * float(torch.trace(Y))
    )
    assert torch.equal(c.model.weights[1].detach(), B)
    assert (
        c.model.dims[1]
        == N * N // 4
        == c.cp_rank
        == cp_rank_bounds(Y, factor=c.model(X, return_layers=True).act[1]).lower
    )
    half = N // 2
    Q = torch.block_diag(half * torch.eye(half), half * torch.eye(half)).double()
    Q[:half, half:] = Q[half:, :half] = 1.0
    assert torch.equal(Y, Q)
    rep = representation_loss(c.model, X, Y, 0.01)
    assert rep.loss == pytest.approx(0.01 * N * N, rel=1e-12)  # the weights are already min-norm
    assert layer_forces(c.model, X, Y, 0.01)[0].balance <= 1e-10


def test_onehot_identity_construction():
    """Check 3: ‖θ‖² = 2 Σ √N_c, Z_1 Z_1ᵀ = M_Y = blockdiag(J/√N_c) = (Y Yᵀ)^½, exact balance."""
    sizes = [3, 5, 2]
    c = onehot_identity(sizes)
    X, Y = c.data.X_train, c.data.Y_train
    assert (c.model(X) - Y).abs().max() <= 1e-12
    assert float(c.model.sq_norm().detach()) == pytest.approx(2 * sum(s**0.5 for s in sizes), rel=1e-12)
    Z1 = X @ c.model.weights[0].detach().T
    M = torch.block_diag(*[torch.ones(s, s, dtype=torch.float64) / s**0.5 for s in sizes])
    assert torch.allclose(Z1 @ Z1.T, M, atol=1e-12)
    assert torch.allclose(M @ M, Y @ Y.T, atol=1e-12)
    assert layer_forces(c.model, X, Y, 0.01)[0].balance <= 1e-10


def test_graph_gram_is_degree_plus_adjacency():
    """Check 6: Q = B Bᵀ = Deg + Adj for C_5, P_4, K_{2,2}, K_{3,3}; K_{N/2,N/2} has N²/4 edges."""
    graphs = {
        "C5": (cycle_edges(5), 5),
        "P4": (path_edges(4), 4),
        "K22": (complete_bipartite_edges(2, 2), 4),
        "K33": (complete_bipartite_edges(3, 3), 6),
    }
    for edges, n in graphs.values():
        B = incidence_matrix(edges, n)
        A = adjacency_matrix(edges, n)
        assert torch.equal(B @ B.T, torch.diag(A.sum(1)) + A)
    for N in (4, 6, 8, 10):
        assert len(complete_bipartite_edges(N // 2, N // 2)) == N * N // 4
    assert int(adjacency_matrix(cycle_edges(5), 5).sum()) == 10


def test_triangle_detector():
    """Check 6: C_3 and K_4 have triangles; C_5, P_4, K_{3,3} do not."""
    k4 = [(i, j) for i in range(4) for j in range(i + 1, 4)]
    assert not is_triangle_free(adjacency_matrix(cycle_edges(3), 3))
    assert not is_triangle_free(adjacency_matrix(k4, 4))
    for edges, n in ((cycle_edges(5), 5), (path_edges(4), 4), (complete_bipartite_edges(3, 3), 6)):
        assert is_triangle_free(adjacency_matrix(edges, n))
