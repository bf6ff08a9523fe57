"""docs/theory/sparsity.md §7 checks 4 (merge), 5 (Carathéodory), 7 (1-D pattern merge), 8 (zero-neuron padding)."""

import pytest
import torch

from featurelab import MLP, FeaturelabError
from featurelab.data import oned
from featurelab.measurements import (
    caratheodory_reduce,
    covariance_pairs,
    merge_aligned_neurons,
    pad_width,
    pattern_merge,
    regularized_loss,
    representation_loss,
)
from featurelab.models import mlp_with_weights

D = torch.float64


def sq(m):
    return float(m.sq_norm().detach())


def randomize(m, gen, scale=1.0):
    with torch.no_grad():
        for W in m.weights:
            W.copy_(scale * torch.randn(W.shape, generator=gen, dtype=D))
    return m


def planted(gen):
    """Depth-3 ReLU net (β = 1) whose first hidden layer holds copies (c = 0.5, 3) and dead neurons."""
    m = randomize(MLP(4, 3, [6, 5], 3, bias=1.0, dtype=D), gen)
    X = torch.randn(20, 4, generator=gen, dtype=D)
    W = [w.detach().clone() for w in m.weights]
    dead = torch.zeros(2, 5, dtype=D)
    dead[:, -1] = -1.0  # bias only, negative: σ = 0 on every input
    W[0] = torch.cat([W[0], 0.5 * W[0][0:1], 3.0 * W[0][2:3], 3.0 * W[0][0:1], dead])
    W[1] = torch.cat([W[1][:, :6], torch.randn(5, 5, generator=gen, dtype=D), W[1][:, 6:]], dim=1)
    return mlp_with_weights(m, W), X


def test_merge_planted_copies(gen):
    """Check 4: outputs to 1e-10, norm does not increase, width = number of groups, idempotent."""
    m, X = planted(gen)
    merged, report = merge_aligned_neurons(m, X)
    assert report.loc[0, "width_before"] == 11 and report.loc[0, "dead"] == 2
    assert merged.dims[1] == 6  # 9 alive neurons in 6 groups: {0, 6, 8}, {2, 7}, 1, 3, 4, 5
    assert (merged(X) - m(X)).abs().max() <= 1e-10 * m(X).abs().max()
    assert sq(merged) <= sq(m) + 1e-12
    again, _ = merge_aligned_neurons(merged, X)
    assert again.dims == merged.dims
    assert (again(X) - merged(X)).abs().max() <= 1e-10 * m(X).abs().max()
    assert sq(again) <= sq(merged) + 1e-12  # re-balancing layer 2 unbalanced layer 1: only "not larger"


def test_caratheodory_reduction(gen):
    """Check 5: N = 5, widths 80/60: width <= rank <= 30, Grams to 1e-10, outputs to 1e-9, ‖θ'‖² <= ‖θ^min‖²."""
    m = randomize(MLP(3, 2, [80, 60], 3, bias=1.0, dtype=D), gen, 0.5)
    X = torch.randn(5, 3, generator=gen, dtype=D)
    reduced, report = caratheodory_reduce(m, X)
    assert (report["width_after"] <= report["rank"]).all() and (report["rank"] <= 30).all()
    assert list(reduced.dims[1:-1]) == report["width_after"].tolist()
    assert (report["gram_error"] <= 1e-10).all()
    assert (reduced(X) - m(X)).abs().max() <= 1e-9 * m(X).abs().max()
    # the kept Grams, measured independently: K^σ exactly, K up to the dead neurons (which only add to K)
    for p, q in zip(covariance_pairs(m, X), covariance_pairs(reduced, X)):
        assert (q.K_sigma - p.K_sigma).norm() <= 1e-10 * p.K_sigma.norm()
        assert torch.linalg.eigvalsh(p.K - q.K).min() >= -1e-10 * p.K.norm()
    Y = torch.zeros(5, 2, dtype=D)
    assert sq(reduced) <= sum(representation_loss(m, X, Y, 1.0).norms) + 1e-9
    # no-op once the widths are at most the rank
    again, rep2 = caratheodory_reduce(reduced, X)
    assert again.dims == reduced.dims and (rep2["dead"] == 0).all()
    assert all(torch.equal(a, b) for a, b in zip(again.weights, reduced.weights))


