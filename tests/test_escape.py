"""docs/theory/saddle-to-saddle.md §7: localized loss, escape directions and the propositions (float64)."""

import math

import numpy as np
import pytest
import torch

from featurelab import MLP, FeaturelabError
from featurelab.data import circle_dataset
from featurelab.measurements import (
    blowup_time,
    eq6_curve,
    escape_norm,
    escape_speed,
    escape_time,
    extend_depth,
    find_escape_directions,
    layer_diagnostics,
    localized_loss,
    prop33_check,
    prop34_check,
    rank_one_chain,
    rank_one_curve,
    second_singular_bound,
    theorem31_bound,
    theorem31_check,
)
from featurelab.measurements.escape import forward
from featurelab.measurements.ranks import numerical_rank

SQ2M1 = math.sqrt(2) - 1


def random_net(dims, gen):
    return [torch.randn(n, m, generator=gen, dtype=torch.float64) for m, n in zip(dims[:-1], dims[1:])]


def sq_norm(Ws):
    return float(sum((W**2).sum() for W in Ws))


def rank_two():
    """Example 1's rank-two optimum (§5), W_3 = [-1] for G = ((-1)^j)."""
    return [
        0.5 * torch.tensor([[1.0, 0], [0, 1], [-1, 0], [0, -1]], dtype=torch.float64),
        0.5 * torch.tensor([[1.0, -1, 1, -1]], dtype=torch.float64),
        torch.tensor([[-1.0]], dtype=torch.float64),
    ]


def rank_one(phi=0.0, sign=1.0):
    return [
        torch.tensor([[math.cos(phi), math.sin(phi)]], dtype=torch.float64),
        torch.tensor([[1.0]], dtype=torch.float64),
        torch.tensor([[sign]], dtype=torch.float64),
    ]


# ------------------------------------------------------------------------ §2 homogeneity
@pytest.mark.parametrize("L", [2, 3, 4, 5, 6])
def test_homogeneity_and_euler(L, gen):
    X = torch.randn(7, 3, generator=gen, dtype=torch.float64)
    G = torch.randn(7, 2, generator=gen, dtype=torch.float64)
    Ws = random_net([3] + [5] * (L - 1) + [2], gen)
    l0 = float(localized_loss(Ws, X, G))
    for lam in (0.3, 2.7):
        assert float(localized_loss([lam * W for W in Ws], X, G)) == pytest.approx(lam**L * l0, rel=1e-10)
    params = [W.clone().requires_grad_(True) for W in Ws]
    value = localized_loss(params, X, G)
    grads = torch.autograd.grad(value, params)
    euler = sum(float((g * W).sum()) for g, W in zip(grads, Ws))
    assert euler == pytest.approx(L * float(value.detach()), rel=1e-10)


def test_localized_loss_is_trace_in_both_conventions(gen):
    """Tr[Gᵀ Y] with the papers' columns equals Σ G∘Y with rows; the MLP gives the same number as its weights."""
    net = MLP(3, 2, 4, 3, bias=0.0, init="absolute", init_scale=1.0, seed=3, dtype=torch.float64)
    X = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    G = torch.randn(6, 2, generator=gen, dtype=torch.float64)
    Y = net(X).detach()
    assert float(localized_loss(net, X, G).detach()) == pytest.approx(float(torch.trace(G @ Y.T)), rel=1e-12)
    assert float(localized_loss(net, X, G).detach()) == pytest.approx(
        float(localized_loss(net.weight_matrices(), X, G).detach())
    )


def test_speed_bound_on_sphere(gen):
    """AM-GM on ‖θ‖² = L: |L0| <= ‖X‖‖G‖ (§2)."""
    for L in (2, 3, 5):
        X = torch.randn(9, 4, generator=gen, dtype=torch.float64)
        G = torch.randn(9, 3, generator=gen, dtype=torch.float64)
        bound = float(torch.linalg.norm(X) * torch.linalg.norm(G))
        for _ in range(50):
            Ws = random_net([4] + [6] * (L - 1) + [3], gen)
            scale = math.sqrt(L / sq_norm(Ws))
            l0 = float(localized_loss([scale * W for W in Ws], X, G))
            assert abs(l0) <= bound
            assert -l0 == pytest.approx(escape_speed(Ws, X, G), rel=1e-10)


# ------------------------------------------------------------------------- §5 Example 1
def circle(flip: bool = False):
    """Example 1's ``(X, G)``: G = ∇(½‖Y - Y*‖²) at Y = 0 = -Y*."""
    data = circle_dataset(flip=flip)
    return data.X_train, -data.Y_train


