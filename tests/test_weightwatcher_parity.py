"""WeightWatcher's columns (`featurelab.analysis.weightwatcher`): its eigenvalue conventions against numpy, its
power-law fit against closed forms and scipy's KS statistic, the small-sample rule, and, when WeightWatcher is
installed, every shared column on every layer it lists against WeightWatcher itself.

The parity tests need WeightWatcher 0.7.7, which is not a dependency (it pulls powerlaw, scikit-learn, ...):
``.venv/bin/pip install weightwatcher==0.7.7`` then ``.venv/bin/pytest -q tests/test_weightwatcher_parity.py``;
without it they are skipped and the rest runs."""

import numpy as np
import pytest
import scipy.stats
import torch
from torch import nn

import featurelab as fl
from featurelab.analysis import weightwatcher as ww


def pareto(n, alpha, xmin, seed):
    u = np.random.default_rng(seed).random(n)
    return xmin * (1 - u) ** (-1 / (alpha - 1))  # inverse CDF of p(x) ∝ x^(−alpha), x >= xmin


def test_esd_conventions_against_numpy():
    """Conv2d: the k_h·k_w slices' squared singular values, pooled and halved; Linear: s_i²; N is the larger
    side (a 3x3 conv with out < in: in)."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(6, 4, 3, 3, generator=g, dtype=torch.float64)
    Wn = W.numpy()
    ref = np.concatenate([np.linalg.svd(Wn[:, :, i, j], compute_uv=False) ** 2 / 2 for i in range(3) for j in range(3)])
    np.testing.assert_allclose(np.sort(ww.esd(W, conv2d=True)), np.sort(ref), rtol=1e-10)
    L = torch.randn(20, 30, generator=g, dtype=torch.float64)
    s = np.linalg.svd(L.numpy(), compute_uv=False)
    np.testing.assert_allclose(np.sort(ww.esd(L, conv2d=False)), np.sort(s**2), rtol=1e-10)
    cols = ww.columns(ww.esd(W, True), ww.sides(W, True)[0])
    top = max(np.linalg.norm(Wn[:, :, i, j], 2) ** 2 for i in range(3) for j in range(3)) / 2
    assert cols["ww_norm"] == pytest.approx((Wn**2).sum() / 2, rel=1e-12)
    assert cols["ww_stable_rank"] == pytest.approx((Wn**2).sum() / 2 / top, rel=1e-10)
    assert cols["ww_log_spectral_norm"] == pytest.approx(np.log10(top), rel=1e-10)
    assert ww.sides(torch.zeros(4, 6, 3, 3), True) == (6, 4) and ww.sides(torch.zeros(4, 6, 2, 2), True) == (4, 6)


def test_fit_closed_form_and_ks_on_pareto():
    """On 2000 draws from p ∝ x^(−2.5), x >= 2: alpha at the chosen x_min is the MLE 1 + n/Σ ln(x/x_min), within
    4 standard errors of 2.5; D is the KS distance of the tail to the fitted law with the empirical CDF taken
    just below each jump, max(D⁻, D⁺ − 1/n) in scipy's one-sided statistics; sigma = (alpha − 1)/√n_tail."""
    x = pareto(2000, 2.5, 2.0, seed=3)
    tail_fit = ww.fit(x)
    tail = np.sort(x[x >= tail_fit.xmin])
    n = len(tail)
    assert not tail_fit.small and tail_fit.n_tail == n and tail_fit.xmax == x.max()
    assert tail_fit.alpha == pytest.approx(1 + n / np.log(tail / tail_fit.xmin).sum(), rel=1e-12)
    assert abs(tail_fit.alpha - 2.5) < 4 * 1.5 / np.sqrt(n)
    law = scipy.stats.pareto(tail_fit.alpha - 1, scale=tail_fit.xmin)
    less = scipy.stats.kstest(tail, law.cdf, alternative="less").statistic
    greater = scipy.stats.kstest(tail, law.cdf, alternative="greater").statistic
    assert tail_fit.D == pytest.approx(max(less, greater - 1 / n), rel=1e-10)
    assert tail_fit.sigma == pytest.approx((tail_fit.alpha - 1) / np.sqrt(n), rel=1e-12)
    # no x_min does better: the chosen one minimises D over all candidates
    for xmin in np.sort(x)[:-1:50]:
        t = np.sort(x[x >= xmin])
        a = 1 + len(t) / np.log(t / xmin).sum()
        d = np.abs(1 - (t / xmin) ** (1 - a) - np.arange(len(t)) / len(t)).max()
        assert d >= tail_fit.D - 1e-12


