"""Critical-point certificates and the float64 polish (featurelab.training.critical): closed-form minimisers,
gradients and Hessian products against independent computations, and the Leaky-ResNet critical-point equation."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from featurelab.data.dataset import Dataset
from featurelab.measurements.hamiltonian import geodesic_diagnostics
from featurelab.models import MLP, LeakyResNet
from featurelab.training.critical import _Problem, _ratio, descend, hessian_condition, polish, stationarity


class Linear(nn.Module):
    """f(X) = X Wᵀ with penalty λ‖W‖²: ridge regression, minimiser in closed form."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.W = nn.Parameter(torch.zeros(d_out, d_in, dtype=torch.float64))

    def forward(self, X):
        return X @ self.W.T

    def penalty(self, lam):
        return lam * (self.W**2).sum()


def ridge_data(seed=0, N=40, d_in=5, d_out=3):
    g = np.random.default_rng(seed)
    X, Y = g.standard_normal((N, d_in)), g.standard_normal((N, d_out))
    return Dataset(torch.from_numpy(X), torch.from_numpy(Y), torch.from_numpy(X), torch.from_numpy(Y))


def test_polish_reaches_the_ridge_minimiser():
    data, lam = ridge_data(), 0.03
    X, Y = data.X_train.numpy(), data.Y_train.numpy()
    N = X.shape[0]
    # (1/N)‖Y − XWᵀ‖² + λ‖W‖²: Wᵀ = (XᵀX/N + λI)⁻¹ XᵀY/N
    W_star = np.linalg.solve(X.T @ X / N + lam * np.eye(X.shape[1]), X.T @ Y / N).T
    model = Linear(5, 3)
    cert = polish(model, data, "mse", lam, tolerance=1e-10)
    assert cert.certified and cert.stationarity <= 1e-10
    np.testing.assert_allclose(model.W.detach().numpy(), W_star, rtol=0, atol=1e-10)
    assert cert.loss_after < cert.loss_before and cert.condition is None and cert.detail["relu_kinks"] == 0


def test_descent_reaches_the_ridge_minimiser_and_stops_at_its_tolerance():
    """L-BFGS (`descend`) on ridge regression: it reaches the closed-form minimiser, and it stops at the first
    iterate within its tolerance (a looser tolerance stops it earlier, at a point that is not yet the minimiser).
    Its line search compares float64 losses, so the tolerance asked stays well above the stationarity at which
    the loss stops resolving the distance to the minimiser (about 1e-7 here); the distance is bounded by strong
    convexity: the Hessian is at least 2λ, so ‖θ − θ*‖ <= ‖∇𝓛(θ)‖/(2λ)."""
    data, lam = ridge_data(2, N=60, d_in=8, d_out=4), 0.02
    X, Y = data.X_train.numpy(), data.Y_train.numpy()
    W_star = np.linalg.solve(X.T @ X / 60 + lam * np.eye(8), X.T @ Y / 60).T
    problem = _Problem(Linear(8, 4), data, "mse", lam)

    def stat(theta):
        _, g, gr, cost = problem.evaluate(theta)
        return _ratio(g, gr, theta, cost, lam)

    theta, iterations = descend(problem, problem.theta, 1e-5, 500)
    assert stat(theta) <= 1e-5 and 0 < iterations < 500
    _, g, _, _ = problem.evaluate(theta)
    distance = float(np.linalg.norm(theta.view(4, 8).numpy() - W_star))
    assert distance <= float(g.norm()) / (2 * lam) * (1 + 1e-9)
    rough, early = descend(problem, problem.theta, 1e-2, 500)
    assert 1e-5 < stat(rough) <= 1e-2 and early < iterations
    capped, two = descend(problem, problem.theta, 1e-9, 2)
    assert two == 2 and stat(capped) > 1e-3
    same, none = descend(problem, theta, 1e-5, 500)  # already within the tolerance: nothing moves
    assert none == 0 and torch.equal(same, theta)


