"""Verdicts in two tiers: "as the paper did" on the trained nets, "certified" on certified critical points.

Each test names the plausible bug it catches: a claim on an uncertified unit that passes its certified tier, a
margin inside its error bar counted as a pass, an error bar that is not the margin's sensitivity times δ, an
identity claim judged twice, a claim about critical points left unmeasured on trained nets, stored certified
parameters that do not give the recorded loss, a report that shows one tier only.
"""

import pytest

from featurelab.claims import certified_tier, claim, error_bar, has_tier, tally, threshold_claim, tier_verdict
from featurelab.runs.runner import _claim_gate, not_certified, tier_results, two_tiers

CERT_ON = {"certified": True, "clarke": 1e-10, "previous_clarke": 1e-6, "rule": "", "tolerance": 1e-8}
CERT_OFF = {"certified": False, "clarke": 3e-4, "previous_clarke": 1e-3, "rule": "snap diverged", "tolerance": 1e-8}


def rank_claim(measured: float, bound: float = 2.0, *, id="rank", **kw):
    return threshold_claim("the rank is at most 2", "ref", measured, bound, "<=", id=id, **kw)


def results(**certs) -> dict[str, dict]:
    return {u: {"certificate": c, "trained_stationarity": 0.1 * (i + 1)} for i, (u, c) in enumerate(certs.items())}


# ------------------------------------------------------------------------------------ the error bar
def test_error_bar_is_the_margins_sensitivity_times_the_residual():
    """κ = |m − m_prev|/(δ_prev − δ); bar = κ·δ (a bar of |m − m_prev| alone would not shrink with δ)."""
    m, m_prev, delta, prev = 0.25, 0.75, 1e-9, 1e-6
    assert error_bar(m, m_prev, delta / (prev - delta)) == pytest.approx(0.5 / (prev - delta) * delta, rel=1e-15)
    at = rank_claim(1.5)  # margin (2 − 1.5)/2 = 0.25
    before = rank_claim(0.5)  # margin 0.75
    tier = certified_tier(rank_claim(1.0), at, before, 0.5 / 0.5)  # a ratio of 1: the bar is |Δmargin| = 0.5
    assert tier.certified_margin == 0.25 and tier.error_bar == 0.5
    assert tier.certified_passed is False and "within its error bar" in tier.certified_reason
    tier = certified_tier(rank_claim(1.0), at, before, 0.1)  # bar 0.05 < 0.25: passes
    assert tier.certified_passed is True and tier.error_bar == pytest.approx(0.05)
    assert tier.passed is True and tier.margin == 0.5  # the paper tier is left as it was


def test_a_failed_certified_claim_fails_and_a_claim_without_margin_takes_its_verdict():
    tier = certified_tier(rank_claim(1.0), rank_claim(3.0), rank_claim(3.5), 0.01)
    assert tier.certified_passed is False and tier.certified_margin == pytest.approx(-0.5)
    yes = claim("a construction exists", "ref", True, True, True, id="b")
    no = claim("a construction exists", "ref", True, False, False, id="b")
    assert certified_tier(yes, no, yes, 0.0).certified_passed is False
    assert (
        certified_tier(no, yes, None, None).certified_passed is True
        and certified_tier(no, yes, None, None).error_bar is None
    )


