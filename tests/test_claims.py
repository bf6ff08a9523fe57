"""Verdicts at their thresholds, margins in closed form, kinds counted apart, unhealthy units gated.

Each test names the plausible bug it catches: a strict comparison where the claim is "<=" or ">=", a
tolerance applied ten times, an identity check counted as a reproduced result, a claim about critical
points left unmeasured on the trained nets of the paper tier.
"""

import json
import math

import pandas as pd
import pytest

from featurelab.claims import (
    Threshold,
    all_of_claim,
    boolean_claim,
    claim,
    claim_from_check,
    fmt_margin,
    margin,
    tally,
    threshold_claim,
)
from featurelab.errors import FeaturelabError
from featurelab.results import Check
from featurelab.runs.report import render_report
from featurelab.runs.reproduce import markdown_tables, robustness_table
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


# ------------------------------------------------------------------------- headroom under a ceiling
@pytest.mark.parametrize(
    "threshold, headroom",
    [
        (Threshold(0.95, ">=", ceiling=1.0), (1 - 0.95) / 0.95),  # an R² >= 0.95
        (Threshold(0.99, ">=", ceiling=1.0), (1 - 0.99) / 0.99),  # an alignment |cos| >= 0.99
        (Threshold(-0.8, "<=", ceiling=-1.0), 0.25),  # a correlation <= -0.8: (-0.8 - (-1))/0.8
        (Threshold(0.05, "<=", ceiling=0.0), 1.0),  # a nonnegative fraction <= 0.05: all of it
        (Threshold(0.1, "<", ceiling=0.0), 1.0),
        (Threshold(0.5, ">", ceiling=1.0), 1.0),  # a fraction > 1/2: (1 - 0.5)/0.5
        (Threshold(0.0, ">=", ceiling=1.0), 1.0),  # a zero bound: absolute, as the margin is
    ],
)
def test_headroom_closed_forms(threshold, headroom):
    """The headroom is the margin at the ceiling, signed as the margin is for each relation (a "<=" headroom
    computed with the ">=" formula would be negative: -0.25, -1)."""
    assert threshold.headroom == pytest.approx(headroom, rel=1e-12)
    assert threshold.headroom > 0
    c = threshold_claim("at the ceiling", "ref", threshold.ceiling, threshold)
    assert c.headroom == pytest.approx(headroom, rel=1e-12)
    assert c.margin == c.headroom  # a measurement at the ceiling has all the room there is


def test_a_ceiling_never_changes_the_verdict_or_the_margin():
    """The same measurements with and without a ceiling: equal verdicts and margins; only the headroom differs."""
    for measured in (0.9, 0.95, 0.97, 1.0):
        bare = threshold_claim("R²", "ref", measured, 0.95, ">=")
        capped = threshold_claim("R²", "ref", measured, 0.95, ">=", ceiling=1.0)
        assert (capped.passed, capped.margin, capped.expected) == (bare.passed, bare.margin, bare.expected)
        assert bare.headroom is None and capped.headroom == pytest.approx(0.05 / 0.95)
        assert capped.margin is not None and capped.headroom is not None and capped.margin <= capped.headroom
    below = threshold_claim("correlation", "ref", -0.7, Threshold(-0.8, "<=", ceiling=-1.0))
    assert below.passed is False and below.margin == pytest.approx(-0.125) and below.headroom == pytest.approx(0.25)


@pytest.mark.parametrize(
    "bound, relation, ceiling",
    [
        (0.95, ">=", 0.9),  # an R² claimed >= 0.95 with a best value 0.9 could never pass
        (0.5, ">", 0.5),  # a strict claim at its ceiling could never pass either
        (-0.8, "<=", -0.5),
        (0.1, "<", 0.1),
        (0.95, ">=", math.nan),
        (0.95, ">=", math.inf),
        (1.0, "==", 1.0),  # an equality's best margin is its whole tolerance: no ceiling
    ],
)
def test_a_ceiling_the_claim_could_never_reach_is_refused_in_one_line(bound, relation, ceiling):
    with pytest.raises(FeaturelabError) as err:
        Threshold(bound, relation, atol=0.1 if relation == "==" else 0.0, ceiling=ceiling)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"ceiling={ceiling!r} is not allowed")
    assert f"'{relation} {bound:g}'" in text
    if relation != "==":
        assert f"give a finite ceiling {relation} {bound:g}" in text
    with pytest.raises(FeaturelabError, match="ceiling="):
        threshold_claim("x", "ref", 1.0, bound, relation, atol=0.1, ceiling=ceiling)