def test_caratheodory_generic_narrow_net_is_noop(gen):
    """Check 5: n <= rank(G): nothing to remove, the network is returned unchanged."""
    m = randomize(MLP(3, 2, [6, 5], 3, leak=0.1, bias=1.0, dtype=D), gen)
    X = torch.randn(5, 3, generator=gen, dtype=D)
    reduced, report = caratheodory_reduce(m, X)
    assert report["width_after"].tolist() == [6, 5]
    assert all(torch.equal(a, b.detach()) for a, b in zip(reduced.weights, m.weights))


def test_pattern_merge_1d(gen):
    """Check 7: N = 10, width 400, scalar input: width <= 4N-2, outputs to 1e-10, norm does not increase."""
    data = oned(10, "sin", seed=1)
    m = randomize(MLP(1, 1, 400, 2, bias=1.0, dtype=D), gen)
    merged, report = pattern_merge(m, data.X_train)
    assert merged.dims[1] <= 4 * 10 - 2
    assert (merged(data.X_train) - m(data.X_train)).abs().max() <= 1e-10 * m(data.X_train).abs().max()
    assert sq(merged) <= sq(m)
    assert report.loc[0, "width_before"] == 400
    with pytest.raises(FeaturelabError, match="depth-2"):
        pattern_merge(randomize(MLP(1, 1, 4, 3, bias=1.0, dtype=D), gen), data.X_train)


def test_zero_padding_is_bit_identical(gen):
    """Check 8: appending zero neurons leaves L_λ bit-identical (Prop. 6)."""
    m = randomize(MLP(4, 3, [7, 6], 3, bias=1.0, dtype=D), gen)
    X = torch.randn(15, 4, generator=gen, dtype=D)
    Y = torch.randn(15, 3, generator=gen, dtype=D)
    padded = pad_width(m, 5)
    assert padded.dims == [4, 12, 11, 3]
    assert regularized_loss(padded, X, Y, 0.01) == regularized_loss(m, X, Y, 0.01)


def test_sparsity_tools_reject_tanh(gen):
    m = randomize(MLP(4, 3, [7, 6], 3, bias=1.0, activation="tanh", dtype=D), gen)
    X = torch.randn(15, 4, generator=gen, dtype=D)
    for tool in (merge_aligned_neurons, caratheodory_reduce):
        with pytest.raises(FeaturelabError, match="positively homogeneous"):
            tool(m, X)


def test_caratheodory_step_pivots_on_the_dominant_entry():
    """Part 3 §5b step 4 with pivoting: along φ ∝ (-1, 3e-5, 0) the step removes coordinate 0 with t ≈ 1
    (a = (0, 1 + 3e-5, 1)), not coordinate 1 with t ≈ 3e4, which would amplify any residual of φ 3e4-fold."""
    from featurelab.measurements.sparsity import caratheodory_weights

    phi = torch.tensor([[-1.0], [3e-5], [0.0]], dtype=D)
    a = caratheodory_weights(phi / phi.norm())
    assert a[0] == 0 and a[1] == pytest.approx(1 + 3e-5, rel=1e-12) and a[2] == 1


# --------------------------------------------------------------------------- cp-rank (Prop. 13-14)
def _graph_gram(edges, n):
    from featurelab.data.constructions import incidence_matrix

    B = incidence_matrix(edges, n)
    return B @ B.T, B


@pytest.mark.parametrize(
    "name, edges, n",
    [
        ("C5", [(i, (i + 1) % 5) for i in range(5)], 5),
        ("P4", [(0, 1), (1, 2), (2, 3)], 4),
        ("K22", [(0, 2), (0, 3), (1, 2), (1, 3)], 4),
        ("K33", [(i, 3 + j) for i in range(3) for j in range(3)], 6),
    ],
)
def test_cp_rank_of_triangle_free_graph_is_its_edge_count(name, edges, n):
    """Prop. 13: Q = BBᵀ = Deg + Adj of a triangle-free graph has cp-rank M = #edges; the lower bound (clique
    cover) and the upper bound (the incidence factor B) meet at M, whatever rank(Q) is."""
    from featurelab.measurements import cp_rank_bounds

    Q, B = _graph_gram(edges, n)
    b = cp_rank_bounds(Q, factor=B)
    assert b.triangle_free and b.edges == len(edges)
    assert b.lower == b.upper == len(edges) and b.exact
    assert b.rank == int(torch.linalg.matrix_rank(Q))  # K22 has rank 3 < 4 edges: the graph bound is the sharp one


