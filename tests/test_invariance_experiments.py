"""docs/theory/invariances.md §6: the experiments end to end (short horizons fast; the quick presets slow)."""

import pytest

from featurelab.runs import run_experiment


def test_invariances_short_run_exact_gd_term_and_control(tmp_path):
    """At a short horizon the GD identity is still exact, in-scope drift is still O(η) and the
    identity-block control's is not."""
    rec = run_experiment(
        "invariances",
        "quick",
        {"archs": ["resnet-identity", "conv"], "etas": [0.08, 0.04], "tau": 2.0, "logs": 2},
        out=tmp_path / "inv",
        workers=1,
    )
    c = {x["id"]: x for x in rec.claims}
    assert c["gd-step-exact"]["passed"] and rec.summary["max_step_residual"] <= 1e-12
    assert c["drift-slope"]["passed"]
    assert c["control-slope"]["passed"]


def test_invariances_on_nets_that_learned_nothing_measure_nothing(tmp_path):
    """init_scale = 1e-4: every net outputs ~0, the loss stays at ln 2 and the error at chance. The drift
    claims hold trivially there (nothing moves), so the units must be unhealthy and no claim may pass."""
    rec = run_experiment(
        "invariances",
        "quick",
        {"archs": ["fc", "resnet-identity"], "etas": [0.08, 0.04], "tau": 2.0, "logs": 2, "init_scale": 1e-4},
        out=tmp_path / "inv",
        workers=1,
    )
    assert len(rec.unhealthy) == 4
    assert [c for c in rec.claims if c.get("kind") == "empirical" and c["passed"]] == []


def test_relu_noninvariance_short_run_separates_blocks(tmp_path):
    rec = run_experiment(
        "relu-noninvariance",
        "quick",
        {"etas": [0.1, 0.05], "tau": 5.0, "check_every": 25},
        out=tmp_path / "rn",
        workers=1,
    )
    assert rec.summary["phi_error"] <= 1e-9
    assert rec.summary["separation"] >= 30


@pytest.mark.slow
@pytest.mark.parametrize("name", ["invariances", "alignment", "relu-noninvariance"])
def test_quick_preset_claims_pass(tmp_path, name):
    rec = run_experiment(name, "quick", out=tmp_path / name, workers=2)
    failed = [c["statement"] for c in rec.claims if not c["passed"]]
    assert not failed, failed
