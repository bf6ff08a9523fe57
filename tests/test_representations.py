"""docs/theory/sparsity.md §7 checks 1, 2, 3 (balanced linear net), 9 and bad input: Prop. 1 reformulation,
forces against autograd, exact balance, projected GD on representations."""

import pytest
import torch

from featurelab import MLP, FeaturelabError
from featurelab.measurements import (
    covariance_pairs,
    layer_forces,
    projected_gd_step,
    regularized_loss,
    representation_loss,
    weights_from_representations,
)
from featurelab.measurements.representations import layers
from featurelab.models import mlp_with_weights

D = torch.float64


def random_net(gen, beta, activation="leaky_relu", N=7, widths=(5, 4), d_in=3, d_out=2):
    m = MLP(d_in, d_out, list(widths), len(widths) + 1, bias=beta, activation=activation, dtype=D, seed=3)
    with torch.no_grad():
        for W in m.weights:
            W.copy_(torch.randn(W.shape, generator=gen, dtype=D))
    X = torch.randn(N, d_in, generator=gen, dtype=D)
    Y = torch.randn(N, d_out, generator=gen, dtype=D)
    return m, X, Y


@pytest.mark.parametrize("activation", ["leaky_relu", "tanh"])
@pytest.mark.parametrize("beta", [0.0, 0.7, 1.0])
def test_reformulation_equality(gen, beta, activation):
    """Check 1: L_λ(θ^min) = L^rep(Z(θ)), L_λ(θ) >= L^rep, θ^min has the same outputs, both forms agree."""
    m, X, Y = random_net(gen, beta, activation)
    lam = 0.1
    rep = representation_loss(m, X, Y, lam)
    m_min = mlp_with_weights(m, rep.weights)
    assert regularized_loss(m_min, X, Y, lam) == pytest.approx(rep.loss, rel=1e-10)
    assert regularized_loss(m, X, Y, lam) >= rep.loss - 1e-10
    assert torch.allclose(m_min(X), m(X), rtol=0, atol=1e-10 * float(m(X).detach().abs().max()))
    kern = representation_loss(m, X, Y, lam, form="kernel")
    assert max(c**2 for c in rep.conds) <= 1e8
    assert kern.loss == pytest.approx(rep.loss, rel=1e-8)
    # the free-representation route (lstsq) gives the same min-norm weights
    W, viol = weights_from_representations(m, X, layers(m, X).pre)
    assert max(viol) < 1e-10
    for a, b in zip(W, rep.weights):
        assert torch.allclose(a, b, atol=1e-9)
    # wider than N: the weights have a component outside the representations' row space, which L^rep drops
    wide, Xw, Yw = random_net(gen, beta, activation, widths=(9, 8))
    rep_w = representation_loss(wide, Xw, Yw, lam)
    assert regularized_loss(wide, Xw, Yw, lam) > rep_w.loss + 1e-3
    assert regularized_loss(mlp_with_weights(wide, rep_w.weights), Xw, Yw, lam) == pytest.approx(rep_w.loss, rel=1e-10)


def rep_loss_autograd(m, X, Y, lam, Zs):
    """L^rep of free representations through torch.linalg.pinv (independent of the explicit formulas)."""
    a, total = X, 0.0
    for l, Z in enumerate(Zs, start=1):
        total = total + (torch.linalg.pinv(m.with_bias(a)) @ Z).pow(2).sum()
        if l < len(Zs):
            a = m.sigma(Z, l)
    return ((Zs[-1] - Y) ** 2).sum() / Y.shape[0] + lam * total


@pytest.mark.parametrize("activation", ["leaky_relu", "tanh"])
def test_forces_match_autograd(gen, activation):
    """Check 2: ∂L^rep/∂Z_l = -(F^att + F^rep) for every layer, at a full-rank point (N > widths + 1)."""
    m, X, Y = random_net(gen, 1.0, activation, N=12, widths=(5, 4))
    lam = 0.3
    Zs = [z.clone().requires_grad_(True) for z in layers(m, X).pre]
    grads = torch.autograd.grad(rep_loss_autograd(m, X, Y, lam, Zs), Zs)
    forces = layer_forces(m, X, Y, lam)
    assert [f.layer for f in forces] == [1, 2, 3]
    for f, g in zip(forces, grads):
        explicit = -(f.attraction + f.repulsion)
        assert (explicit - g).norm() <= 1e-7 * g.norm()


def test_forces_homogeneity(gen):
    """Check 2: a neuron that is a 2.5x copy of another feels 2.5x its forces (Part 3 §2)."""
    m, X, Y = random_net(gen, 1.0, N=12, widths=(5, 4))
    W = [w.detach().clone() for w in m.weights]
    W[0] = torch.cat([W[0], 2.5 * W[0][1:2]])
    W[1] = torch.cat([W[1][:, :5], torch.randn(4, 1, generator=gen, dtype=D), W[1][:, 5:]], dim=1)
    m2 = mlp_with_weights(m, W)
    f = layer_forces(m2, X, Y, 0.2)[0]
    for F in (f.attraction, f.repulsion):
        assert F[:, 1].norm() > 1e-6
        assert torch.allclose(F[:, 5], 2.5 * F[:, 1], rtol=1e-9, atol=1e-12 * float(F.abs().max()))


