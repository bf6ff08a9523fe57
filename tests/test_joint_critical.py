"""Critical points of a Leaky ResNet in its weights and steps jointly (`featurelab.training._joint`): the simplex
parametrisation's gradient against the chain rule through ∂𝓛/∂ρ, and the constant Hamiltonian at a joint critical
point (Jacot & Kaiser, arXiv 2405.17573 §3: ∂𝓛/∂ρ_l = −λ𝓗_l at critical weights)."""

from __future__ import annotations

import pytest
import torch

import featurelab as fl
from featurelab.data import bottleneck_teacher
from featurelab.measurements.hamiltonian import geodesic_diagnostics
from featurelab.training._joint import JointSteps, certify_joint, joint_smooth_critical_point
from featurelab.training.certify import Pieces
from featurelab.training.objectives import data_cost

LAM = 0.02


def test_simplex_gradient_is_the_projected_step_gradient(gen):
    rho = (0.5 + torch.rand(5, generator=gen, dtype=torch.float64)) / 5
    net = fl.LeakyResNet(3, 2, 6, 5, 2.0, steps=rho / rho.sum(), seed=2, dtype=torch.float64)
    X = torch.randn(10, 3, generator=gen, dtype=torch.float64)
    Y = torch.randn(10, 2, generator=gen, dtype=torch.float64)
    joint = JointSteps(net)
    torch.testing.assert_close(joint.steps(), net.rho, rtol=1e-14, atol=0)
    (dz,) = torch.autograd.grad(data_cost("mse", joint(X), Y) + joint.penalty(LAM), [joint.logits])
    r = net.rho.clone().requires_grad_()
    (G,) = torch.autograd.grad(data_cost("mse", net(X, rho=r), Y) + net.penalty(LAM, rho=r), [r])
    expected = net.rho * (G - (net.rho * G).sum())  # ∂𝓛/∂z_j = ρ_j(∂𝓛/∂ρ_j − Σ_l ρ_l ∂𝓛/∂ρ_l)
    torch.testing.assert_close(dz, expected[:-1], rtol=1e-10, atol=1e-14)
    with pytest.raises(fl.FeaturelabError, match="model"):
        JointSteps(fl.MLP(3, 2, 6, 2))  # type: ignore[arg-type]


@pytest.mark.slow
def test_hamiltonian_is_constant_at_a_joint_smooth_critical_point():
    """N = 64, w = 12, L = 6, L̃ = 2, λ = 0.02, σ = softplus_10: at the critical point in (W, ρ) with Σρ = 1 every
    layer has the same 𝓗_l (to rounding), while ρ itself is far from equidistant."""
    data = bottleneck_teacher((6, 2, 6), hidden=16, n_train=64, n_test=8)
    net = fl.LeakyResNet(6, 6, 12, 6, 2.0, seed=0, dtype=torch.float64)
    assert joint_smooth_critical_point(net, data, LAM, 10.0) < 1e-10
    assert float(net.rho.sum()) == pytest.approx(1.0, abs=1e-14) and float(net.rho.min()) > 0
    assert float(net.rho.max() / net.rho.min()) > 2
    with Pieces(beta=10.0):
        df = geodesic_diagnostics(net, data.X_train, data.Y_train, LAM)
    H = df["hamiltonian"]
    assert df.attrs["summary"]["residual_max"] < 1e-9
    assert float(H.max() - H.min()) < 1e-10 * float(H.abs().max())


@pytest.mark.slow
def test_hamiltonian_is_constant_at_a_certified_joint_relu_critical_point():
    """The same net with ReLU: `certify_joint` reaches a certified strict minimum in (W, ρ) at ReLU kinks; under the
    certificate's slopes mode (B through the slopes s*) 𝓗_l is constant to rounding and W_l = L̃B_lᵀσ(A_{l−1})."""
    data = bottleneck_teacher((6, 2, 6), hidden=16, n_train=64, n_test=8)
    net = fl.LeakyResNet(6, 6, 12, 6, 2.0, seed=1, dtype=torch.float64)
    found = certify_joint(net, data, LAM)
    c = found.certificate
    assert c.certified and c.kinks > 0 and c.clarke <= 1e-12 and c.kind == "minimum", c
    assert float(net.rho.sum()) == pytest.approx(1.0, abs=1e-14) and float(net.rho.min()) > 0
    with found.slopes_mode():
        df = geodesic_diagnostics(net, data.X_train, data.Y_train, LAM)
    H = df["hamiltonian"]
    assert df.attrs["summary"]["residual_max"] < 1e-10
    assert float(H.max() - H.min()) < 1e-10 * float(H.abs().max())
    plain = geodesic_diagnostics(net, data.X_train, data.Y_train, LAM)["hamiltonian"]  # relu'(0) = 0 at the kinks
    assert float(plain.max() - plain.min()) > 1e-3 * float(H.abs().max())
