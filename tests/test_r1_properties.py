"""Theorem 3 item 3 and Prop. 5 of Jacot 2023 (arXiv 2305.19008) in float64: the CP construction computes f on Ω
and costs exactly L Σ s_i^{2/L}; nets that keep f on Ω never cost less; complete positivity separates the CP and
the centred planar sets; the known-rank depth fit and the shrinkage correction; the `r1-properties` tasks and its
tiny preset (docs/theory/bottleneck-rank.md §2.5, §3.11, §4c)."""

import math

import numpy as np
import pytest
import torch

from featurelab.data.bn_tasks import R1_TASKS, cp_basis, r1_task
from featurelab.errors import FeaturelabError
from featurelab.experiments.r1_properties import PRESETS, Config
from featurelab.measurements.bottleneck import theorem3_check
from featurelab.measurements.jacobian import jacobian
from featurelab.measurements.representation_cost import (
    complete_positivity,
    cp_linear_cost,
    cp_linear_representation,
    estimate_r1_given_rank,
    linear_expansion,
    linear_representation_cost,
    shrinkage_corrected_cost,
)
from featurelab.models import MLP
from featurelab.models.mlp import mlp_with_weights
from featurelab.runs import run_experiment

F64 = torch.float64


def _orthonormal(g: torch.Generator, d: int, k: int) -> torch.Tensor:
    Q, _ = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=F64))
    return Q


def _cp_problem(seed: int, d: int = 7, k: int = 3):
    """A = U S Vᵀ with V non-negative with disjoint supports, samples X = C Vᵀ with C >= 0 (a CP set)."""
    g = torch.Generator().manual_seed(seed)
    V = torch.from_numpy(cp_basis(d, k, seed))
    s = 0.3 + 3 * torch.rand(k, generator=g, dtype=F64)
    A = _orthonormal(g, d, k) * s @ V.T
    X = torch.rand(200, k, generator=g, dtype=F64) @ V.T
    return A, V, X, s


def _net(weights: list[torch.Tensor], d_in: int, d_out: int) -> MLP:
    """A ReLU `MLP` with bias column (zero biases) holding `weights` (n_l x n_{l-1} each)."""
    stored = [torch.cat([W, torch.zeros(W.shape[0], 1, dtype=F64)], 1) for W in weights]
    widths = [W.shape[0] for W in weights[:-1]]
    return mlp_with_weights(MLP(d_in, d_out, widths or 1, len(weights), bias=1.0, dtype=F64), stored)


def _sq_norm(model: MLP) -> float:
    return float(sum((W.detach() ** 2).sum() for W in model.weights))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("L", [1, 2, 3, 5, 9])
def test_cp_construction_computes_f_on_omega_at_the_exact_cost(seed, L):
    A, V, X, s = _cp_problem(seed)
    net = _net(cp_linear_representation(A, V, L), 7, 7)
    with torch.no_grad():
        assert float((net(X) - X @ A.T).abs().max()) <= 1e-12 * float((X @ A.T).abs().max())
    exact = L * float((s ** (2.0 / L)).sum())
    assert _sq_norm(net) == pytest.approx(exact, rel=1e-10)
    assert cp_linear_cost(A, V, L) == pytest.approx(exact, rel=1e-10)
    assert linear_representation_cost(A, L) == pytest.approx(exact, rel=1e-10)  # A = A P_Ω here


@pytest.mark.parametrize("seed", range(4))
def test_nets_that_keep_f_on_omega_never_cost_less(seed):
    """Positive rescalings of hidden neurons, neuron permutations and extra neurons that are dead on Ω keep f on Ω;
    their ‖θ‖² never goes below L Σ s_i^{2/L}, and the Jacobian bound at a sample equals it (Jf V = A V)."""
    A, V, X, s = _cp_problem(seed, d=6, k=2)
    g = torch.Generator().manual_seed(100 + seed)
    L = 5
    exact = cp_linear_cost(A, V, L)
    base = cp_linear_representation(A, V, L)
    for _ in range(20):
        Ws = [W.clone() for W in base]
        for l in range(L - 1):  # hidden layer l+1: rescale by c > 0, permute, add a neuron dead on Ω
            c = torch.exp(0.5 * torch.randn(Ws[l].shape[0], generator=g, dtype=F64))
            perm = torch.randperm(Ws[l].shape[0], generator=g)
            Ws[l] = (c[:, None] * Ws[l])[perm]
            Ws[l + 1] = (Ws[l + 1] / c[None, :])[:, perm]
            dead_in = -torch.rand(1, Ws[l].shape[1], generator=g, dtype=F64)  # <= 0 on the non-negative reps
            Ws[l] = torch.cat([Ws[l], dead_in])
            Ws[l + 1] = torch.cat([Ws[l + 1], torch.randn(Ws[l + 1].shape[0], 1, generator=g, dtype=F64)], 1)
        net = _net(Ws, 6, 6)
        with torch.no_grad():
            assert float((net(X) - X @ A.T).abs().max()) <= 1e-10 * float((X @ A.T).abs().max())
        assert _sq_norm(net) >= exact - 1e-10 * exact
        J = jacobian(net, X[:3])
        bound = L * (torch.linalg.svdvals(J @ V) ** (2.0 / L)).sum(1)
        assert torch.allclose(bound, torch.full_like(bound, exact), rtol=1e-10)
        assert theorem3_check(net, X, float("nan"), 2).exact_slack >= -1e-10 * exact