def test_balanced_linear_net_exact_balance(gen):
    """Check 3: X = I, L = 3, σ = id, W_1 = S^⅓Vᵀ, W_2 = S^⅓, W_3 = US^⅓ is exactly balanced, K_l = (YᵀY)^{l/3}
    (the papers' columns; ours Y Yᵀ... in rows: Z_l Z_lᵀ = (Y Yᵀ)^{l/3}), ‖θ‖² = 3 Σ s^⅔; doubling Z_1 breaks it."""
    N, d_out, r = 6, 4, 4
    Y = torch.randn(N, d_out, generator=gen, dtype=D)
    U, s, Vh = torch.linalg.svd(Y.T, full_matrices=False)  # the papers' Y (d_out x N) = U S Vᵀ
    c = torch.diag(s ** (1 / 3))
    m = MLP(N, d_out, [r, r], 3, leak=1.0, bias=0.0, dtype=D)
    with torch.no_grad():
        for p, W in zip(m.weights, (c @ Vh, c, U @ c)):
            p.copy_(W)
    X = torch.eye(N, dtype=D)
    assert torch.allclose(m(X), Y, atol=1e-12)
    assert float(m.sq_norm().detach()) == pytest.approx(3 * float((s ** (2 / 3)).sum()), rel=1e-12)
    lay = layers(m, X)
    evals, evecs = torch.linalg.eigh(Y @ Y.T)
    for l in (1, 2):
        power = evecs @ torch.diag(evals.clamp_min(0) ** (l / 3)) @ evecs.T
        assert torch.allclose(lay.pre[l - 1] @ lay.pre[l - 1].T, power, atol=1e-10)
    for f in layer_forces(m, X, Y, 0.1)[:2]:
        assert f.balance <= 1e-10
    with torch.no_grad():
        m.weights[0].mul_(2.0)
        m.weights[1].div_(2.0)
    assert torch.allclose(m(X), Y, atol=1e-12)
    assert layer_forces(m, X, Y, 0.1)[0].balance >= 0.5


def test_projected_gd_step_decreases_loss(gen):
    """Check 9: one projected GD step on representations (η = 1e-4) does not increase L^rep."""
    m, X, Y = random_net(gen, 1.0, N=12, widths=(5, 4))
    lam = 0.05
    before = representation_loss(m, X, Y, lam).loss
    Zs = projected_gd_step(m, X, layers(m, X).pre, Y, lam, lr=1e-4)
    W, viol = weights_from_representations(m, X, Zs)
    assert max(viol) < 1e-9
    after = representation_loss(mlp_with_weights(m, W), X, Y, lam).loss
    assert after < before


def test_bad_input(gen):
    """One-line errors for tanh in covariance tools, width mismatch and NaN."""
    m, X, Y = random_net(gen, 1.0, "tanh")
    with pytest.raises(FeaturelabError, match="positively homogeneous"):
        covariance_pairs(m, X)
    m, X, Y = random_net(gen, 1.0)
    with pytest.raises(FeaturelabError, match="d_in=3"):
        representation_loss(m, X[:, :2], Y, 0.1)
    Xn = X.clone()
    Xn[0, 0] = float("nan")
    with pytest.raises(FeaturelabError, match="NaN"):
        layer_forces(m, Xn, Y, 0.1)
    with pytest.raises(FeaturelabError, match="rows"):
        representation_loss(m, X, Y[:3], 0.1)


def test_covariance_pairs_are_grams(gen):
    """Part 3 §3: K^σ_l = σ(Z_l)σ(Z_l)ᵀ + β²11ᵀ and the kernel-form penalty equals Σ Tr[K_l (K^σ_{l-1})⁺]."""
    m, X, Y = random_net(gen, 0.7, N=12, widths=(5, 4))
    pairs = covariance_pairs(m, X)
    Z1 = layers(m, X).pre[0]
    assert torch.allclose(pairs[0].K_sigma, torch.relu(Z1) @ torch.relu(Z1).T + 0.49, atol=1e-12)
    lay = layers(m, X)
    Ks = [lay.inputs[0] @ lay.inputs[0].T] + [p.K_sigma for p in pairs]
    Ks_next = [p.K for p in pairs] + [lay.pre[-1] @ lay.pre[-1].T]
    pen = sum(float(torch.trace(torch.linalg.pinv(a, hermitian=True, rtol=1e-10) @ k)) for a, k in zip(Ks, Ks_next))
    rep = representation_loss(m, X, Y, 1.0)
    assert pen == pytest.approx(sum(rep.norms), rel=1e-8)


def test_tikhonov_form_matches_projection_form(gen):
    """Part 3 §2 'Stable evaluation': Tr[Zᵀ(K^σ+εI)^-1 Z] with ε = 1e-8·TrK^σ/N is within ~ε/s_min² of L^rep."""
    from featurelab.measurements import tikhonov_loss

    m, X, Y = random_net(gen, 1.0, N=12, widths=(5, 4))
    rep = representation_loss(m, X, Y, 0.1)
    tik = float(tikhonov_loss(m, X, layers(m, X).pre, Y, 0.1))
    assert max(c**2 for c in rep.conds) < 1e4
    assert tik == pytest.approx(rep.loss, rel=1e-5)
    assert tik <= rep.loss  # ε > 0 can only lower each term


def test_representation_descent_lowers_the_loss(gen):
    """Projected GD as an optimizer: L^rep decreases step by step and the realized net attains it."""
    from featurelab.measurements import representation_descent

    m, X, Y = random_net(gen, 1.0, N=12, widths=(5, 4))
    net, hist = representation_descent(m, X, Y, 0.05, lr=1e-3, steps=5)
    assert len(hist) == 6 and all(b <= a for a, b in zip(hist, hist[1:])) and hist[-1] < hist[0]
    assert regularized_loss(net, X, Y, 0.05) == pytest.approx(hist[-1], rel=1e-8)
