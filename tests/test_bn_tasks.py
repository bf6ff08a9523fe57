"""docs/theory/bottleneck-rank.md §5, checkable facts 10 and 12: the symmetry task's exact summary statistics and
Jacobian rank, and (slow) the symmetry-learning quick preset; plus the BN-rank-2 task's construction."""

import numpy as np
import pytest
import torch
from torch.func import jacrev

from featurelab import FeaturelabError, run_experiment
from featurelab.data import bn_rank_two_task, symmetry_gd, symmetry_summary, symmetry_task


def unit(d, gen):
    u = torch.randn(d, generator=gen, dtype=torch.float64)
    return u / u.norm()


# ---------------------------------------------------------------------------- fact 10
def test_summary_recursion_equals_full_gd(gen):
    d, eta, T = 10, 0.05, 30
    u = unit(d, gen)
    W0 = 0.35 * torch.randn(50, d, generator=gen, dtype=torch.float64)  # ‖w‖² ≈ 1.2: GD is stable
    traj, costs = symmetry_gd(W0, u, torch.zeros(d, d, dtype=torch.float64), eta, T)
    m0 = W0 @ u
    r0 = (W0 - m0[:, None] * u).norm(dim=1)
    m, r, C = symmetry_summary(m0.numpy(), r0.numpy(), eta, T)
    m_gd = (traj @ u).numpy()
    r_gd = (traj - (traj @ u)[..., None] * u).norm(dim=2).numpy()
    assert np.abs(m - m_gd).max() < 1e-10
    assert np.abs(r - r_gd).max() < 1e-10
    assert np.abs(C - costs.numpy()).max() < 1e-10


def test_gd_step_is_the_gradient_step(gen):
    """One step of `symmetry_gd` is w − η∇C(w) with ∇C from autograd (E symmetric, nonzero)."""
    d, eta = 6, 0.03
    u = unit(d, gen)
    G = torch.randn(d, d, generator=gen, dtype=torch.float64)
    E = 0.1 * (G + G.T)
    w = torch.randn(d, generator=gen, dtype=torch.float64)
    cost = lambda v: ((torch.outer(v, v) - torch.outer(u, u) - E) ** 2).sum()
    traj, costs = symmetry_gd(w[None], u, E, eta, 1)
    assert torch.allclose(traj[0, 1], w - eta * jacrev(cost)(w), atol=1e-13)
    assert float(costs[0, 0]) == pytest.approx(float(cost(w)), rel=1e-13)


def test_loss_curve_has_jacobian_rank_two(gen):
    d, T, eta = 10, 10, 0.05
    u = unit(d, gen)

    def curve(w):  # the E = 0 target map w0 -> (C(w_1), ..., C(w_T)), written out for autograd
        out = []
        for _ in range(T):
            w = w - 4 * eta * ((w @ w) * w - (u @ w) * u)
            out.append((w @ w) ** 2 - 2 * (u @ w) ** 2 + 1)
        return torch.stack(out)

    for _ in range(20):
        m0 = float(torch.rand(1, generator=gen)) * 2.4 - 1.2
        v = torch.randn(d, generator=gen, dtype=torch.float64)
        v = v - (v @ u) * u
        w0 = m0 * u + (0.05 + 1.15 * float(torch.rand(1, generator=gen))) * v / v.norm()
        # the written-out map agrees with symmetry_gd
        assert torch.allclose(
            curve(w0), symmetry_gd(w0[None], u, torch.zeros(d, d, dtype=torch.float64), eta, T)[1][0, 1:], rtol=1e-12
        )
        s = torch.linalg.svdvals(jacrev(curve)(w0))
        assert float(s[2] / s[0]) < 1e-10
        assert float(s[1] / s[0]) > 1e-3


def test_symmetry_task_targets_depend_on_abs_m_and_r_only():
    data = symmetry_task(d=8, T=6, eps=0.0, n_train=64, n_test=0)
    u = torch.tensor(data.meta["u"], dtype=torch.float64)
    X = data.X_train
    flip = X - 2 * (X @ u)[:, None] * u  # (I − 2uuᵀ) w: m -> −m
    m = X @ u
    _, _, C = symmetry_summary(m.numpy(), (X - m[:, None] * u).norm(dim=1).numpy(), 0.05, 6)
    assert np.allclose(C[:, 1:] / data.meta["target_scale"], data.Y_train.numpy(), rtol=1e-12)
    _, C_flip = symmetry_gd(flip, u, torch.zeros(8, 8, dtype=torch.float64), 0.05, 6)
    assert torch.allclose(C_flip[:, 1:] / data.meta["target_scale"], data.Y_train, rtol=1e-12)
    assert float(data.Y_train.std()) == pytest.approx(1.0, rel=0.05)