def test_circle_dataset_snapped():
    X, G = circle()
    assert X.shape == (8, 2) and G.shape == (8, 1)
    assert (X[3] == torch.tensor([0.0, -1.0], dtype=torch.float64)).all() and X[7, 0] == 0.0
    assert float(torch.linalg.norm(X)) == pytest.approx(2 * math.sqrt(2), rel=1e-15)
    assert float(torch.linalg.norm(G)) == pytest.approx(2 * math.sqrt(2), rel=1e-15)
    assert G[0, 0] == -1 and G[1, 0] == 1
    assert torch.equal(circle(flip=True)[1], -G)
    data = circle_dataset()
    assert data.n_classes is None and data.d_out == 1 and len(data.X_test) == 0


def test_example1_rank_one_curve():
    X, G = circle()
    phi = torch.linspace(0, 2 * math.pi, 8 * 500 + 1, dtype=torch.float64).numpy()
    S = rank_one_curve(phi)
    assert abs(S.max() - SQ2M1) < 1e-9
    k = phi[S.argmax()] / (math.pi / 4)
    assert abs(k - round(k)) < 1e-9
    assert abs(S - eq6_curve(phi)).max() < 1e-12
    assert S[250] < 1e-12  # φ = π/8 (grid step π/2000): speed 0
    for p in (0.1, 0.5, 1.3, 2.9):  # independent computation through the net, best sign of W_3
        best = max(-float(localized_loss(rank_one(p, s), X, G)) for s in (1.0, -1.0))
        assert best == pytest.approx(float(rank_one_curve(np.array([p]))[0]), abs=1e-14)


def test_example1_rank_one_is_exact_escape_direction():
    X, G = circle()
    rho = [W.requires_grad_(True) for W in rank_one()]
    l0 = localized_loss(rho, X, G)
    assert float(l0.detach()) == pytest.approx(1 - math.sqrt(2), abs=1e-15)
    grads = torch.autograd.grad(l0, rho)
    residual = math.sqrt(sum(float(((g + SQ2M1 * W.detach()) ** 2).sum()) for g, W in zip(grads, rho)))
    assert residual < 1e-12
    Y = rho[2] @ torch.relu(rho[1] @ torch.relu(rho[0] @ X.T))
    assert torch.allclose(Y[0, :3].detach(), torch.tensor([0.5**0.5, 1, 0.5**0.5], dtype=torch.float64), atol=1e-15)


def test_example1_rank_two_optimum():
    X, G = circle()
    Ws = rank_two()
    assert float(localized_loss(Ws, X, G)) == pytest.approx(-0.5, abs=1e-12)
    assert sq_norm(Ws) == pytest.approx(3.0, abs=1e-12)
    assert escape_speed(Ws, X, G) == pytest.approx(0.5, abs=1e-12)
    assert [numerical_rank(W, rtol=1e-9) for W in Ws] == [2, 1, 1]
    Z1s = torch.relu(X @ Ws[0].T)
    assert numerical_rank(Z1s, rtol=1e-9) == 4
    d = layer_diagnostics(Ws, X)
    assert d["r_Z"][1] == pytest.approx(0.625, abs=1e-12)
    assert d["r_Z"][2] == pytest.approx(0.0, abs=1e-12)
    assert d["r_W"] == pytest.approx([0.5, 0.0, 0.0], abs=1e-12)
    assert d["lin"] == pytest.approx([0.5, 0.5], abs=1e-12)
    assert d["singular_values"][0] == pytest.approx([0.5**0.5] * 2, abs=1e-12)
    # the paper's printed W_3 = [+1] escapes for the flipped G (§8.3)
    flipped = Ws[:2] + [-Ws[2]]
    assert float(localized_loss(flipped, X, circle(flip=True)[1])) == pytest.approx(-0.5, abs=1e-12)
    # padding to width 4 changes nothing
    padded = [
        torch.cat([Ws[0], torch.zeros(0, 2, dtype=torch.float64)]),
        torch.cat([Ws[1], torch.zeros(3, 4, dtype=torch.float64)]),
        torch.cat([Ws[2], torch.zeros(1, 3, dtype=torch.float64)], dim=1),
    ]
    assert float(localized_loss(padded, X, G)) == pytest.approx(-0.5, abs=1e-12)


