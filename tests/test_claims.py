"""Verdicts at their thresholds, margins in closed form, kinds counted apart, unhealthy units gated.

Each test names the plausible bug it catches: a strict comparison where the claim is "<=" or ">=", a
tolerance applied ten times, an identity check counted as a reproduced result, a claim about critical
points left unmeasured on the trained nets of the paper tier.
"""

import json
import math

import pytest

from featurelab.claims import (
    Threshold,
    all_of_claim,
    boolean_claim,
    claim,
    claim_from_check,
    margin,
    tally,
    threshold_claim,
)
from featurelab.results import Check
from featurelab.runs.report import render_report
from featurelab.runs.runner import RunRecord, _claim_gate


# ----------------------------------------------------------------------- the boundary is inside
@pytest.mark.parametrize("relation", ["<=", ">="])
def test_a_measurement_at_its_bound_holds(relation):
    """``measured <= bound`` and ``>=`` include equality (a `<` in the comparison fails here)."""
    assert Check.holds(2.0, 2.0, relation) is True
    c = threshold_claim("at the bound", "ref", 2.0, 2.0, relation)
    assert c.passed is True and c.margin == 0.0
    outside = 2.0 + (1e-12 if relation == "<=" else -1e-12)
    assert Check.holds(outside, 2.0, relation) is False
    assert threshold_claim("just outside", "ref", outside, 2.0, relation).passed is False


def test_an_equality_at_the_edge_of_its_tolerance_holds():
    # |1.5 - 1| = 0.5 = atol exactly (every number here is a binary fraction: no rounding)
    assert Check.holds(1.5, 1.0, "==", atol=0.5) is True
    c = threshold_claim("at the edge", "ref", 1.5, 1.0, "==", atol=0.5)
    assert c.passed is True and c.margin == 0.0
    assert threshold_claim("past it", "ref", 1.5 + 2**-40, 1.0, "==", atol=0.5).passed is False


# ------------------------------------------------------------------------ tolerances as given
@pytest.mark.parametrize("rtol", [1e-3, 0.01, 0.1])
def test_a_measurement_just_outside_its_tolerance_fails(rtol):
    """At 1.1x the allowed distance every route fails, with margin -0.1 (a tolerance applied 10x would
    pass with margin +0.89)."""
    bound = 4.0
    measured = bound * (1 + 1.1 * rtol)
    assert Check.holds(measured, bound, "==", rtol=rtol) is False
    c = threshold_claim("close to 4", "ref", measured, bound, "==", rtol=rtol)
    assert c.passed is False and c.margin == pytest.approx(-0.1, rel=1e-9)
    check = Check(
        passed=Check.holds(measured, bound, "==", rtol), measured=measured, bound=bound, relation="==", rtol=rtol
    )
    from_check = claim_from_check("close to 4", "ref", check)
    assert from_check.passed is False and from_check.margin == pytest.approx(-0.1, rel=1e-9)
    # an inequality with slack: bound + slack is the threshold, 1.1x past the bound by the slack fails
    above = bound + 1.1 * rtol * bound
    le = Check(passed=Check.holds(above, bound, "<=", rtol), measured=above, bound=bound, relation="<=", rtol=rtol)
    assert le.passed is False and claim_from_check("below 4", "ref", le).margin < 0
    inside = bound * (1 + 0.9 * rtol)
    assert threshold_claim("close to 4", "ref", inside, bound, "==", rtol=rtol).margin == pytest.approx(0.1, rel=1e-9)


# ------------------------------------------------------------------- one comparison, both answers
@pytest.mark.parametrize("relation, inside", [("<", 1.5), (">", 2.5)])
def test_a_strict_threshold_fails_at_its_bound(relation, inside):
    """ "<" and ">" exclude their bound (margin 0, verdict FAIL); "<=" and ">=" include it."""
    th = Threshold(2.0, relation)
    assert th.margin(2.0) == 0.0 and th.holds(2.0) is False and th.holds(inside) is True
    assert Threshold(2.0, relation + "=").holds(2.0) is True
    c = threshold_claim("at a strict bound", "ref", 2.0, th)
    assert c.passed is False and c.margin == 0.0 and c.expected == f"{relation} 2"


def test_all_of_claim_takes_the_smallest_margin_and_fails_on_nan():
    """Three comparisons: margins 0.25, -0.5 and 0.1 (binary-exact): the claim fails by the worst one; a NaN among
    them (a quantity the run could not measure) fails with no margin; no comparison at all fails."""
    pairs = [(2.5, Threshold(2.0, ">=")), (3.0, Threshold(2.0, "<=")), (1.05, Threshold(1.0, "==", atol=0.0625))]
    assert [th.margin(v) for v, th in pairs] == pytest.approx([0.25, -0.5, 0.2])
    c = all_of_claim("three at once", "ref", pairs, expected="all three", measured=[2.5, 3.0, 1.05])
    assert c.passed is False and c.margin == pytest.approx(-0.5)
    assert all_of_claim("two", "ref", [pairs[0], pairs[2]], expected="e").margin == pytest.approx(0.2)
    nan = all_of_claim("nan", "ref", [*pairs[:1], (math.nan, Threshold(1.0))], expected="e")
    assert nan.passed is False and nan.margin is None
    assert all_of_claim("none", "ref", [], expected="e").passed is False