def test_bn_rank_two_task_is_centred_unit_scale_and_two_dimensional():
    data = bn_rank_two_task(d=10, n_train=300, n_test=100)
    X = torch.cat([data.X_train, data.X_test])
    Y = torch.cat([data.Y_train, data.Y_test])
    for M in (X, Y):
        assert torch.allclose(M.mean(0), torch.zeros(10, dtype=torch.float64), atol=1e-12)
        assert float((M**2).sum(1).mean()) == pytest.approx(1.0, rel=1e-12)
    assert data.meta["bottleneck_rank"] == 2


def test_bad_task_input():
    with pytest.raises(FeaturelabError, match="u must have length 3"):
        symmetry_gd(torch.zeros(2, 3), torch.ones(4), torch.zeros(3, 3), 0.1, 2)
    with pytest.raises(FeaturelabError, match="eta"):
        symmetry_task(eta=-1.0)
    with pytest.raises(FeaturelabError, match="one \\(m, r\\) per sample"):
        symmetry_summary([0.1, 0.2], [0.3], 0.05, 2)


# ---------------------------------------------------------------------------- fact 12
@pytest.mark.slow
def test_symmetry_learning_quick_preset_meets_checks_1_to_3(tmp_path):
    record = run_experiment("symmetry-learning", "quick", out=tmp_path / "run", workers=1)
    by_id = {c["id"]: c for c in record.claims}
    checks = ("check1-2d-bottleneck", "check2-encodes-invariants", "check2-forgets-sign", "check3-invariance")
    claims = [by_id[f"{check}@L8-lam0.003"] for check in checks]
    assert all(c["passed"] for c in claims), [(c["id"], c["measured"]) for c in claims]


def test_path_crossings_counts_proper_crossings_of_different_paths():
    from featurelab.experiments.symmetry_learning import path_crossings

    assert path_crossings(np.array([[[0, 0], [1, 1]], [[0, 1], [1, 0]]])) == 1
    assert path_crossings(np.array([[[0, 0], [1, 1], [2, 0]], [[0, 1], [1, 0], [2, 1]]])) == 2
    assert path_crossings(np.array([[[0, 0], [1, 0]], [[0, 1], [1, 1]]])) == 0  # parallel
    assert path_crossings(np.array([[[0, 0], [1, 1], [2, 0], [1, -1]]])) == 0  # one path crossing itself does not count
    assert path_crossings(np.array([[[0, 0], [1, 0]], [[1, 0], [2, 1]]])) == 0  # touching at an end point
    # a flow's paths never cross: the radial lines t -> t·x of the map x -> 1.1x
    starts = np.random.default_rng(0).normal(size=(20, 2))
    assert path_crossings(np.stack([starts * 1.1**t for t in range(10)], 1)) == 0


def test_gradient_flow_paths_in_the_exact_invariants_never_cross():
    """Check 5's premise (Jacot 2023 Sec. 5, "the GF paths do not cross"): without E the dynamics of (|m|, r) is
    an autonomous planar flow, so gradient-flow paths (GD at a small step over the task's horizon) never cross
    there; GD at the task's own step η over 4x its horizon, a discrete map, does cross."""
    from featurelab.experiments.symmetry_learning import path_crossings

    data = symmetry_task(d=10, T=10, eps=0.0, n_train=16, n_test=0)
    u = torch.tensor(data.meta["u"])
    E = torch.zeros(10, 10, dtype=torch.float64)

    def crossings(eta, steps):
        traj = symmetry_gd(data.X_train[:12], u, E, eta, steps)[0].numpy()
        m = traj @ u.numpy()
        return path_crossings(np.stack([np.abs(m), np.linalg.norm(traj - m[..., None] * u.numpy(), axis=-1)], -1))

    assert crossings(0.005, 100) == 0
    assert crossings(0.05, 40) > 0


def test_check1_counts_the_two_dimensional_hidden_layers():
    """Check 1 across depth counts hidden layers ℓ = 1..L−1 with s₃/s₁ < 0.05 < s₂/s₁ (the output layer L is not
    hidden); which layers they are does not matter (Cor. 8 bounds how many are not low-dimensional)."""
    from featurelab.experiments.symmetry_learning import two_dim_layers, unit_claims

    two, one, wide = [1.0, 0.3, 0.01], [1.0, 0.01, 0.001], [1.0, 0.5, 0.2]
    spectra = [wide, two, two, one, two, wide]  # L = 6: hidden layers 1..5, the last entry is the output
    assert two_dim_layers(spectra) == [2, 3, 5]
    res = {
        "s_ratios": [0.3, 0.01],
        "r2": {"|m|": 0.99, "r": 0.95, "reverse": 0.97, "signed m": 0.01},
        "l_star": 2,
        "spectra": spectra,
        "symmetry_change": [0.01],
        "control_change": 0.9,
        "path_crossings": 3,
        "true_path_crossings": 2,
    }
    by_id = {c.id.split("@")[0]: c for c in unit_claims("u", res)}
    share = by_id["check1-almost-all-layers"]
    assert not share.passed and share.margin == pytest.approx((3 / 5 - 0.75) / 0.75)
    assert by_id["check5-paths-do-not-cross"].margin == pytest.approx(-0.5)  # 3 crossings against 2
    assert by_id["check2-encodes-invariants"].margin == pytest.approx((0.97 - 0.95) / 0.95)  # the closest of three