def test_figure2_width_sweep():
    """A1, R = 20: width 2 never beats √2-1; width 64 mostly reaches 1/2; nothing exceeds 1/2 (§5, §7)."""
    X, G = circle()
    frac, best = {}, {}
    for w in (2, 8, 64):
        res = find_escape_directions(X, G, 3, w, restarts=20, steps=4000, seed=1)
        assert res.weights[0].shape == (20, w, 2)
        norms = torch.stack([(W**2).sum((1, 2)) for W in res.weights]).sum(0)  # ‖θ‖² of each restart
        assert torch.allclose(norms, torch.full((20,), 3.0, dtype=torch.float64))
        assert float(res.speeds.max()) <= 0.5 + 1e-6
        frac[w] = float((res.speeds > SQ2M1 + 1e-3).double().mean())
        best[w] = float(res.speeds.max())
    assert frac[2] <= 0.05
    assert frac[8] <= frac[64]
    assert frac[64] >= 0.8
    assert abs(best[64] - 0.5) < 1e-3


def test_batched_restarts_equal_single_runs():
    """One batched search of 3 restarts = 3 single searches from the same starts."""
    X, G = circle()
    gen = torch.Generator().manual_seed(5)
    init = [
        torch.randn(3, 4, 2, generator=gen, dtype=torch.float64),
        torch.randn(3, 4, 4, generator=gen, dtype=torch.float64),
        torch.randn(3, 1, 4, generator=gen, dtype=torch.float64),
    ]
    batched = find_escape_directions(X, G, 3, 4, restarts=3, steps=200, init=init)
    for i in range(3):
        single = find_escape_directions(X, G, 3, 4, restarts=1, steps=200, init=[W[i] for W in init])
        assert float(single.speeds[0]) == pytest.approx(float(batched.speeds[i]), abs=1e-12)


def test_rank_one_search_tops_out_at_sqrt2_minus_1():
    X, G = circle()
    res = find_escape_directions(X, G, 3, 4, restarts=12, steps=3000, rank_one=True, seed=2)
    assert [numerical_rank(W, rtol=1e-9) for W in res.run(0)] == [1, 1, 1]
    assert abs(float(res.speeds.max()) - SQ2M1) < 1e-6
    assert float(res.speeds.max()) <= SQ2M1 + 1e-9


# ---------------------------------------------------------------------- §2 Prop 2.2
def _rk4_flow(Ws, X, G, T, n):
    def vel(Ws):
        p = [W.clone().requires_grad_(True) for W in Ws]
        return [-g for g in torch.autograd.grad(localized_loss(p, X, G), p)]

    h = T / n
    for _ in range(n):
        k1 = vel(Ws)
        k2 = vel([W + h / 2 * k for W, k in zip(Ws, k1)])
        k3 = vel([W + h / 2 * k for W, k in zip(Ws, k2)])
        k4 = vel([W + h * k for W, k in zip(Ws, k3)])
        Ws = [W + h / 6 * (a + 2 * b + 2 * c + d) for W, a, b, c, d in zip(Ws, k1, k2, k3, k4)]
    return Ws


def _check_flow(rho, X, G, L, rel, n=1500):
    s = escape_speed(rho, X, G)
    theta0 = [0.05 * W for W in rho]
    norm0 = math.sqrt(sq_norm(theta0))
    T = 0.8 * blowup_time(norm0, s, L) if L > 2 else math.log(10) / s
    out = _rk4_flow(theta0, X, G, T, n)
    norm = math.sqrt(sq_norm(out))
    assert norm == pytest.approx(escape_norm(T, norm0, s, L), rel=rel)
    assert escape_time(norm0, norm, s, L) == pytest.approx(T, rel=rel * 10)
    return sum(float((a * b).sum()) for a, b in zip(out, rho)) / (norm * math.sqrt(sq_norm(rho)))


@pytest.mark.parametrize("L", [2, 3, 4, 6])
def test_prop22_corrected_escape_norm(L):
    X = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    G = torch.tensor([[-1.0], [-1.0]], dtype=torch.float64)
    rho = rank_one_chain([1.0], [1.0, 2.0], G, L, 3)  # chain of ones padded to width 3, W_L = +e_1ᵀ
    assert escape_speed(rho, X, G) == pytest.approx(3.0, rel=1e-14)
    cos = _check_flow(rho, X, G, L, 1e-8)
    assert cos > 1 - 1e-10


def test_prop22_at_kinks():
    X, G = circle()
    _check_flow(rank_one(), X, G, 3, 5e-3, n=4000)  # explicit RK4 slides along the kink: O(h) error


