"""Part 1 §4 T1-T4, T8, T9: the backward variables, the Hamiltonian identities and the symmetries of
Leaky ResNets, each checked against an independent computation (float64, rows are samples)."""

import math

import numpy as np
import pytest
import torch

import featurelab as fl
from featurelab.measurements.cost_of_identity import features
from featurelab.measurements.hamiltonian import (
    backward_variables,
    balancedness_residual,
    hamiltonian_gradients,
    lagrangian_weights,
    layer_energies,
)
from featurelab.training.certify import Pieces
from featurelab.training.objectives import data_cost

LAM = 0.01


def random_net(gen, w=8, N=12, L=6, Lt=2.0, d_in=3, d_out=2, bias_scale=0.3):
    """A small float64 Leaky ResNet with random positive steps (Σρ ≠ 1), perturbed weights and biases."""
    rho = (0.3 + torch.rand(L, generator=gen, dtype=torch.float64)) / L
    model = fl.LeakyResNet(
        d_in, d_out, w, L, Lt, steps=rho, seed=int(torch.randint(1000, (1,), generator=gen)), dtype=torch.float64
    )
    with torch.no_grad():
        model.W.add_(0.5 * torch.randn(model.W.shape, generator=gen, dtype=torch.float64))
        model.W[:, :, -1] = bias_scale * torch.randn(L, w, generator=gen, dtype=torch.float64)
    X = torch.randn(N, d_in, generator=gen, dtype=torch.float64)
    Y = torch.randn(N, d_out, generator=gen, dtype=torch.float64)
    return model, X, Y


def loss(model, X, Y, rho=None):
    return data_cost("mse", model(X, rho=rho), Y) + model.penalty(LAM, rho=rho)


def test_autograd_B_equals_the_backward_recursion(gen):
    model, X, Y = random_net(gen)
    A, B = backward_variables(model, X, Y, LAM)
    Lt, rho, N = model.effective_depth, model.rho, X.shape[0]
    # Part 1 §3.2 recursion, written in rows: B_L = (2/(λN))(Y − A_L V_outᵀ)V_out, then backwards
    R = (2 / (LAM * N)) * (Y - A[-1] @ model.V_out.T) @ model.V_out
    torch.testing.assert_close(B[-1], R, rtol=1e-10, atol=1e-12)
    for l in range(model.depth, 0, -1):
        Wl = model.W[l - 1].detach()
        R = (1 - rho[l - 1] * Lt) * R + rho[l - 1] * (A[l - 1] > 0) * (R @ Wl)[:, :-1]
        torch.testing.assert_close(B[l - 1], R, rtol=1e-10, atol=1e-12)


def test_weight_gradient_and_residual(gen):
    model, X, Y = random_net(gen)
    A, B = backward_variables(model, X, Y, LAM)
    (grad,) = torch.autograd.grad(loss(model, X, Y), [model.W])
    Lt = model.effective_depth
    df = fl.measurements.geodesic_diagnostics(model, X, Y, LAM)
    for l in range(1, model.depth + 1):
        Wl, rho = model.W[l - 1].detach(), model.rho[l - 1]
        formula = rho * LAM * (Wl / Lt - B[l].T @ features(A[l - 1]))
        torch.testing.assert_close(grad[l - 1], formula, rtol=1e-10, atol=1e-14)
        r = Lt * torch.linalg.norm(grad[l - 1]) / (LAM * rho * torch.linalg.norm(Wl))
        assert df["residual"][l - 1] == pytest.approx(float(r), rel=1e-10)


def test_step_gradient_is_minus_lambda_pre_hamiltonian(gen):
    model, X, Y = random_net(gen)
    rho = model.rho.clone().requires_grad_()
    (grad,) = torch.autograd.grad(loss(model, X, Y, rho=rho), [rho])
    df = fl.measurements.geodesic_diagnostics(model, X, Y, LAM)
    np.testing.assert_allclose(grad.numpy(), -LAM * df["pre_hamiltonian"].to_numpy(), rtol=1e-10)
    # 𝓗ᵖʳᵉ <= 𝓗 (§3.3): the Hamiltonian is the maximum over W of the pre-Hamiltonian
    assert (df["pre_hamiltonian"] <= df["hamiltonian"] + 1e-12).all()


