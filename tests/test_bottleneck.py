"""docs/theory/bottleneck-rank.md §5, checkable facts 7, 8, 9 and 11 on random leaky-ReLU MLPs (float64): the exact
Jacobian bound, the Theorem 6 proxy, the NTK trace closed form, rebalancing and Theorem 7, and the
easy side of the rank sandwich."""

import pytest
import torch

from featurelab import MLP, FeaturelabError
from featurelab.measurements import (
    balancedness_residual,
    bottleneck_rank,
    corollary8_check,
    jacobian,
    jacobian_ranks,
    layer_proxy,
    ntk_trace,
    ntk_trace_closed_form,
    rebalance,
    theorem3_check,
    theorem6_check,
    theorem7_check,
)


def random_net(gen, leak=None, bias=1.0, depth=None, widths=None, d_in=4, d_out=3, **kw):
    """A random leaky MLP with random (nonzero) biases, float64."""
    depth = depth or int(torch.randint(2, 7, (1,), generator=gen))
    leak = float(torch.rand(1, generator=gen) * 1.98 - 0.99) if leak is None else leak
    widths = widths or [int(w) for w in torch.randint(2, 9, (depth - 1,), generator=gen)]
    seed = int(torch.randint(0, 10**6, (1,), generator=gen))
    net = MLP(d_in, d_out, widths, depth, leak=leak, bias=bias, seed=seed, dtype=torch.float64, **kw)
    if bias > 0:
        with torch.no_grad():
            for W in net.weights:
                W[:, -1] = 0.5 * torch.randn(W.shape[0], generator=gen, dtype=torch.float64)
    return net.requires_grad_(False)


# ---------------------------------------------------------------------------- fact 7
def test_exact_jacobian_bound_and_theorem6_proxy(gen):
    exact, proxy = [], []
    for _ in range(60):
        net = random_net(gen)
        X = torch.randn(5, 4, generator=gen, dtype=torch.float64)
        exact.append(theorem3_check(net, X, 0.0, 1).exact_slack)
        for x in X:
            t6 = theorem6_check(net, x)
            proxy.append(t6.slack)
            # the proxy's own pieces: e_l(k) is a distance to a rank-k partial isometry, >= 0
            assert min(t6.proxies) >= 0 and t6.fraction_within >= 0.75
    assert min(exact) >= 0
    assert min(proxy) >= -1e-9


def test_proxy_is_zero_on_partial_isometries(gen):
    q, _ = torch.linalg.qr(torch.randn(6, 3, generator=gen, dtype=torch.float64))
    p, _ = torch.linalg.qr(torch.randn(4, 3, generator=gen, dtype=torch.float64))
    assert layer_proxy(q @ p.T, 3) == pytest.approx(0.0, abs=1e-20)
    # e(k) = Σ_{i<=k}(s_i-1)² + Σ_{i>k} s_i² for a diagonal matrix
    assert layer_proxy(torch.diag(torch.tensor([2.0, 0.5, 0.1], dtype=torch.float64)), 1) == pytest.approx(
        1 + 0.25 + 0.01
    )


def near_bottleneck_net(gen, k, width, depth, eps, bias=1.0):
    """A ReLU MLP 4 -> 4 whose weights are eps-perturbed rank-k partial isometries V_ℓV_{ℓ−1}ᵀ with non-negative
    V (disjoint supports, so ReLU passes the k-dim signal of non-negative inputs): a real bottleneck, small S."""
    net = random_net(gen, leak=0.0, bias=bias, depth=depth, widths=[width] * (depth - 1), d_in=4, d_out=4)
    dims = [4] + [width] * (depth - 1) + [4]
    V = []
    for n in dims:
        v = torch.zeros(n, k, dtype=torch.float64)
        v[torch.randperm(n, generator=gen)[:k], torch.arange(k)] = 1.0
        V.append(v)
    with torch.no_grad():
        for l, W in enumerate(net.weights):
            noise = torch.randn(dims[l + 1], dims[l], generator=gen, dtype=torch.float64)
            W[:, : dims[l]] = V[l + 1] @ V[l].T + eps * noise
            W[:, -1] = eps * torch.rand(dims[l + 1], generator=gen, dtype=torch.float64)
    return net


def test_corollary8_bound_follows_from_the_theorem6_proxy(gen):
    """Cor. 8's explicit form: per layer s_{k+1}(α̃_ℓ/√N) <= s_1([α_{ℓ−1}, β]/√N)·√(e_ℓ(k) + ‖c_ℓ‖²) (Horn, Weyl),
    computed here from `theorem6_check`'s proxies at the sample that sets S; Markov then leaves fewer than
    pL layers above √(S/(pL))·s_1(...). Random nets, and near-bottleneck nets whose middle tails are small."""
    for trial in range(24):
        near = trial % 2 == 1
        net = near_bottleneck_net(gen, 2, 8, 8, 1e-3) if near else random_net(gen, leak=0.0, d_out=2)
        X = torch.rand(40, 4, generator=gen, dtype=torch.float64) + (0.5 if near else -0.5)  # >= 0 for the near nets
        k = int(jacobian_ranks(net, X).max())
        if k == 0:  # a dead random ReLU net: Cor. 8 needs a sample of positive rank
            continue
        c8 = corollary8_check(net, X, k)
        assert c8.passed and c8.measured >= 0.75 and c8.S >= 0
        J = jacobian(net, X)
        two_lp = 2 * torch.log(torch.linalg.svdvals(J)[:, :k]).sum(1)
        best = int(torch.where(jacobian_ranks(net, X) == k, two_lp, torch.full_like(two_lp, -torch.inf)).argmax())
        t6 = theorem6_check(net, X[best], k)
        assert c8.S == pytest.approx(t6.bound, rel=1e-12)
        bias_sq = [float((W[:, -1] ** 2).sum()) for W in net.weights]
        for tail, a, e, b in zip(c8.tail, c8.input_norm, t6.proxies, bias_sq):
            assert tail <= a * (e + b) ** 0.5 * (1 + 1e-9) + 1e-12
        assert sum(e + b > c8.S / (0.25 * net.depth) for e, b in zip(t6.proxies, bias_sq)) < 0.25 * net.depth
        if near:  # a real bottleneck: rank 2 and small tails in the middle layers, where rounding could bite
            assert k == 2 and max(c8.tail[2:-2]) < 1e-2