def test_gaussian_factorizations_of_a_never_cost_less():
    """Linear nets W_L⋯W_1 = A V Vᵀ with random Gaussian W_1 = G Vᵀ, W_2..W_{L-1} (W_L solved by least squares):
    ‖θ‖² >= the CP cost, the minimum over all depth-L factorizations (docs/theory/bottleneck-rank.md §2.2)."""
    A, V, _, _ = _cp_problem(7, d=6, k=2)
    g = torch.Generator().manual_seed(7)
    target = A @ V @ V.T
    for L in (2, 3, 6):
        exact = cp_linear_cost(A, V, L)
        for _ in range(50):
            Ws = [torch.randn(4, 2, generator=g, dtype=F64) @ V.T] + [  # row space span V, so W_L exists
                torch.randn(4, 4, generator=g, dtype=F64) for _ in range(L - 2)
            ]
            P = Ws[0]
            for W in Ws[1:]:
                P = W @ P
            WL = torch.linalg.lstsq(P.T, target.T).solution.T  # W_L P = target (P has full row rank)
            assert torch.allclose(WL @ P, target, atol=1e-9)
            assert sum(float((W**2).sum()) for W in [*Ws, WL]) >= exact - 1e-10 * exact


@pytest.mark.parametrize("k", [1, 2, 3])
def test_cp_identity_costs_k_times_L(k):
    V = torch.from_numpy(cp_basis(7, k, seed=k))
    X = torch.rand(50, k, generator=torch.Generator().manual_seed(k), dtype=F64) @ V.T
    for L in (2, 4, 11):
        net = _net(cp_linear_representation(V @ V.T, V, L), 7, 7)
        assert _sq_norm(net) == pytest.approx(k * L, rel=1e-12)
        with torch.no_grad():
            assert float((net(X) - X).abs().max()) <= 1e-12
        assert linear_expansion(V @ V.T).r1 == pytest.approx(0.0, abs=1e-12)  # Prop. 5: R⁽¹⁾ = 0


def test_centred_square_is_not_completely_positive_in_any_basis_of_its_plane():
    plane = r1_task("id-plane", n_train=200)
    X = plane.X_train
    cp = r1_task("id-cp", n_train=200)
    V = torch.tensor(cp.meta["basis"], dtype=F64)
    assert complete_positivity(cp.X_train, V).passed
    assert complete_positivity(cp.X_train, V).planar_rank == 2
    P = torch.linalg.svd(X, full_matrices=False).Vh[:2].T  # an orthonormal basis of the plane
    assert complete_positivity(X, P).span_residual <= 1e-12 and complete_positivity(X, P).planar_rank == 2
    for phi in np.linspace(0, 2 * math.pi, 361):
        R = torch.tensor([[math.cos(phi), -math.sin(phi)], [math.sin(phi), math.cos(phi)]], dtype=F64)
        for flip in (torch.eye(2, dtype=F64), torch.diag(torch.tensor([1.0, -1.0], dtype=F64))):
            check = complete_positivity(X, P @ R @ flip)
            assert not check.passed and check.min_coordinate < -0.1
    # a basis off the plane fails by its span residual even on a CP set
    off = torch.linalg.qr(V + 0.3 * torch.randn(V.shape, generator=torch.Generator().manual_seed(0), dtype=F64))[0]
    assert complete_positivity(cp.X_train, off).span_residual > 1e-3


def test_construction_refuses_a_basis_that_is_not_singular_for_a():
    A, V, _, _ = _cp_problem(3, d=6, k=2)
    R = torch.tensor([[0.8, -0.6], [0.6, 0.8]], dtype=F64)
    with pytest.raises(FeaturelabError, match="right singular"):
        cp_linear_representation(A, V @ R, 4)
    with pytest.raises(FeaturelabError, match="orthonormal"):
        cp_linear_cost(A, 2 * V, 4)


def test_known_rank_fit_recovers_an_exact_expansion_and_the_linear_r1():
    depths = [4, 6, 8, 10, 12]
    fit = estimate_r1_given_rank(depths, [2 * L + 1.7 + 0.9 / L for L in depths], 2)
    assert fit.R1 == pytest.approx(1.7, abs=1e-12) and fit.R2 == pytest.approx(0.9, abs=1e-11)
    assert fit.R1_se <= 1e-10
    A, V, _, _ = _cp_problem(11, d=6, k=2)
    Ls = list(range(20, 201, 10))
    fit = estimate_r1_given_rank(Ls, [cp_linear_cost(A, V, L) for L in Ls], 2)
    e = linear_expansion(A)
    assert fit.R1 == pytest.approx(e.r1, abs=0.02) and fit.R2 == pytest.approx(e.r2, rel=0.1)


