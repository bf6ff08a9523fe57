"""Verdicts in two tiers: "as the paper did" on the trained nets, "certified" on certified critical points.

Each test names the plausible bug it catches: a claim on an uncertified unit that passes its certified tier, a
margin inside its error bar counted as a pass, an error bar that is not the margin's sensitivity times δ, an
identity claim judged twice, a claim about critical points left unmeasured on trained nets, stored certified
parameters that do not give the recorded loss, a report that shows one tier only.
"""

import contextlib
import json
from dataclasses import dataclass

import pytest
import torch

from featurelab.claims import (
    certified_tier,
    claim,
    error_bar,
    fmt_error_bar,
    has_tier,
    tally,
    threshold_claim,
    tier_verdict,
)
from featurelab.config import ExperimentConfig
from featurelab.data import bottleneck_teacher
from featurelab.experiments import REGISTRY
from featurelab.experiments.base import (
    Analysis,
    Experiment,
    TrainingUnit,
    UnitContext,
    certified_results,
    load_certified,
)
from featurelab.models import MLP
from featurelab.runs.report import render_report
from featurelab.runs.runner import _claim_gate, not_certified, run_experiment, tier_results, two_tiers
from featurelab.training import Phase, TrainConfig, train
from featurelab.training.checkpoint import load_tensors
from featurelab.training.critical import polish, stationarity

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
    assert tier.certified_passed is False and "within 10 error bars" in tier.certified_reason
    tier = certified_tier(rank_claim(1.0), at, before, 0.1)  # bar 0.05: 0.25 is 5 bars, within 10 of them
    assert tier.certified_passed is False and tier.error_bar == pytest.approx(0.05)
    tier = certified_tier(rank_claim(1.0), at, before, 0.04)  # bar 0.02: 0.25 is 12.5 bars, it passes
    assert tier.certified_passed is True and tier.error_bar == pytest.approx(0.02)
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


def test_where_the_snap_began_at_its_end_the_trained_nets_give_the_error_bar():
    """A unit whose snap began as close to its critical point as it ended (δ_prev <= δ) measures no sensitivity;
    the trained nets do: κ = |m − m_trained|/(δ_trained − δ), δ_trained their stationarity (0.1 here), m_trained
    the first tier's margin. Where the trained nets are no farther either, no error bar can be measured."""
    res = results(a={**CERT_ON, "previous_clarke": 1e-10})
    paper = rank_claim(0.4)  # margin (2 − 0.4)/2 = 0.8
    tier = two_tiers([paper], [rank_claim(1.0)], [rank_claim(1.9)], res, {})[0]  # certified margin 0.5
    assert tier.error_bar == pytest.approx(0.3 * 1e-10 / (0.1 - 1e-10), rel=1e-12) and tier.certified_passed is True
    c = rank_claim(1.0)
    tier = two_tiers([c], [c], [c], results(a={**CERT_ON, "clarke": 0.2, "previous_clarke": 0.1}), {})[0]
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


# ------------------------------------------------------------------------------------ run folders
class TierConfig(ExperimentConfig):
    steps: int = 300


def tier_build(cfg, unit):
    data = bottleneck_teacher((4, 2, 4), "fcnn", 8, 24, 8, teacher_seed=cfg.seed, data_seed=cfg.seed + 1)
    model = MLP(4, 4, 6, 3, activation="tanh", seed=cfg.seed + (unit["id"] == "b"), dtype=torch.float64)
    tc = TrainConfig(lam=1e-2, phases=[Phase(steps=cfg.steps, lr=1e-2)], log_every=100, checkpoint_every=0)
    return TrainingUnit(model, data, tc, certify=1e-8)


def tier_finish(cfg, unit, model, result, ctx):
    job = tier_build(cfg, unit)
    return {"loss": stationarity(model, job.data, "mse", job.config.lam).loss_after}


def tier_analyze(cfg, results, ctx):
    worst = max(r["loss"] for r in results.values())
    return Analysis(
        [
            threshold_claim("the loss is below 10", "test", worst, 10.0, "<=", id="loss", premise="critical"),
            claim("two units", "test", 2, len(results), len(results) == 2, id="count", kind="identity"),
        ]
    )


TIERED = Experiment(
    name="test-tiers",
    summary="test-only two-unit regression, certified",
    reference="tests",
    config=TierConfig,
    presets={"quick": {}},
    units=lambda cfg: [{"id": "a"}, {"id": "b"}],
    analyze=tier_analyze,
    build=tier_build,
    finish=tier_finish,
)
REGISTRY[TIERED.name] = TIERED


@dataclass(frozen=True)
class StandIn:
    """What `certify` returns, from the second-order polish of a smooth (tanh) net, which reaches 1e-8: the run
    folder's plumbing checked apart from the method at kinks."""

    certificate: object
    slopes: torch.Tensor
    kink_masks: list
    previous: dict

    def slopes_mode(self):
        return contextlib.nullcontext()  # a tanh net has no kinks


@dataclass(frozen=True)
class StandInCertificate:
    polished: object
    previous_clarke: float

    def to_dict(self) -> dict:
        d = self.polished.to_dict()
        return {**d, "clarke": d["stationarity"], "previous_clarke": self.previous_clarke, "rule": ""}