def test_stationarity_against_closed_form_gradients():
    data, lam = ridge_data(1), 0.1
    X, Y = data.X_train.numpy(), data.Y_train.numpy()
    model = Linear(5, 3)
    W = np.random.default_rng(2).standard_normal((3, 5))
    model.W.data = torch.from_numpy(W.copy())
    grad_C = -2 / X.shape[0] * (Y - X @ W.T).T @ X
    grad_R = 2 * lam * W
    cert = stationarity(model, data, "mse", lam)
    assert cert.stationarity == pytest.approx(np.linalg.norm(grad_C + grad_R) / np.linalg.norm(grad_R), rel=1e-12)
    assert cert.grad_norm == pytest.approx(np.linalg.norm(grad_C + grad_R), rel=1e-12)
    assert cert.penalty_grad_norm == pytest.approx(np.linalg.norm(grad_R), rel=1e-12)
    assert not cert.certified and cert.iterations == 0 and cert.condition is not None and math.isfinite(cert.condition)
    np.testing.assert_array_equal(model.W.detach().numpy(), W)  # measured on a copy


def test_stationarity_without_penalty_is_grad_times_norm_over_cost():
    torch.manual_seed(0)
    model = MLP(3, 2, 6, 3, activation="tanh", bias=1.0, seed=3, dtype=torch.float64)
    X, Y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, 2, dtype=torch.float64)
    C = ((model(X) - Y) ** 2).sum() / 20
    grads = torch.autograd.grad(C, list(model.parameters()))
    g = torch.cat([x.reshape(-1) for x in grads]).norm()
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).norm()
    cert = stationarity(model, Dataset(X, Y, X, Y), "mse", 0.0)
    assert cert.stationarity == pytest.approx(float((g * theta / C).detach()), rel=1e-12)
    assert cert.penalty_grad_norm == 0.0


