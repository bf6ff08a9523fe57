"""Part 1 §4 T11 (slow): the quick preset of leaky-hamiltonian reproduces Q1-Q7 of §5.4 on trained networks.
The residual r, |𝓗ᵀ⁴ − 𝓗|, the balancedness residual and the spread of ĥ are printed, not asserted."""

import pytest

from featurelab.runs import run_experiment


@pytest.mark.slow
def test_quick_preset_checks_Q1_to_Q7(tmp_path):
    record = run_experiment("leaky-hamiltonian", "quick", out=tmp_path / "run", workers=2, progress=False)
    by_id = {c["statement"].split(":")[0]: c for c in record.claims}
    for q in ("Q1", "Q2", "Q3", "Q4", "Q5", "Q6", "Q7"):
        assert by_id[q]["passed"], f"{q}: measured {by_id[q]['measured']}, expected {by_id[q]['expected']}"
    for row in record.summary["per_depth"]:
        print(
            f"L̃={row['effective_depth']:g}: median r={row['residual_median']:.3g}, "
            f"max|H_T4-H|={row['thm4_gap_max']:.3g}, balancedness={row['balancedness']:.3g}, "
            f"spread ĥ={row['h_spread']:.3g}"
        )
