"""Part 1 §4 T10: the layer-step schemes of §2 (sums, validity, the irregular maximum, the fixed point of the
adaptive update, the projection's bounds)."""

import pytest
import torch

import featurelab as fl
from featurelab.models import adaptive_update


@pytest.mark.parametrize("L", [5, 6, 17, 50])
def test_steps_sum_to_one(L):
    assert float(fl.models.equidistant_steps(L).sum()) == pytest.approx(1.0, abs=1e-12)
    assert float(fl.models.irregular_steps(L, 0.5).sum()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("L,a", [(6, 0.5), (18, 0.5), (40, 0.9)])
def test_irregular_maximum_for_even_L(L, a):
    rho = fl.models.irregular_steps(L, a)
    assert float(rho.max()) == pytest.approx((1 + a / 4) / L, rel=1e-12)
    assert int(rho.argmax()) + 1 == L // 2
    assert float(rho[0]) == pytest.approx((1 - a / 4) / L + a / L**2, rel=1e-12)  # ρ_1 = 1/L + (a/L)(1/4 − 1/2 + 1/L)


def test_invalid_fixed_schemes_raise():
    with pytest.raises(fl.FeaturelabError, match="effective_depth"):
        fl.LeakyResNet(2, 2, 4, depth=3, effective_depth=3.0)  # ρL̃ = 1
    with pytest.raises(fl.FeaturelabError, match="irregular"):
        fl.LeakyResNet(2, 2, 4, depth=4, effective_depth=3.8, steps="irregular")  # L <= (1 + a/4) L̃
    fl.LeakyResNet(2, 2, 4, depth=4, effective_depth=3.5)  # valid: L > L̃


def test_adaptive_update_fixed_point(gen):
    rho = torch.rand(7, generator=gen, dtype=torch.float64) + 0.2
    rho = rho / rho.sum()
    A0 = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    reps = [1.3**l * A0 for l in range(8)]  # equal relative increments ‖A_l − A_{l-1}‖/‖A_l‖ = 1 − 1/1.3
    torch.testing.assert_close(adaptive_update(rho, reps), rho, rtol=1e-12, atol=1e-15)


def test_projection_stays_within_bounds(gen):
    L, Lt = 12, 4.0
    low, high = 0.1 / L, 0.9 / Lt
    for _ in range(20):
        rho = torch.rand(L, generator=gen, dtype=torch.float64) ** 4
        rho = rho / rho.sum()
        p = fl.models.project_steps(rho, low, high)
        assert float(p.sum()) == pytest.approx(1.0, abs=1e-12)
        assert float(p.min()) >= low - 1e-15 and float(p.max()) <= high + 1e-15
    with pytest.raises(fl.FeaturelabError):
        fl.models.project_steps(fl.models.equidistant_steps(3), 0.1 / 3, 0.9 / 4.0)  # L < L̃/0.9: infeasible