def test_cp_rank_lower_bound_is_real_for_k22():
    """Independent check of the bound: symmetric NMF (projected Adam, 16 restarts) with M - 1 = 3 nonnegative
    columns leaves a relative residual > 1e-2 on Q(K_{2,2}), while with M = 4 it reaches < 1e-2."""
    Q, _ = _graph_gram([(0, 2), (0, 3), (1, 2), (1, 3)], 4)

    def snmf(k):
        H = torch.rand(16, 4, k, generator=torch.Generator().manual_seed(0), dtype=D).requires_grad_(True)
        opt = torch.optim.Adam([H], lr=0.02)
        for _ in range(2000):
            P = H.clamp_min(0)
            loss = ((P @ P.transpose(1, 2) - Q) ** 2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        P = H.detach().clamp_min(0)
        return float(((P @ P.transpose(1, 2) - Q) ** 2).sum((1, 2)).sqrt().min() / Q.norm())

    assert snmf(3) > 1e-2 and snmf(4) < 1e-2


def test_onehot_gram_root_and_cp_rank():
    """Prop. 14 for one-hot labels: M_Y = (YYᵀ)^½ = blockdiag(J_{N_c}/√N_c) (closed form); its graph has
    triangles, so the rank bound C is used, and the factor Y diag(N_c^{-1/4}) meets it."""
    from featurelab.measurements import cp_rank_bounds, output_gram_root

    sizes = [3, 5, 2]
    labels = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
    Y = torch.nn.functional.one_hot(labels).to(D)
    expected = torch.block_diag(*[torch.ones(n, n, dtype=D) / n**0.5 for n in sizes])
    M = output_gram_root(Y)
    assert (M - expected).abs().max() <= 1e-12
    b = cp_rank_bounds(M, factor=Y * torch.tensor(sizes, dtype=D) ** -0.25)
    assert not b.triangle_free and b.lower == b.upper == b.rank == 3


def test_cp_rank_bounds_reject_bad_input():
    from featurelab.measurements import cp_rank_bounds

    Q, B = _graph_gram([(0, 1), (1, 2)], 3)
    for bad, field in ((-Q, "A"), (torch.ones(2, 3), "A")):
        with pytest.raises(FeaturelabError, match=field):
            cp_rank_bounds(bad)
    with pytest.raises(FeaturelabError, match="factor"):
        cp_rank_bounds(Q, factor=B[:, :1])


def test_merged_neuron_is_balanced_with_the_predicted_norm(gen):
    """Check 4 in closed form: neurons 0 and 1 of a depth-2 ReLU net have σ-vectors a and 2a (w, 2w in),
    so they merge into one neuron ``(t w, u/t)`` with ``u = v_0 + 2 v_1`` and ``t = (‖u‖/‖w‖)^½``: the same
    function, and in- and outgoing norms both ``(‖w‖‖u‖)^½``, hence ‖θ‖² = 2‖w‖‖u‖ + 2‖w_2‖‖v_2‖ (the lone
    neuron 2 is balanced too). A rescale by ‖u‖/‖w‖ keeps the function but not the norm."""
    m = randomize(MLP(3, 2, 3, 2, dtype=D), gen)
    W0, W1 = (w.detach().clone() for w in m.weights)
    W0[1] = 2 * W0[0]
    m = mlp_with_weights(m, [W0, W1])
    X = torch.randn(30, 3, generator=gen, dtype=D)
    merged, report = merge_aligned_neurons(m, X)
    assert merged.dims == [3, 2, 2] and report.loc[0, "width_after"] == 2
    assert (merged(X) - m(X)).abs().max() <= 1e-12 * m(X).abs().max()
    w, u = W0[0].norm(), (W1[:, 0] + 2 * W1[:, 1]).norm()
    M0, M1 = merged.weights
    torch.testing.assert_close(M0[0].norm(), (w * u).sqrt(), rtol=1e-12, atol=0)
    torch.testing.assert_close(M1[:, 0].norm(), (w * u).sqrt(), rtol=1e-12, atol=0)
    predicted = 2 * w * u + 2 * W0[2].norm() * W1[:, 2].norm()
    assert sq(merged) == pytest.approx(float(predicted), rel=1e-12)