# ------------------------------------------------------------------------------------ gating by unit
def test_claims_on_uncertified_units_are_not_measured_in_the_certified_tier_only():
    res = results(on=CERT_ON, off=CERT_OFF)
    on = rank_claim(1.0, id="on", premise="critical").rests_on(["on"])
    off = rank_claim(1.0, id="off", premise="critical").rests_on(["off"])
    both = rank_claim(1.0, id="both")
    certified = [rank_claim(1.2, id=i) for i in ("on", "off", "both")]
    previous = [rank_claim(1.4, id=i) for i in ("on", "off", "both")]
    tiers = {c.id: c for c in two_tiers(_claim_gate([on, off, both], {}), certified, previous, res, {})}
    # the paper tier measures the claims at critical points on the trained nets, stationarity beside them
    assert all(c.passed is True for c in tiers.values())
    assert tiers["on"].stationarity == pytest.approx(0.1) and tiers["both"].stationarity == pytest.approx(0.2)
    assert tiers["off"].certified_passed is None
    assert tiers["off"].certified_reason == "unit not certified: off: snap diverged"
    assert tiers["both"].certified_passed is None and tiers["both"].certified_reason.startswith("unit not certified")
    ratio = 1e-10 / (1e-6 - 1e-10)
    assert tiers["on"].certified_passed is True and tiers["on"].clarke == 1e-10
    assert tiers["on"].error_bar == pytest.approx(abs(0.4 - 0.3) * ratio, rel=1e-12)
    assert not_certified({}) == "no certificate"
    assert not_certified({"certificate": {**CERT_OFF, "rule": ""}}) == "Clarke residual 0.0003 > 1e-08"


def test_unhealthy_units_and_a_failed_certified_analysis_are_not_measured_with_the_reason():
    res = results(a=CERT_ON)
    c = rank_claim(1.0).rests_on(["a"])
    sick = two_tiers(_claim_gate([c], {"a": "diverged"}), [c], [c], res, {"a": "diverged"})[0]
    assert sick.passed is None and sick.certified_passed is None and sick.certified_reason.startswith("unit unhealthy")
    why = "the analysis of the certified nets failed: ValueError: x"
    failed = two_tiers([c], [], [], res, {}, why)[0]
    assert failed.passed is True and failed.certified_passed is None and failed.certified_reason == why
    absent = two_tiers([c], [], [], res, {})[0]
    assert absent.certified_passed is None and "does not make this claim" in absent.certified_reason


def test_an_earlier_point_no_farther_from_criticality_gives_no_error_bar():
    res = results(a={**CERT_ON, "previous_clarke": 1e-10})
    c = rank_claim(1.0)
    tier = two_tiers([c], [c], [c], res, {})[0]
    assert tier.certified_passed is None and tier.certified_reason.startswith("no error bar")
    exact = two_tiers([c], [c], [rank_claim(0.0)], results(a={**CERT_ON, "clarke": 0.0}), {})[0]
    assert exact.error_bar == 0.0 and exact.certified_passed is True  # δ = 0: the margin is exact


def test_identity_claims_have_one_tier_and_runs_without_certificates_are_unchanged():
    ident = claim("Σρ = 1", "ref", 1, 1, True, id="sum", kind="identity")
    emp = rank_claim(1.0)
    tiers = {c.id: c for c in two_tiers([ident, emp], [ident, emp], [ident, emp], results(a=CERT_ON), {})}
    assert not has_tier(tiers["sum"].to_dict()) and tier_verdict(tiers["sum"].to_dict()) == ""
    assert tier_verdict(tiers["rank"].to_dict()) == "PASS"
    counts = tally([c.to_dict() for c in tiers.values()])
    assert (counts["certified_claims_passed"], counts["certified_claims_total"]) == (1, 1)
    assert (counts["claims_passed"], counts["identity_total"]) == (1, 1)
    plain = two_tiers([ident, emp], [], [], {"a": {"x": 1}}, {})
    assert plain == [ident, emp] and tally([c.to_dict() for c in plain])["certified_claims_total"] == 0


def test_tier_results_take_the_certified_measurements_with_the_certificate():
    res = {
        "a": {"rank": 3, "certificate": CERT_ON, "certified": {"rank": 2}, "previous": {"rank": 4}},
        "b": {"rank": 5},
    }
    assert tier_results(res, "certified") == {"a": {"rank": 2, "certificate": CERT_ON}, "b": {"rank": 5}}
    assert tier_results(res, "previous")["a"]["rank"] == 4