def stand_in_certify(model, data, objective, lam, *, tolerance=1e-8, **options):  # options: checkpoint, progress, ...
    previous = {k: v.clone() for k, v in model.state_dict().items()}
    before = stationarity(model, data, objective, lam).stationarity
    polished = polish(model, data, objective, lam, tolerance=tolerance, max_iterations=400)
    mask = torch.zeros(len(data.X_train), 6, dtype=torch.bool)
    mask[0, 0] = True
    return StandIn(StandInCertificate(polished, before), torch.tensor([0.25]), [mask], previous)


@pytest.fixture(scope="module")
def tiered_run(tmp_path_factory):
    from featurelab.training import certify

    patch = pytest.MonkeyPatch()
    patch.setattr(certify, "certify", stand_in_certify)
    run = tmp_path_factory.mktemp("tiers") / "run"
    try:
        run_experiment(TIERED.name, out=run, workers=1, progress=False)
    finally:
        patch.undo()
    return run


def test_the_folder_stores_the_certified_parameters_and_they_give_the_recorded_loss_bit_for_bit(tiered_run):
    for uid in ("a", "b"):
        folder = tiered_run / "units" / uid
        state, slopes, masks, meta = load_certified(folder)
        cert = json.loads((folder / "certificate.json").read_text())
        job = tier_build(TierConfig(), {"id": uid})
        job.model.load_state_dict(state)
        assert stationarity(job.model, job.data, "mse", job.config.lam).loss_after == cert["loss_after"]
        assert meta["loss"] == cert["loss_after"] and meta["lam"] == job.config.lam
        assert slopes.tolist() == [0.25] and masks[0].dtype == torch.bool and int(masks[0].sum()) == 1
        trained = load_tensors(folder / "model.safetensors")  # the trained net stays beside it, unpolished
        assert any(not torch.equal(trained[k], state[k]) for k in state)
        result = json.loads((folder / "result.json").read_text())["result"]
        assert result["certified"]["loss"] == cert["loss_after"] and result["loss"] == cert["loss_before"]
        assert result["previous"]["loss"] == cert["loss_before"]  # the earlier point of this path: the trained net


def test_claims_json_and_the_report_carry_both_tiers(tiered_run):
    claims = {c["id"]: c for c in json.loads((tiered_run / "claims.json").read_text())}
    loss, count = claims["loss"], claims["count"]
    assert loss["passed"] is True and loss["stationarity"] > loss["clarke"]
    assert loss["certified_passed"] is True and loss["certified_margin"] > loss["margin"]  # the polish lowers it
    # the error bar: |Δmargin| · δ/(δ_prev − δ) of the unit with the largest ratio
    certs = [json.loads((tiered_run / "units" / u / "certificate.json").read_text()) for u in ("a", "b")]
    ratio = max(c["clarke"] / (c["previous_clarke"] - c["clarke"]) for c in certs)
    assert loss["error_bar"] == pytest.approx(abs(loss["certified_margin"] - loss["margin"]) * ratio, rel=1e-12)
    assert not has_tier(count)
    results = json.loads((tiered_run / "results.json").read_text())
    assert results["certified_claims_passed"] == 1 and set(results["certify_seconds"]) == {"a", "b"}
    (tiered_run / "report.html").unlink()
    render_report(tiered_run)  # `featurelab report` rebuilds it from the folder
    html = (tiered_run / "report.html").read_text()
    assert "Certified: 1 of 1 pass." in html and "<th>as the paper did</th>" in html
    assert "<h2>Certificates</h2>" in html and html.count("<tr><td>a</td><td>True</td>") == 1
    head, checks = html.split("<h2>Certificates</h2>")[0].split("<h2>Checks of the code</h2>")
    assert "<th>certified</th>" in head and "<th>certified</th>" not in checks  # identity claims: one tier
    assert f"<td>{fmt_error_bar(loss['error_bar'])}</td>" in html and fmt_error_bar(-0.001) == "±0.1%"


def test_certify_on_a_relu_net_stores_what_gives_its_recorded_loss_bit_for_bit(tmp_path):
    """The method itself (`featurelab.training.certify.certify`) on a ReLU net with kinks: the folder's
    parameters give the certificate's loss to the last bit, and its slopes lie in [0, 1], one per kink entry."""
    job = tier_build(TierConfig(steps=200), {"id": "a"})
    job = TrainingUnit(MLP(4, 4, 6, 3, seed=0, dtype=torch.float64), job.data, job.config, certify=1e-8)
    result = train(job.model, job.data, job.config, run_dir=tmp_path, progress=False)
    ctx = UnitContext(tmp_path)
    out = certified_results(lambda cfg, unit, model, res, ctx: {}, TierConfig(), {"id": "a"}, job, result, ctx)
    state, slopes, masks, meta = load_certified(tmp_path)
    model = MLP(4, 4, 6, 3, seed=0, dtype=torch.float64)
    model.load_state_dict(state)
    assert stationarity(model, job.data, "mse", job.config.lam).loss_after == out["certificate"]["loss_after"]
    assert meta["loss"] == out["certificate"]["loss_after"]
    assert slopes.numel() == sum(int(m.sum()) for m in masks) and bool(((slopes >= 0) & (slopes <= 1)).all())