def test_shrinkage_correction_is_second_order_in_lambda():
    """Depth-L scalar nets fitting y = a x: the regularized optimum c* solves 2m(c − a) + 2λ c^{2/L−1} = 0
    (C = m(c − a)², R(c) = L c^{2/L}); the corrected cost R(c*) + 2C/λ tends to R(a) like λ², the raw R(c*) like λ."""
    a, m, L = 2.0, 0.7, 5

    def optimum(lam):
        lo, hi = 1e-9, a
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if 2 * m * (mid - a) + 2 * lam * mid ** (2 / L - 1) < 0 else (lo, mid)
        return (lo + hi) / 2

    target = L * a ** (2 / L)
    errs = []
    for lam in (1e-2, 5e-3, 2.5e-3):
        c = optimum(lam)
        raw = L * c ** (2 / L)
        corrected = shrinkage_corrected_cost(raw, m * (c - a) ** 2, lam)
        assert abs(corrected - target) < abs(raw - target) / 10
        errs.append(abs(corrected - target))
    assert errs[0] / errs[1] == pytest.approx(4, rel=0.1) and errs[1] / errs[2] == pytest.approx(4, rel=0.1)


def test_tasks_compose_and_add_to_the_linear_task():
    tasks = {t: r1_task(t, n_train=40, n_test=10) for t in R1_TASKS}
    lin, f, g = tasks["linear"], tasks["comp-f"], tasks["comp-g"]
    assert torch.allclose(f.X_train, g.Y_train, atol=1e-14) and torch.allclose(f.Y_train, lin.Y_train, atol=1e-13)
    total = tasks["sum-f"].Y_train + tasks["sum-g"].Y_train
    assert torch.allclose(total, lin.Y_train, atol=1e-13)
    r1 = {}
    for t in ("linear", "sum-f", "sum-g", "comp-f", "comp-g", "id-cp"):
        A, V = (torch.tensor(tasks[t].meta[key], dtype=F64) for key in ("A", "basis"))
        assert complete_positivity(tasks[t].X_train, V).passed
        assert torch.allclose(tasks[t].X_train @ A.T, tasks[t].Y_train, atol=1e-13)
        r1[t] = linear_expansion(A).r1
    assert r1["linear"] == pytest.approx(2 * math.log(4.5), abs=1e-12) and abs(r1["id-cp"]) < 1e-12
    assert r1["linear"] == pytest.approx(r1["sum-f"] + r1["sum-g"], abs=1e-12)  # items 1, 2: equality for CP maps
    assert r1["linear"] == pytest.approx(r1["comp-f"] + r1["comp-g"], abs=1e-12)
    assert "basis" not in tasks["id-plane"].meta


@pytest.mark.parametrize(
    "overrides",
    [{"depths": [4, 4, 6]}, {"depths": [1, 4, 6]}, {"depths": [4, 6]}, {"lam": 0.0}, {"singular_values": [3.0, -1.0]}],
)
def test_bad_config_values_fail_before_anything_is_written(overrides, tmp_path):
    with pytest.raises(FeaturelabError):
        Config(**overrides)
    with pytest.raises(FeaturelabError):
        run_experiment("r1-properties", "tiny", overrides, out=tmp_path / "run", workers=1, progress=False)
    assert not (tmp_path / "run").exists()


IDS = {
    "slopes-equal-rank",
    "thm3-item3-linear",
    "thm3-item3-intercept",
    "thm3-item3-cp-maps",
    "prop5-cp-identity-zero",
    "prop5-noncp-positive",
    "thm3-item1-composition",
    "thm3-item2-sum",
    "exact-lower-bound",
}


def test_tiny_preset_runs_end_to_end(tmp_path):
    rec = run_experiment("r1-properties", "tiny", out=tmp_path / "run", workers=1, progress=False)
    by_id = {c["id"]: c for c in rec.claims}
    assert IDS <= set(by_id)
    assert by_id["exact-lower-bound"]["passed"]  # true for every θ, trained or not
    cfg = Config(**PRESETS["tiny"])
    s1, s2 = cfg.singular_values
    for task, expected in (("linear", [s1, s2]), ("sum-f", [s1]), ("sum-g", [s2]), ("id-cp", [1.0, 1.0])):
        depths = cfg.depths
        costs = [L * sum(s ** (2 / L) for s in expected) for L in depths]  # the closed form, unit by unit
        fit = estimate_r1_given_rank(depths, costs, len(expected))
        assert rec.summary["R1_exact_fit"][task] == pytest.approx(fit.R1, abs=1e-10)


@pytest.mark.parametrize("L", [12, 24])
def test_exact_bound_is_tight_on_the_cp_construction_at_large_depth(L):
    """At the minimal net the Jacobian bound is attained: exact_slack = 0 to rounding, with the singular values
    that rounding leaves at ~1e-17 counted as zero (kept, they made the slack of such nets −0.05 to −0.09 at L = 12
    and −2 to −4 at L = 24)."""
    A, V, X, s = _cp_problem(5, d=6, k=2)
    net = _net(cp_linear_representation(A, V, L), 6, 6)
    exact = L * float((s ** (2.0 / L)).sum())
    slack = theorem3_check(net, X, float("nan"), 2).exact_slack
    assert abs(slack) <= 1e-10 * exact
