"""Part 1 §4 T11 (slow): the quick preset of leaky-hamiltonian reproduces the calibrated checks of §5.4 on trained
networks (claims found by id). The residual r, |𝓗ᵀ⁴ − 𝓗|, the balancedness residual and the spread of ĥ are
printed, not asserted. And F4's per-layer test (docs/theory/leaky-resnets.md §5.3) on constructed spectra."""

import pytest
import torch

from featurelab.experiments import leaky_bottleneck as lb
from featurelab.runs import run_experiment


def _kind(V: torch.Tensor, b: torch.Tensor, k: int) -> str:
    W = torch.cat([V, b[:, None]], dim=1)
    return lb.bottleneck_kind(torch.linalg.svdvals(W), torch.linalg.svdvals(V), k)


def test_f4_bottleneck_kind_tells_the_bias_direction_apart():
    g = torch.Generator().manual_seed(0)
    w, k = 12, 3
    low = torch.randn(w, k, generator=g, dtype=torch.float64) @ torch.randn(k, w, generator=g, dtype=torch.float64)
    noise = 1e-3 * torch.randn(w, w, generator=g, dtype=torch.float64)
    inside = low[:, 0]  # a bias in the column space of the weights adds no direction
    outside = torch.randn(w, generator=g, dtype=torch.float64) * 3
    extra = torch.outer(outside, torch.randn(w, generator=g, dtype=torch.float64))
    assert lb.bottleneck_kind(torch.linalg.svdvals(low + noise), torch.linalg.svdvals(low), k) == "k*"
    assert _kind(low + noise, inside, k) == "k*"
    assert _kind(low + noise, outside, k) == "k*+1 (bias)"
    assert _kind(low + extra + noise, 0 * outside, k + 1) == "k*"
    assert _kind(low + extra + noise, inside, k) == "k*+1 (not bias)"
    assert _kind(torch.randn(w, w, generator=g, dtype=torch.float64), outside, k) == "none"
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