# ---------------------------------------------------------------------------- fact 8
@pytest.mark.parametrize("bias, leak, tail", [(1.0, 0.0, 0), (1.0, -0.6, 0), (0.5, 0.3, 1), (0.0, 0.2, 0)])
def test_ntk_trace_matches_closed_form(gen, bias, leak, tail):
    net = random_net(gen, leak=leak, bias=bias, depth=4, linear_tail=tail)
    X = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    auto, closed = ntk_trace(net, X), ntk_trace_closed_form(net, X)
    assert torch.allclose(auto, closed, rtol=1e-10, atol=0)
    assert float(ntk_trace(net, X[2])) == pytest.approx(float(closed[2]), rel=1e-10)


def test_ntk_trace_of_a_linear_net_by_hand(gen):
    """For f(x) = W2 W1 x: Tr Θ = ‖x‖²‖W2‖² + d_out‖W1 x‖²."""
    net = random_net(gen, leak=1.0, bias=0.0, depth=2, widths=[5])
    W1, W2 = net.weight_matrices()
    x = torch.randn(4, generator=gen, dtype=torch.float64)
    hand = float((x**2).sum() * (W2**2).sum() + 3 * ((W1 @ x) ** 2).sum())
    assert float(ntk_trace(net, x)) == pytest.approx(hand, rel=1e-12)


# ---------------------------------------------------------------------------- fact 9
def test_rebalance_preserves_function_and_theorem7_holds(gen):
    ratios = []
    for _ in range(25):
        net = random_net(gen, widths=None)
        X = torch.randn(4, 4, generator=gen, dtype=torch.float64)
        bal = rebalance(net)
        assert torch.allclose(bal(X), net(X), rtol=0, atol=1e-12 * max(1.0, float(net(X).abs().max())))
        assert float(bal.sq_norm()) <= float(net.sq_norm()) + 1e-12
        assert max(float(r.max()) for r in balancedness_residual(bal)) < 1e-10
        for x in X:
            if int(jacobian_ranks(bal, x)) >= 1:
                ratios.append(theorem7_check(bal, x).ratio)
    assert len(ratios) > 50 and min(ratios) >= 1


def test_rebalanced_norms_increase_with_depth(gen):
    """Balancedness implies ‖W_ℓ‖² (bias column included) is non-decreasing in ℓ (Part 2 §2.4)."""
    bal = rebalance(random_net(gen, depth=5))
    norms = [float((W**2).sum()) for W in bal.weights]
    assert all(b >= a - 1e-10 for a, b in zip(norms[:-1], norms[1:]))


# ---------------------------------------------------------------------------- fact 11
def test_width_k_layer_caps_jacobian_rank(gen):
    for k in (1, 2, 3):
        net = random_net(gen, depth=4, widths=[8, k, 8], d_in=6, d_out=5)
        X = torch.randn(20, 6, generator=gen, dtype=torch.float64)
        ranks = jacobian_ranks(net, X, rtol=1e-10)
        assert int(ranks.max()) <= k
        assert int(ranks.max()) == k  # leaky σ (a != 0) keeps every D_l invertible: generically rank k


def test_linear_net_jacobian_rank_is_product_rank(gen):
    net = random_net(gen, leak=1.0, bias=0.0, depth=3, widths=[6, 2], d_in=5, d_out=4)
    W1, W2, W3 = net.weight_matrices()
    P = W3 @ W2 @ W1
    X = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    assert torch.allclose(jacobian(net, X), P.expand(3, 4, 5), atol=1e-12)
    assert jacobian_ranks(net, X).tolist() == [int(torch.linalg.matrix_rank(P))] * 3 == [2] * 3


def test_bottleneck_rank_reads_middle_spectra(gen):
    net = random_net(gen, depth=8, widths=[6] * 7, d_in=6, d_out=6)
    with torch.no_grad():
        for W in net.weight_matrices()[2:6]:
            U, s, Vh = torch.linalg.svd(W)
            W.copy_(U[:, :2] @ Vh[:2] + 0.05 * U[:, 2:3] @ Vh[2:3])  # singular values 1, 1, 0.05
    est = bottleneck_rank(net, atol=0.1)
    assert est.layers == [2, 3, 4, 5, 6] and est.k_mid == 2


# ---------------------------------------------------------------------------- bad input
def test_bad_input_is_a_one_line_error(gen):
    net = random_net(gen, depth=3)
    with pytest.raises(FeaturelabError, match="d_in=4"):
        jacobian(net, torch.zeros(2, 5))
    with pytest.raises(FeaturelabError, match="one sample"):
        theorem6_check(net, torch.zeros(2, 4))
    with pytest.raises(FeaturelabError, match="p=1.5"):
        theorem6_check(net, torch.zeros(4), p=1.5)
    with pytest.raises(FeaturelabError, match="homogeneous"):
        rebalance(MLP(3, 2, 4, 3, activation="tanh"))
    with pytest.raises(FeaturelabError, match="featurelab MLP"):
        ntk_trace_closed_form(torch.nn.Linear(3, 2), torch.zeros(1, 3))
