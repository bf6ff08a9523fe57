"""The spectral tools behind `analyze`: the Gram-route singular values and their stated accuracy and the
Clauset–Shalizi–Newman power-law fit on samples from known power laws (WeightWatcher's columns:
test_weightwatcher_parity.py)."""

import numpy as np
import pytest
import torch

import featurelab as fl
from featurelab.analysis import power_law_fit, singular_values


def prescribed(n, m, s, seed=0):
    """An n x m matrix with singular values s (random orthonormal factors)."""
    g = np.random.default_rng(seed)
    U = np.linalg.qr(g.standard_normal((n, len(s))))[0]
    V = np.linalg.qr(g.standard_normal((m, len(s))))[0]
    return (U * s) @ V.T


@pytest.mark.parametrize("shape", [(300, 900), (900, 300)])
def test_gram_route_accuracy(shape: tuple[int, int]):
    """|ŝ_i − s_i| <= c·ε·s_1²/s_i (spectra module docstring), here with c = 100, for s_i from 1 down to 1e-6."""
    s = np.logspace(0, -6, 200)
    M = torch.from_numpy(prescribed(*shape, s))
    got = singular_values(M, gram_above=100).numpy()[:200]
    assert np.all(np.abs(got - s) <= 100 * 2.2e-16 * s[0] ** 2 / s)
    # the thresholds analyze uses (1e-1, 1e-3 relative) are resolved to 1e-12 relative
    big = s >= 1e-3
    np.testing.assert_allclose(got[big], s[big], rtol=1e-10)
    exact = singular_values(M, gram_above=10_000).numpy()[:200]  # the SVD route
    np.testing.assert_allclose(exact, s, rtol=1e-9)


def pareto(n, alpha, xmin, seed):
    u = np.random.default_rng(seed).random(n)
    return xmin * (1 - u) ** (-1 / (alpha - 1))  # inverse CDF of p(x) ∝ x^(−alpha), x >= xmin


@pytest.mark.parametrize("alpha", [1.8, 2.5, 4.0])
def test_power_law_recovers_a_known_exponent(alpha):
    """A tail of 4000 draws from p ∝ x^(−alpha), x >= 1, on top of a uniform body below 1: the fit finds alpha
    within 4 standard errors (alpha − 1)/√n and x_min near 1."""
    tail = pareto(4000, alpha, 1.0, seed=int(alpha * 10))
    body = np.random.default_rng(1).uniform(0.05, 1.0, 2000)
    fit = power_law_fit(np.concatenate([body, tail]))
    assert abs(fit.alpha - alpha) < 4 * (alpha - 1) / np.sqrt(4000)
    assert 0.8 < fit.xmin < 1.5 and fit.n_tail > 2500
    assert fit.sigma == pytest.approx((fit.alpha - 1) / np.sqrt(fit.n_tail))


def test_power_law_closed_form_and_scale():
    """With every value a candidate: alpha at the chosen x_min is 1 + n/Σ ln(x/x_min) (the MLE), and scaling the
    sample by c scales x_min by c and leaves alpha and the KS distance unchanged."""
    x = pareto(500, 3.0, 2.0, seed=7)
    fit = power_law_fit(x)
    t = x[x >= fit.xmin]
    assert fit.alpha == pytest.approx(1 + len(t) / np.log(t / fit.xmin).sum(), rel=1e-12)
    scaled = power_law_fit(10 * x)
    assert scaled.alpha == pytest.approx(fit.alpha, rel=1e-9) and scaled.xmin == pytest.approx(10 * fit.xmin)
    assert scaled.ks == pytest.approx(fit.ks, rel=1e-9)
    with pytest.raises(fl.FeaturelabError, match="positive values"):
        power_law_fit([0.0, -1.0, 2.0])