def test_small_sample_rule_and_nan_below_the_fit_size():
    """Below 20 eigenvalues: tails of at least 8 only, the bias-corrected 1 + (n − 1)/Σ ln(x/x_min), the first of
    smallest D; `columns` leaves the fit columns NaN below `min_fit` (20) and gives them with min_fit=0."""
    x = pareto(15, 3.0, 1.0, seed=11)
    f = ww.fit(x)
    assert f.small and f.n_tail >= 8 and f.n == 15
    tail = np.sort(x[x >= f.xmin])
    assert f.alpha == pytest.approx(1 + (len(tail) - 1) / np.log(tail / f.xmin).sum(), rel=1e-12)
    Ds = []
    for xmin in np.sort(x)[: 15 - 8 + 1]:
        t = np.sort(x[x >= xmin])
        a = 1 + (len(t) - 1) / np.log(t / xmin).sum()
        Ds.append(np.abs(1 - (t / xmin) ** (1 - a) - np.arange(len(t)) / len(t)).max())
    assert f.D == pytest.approx(min(Ds), rel=1e-12) and f.xmin == np.sort(x)[int(np.argmin(Ds))]
    cols = ww.columns(x, 15)
    assert all(np.isnan(cols[f"ww_{c}"]) for c in ww.FIT_COLUMNS) and cols["ww_warning"] == ""
    assert cols["ww_norm"] == pytest.approx(x.sum())
    assert ww.columns(x, 15, min_fit=0)["ww_alpha"] == pytest.approx(f.alpha, rel=1e-12)


def test_analyze_notes_the_layers_without_a_fit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 30), nn.ReLU(), nn.Linear(30, 9))
    res = fl.analyze(model)
    layers = res.layers.set_index("name")
    assert np.isnan(layers.loc["2", "ww_alpha"]) and np.isfinite(layers.loc["0", "ww_alpha"])
    assert layers.loc["2", "ww_num_evals"] == 9
    assert any("too few eigenvalues (n < 20)" in n and "2 (9)" in n for n in res.summary["notes"])
    # the ESD kept for the report's figure is the one the columns were computed on
    assert res.esd["0"].sum() == pytest.approx(layers.loc["0", "ww_norm"], rel=1e-12)


def _models():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 10))
    conv = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, groups=4),
        nn.ReLU(),
        nn.Conv2d(32, 16, 2),  # 4 slices with out < in: WeightWatcher's N is out (`sides`)
        nn.ReLU(),
        nn.Conv2d(16, 24, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(24, 10),
    )
    bn = conv[3]
    assert isinstance(bn, nn.BatchNorm2d)
    with torch.no_grad():  # BatchNorm statistics away from the identity: WeightWatcher reads the stored kernel
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 2.0)
    return {"mlp": mlp.eval(), "conv": conv.eval()}


@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_every_shared_column_matches_weightwatcher(kind):
    """Every layer WeightWatcher lists, every column it shares with us, to 1e-6 relative: `analyze`'s row where it
    fits (n >= 20), and `weightwatcher.columns(min_fit=0)` on the same eigenvalues for every layer (its
    small-sample estimator included); the layers it lists are those `weightwatcher.listed` says."""
    weightwatcher = pytest.importorskip("weightwatcher")
    model = _models()[kind]
    details = weightwatcher.WeightWatcher(model=model).analyze().set_index("longname")
    res = fl.analyze(model)
    layers = res.layers.set_index("name")
    modules = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear | nn.Conv2d)}
    listed = {n for n, m in modules.items() if ww.listed(m.weight, isinstance(m, nn.Conv2d))}
    assert set(details.index) == listed and len(listed) >= 3
    shared = [c for c in layers.columns if c.startswith("ww_") and c[3:] in details.columns]
    assert len(shared) == 17
    small = 0
    for name, theirs in details.iterrows():
        W = modules[name].weight.detach().double()
        conv2d = isinstance(modules[name], nn.Conv2d)
        assert ww.sides(W, conv2d) == (theirs["N"], theirs["M"])
        ours = ww.columns(res.esd[name], ww.sides(W, conv2d)[0], min_fit=0)
        fitted = not np.isnan(layers.loc[name, "ww_alpha"])
        small += not fitted
        for col in shared:
            values = [ours[col]]
            if fitted or col[3:] not in (*ww.FIT_COLUMNS, "warning"):
                values.append(layers.loc[name, col])
            for value in values:
                if col == "ww_warning":
                    assert value == theirs[col[3:]], (name, col)
                else:
                    assert float(value) == pytest.approx(float(theirs[col[3:]]), rel=1e-6), (name, col, value)
    assert small >= 1  # a layer below 20 eigenvalues was compared through the small-sample estimator
