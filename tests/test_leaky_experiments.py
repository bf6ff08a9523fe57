"""Part 1 §4 T11 (slow): the quick preset of leaky-hamiltonian reproduces the calibrated checks of §5.4 on trained
networks (claims found by id). The residual r, |𝓗ᵀ⁴ − 𝓗|, the balancedness residual and the spread of ĥ are
printed, not asserted. And F4's per-layer test (docs/theory/leaky-resnets.md §5.3) on constructed spectra."""

import pytest
import torch

from featurelab.experiments import leaky_bottleneck as lb
from featurelab.runs import run_experiment


def test_f4_bottleneck_kind_tells_the_bias_direction_apart():
    """A W_l that reproduces a k-dimensional affine, non-negative representation (the bottleneck of Prop. 5) has
    k+1 non-zero singular values, with or without its bias column; with the mean input direction removed it has
    k. A genuine extra direction keeps k+1 after that removal."""
    g = torch.Generator().manual_seed(0)
    N, w, k, Lt = 200, 12, 3, 8.0
    U = torch.linalg.qr(torch.randn(w, k, generator=g, dtype=torch.float64)).Q
    A = 3.0 + (2 * torch.rand(N, k, generator=g, dtype=torch.float64) - 1) @ U.T  # affine, all entries > 0
    S = torch.cat([A.clamp_min(0), torch.ones(N, 1, dtype=torch.float64)], dim=1)  # σ(A) = [ReLU(A), 1]
    W = torch.linalg.lstsq(S, Lt * A, driver="gelsd").solution.T  # min-norm W with σ(A)Wᵀ = L̃A
    sv = torch.linalg.svdvals
    assert sv(W)[k] > 1e-3 * sv(W)[0] and sv(W)[k + 1] < 1e-10 * sv(W)[0]  # k+1 values
    assert sv(W[:, :-1])[k] > 1e-3 * sv(W)[0]  # the bias-free columns keep the extra value
    free = lb.mean_free_weights(W, S)
    assert sv(free)[k] < 1e-10 * sv(W)[0]  # the mean input direction carried it
    assert lb.bottleneck_kind(sv(W), sv(free), k) == "k*+1 (bias)"
    assert lb.f4_gap(sv(W), sv(free), k) > 1e9

    centred = torch.cat(
        [torch.randn(w, k, generator=g, dtype=torch.float64) @ U.T, torch.zeros(w, 1, dtype=torch.float64)], dim=1
    )
    assert lb.bottleneck_kind(sv(centred), sv(lb.mean_free_weights(centred, S)), k) == "k*"  # acts on U only
    m = S.mean(0)
    off = torch.randn(w + 1, generator=g, dtype=torch.float64)
    off = off - (off @ m) / (m @ m) * m  # an input direction orthogonal to the mean
    extra = centred + sv(centred)[k - 1] * torch.outer(
        torch.randn(w, generator=g, dtype=torch.float64), off / off.norm()
    )
    assert lb.bottleneck_kind(sv(extra), sv(lb.mean_free_weights(extra, S)), k) == "k*+1 (not bias)"
    noisy = torch.randn(w, w + 1, generator=g, dtype=torch.float64)
    assert lb.bottleneck_kind(sv(noisy), sv(lb.mean_free_weights(noisy, S)), k) == "none"
    assert lb.spectral_gap(torch.tensor([4.0, 2.0, 0.0]), 2) == float("inf")


def test_bottleneck_layers_are_the_middle_half_in_p():
    assert lb.bottleneck_layers([0, 0.25, 0.5, 0.75, 1.0]) == [2, 3]
    assert lb.bottleneck_layers([0, 0.1, 0.2, 0.3, 0.74, 0.8, 1.0]) == [4, 5]


CALIBRATED = (
    "q1-hamiltonians-increase",
    "q2-coi-decreases",
    "q3-hgamma-below-coi",
    "q4-no-gap-small-depth",
    "q5-kappa-large-at-input",
    "q6-negativity-decreases",
    "q7-hgamma-flat",
)


@pytest.mark.slow
def test_quick_preset_checks_Q1_to_Q7(tmp_path):
    record = run_experiment("leaky-hamiltonian", "quick", out=tmp_path / "run", workers=2, progress=False)
    by_id = {c["id"]: c for c in record.claims}
    for q in CALIBRATED:
        assert by_id[q]["passed"], f"{q}: measured {by_id[q]['measured']}, expected {by_id[q]['expected']}"
    for row in record.summary["per_depth"]:
        print(
            f"L̃={row['effective_depth']:g}: median r={row['residual_median']:.3g}, "
            f"max|H_T4-H|={row['thm4_gap_max']:.3g}, balancedness={row['balancedness']:.3g}, "
            f"spread ĥ={row['h_spread']:.3g}"
        )


def test_paired_advantage_pairs_seeds():
    import pandas as pd

    from featurelab.experiments.leaky_discretization import paired_advantage

    t = pd.DataFrame(
        [
            {"depth": L, "scheme": s, "seed": seed, "test_cost": cost}
            for L, s, seed, cost in [
                (4, "equidistant", 0, 3.0),
                (4, "equidistant", 1, 1.0),
                (4, "adaptive", 0, 2.0),
                (4, "adaptive", 1, 1.5),  # worse on seed 1, better on average
                (8, "equidistant", 0, 2.0),
                (8, "adaptive", 0, 2.5),
                (8, "adaptive", 1, 0.1),  # no equidistant partner: left out
            ]
        ]
    )
    a = paired_advantage(t, ["adaptive"]).set_index("depth")
    assert a.loc[4, "mean"] == pytest.approx(0.25) and a.loc[4, "min"] == pytest.approx(-0.5)
    assert a.loc[8, "mean"] == pytest.approx(-0.5) and a.loc[8, "seeds"] == 1