# ------------------------------------------------------------------------ §3 Prop 3.2
@pytest.mark.parametrize("k", [1, 2, 3])
def test_prop32_extends_rank_two_optimum(k):
    X, G = circle()
    new = extend_depth(rank_two(), X, G, k)
    assert len(new) == 3 + k
    assert sq_norm(new) == pytest.approx(3 + k, abs=1e-12)
    assert float(localized_loss(new, X, G)) == pytest.approx(-0.5, abs=1e-10)


def test_prop32_random_nets(gen):
    checked = 0
    while checked < 20:
        L = 2 + checked % 3
        X = torch.randn(10, 3, generator=gen, dtype=torch.float64)
        G = torch.randn(10, 2, generator=gen, dtype=torch.float64)
        Ws = random_net([3] + [5] * (L - 1) + [2], gen)
        Ws = [W * math.sqrt(L / sq_norm(Ws)) for W in Ws]
        l0 = float(localized_loss(Ws, X, G))
        if l0 == 0:
            continue
        if l0 > 0:
            Ws[-1] = -Ws[-1]
            l0 = -l0
        k = 1 + checked % 3
        raw = extend_depth(Ws, X, G, k, rescale=False)
        assert float(localized_loss(raw, X, G)) <= l0 + 1e-10
        assert sq_norm(raw) <= L + k + 1e-10
        assert escape_speed(extend_depth(Ws, X, G, k), X, G) >= escape_speed(Ws, X, G) - 1e-10
        assert all(numerical_rank(W, rtol=1e-9) == 1 for W in raw[L - 2 :])
        pre = forward(raw, X)[0]
        assert all((z >= -1e-12).all() for z in pre[L - 1 : L + k - 1])
        checked += 1


# ------------------------------------------------------------------------ §3 Prop 3.4
def test_prop34_sum_form_on_random_nets(gen):
    worst = -math.inf
    for i in range(2000):
        L = 2 + i % 6
        X = torch.randn(8, 3, generator=gen, dtype=torch.float64)
        G = torch.randn(8, 2, generator=gen, dtype=torch.float64)
        Ws = random_net([3] + [4] * (L - 1) + [2], gen)
        l0 = float(localized_loss(Ws, X, G))
        if l0 == 0:
            continue
        if l0 > 0:
            Ws[-1] = -Ws[-1]
        r = prop34_check(Ws, X, G, p=0.5)
        assert r.passed and r.count_passed
        worst = max(worst, -r.slack)
    assert worst <= 0


# ------------------------------------------------------------------------ §3 Prop 3.3
def test_prop33_near_rank_one_input(gen):
    d, N, L, w = 4, 6, 4, 8
    u = torch.rand(d, generator=gen, dtype=torch.float64) + 0.1
    v = torch.rand(N, generator=gen, dtype=torch.float64) + 0.1
    G = torch.randn(N, 2, generator=gen, dtype=torch.float64)
    eps = 0.03 * float(torch.linalg.norm(u) * torch.linalg.norm(v))
    E = torch.randn(N, d, generator=gen, dtype=torch.float64)
    X = v[:, None] * u[None, :] + eps * E / torch.linalg.norm(E)
    chain = rank_one_chain(u, v, G, L, w)
    clean = v[:, None] * u[None, :]
    assert float(localized_loss(chain, clean, G)) == pytest.approx(
        -float(torch.linalg.norm(G.T @ v) * torch.linalg.norm(u)), rel=1e-12
    )
    res = find_escape_directions(X, G, L, w, restarts=1, steps=6000, init=chain)
    check = prop33_check(res.run(0), X, G, u, v, eps)
    assert check.precondition
    assert check.measured <= check.bound


# ------------------------------------------------------------------------ §3 Thm 3.1
def test_theorem31_example1_is_vacuous():
    X, G = circle()
    thm = theorem31_bound(X, G, 0.5, 1420)
    c, B = thm.c, thm.bounds
    assert c == pytest.approx(16 * math.sqrt(2 * math.log(16)), abs=1e-12)
    assert c == pytest.approx(37.677, abs=1e-3)
    assert all(math.isinf(b) for b in B[:1419]) and math.isfinite(B[1419])
    Ws = rank_two()
    d = layer_diagnostics(Ws, X)
    B3 = theorem31_bound(X, G, 0.5, 3).bounds
    assert all(r <= b for r, b in zip(d["r_W"], B3))