@pytest.mark.parametrize(
    "gamma,mode",
    [
        (1e-3, "absolute"),
        (1.0, "absolute"),
        (10.0, "absolute"),
        (1e-3, "relative"),
        (1.0, "relative"),
        (10.0, "relative"),
    ],
)
def test_theorem4_identity_and_bounds_at_the_critical_velocity(gen, gamma, mode):
    A = torch.randn(9, 7, generator=gen, dtype=torch.float64)  # N = 9 samples, w = 7 (the papers' 7×9, transposed)
    B = torch.randn(9, 7, generator=gen, dtype=torch.float64)
    Lt = 2.5
    S = features(A)
    D = Lt * (S @ S.T @ B - A)  # the critical-point velocity L̃(BK − A), in rows
    e = layer_energies(A, B, D, Lt, gamma, mode)
    # independent 𝓗 of eq. 1 from the critical weights W = L̃ Bᵀσ(A): 𝓗 = Tr[Bᵀ(σ(A)Wᵀ − L̃A)] − ‖W‖²/(2L̃)
    W = Lt * B.T @ S
    H = float((B * (S @ W.T - Lt * A)).sum() - (W**2).sum() / (2 * Lt))
    assert e["hamiltonian"] == pytest.approx(H, rel=1e-10)
    assert e["thm4"] == pytest.approx(e["hamiltonian"], rel=1e-9)
    for k in ("slack_a", "slack_b", "slack_c"):
        assert e[k] >= -1e-9 * max(1.0, abs(e["hamiltonian"])), k
    # the kinetic norm through an independent dense solve
    g = gamma * float(torch.linalg.matrix_norm(S, 2)) ** 2 if mode == "relative" else gamma
    kappa = float((D * torch.linalg.solve(S @ S.T + g * torch.eye(9, dtype=torch.float64), D)).sum()) / Lt**2
    assert e["kappa"] == pytest.approx(kappa, rel=1e-9)


@pytest.mark.parametrize("c", [0.5, 3.0])
def test_stretching_symmetry(gen, c):
    model, X, Y = random_net(gen)
    stretched = fl.LeakyResNet(3, 2, 8, 6, model.effective_depth / c, steps=c * model.rho, dtype=torch.float64)
    stretched.load_state_dict({**model.state_dict(), "W": model.W.detach() / c, "rho": c * model.rho})
    A, B = backward_variables(model, X, Y, LAM)
    A2, B2 = backward_variables(stretched, X, Y, LAM)
    for a, a2, b, b2 in zip(A, A2, B, B2):
        torch.testing.assert_close(a2, a, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(b2, b, rtol=1e-12, atol=1e-13)
    assert float(loss(stretched, X, Y).detach()) == pytest.approx(float(loss(model, X, Y).detach()), rel=1e-12)
    d, d2 = (
        fl.measurements.geodesic_diagnostics(model, X, Y, LAM),
        fl.measurements.geodesic_diagnostics(stretched, X, Y, LAM),
    )
    np.testing.assert_allclose(d2["h_rescaled"], d["h_rescaled"], rtol=1e-12)
    np.testing.assert_allclose(d2["hamiltonian"], d["hamiltonian"] / c, rtol=1e-12)


def test_output_scaling_exact_discrete_form(gen):
    model, X, _ = random_net(gen, bias_scale=0.0)
    c, Lt, rho = 0.7, model.effective_depth, model.rho
    ratio = (1 - rho * (Lt + c)) / (1 - rho * Lt)
    s = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(ratio, 0)])
    shifted = fl.LeakyResNet(3, 2, 8, 6, Lt + c, steps=rho, dtype=torch.float64)
    shifted.load_state_dict({**model.state_dict(), "W": model.W.detach() * ratio[:, None, None]})
    with torch.no_grad():
        for l, (a, a2) in enumerate(zip(model.representations(X), shifted.representations(X))):
            torch.testing.assert_close(a2, s[l] * a, rtol=1e-12, atol=1e-13)