def test_a_bound_moved_past_its_ceiling_is_refused():
    """`Threshold.at` keeps the ceiling and checks it again (a data-dependent bound above 1 for an R²)."""
    assert Threshold(0.5, ">=", ceiling=1.0).at(0.8).headroom == pytest.approx(0.25)
    with pytest.raises(FeaturelabError, match=r"ceiling=1.0 is not allowed for the threshold '>= 1.5'"):
        Threshold(0.5, ">=", ceiling=1.0).at(1.5)


def test_all_of_claim_headroom_is_the_smallest_of_those_with_a_ceiling():
    """R² >= 0.95 (headroom 0.05/0.95) and |cos| >= 0.99 (0.01/0.99) and a gap >= 10 (no ceiling: it grows
    without end): the claim can reach at most the smaller ceilinged headroom; with no ceiling at all, None."""
    pairs = [
        (0.97, Threshold(0.95, ">=", ceiling=1.0)),
        (0.995, Threshold(0.99, ">=", ceiling=1.0)),
        (12.0, Threshold(10.0, ">=")),
    ]
    c = all_of_claim("three", "ref", pairs, expected="e")
    assert c.headroom == pytest.approx(0.01 / 0.99) and c.margin == pytest.approx(0.005 / 0.99)
    assert all_of_claim("gap", "ref", pairs[2:], expected="e").headroom is None
    assert claim("s", "r", 1, 1, True, margin=0.1, headroom=math.inf).headroom is None
    assert "headroom" in c.to_dict() and c.to_dict()["headroom"] == c.headroom  # claims.json carries it


def test_margins_print_with_their_headroom_in_the_report_and_the_tables(tmp_path):
    """ "+0.9% of +1%" wherever a margin is printed and the claim has a headroom; a bare margin otherwise."""
    assert fmt_margin(0.009, 0.01) == "+0.9% of +1%" and fmt_margin(0.009) == "+0.9%"
    assert fmt_margin(None, 0.01) == "" and fmt_margin(-0.5, 0.25) == "-50% of +25%"
    r2 = threshold_claim("R²", "ref", 0.999, Threshold(0.99, ">=", ceiling=1.0), id="r2").to_dict()
    gap = threshold_claim("gap", "ref", 12.5, 10.0, id="gap").to_dict()
    (tmp_path / "claims.json").write_text(json.dumps([r2, gap]))
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    render_report(tmp_path, {"experiment": "x", "preset": "tiny"})
    html = (tmp_path / "report.html").read_text()
    assert "<td>+0.909% of +1.01%</td>" in html and "<td>+25%</td>" in html
    runs = [{"label": s, "seed": 0, "dir": s, "claims": [r2, gap], "problems": "", "error": ""} for s in ("a", "b")]
    table = robustness_table("x", "quick", runs)
    index = {"preset": "quick", "seeds": [0], "tables": [table], "identity": 0}
    index |= {k: table[k] for k in ("reproduced", "empirical", "certified_reproduced", "certified")}
    text = markdown_tables(index)
    assert "| `r2` | PASS +0.909% of +1.01% | PASS +0.909% of +1.01% | yes |" in text
    assert "| `gap` | PASS +25% | PASS +25% | yes |" in text


def test_an_experiment_claim_carries_its_ceiling():
    """symmetry-learning's R² thresholds are capped at 1 (an R² cannot exceed it) and alignment's claims read it:
    min |⟨v_(k+1), u_k⟩| >= 0.99 measured 0.9999 has +0.99% of +1.01%."""
    from featurelab.experiments import alignment, symmetry_learning

    for th in (symmetry_learning.R2_ABS_M, symmetry_learning.R2_R, symmetry_learning.R2_REVERSE):
        assert th.ceiling == 1.0 and th.headroom == pytest.approx((1 - th.bound) / th.bound)
    assert alignment.TAIL_ALIGNED.ceiling == 1.0
    table = pd.DataFrame(
        {
            "loss": [1e-4],
            "train_error": [0.0],
            "ratio_2": [0.95],
            "ratio0_2": [0.2],
            "ratio_3": [1.0],
            "ratio0_3": [1.0],
            "align_2_3": [0.9999],
        }
    )
    claims = {c.id: c for c in alignment.alignment_claims(table, [0.01], [2, 3], [(2, 3)])}
    aligned = claims["tail-aligned"]
    assert aligned.passed is True and aligned.margin == pytest.approx(0.0099 / 0.99)
    assert aligned.headroom == pytest.approx(0.01 / 0.99)
    assert claims["tail-rank-one"].headroom == pytest.approx(0.12 / 0.88)
    assert claims["tail-ratio-gain"].headroom is None  # a gain of a ratio in [0, 1] is at most 1 - its init