def test_cor8_tail_rate_and_its_interval():
    """`tail_rate`: an exact power law s = 3 L^(-1/2) gives b = −1/2 with no spread; with noise, the standard error
    is the least-squares one, √(Σ residual²/(n − 2)/Σ(x − x̄)²) in x = log L, and the 95% interval uses Student's t."""
    from scipy.stats import t as student

    from featurelab.experiments.bn_rank_depth import cor8_claims, tail_rate

    L = np.array([4, 6, 9, 12, 4, 6, 9, 12], dtype=float)
    exact = tail_rate(L, 3 * L**-0.5)
    assert exact["b"] == pytest.approx(-0.5) and exact["se"] == pytest.approx(0.0, abs=1e-12)
    y = 3 * L**-0.5 * np.exp(np.random.default_rng(0).normal(0, 0.1, L.size))
    r = tail_rate(L, y)
    x, z = np.log(L), np.log(y)
    b = np.sum((x - x.mean()) * (z - z.mean())) / np.sum((x - x.mean()) ** 2)
    resid = z - z.mean() - b * (x - x.mean())
    se = np.sqrt(np.sum(resid**2) / (L.size - 2) / np.sum((x - x.mean()) ** 2))
    assert r["b"] == pytest.approx(b) and r["se"] == pytest.approx(se)
    assert r["ci"] == pytest.approx([b - student.ppf(0.975, 6) * se, b + student.ppf(0.975, 6) * se])
    assert np.isnan(tail_rate([6, 6, 6], [1.0, 2.0, 3.0])["b"])  # one depth: no rate

    f = {"lam": 0.01, "k": 2, "cor8_share": {}, "tail_sqrt_L": {}, "rate": tail_rate(L, 3 * L**0.3)}
    (growing,) = cor8_claims(f)  # tails that grow with L: the interval lies above 0
    # b = 0.3 exactly: the interval [0.3, 0.3] misses -1/2 by (-0.5 - 0.3)/0.5 = -1.6 (and 0 by -0.3)
    assert growing.passed is False and growing.margin == pytest.approx(-1.6, rel=1e-6)
    (falling,) = cor8_claims({**f, "rate": r})
    assert falling.passed and falling.kind == "empirical"


def test_fig1_classes_claim_counts_depths_and_fitting_underestimates():
    """Fig. 1's classes at one λ: a recovering line needs fitting rank-2 nets at >= 2 *depths* (two seeds at one
    depth are one point of the line), and no *fitting* net may sit below rank 2 (a non-fitting one may: Fig. 1
    shows them at large depths). One claim per λ, id ``fig1-classes@lam<λ>``."""
    import pandas as pd

    from featurelab.experiments.bn_rank_depth import Config, classes_claim, depth_claims

    def nets(spec):
        return pd.DataFrame([{"lam": lam, "depth": L, "k_mid": k, "fits": f, "class": "x"} for lam, L, k, f in spec])

    good = nets([(0.01, 4, 3, True), (0.01, 6, 2, True), (0.01, 9, 2, True), (0.01, 12, 1, False)])
    c = classes_claim(0.01, good)
    assert c.passed and c.id == "fig1-classes@lam0.01" and c.premise == ""
    assert c.margin == pytest.approx(min((2 - 1.5) / 1.5, (0.5 - 0) / 0.5))
    one_depth = nets([(0.01, 6, 2, True), (0.01, 6, 2, True), (0.01, 9, 3, True)])
    assert not classes_claim(0.01, one_depth).passed
    assert classes_claim(0.01, one_depth).margin == pytest.approx((1 - 1.5) / 1.5)
    under = nets([(0.01, 6, 2, True), (0.01, 9, 2, True), (0.01, 12, 1, True)])
    assert not classes_claim(0.01, under).passed and classes_claim(0.01, under).margin == pytest.approx(-1.0)

    both = pd.concat([good, under.assign(lam=0.001)], ignore_index=True)
    ids = [x.id for x in depth_claims(Config.model_validate({}), both, [])]
    assert "fig1-classes@lam0.01" in ids and "fig1-classes@lam0.001" in ids