def test_hessian_products_against_finite_differences():
    model = MLP(3, 2, 5, 3, activation="tanh", bias=1.0, seed=1, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(15, 3, generator=g, dtype=torch.float64), torch.randn(15, 2, generator=g, dtype=torch.float64)
    problem = _Problem(model, Dataset(X, Y, X, Y), "mse", 0.01)
    theta = problem.theta
    v = torch.randn(theta.shape, generator=g, dtype=torch.float64)
    eps = 1e-5
    fd = (problem.evaluate(theta + eps * v)[1] - problem.evaluate(theta - eps * v)[1]) / (2 * eps)
    Hv = problem.hessian_at(theta)(v)
    assert float((Hv - fd).norm() / Hv.norm()) < 1e-8


def test_lanczos_condition_of_a_diagonal_operator():
    d = torch.linspace(1.0, 250.0, 30, dtype=torch.float64)
    assert hessian_condition(lambda v: d * v, 30, steps=30) == pytest.approx(250.0, rel=1e-8)
    d[3] = -1e-2  # indefinite: |μ| max over min
    assert hessian_condition(lambda v: d * v, 30, steps=30) == pytest.approx(25000.0, rel=1e-6)


def positive_leaky(seed):
    """A Leaky ResNet (d_in = w = 3) on inputs whose representations stay far inside the positive orthant, with
    targets close to its own outputs: no ReLU input sits at its kink near the minimum, so the loss is smooth
    there and Newton converges. Returned with its weights perturbed away from that minimum."""
    model = LeakyResNet(3, 2, 3, 6, 2.0, seed=seed, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    A0 = 4.0 + torch.rand(12, 3, generator=g, dtype=torch.float64)
    X = A0 @ model.U_in  # A_0 = X U_inᵀ (U_in orthogonal)
    with torch.no_grad():
        Y = model(X) + 0.1 * torch.randn(12, 2, generator=g, dtype=torch.float64)
        model.W.add_(0.05 * torch.randn(model.W.shape, generator=g, dtype=torch.float64))
    return model, Dataset(X, Y, X, Y)


def test_leaky_residual_vanishes_at_a_polished_critical_point_only():
    lam = 0.01
    model, data = positive_leaky(0)
    W0 = model.W.detach().clone()
    before = stationarity(model, data, "mse", lam)
    table = geodesic_diagnostics(model, data.X_train, data.Y_train, lam)
    # the per-layer residual read off the gradients is the §3.2 residual computed from B_l and σ(A_{l-1})
    np.testing.assert_allclose(before.detail["residual"], table["residual"], rtol=1e-10)
    # and ĥ from ∂𝓛/∂ρ_l is −(2/L̃) times the pre-Hamiltonian of §3.3 (an identity at any parameters)
    np.testing.assert_allclose(before.detail["h_rescaled"], -2 / 2.0 * table["pre_hamiltonian"], rtol=1e-10)
    assert before.detail["residual_max"] > 0.1

    cert = polish(model, data, "mse", lam, tolerance=1e-9)
    assert cert.certified and cert.stationarity <= 1e-9 and cert.detail["relu_kinks"] == 0
    assert cert.detail["residual_max"] < 1e-7
    after = geodesic_diagnostics(model, data.X_train, data.Y_train, lam)
    assert float(after["residual"].max()) < 1e-7
    # at the critical point the pre-Hamiltonian is the Hamiltonian: ĥ_l of both routes agree
    np.testing.assert_allclose(cert.detail["h_rescaled"], after["h_rescaled"], rtol=0, atol=1e-6)
    assert model.W.dtype == torch.float64 and not torch.equal(model.W.detach(), W0)


def test_an_unfinished_polish_is_not_certified_and_estimates_the_condition():
    model, data = positive_leaky(1)
    cert = polish(model, data, "mse", 0.01, tolerance=1e-9, max_iterations=1)
    assert not cert.certified and cert.iterations == 1 and cert.stationarity > 1e-9
    assert cert.condition is not None and 1 < cert.condition < math.inf
    assert cert.method.startswith("trust-region Newton-CG")
    assert set(cert.to_dict()) >= {"stationarity", "certified", "hvps", "seconds", "condition", "detail"}


class Kink(nn.Module):
    """f(x) = relu((w − 1)x) with penalty λw², at w = 1: its one ReLU input sits at the kink."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1, dtype=torch.float64))

    def forward(self, X):
        return torch.relu((self.w - 1) * X)

    def penalty(self, lam):
        return lam * (self.w**2).sum()


@pytest.mark.parametrize("lam", [0.3, 4.0])
def test_clarke_stationarity_chooses_the_kink_slope(lam):
    # with target 1: ∇C = −2s for the ReLU slope s ∈ [0, 1] at the kink, ∇R = 2λ; torch takes s = 0
    one = torch.ones(1, 1, dtype=torch.float64)
    cert = stationarity(Kink(), Dataset(one, one, one, one), "mse", lam)
    assert cert.stationarity == pytest.approx(1.0, rel=1e-12) and cert.detail["relu_kinks"] == 1
    # min_s |2λ − 2s| / 2λ: 0 when λ <= 1 (s = λ), else 1 − 1/λ (s = 1)
    assert cert.detail["clarke_stationarity"] == pytest.approx(max(0.0, 1 - 1 / lam), abs=1e-9)


def test_a_unit_with_certify_is_finished_trained_and_certified(tmp_path):
    from featurelab.config import ExperimentConfig
    from featurelab.experiments.base import Analysis, Experiment, TrainingUnit, UnitContext
    from featurelab.training import Phase, TrainConfig

    data, lam = ridge_data(3), 0.05
    seen = {}

    def build(cfg, unit):
        config = TrainConfig(lam=lam, phases=[Phase(optimizer="sgd", steps=5, lr=0.05)], log_every=5)
        return TrainingUnit(Linear(5, 3), data, config, certify=1e-9)

    def finish(cfg, unit, model, result, ctx):
        seen["model"] = model
        return {"W": model.W.detach().clone()}

    def analyze(cfg, units, ctx) -> Analysis:
        raise AssertionError("not called: the test runs one unit")

    exp = Experiment("t", "", "", ExperimentConfig, {}, lambda cfg: [{"id": "a"}], analyze, build=build, finish=finish)
    result = exp.execute(ExperimentConfig(), {"id": "a"}, UnitContext(tmp_path))
    cert = result["certificate"]
    assert cert["certified"] and cert["clarke"] <= 1e-9 and cert["loss_after"] < cert["loss_before"]
    X, Y = data.X_train.numpy(), data.Y_train.numpy()
    W_star = np.linalg.solve(X.T @ X / 40 + lam * np.eye(5), X.T @ Y / 40).T
    np.testing.assert_allclose(result["certified"]["W"].numpy(), W_star, atol=1e-9)  # the certified tier: the minimiser
    assert np.abs(result["W"].numpy() - W_star).max() > 1e-3  # the paper's tier: the net as trained (5 SGD steps)
    assert seen["model"].W.dtype == torch.float64