def test_second_singular_bound_is_sharp_and_scales_as_l_to_the_minus_quarter():
    """s_2/s_1 <= sqrt(r/(1-r)) (numpy SVD, an independent computation), with equality at rank two; and with
    B(ℓ) of Thm 3.1, sqrt(B/(1-B))·ℓ^{1/4} -> sqrt(8c) (the abstract's O(ℓ^{-1/4}))."""
    rng = np.random.default_rng(0)
    for k in (2, 3, 6):
        M = rng.normal(size=(7, k)) @ rng.normal(size=(k, 5))
        s = np.linalg.svd(M, compute_uv=False)
        r = (s[1:] ** 2).sum() / (s**2).sum()
        bound = second_singular_bound(r)
        assert s[1] / s[0] <= bound * (1 + 1e-12)
        if k == 2:
            assert s[1] / s[0] == pytest.approx(bound, rel=1e-10)
    assert math.isinf(second_singular_bound(1.0))
    X, G = circle()
    c = theorem31_bound(X, G, 0.5, 2).c
    for ell in (10**12, 10**14):
        q = c / math.sqrt(ell)
        b = 8 * q / (1 - q)
        assert second_singular_bound(b) * ell**0.25 == pytest.approx(
            math.sqrt(8 * c), rel=3e-3 if ell == 10**12 else 3e-4
        )


def test_theorem31_on_optima_found_by_projected_gd():
    """Thm 3.1 at optima found by projected GD (A1), on nearly rank-one data with G along v, where c < 1 and the
    bound is informative at every layer: every r_W, r_Z, lin and s_2/s_1 is within it. The check can fail:
    a random θ read with s* = ‖X‖‖G‖ (c = 0, B = 0) violates it."""
    gen = torch.Generator().manual_seed(0)
    u = torch.rand(4, generator=gen, dtype=torch.float64) + 0.5
    v = torch.rand(6, generator=gen, dtype=torch.float64) + 0.5
    E = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    X = v[:, None] * u[None, :] + 0.05 * E * float(u.norm() * v.norm() / E.norm())
    G = -v[:, None] * torch.tensor([[1.0, -0.5]], dtype=torch.float64)
    res = find_escape_directions(X, G, 4, 6, restarts=4, steps=2000, seed=1)
    check = theorem31_check(res.best()[1], X, G)
    assert check.c < 1 and check.informative == [1, 2, 3, 4]
    assert check.passed and max(check.B) < 1
    top = float(torch.linalg.norm(X) * torch.linalg.norm(G))
    bad = theorem31_check(
        [
            torch.randn(6, 4, generator=gen),
            torch.randn(6, 6, generator=gen),
            torch.randn(6, 6, generator=gen),
            torch.randn(2, 6, generator=gen),
        ],
        X,
        G,
        s_star=top,
    )
    assert check.B[0] > 0 and bad.B == [0.0] * 4 and not bad.passed and bad.measured > 0


# ------------------------------------------------------------------------ bad input
def test_bad_input_is_one_line_error(gen):
    X, G = circle()
    biased = MLP(2, 1, 4, 3, bias=1.0)
    cases = [
        (lambda: localized_loss(biased, X, G), "bias"),
        (lambda: localized_loss([torch.ones(4, 3), torch.ones(4, 4), torch.ones(1, 4)], X, G), "bias column"),
        (lambda: localized_loss(rank_two(), X, G.T), "G has shape"),
        (lambda: localized_loss(rank_two(), X, torch.ones(8, 2)), "G has shape"),
        (lambda: localized_loss([torch.ones(1, 2)], X, G), "depth"),
        (lambda: find_escape_directions(X, G, 1, 4), "depth"),
        (lambda: find_escape_directions(X, G, 3, 4, lr=0.0), "lr"),
        (lambda: find_escape_directions(X, G, 3, 4, lr=-1.0), "lr"),
        (lambda: escape_time(1.0, -2.0, 0.5, 3), "radius"),
        (lambda: escape_norm(1.0, 0.0, 0.5, 3), "norm0"),
        (lambda: blowup_time(1.0, 0.0, 3), "speed"),
        (lambda: theorem31_bound(X, G, 0.0, 3), "s_star"),
        (lambda: extend_depth(rank_two(), X, G, -1), "k"),
    ]
    for fn, word in cases:
        with pytest.raises(FeaturelabError) as err:
            fn()
        assert word in str(err.value) and "\n" not in str(err.value)