def test_output_scaling_first_order_in_the_step(gen):
    w, Lt, c = 6, 2.0, 1.0
    M1 = torch.randn(w, w, generator=gen, dtype=torch.float64) / w**0.5
    M2 = torch.randn(w, w, generator=gen, dtype=torch.float64) / w**0.5
    X = torch.randn(10, 3, generator=gen, dtype=torch.float64)

    def error(L):  # unchanged weights W(p) = L̃I + cos(2πp)M1 + pM2 (bias 0), sampled at p_{l-1}
        p = torch.arange(L, dtype=torch.float64) / L
        W = Lt * torch.eye(w) + torch.cos(2 * math.pi * p)[:, None, None] * M1 + p[:, None, None] * M2
        W = torch.cat([W, torch.zeros(L, w, 1, dtype=torch.float64)], dim=2)
        ends = []
        for depth_eff in (Lt, Lt + c):
            net = fl.LeakyResNet(3, 2, w, L, depth_eff, dtype=torch.float64)
            net.load_state_dict({**net.state_dict(), "W": W})
            with torch.no_grad():
                ends.append(net.representations(X)[-1])
        return float(torch.linalg.norm(ends[1] - math.exp(-c) * ends[0]) / torch.linalg.norm(ends[0]))

    assert 0.4 <= error(200) / error(100) <= 0.6


def test_diagnostics_table_and_bad_inputs(gen):
    model, X, Y = random_net(gen)
    df = fl.measurements.geodesic_diagnostics(model, X, Y, LAM)
    assert len(df) == model.depth and df["layer"].tolist() == list(range(1, 7))
    np.testing.assert_allclose(df["p"], model.positions[:-1].numpy())
    s = df.attrs["summary"]
    assert s["h_median"] == pytest.approx(float(np.median(-2 * df["hamiltonian"] / model.effective_depth)))
    with torch.no_grad():
        reps = model.representations(X)
    assert s["path_length_F"] == pytest.approx(
        sum(float(torch.linalg.norm(reps[l] - reps[l - 1])) for l in range(1, 7))
    )
    bad = [
        ((fl.MLP(3, 2, 8, 2), X, Y, LAM), {}, "model"),
        ((model, X, Y[:5], LAM), {}, "rows"),
        ((model, X, Y, 0.0), {}, "lam"),
        ((model, X, Y, LAM), {"gamma0": -1.0}, "gamma0"),
        ((model, X.clone().fill_(float("nan")), Y, LAM), {}, "X"),
        ((model, X[:, :2], Y, LAM), {}, "X"),
    ]
    for args, kw, word in bad:
        with pytest.raises(fl.FeaturelabError, match=word):
            fl.measurements.geodesic_diagnostics(*args, **kw)


def hamiltonian_flow(A0, B0, Lt, n):
    """A representation geodesic by RK4 (n steps on [0, 1]) of Jacot & Kaiser's Hamiltonian equations, in rows:
    ∂A = σ(A)Wᵀ − L̃A, ∂B = L̃B − 1[A>0] ⊙ (BW)[:, :w], with W = L̃Bᵀσ(A) (§2.4; the continuous limit of the
    recursion of T1). Every such path is a critical path of the Lagrangian loss for its own end-point cost."""

    def rhs(A, B):
        W = Lt * B.T @ features(A)
        return features(A) @ W.T - Lt * A, Lt * B - (A > 0) * (B @ W)[:, :-1]

    h, A, B, path = 1.0 / n, A0, B0, [(A0, B0)]
    for _ in range(n):
        k1 = rhs(A, B)
        k2 = rhs(A + h / 2 * k1[0], B + h / 2 * k1[1])
        k3 = rhs(A + h / 2 * k2[0], B + h / 2 * k2[1])
        k4 = rhs(A + h * k3[0], B + h * k3[1])
        A = A + h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
        B = B + h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
        path.append((A, B))
    return path