def test_one_comparison_claim_reports_its_threshold():
    c = all_of_claim("one", "ref", [(0.5, Threshold(1.0, "==", rtol=0.25, atol=0.25))])
    assert (c.expected, c.measured, c.tolerance) == ("== 1", "0.5", "rtol=0.25, atol=0.25")
    assert c.passed is True and c.margin == pytest.approx(0.0)  # |0.5 - 1| = 0.5 = 0.25 + 0.25·1: at the edge


def test_boolean_claim_has_no_margin_and_thresholds_check_their_relation():
    c = boolean_claim("a construction exists", "ref", "yes", "yes", True, kind="identity")
    assert c.passed is True and c.margin is None and c.kind == "identity"
    with pytest.raises(ValueError, match="relation must be one of"):
        Threshold(1.0, "=<")
    assert Threshold(1.0, ">=").at(3.0) == Threshold(3.0, ">=")


def test_margin_closed_forms():
    assert margin(12.5, 10.0, ">=") == pytest.approx(0.25)  # the demo's target: 25 % above the F4 threshold
    assert margin(9.807, 10.0, ">=") == pytest.approx(-0.0193)  # the F4 gap that sat at its threshold
    assert margin(0.5, 2.0, "<=") == pytest.approx(0.75)
    assert margin(1.02, 1.0, "==", rtol=0.04) == pytest.approx(0.5)  # half the tolerance left
    assert margin(-3.0, -2.0, ">=") == pytest.approx(-0.5)  # relative to |bound|
    assert margin(0.1, 0.0, "<=") == pytest.approx(-0.1)  # a zero bound: absolute
    assert math.isnan(margin(math.nan, 1.0))


def test_claim_checks_kind_and_premise():
    with pytest.raises(ValueError, match="kind must be one of"):
        claim("s", "r", 1, 1, True, kind="empiric")
    with pytest.raises(ValueError, match="premise must be one of"):
        claim("s", "r", 1, 1, True, premise="minimum")
    assert claim("s", "r", 1, 1, True, margin=math.nan).margin is None


# -------------------------------------------------------------- identity claims counted apart
def claims_of(*spec):
    return [
        claim(f"claim {i}", "ref", 1, 1, bool(p), id=f"c{i}", kind=k, margin=0.25).to_dict()
        | ({"passed": None} if p is None else {})
        for i, (k, p) in enumerate(spec)
    ]


def test_tally_counts_empirical_claims_only():
    claims = claims_of(("empirical", True), ("empirical", False), ("empirical", None), ("identity", True))
    assert tally(claims) == {
        "claims_passed": 1,
        "claims_failed": 1,
        "claims_not_measured": 1,
        "claims_total": 3,
        "identity_passed": 1,
        "identity_total": 1,
        "certified_claims_passed": 0,
        "certified_claims_failed": 0,
        "certified_claims_not_measured": 0,
        "certified_claims_total": 0,
    }
    # tier "certified" is counted over the empirical claims that carry it, an identity claim never
    tiered = [c | {"certified_passed": i == 0, "certified_measured": "1"} for i, c in enumerate(claims)]
    tiered[2] |= {"certified_passed": None, "certified_reason": "unit not certified: a: snap diverged"}
    counts = tally(tiered)
    assert [counts[f"certified_claims_{k}"] for k in ("passed", "failed", "not_measured", "total")] == [1, 1, 1, 3]


@pytest.mark.parametrize(
    "spec, ok",
    [
        ((("empirical", True), ("identity", True)), True),
        ((("empirical", True), ("identity", False)), False),  # a check of the code failed
        ((("empirical", None), ("identity", True)), False),  # not measured is not passed
        ((("empirical", False),), False),
        ((("identity", True),), True),
    ],
)
def test_all_passed_needs_every_empirical_claim(tmp_path, spec, ok):
    assert RunRecord(tmp_path, tmp_path / "report.html", claims_of(*spec), {}).all_passed is ok


def test_report_headline_counts_empirical_claims_and_lists_identities_apart(tmp_path):
    claims = claims_of(("empirical", True), ("empirical", False), ("identity", True), ("identity", True))
    (tmp_path / "claims.json").write_text(json.dumps(claims))
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    render_report(tmp_path, {"experiment": "x", "preset": "tiny"})
    html = (tmp_path / "report.html").read_text()
    assert "Claims: 1 of 2 pass." in html and "Checks of the code: 2 of 2 pass." in html
    head, checks = html.split("<h2>Checks of the code</h2>")
    assert "claim 0" in head and "claim 2" not in head and "claim 2" in checks and "claim 3" in checks
    assert "<td>+25%</td>" in head and "<td>+25%</td>" in checks  # every claim shows its margin


# ------------------------------------------------------------------------------------ premises
def test_claims_at_critical_points_are_measured_on_trained_nets_in_the_paper_tier():
    """The paper tier gates by health only: a claim at critical points is measured on the trained nets (its
    certified tier, tests/test_tiers.py, is where certification counts)."""
    at_off = claim("at a critical point", "ref", 1, 1, True, id="off", premise="critical").rests_on(["off"])
    everywhere = claim("at every critical point", "ref", 1, 1, True, id="all", premise="critical")
    anywhere = claim("any parameters", "ref", 1, 1, True, id="any")
    gated = {c.id: c for c in _claim_gate([at_off, everywhere, anywhere], {})}
    assert all(c.passed is True for c in gated.values())
    sick = {c.id: c for c in _claim_gate([at_off, everywhere, anywhere], {"off": "stalled: x", "b": "nan"})}
    assert sick["off"].passed is None and sick["off"].reason == "unit unhealthy: off: stalled: x"
    assert sick["all"].reason.endswith("and 1 more")