@pytest.fixture(scope="module")
def geodesic():
    g = torch.Generator().manual_seed(3)
    Lt, n = 1.5, 2000
    A0 = torch.randn(7, 5, generator=g, dtype=torch.float64)
    B0 = 0.3 * torch.randn(7, 5, generator=g, dtype=torch.float64)
    path = hamiltonian_flow(A0, B0, Lt, n)
    W = torch.stack([Lt * B.T @ features(A) for A, B in path])  # (n+1) x w x (w+1), W_p = L̃B_pᵀσ(A_p)
    return Lt, n, path, W


def test_balancedness_rate_is_twice_prop10(geodesic):
    """d/dp ‖W_p‖² = 2L̃‖b_p‖² along a Hamiltonian geodesic (docs/leaky-resnets.md, "Balancedness"): central
    differences in p against both rates; Jacot & Kaiser's Prop. 10 states L̃‖b_p‖²."""
    Lt, n, _, W = geodesic
    E, beta = (W**2).sum(dim=(1, 2)), (W[:, :, -1] ** 2).sum(dim=1)
    dE = (E[2:] - E[:-2]) * n / 2
    assert float(beta.min()) > 1.0  # the bias carries weight: the two rates differ
    err = lambda rate: float((dE - rate * Lt * beta[1:-1]).abs().max() / dE.abs().max())
    assert err(2.0) < 0.02 and err(1.0) > 0.4
    # the discrete law on the net sampled from the geodesic at L = 200 equidistant steps
    L = 200
    p = torch.linspace(0, 1, L + 1, dtype=torch.float64)
    Wl = W[torch.arange(L) * (n // L)]
    assert balancedness_residual(Wl, p, Lt) < 1e-3
    assert balancedness_residual(Wl, p, Lt / 2) > 0.1  # = the residual at Prop. 10's rate


def test_hamiltonian_is_constant_along_the_geodesic(geodesic):
    Lt, n, path, W = geodesic
    H = []
    for (A, B), Wp in zip(path[::100], W[::100]):
        D = features(A) @ Wp.T - Lt * A
        H.append(layer_energies(A, B, D, Lt)["hamiltonian"])
    # RK4 loses its order where a ReLU switches (σ is only piecewise smooth): 1e-4 relative at n = 2000
    assert max(H) - min(H) < 1e-3 * max(abs(h) for h in H)


def test_lagrangian_weights(gen, geodesic):
    """W = (L̃A + ∂A)σ(A)⁺ (Jacot & Kaiser §2.2): on a geodesic it is W_p itself; on any net it is W_l projected
    onto the row space of σ(A_{l-1}) (an SVD projection), the minimum-norm weights moving A_{l-1} as W_l does."""
    Lt, _, path, W = geodesic
    for (A, _), Wp in zip(path[::250], W[::250]):
        D = features(A) @ Wp.T - Lt * A
        torch.testing.assert_close(lagrangian_weights(A, D, Lt), Wp, rtol=1e-9, atol=1e-10)
    model, X, Y = random_net(gen, N=6)  # N = 6 < w+1 = 9: σ(A) has a null space, so W is not identifiable
    df = fl.measurements.geodesic_diagnostics(model, X, Y, LAM)
    with torch.no_grad():
        reps = model.representations(X)
    for l in range(1, model.depth + 1):
        A, Wl = reps[l - 1], model.W[l - 1].detach()
        D = (reps[l] - A) / model.rho[l - 1]
        _, s, Vh = torch.linalg.svd(features(A), full_matrices=False)
        V = Vh[s > 1e-10 * s[0]].T
        W_lag = lagrangian_weights(A, D, model.effective_depth)
        torch.testing.assert_close(W_lag, Wl @ V @ V.T, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(features(A) @ W_lag.T - model.effective_depth * A, D, rtol=1e-9, atol=1e-9)
        assert float(torch.linalg.norm(W_lag)) < float(torch.linalg.norm(Wl))
        rel = torch.linalg.norm(Wl - W_lag) / torch.linalg.norm(Wl)
        assert df["lagrangian_residual"][l - 1] == pytest.approx(float(rel), rel=1e-9)


def symplectic_net(gen, L, Lt=1.5, w=5, N=7, lam=0.1):
    """A Leaky ResNet (d_in = d_out = w, equidistant steps) that is an exact critical point in W of its own data by
    construction: from (A_0, B_0) the symplectic-Euler recursion ``B_l = B_{l−1} − ρ∂_A𝓗(A_{l−1}, B_l)`` (solved by
    fixed-point iteration), ``A_l = A_{l−1} + ρ∂_B𝓗(A_{l−1}, B_l)``, with W_l = L̃B_lᵀσ(A_{l−1}), X = A_0U_in and
    Y = A_LV_outᵀ + (λN/2)B_LV_outᵀ, so that B_L is the data cost's backward variable (V_out is orthogonal).
    Run it under the activation mode the test uses (σ smoothed by `Pieces(beta=...)`)."""
    A0 = torch.randn(N, w, generator=gen, dtype=torch.float64)
    A, B, rho, Ws = A0, 0.3 * torch.randn(N, w, generator=gen, dtype=torch.float64), 1.0 / L, []
    for _ in range(L):
        Bn, change = B, 1.0
        while change > 1e-15:  # a contraction for small ρ
            new = B - rho * hamiltonian_gradients(A, Bn, Lt)[0]
            Bn, change = new, float(torch.linalg.norm(new - Bn) / torch.linalg.norm(new))
        Ws.append(Lt * Bn.T @ features(A))
        A, B = A + rho * hamiltonian_gradients(A, Bn, Lt)[1], Bn
    model = fl.LeakyResNet(w, w, w, L, Lt, dtype=torch.float64)
    model.load_state_dict({**model.state_dict(), "W": torch.stack(Ws)})
    V = model.V_out
    return model, A0 @ model.U_in, A @ V.T + (lam * N / 2) * B @ V.T, lam


def test_modified_hamiltonian_is_conserved_at_second_order(gen):
    """On exact critical points in W with smooth σ (softplus_5) ĥ's spread over layers falls like ρ = 1/L and that of
    the modified ĥ (𝓗 + (ρ/2)g) like ρ²; g is ⟨∂_A𝓗, ∂_B𝓗⟩ of eq. 1 there (autograd of 𝓗 against the recursions)."""
    spreads = []
    for L in (20, 40, 80):
        g = torch.Generator().manual_seed(5)
        with Pieces(beta=5.0):
            model, X, Y, lam = symplectic_net(g, L)
            df = fl.measurements.geodesic_diagnostics(model, X, Y, lam)
            A, B = backward_variables(model, X, Y, lam)
            dA, dB = zip(*(hamiltonian_gradients(A[l - 1], B[l], model.effective_depth) for l in range(1, L + 1)))
        assert df.attrs["summary"]["residual_max"] < 1e-12
        products = [float((a * b).sum()) for a, b in zip(dA, dB)]
        np.testing.assert_allclose(df["g"], products, rtol=1e-9, atol=1e-12 * max(map(abs, products)))
        s = df.attrs["summary"]
        spreads.append((s["h_spread"], s["h_modified_spread"]))
    h, m = np.array(spreads).T
    order = lambda spread: -np.polyfit(np.log([20, 40, 80]), np.log(spread), 1)[0]  # spread ∝ L^(−order)
    assert 0.8 <= order(h) <= 1.4 and 1.8 <= order(m) <= 2.6
    assert (m < 0.05 * h).all()
