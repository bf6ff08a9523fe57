"""Part 3 experiment helpers on known numbers: the plateau start of docs/theory/sparsity.md §6's measured table,
ray share and class separation on constructed representations."""

import pytest
import torch

from featurelab.measurements.sparsity import class_separation, ray_share
from featurelab.training.plateaus import plateau_start


def test_plateau_start_on_the_measured_digits_table():
    """docs/theory/sparsity.md §6: with its m(w) table, n*(5%) = 10 and n*(1%) = 24 (<= 48)."""
    widths = [2, 4, 6, 8, 10, 12, 16, 24, 32, 64, 128]
    m = [0.829, 0.224, 0.160, 0.139, 0.136, 0.135, 0.133, 0.131, 0.132, 0.130, 0.131]
    assert plateau_start(widths, m, 0.05) == 10
    assert plateau_start(widths, m, 0.01) == 24
    assert plateau_start(widths, m, 0.0) == 64


def test_ray_share_and_class_separation():
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(50, 3, generator=gen, dtype=torch.float64) + 0.1
    Z = torch.cat([base, 2.0 * base[:, :1], -torch.ones(50, 1, dtype=torch.float64)], dim=1)
    assert ray_share(Z, 0.99999) == 0.5  # 2 of the 4 alive neurons are on one ray; the dead one is ignored
    labels = torch.arange(50) % 2
    Zc = torch.stack([labels.double() * 10, torch.zeros(50, dtype=torch.float64)], dim=1)
    assert class_separation(Zc, labels) == 1.0


def test_width_plateau_claims_rest_on_the_minimising_trials():
    """m(w) is a min over trials: a collapsed trial that is not the minimiser leaves the m(w) claims measured,
    and the Carathéodory claims are checked on the healthy networks only; a collapsed minimiser gates."""
    from featurelab.experiments.width_plateau import Config, analyze
    from featurelab.runs.runner import _claim_gate

    def row(width, trial, loss, unhealthy=""):
        r = {
            "id": f"teacher-w{width}-t{trial}",
            "dataset": "teacher",
            "width": width,
            "trial": trial,
            "loss": loss,
            "cost": loss / 2,
            "sq_norm": 1.0,
            "train_error": 0.0,
            "test_error": 0.1,
            "grad_norm": 1e-6,
            "reduced_width": [width, width],
            "merged_width": [width, width],
            "alive": [width, width],
            "reduced_output_error": 0.0 if not unhealthy else 1.0,  # a collapsed net fails nothing it is not in
            "reduced_loss": loss,
            "reduced_output_slack": 0.0,
        }
        return {**r, "unhealthy": unhealthy} if unhealthy else r

    cfg = Config.model_validate({"datasets": ["teacher"]})
    widths = [1, 2, 4, 8, 16, 32]
    base = {w: (1.0 if w == 1 else 0.15 if w < 8 else 0.1) for w in widths}  # n*(10%) = 8
    rows = [row(w, 0, base[w]) for w in widths] + [row(1, 1, 3.0, "collapsed: constant output")]
    unhealthy = {r["id"]: r["unhealthy"] for r in rows if r.get("unhealthy")}
    claims = {c.id: c for c in _claim_gate(analyze(cfg, {r["id"]: r for r in rows}, None).claims, unhealthy)}
    assert claims["teacher-m1-gap"].passed is True  # m(1)/m_inf = 1.0/0.1 from trial 0
    assert claims["teacher-plateau-start"].passed is True
    assert claims["teacher-caratheodory-outputs"].passed is True  # the collapsed trial is left out
    outputs = claims["teacher-caratheodory-outputs"].units
    assert outputs is not None and "teacher-w1-t1" not in outputs
    assert claims["teacher-m1-gap"].margin == pytest.approx((10 - 5) / 5)  # m(1)/m_inf = 10 against >= 5
    assert claims["teacher-plateau-start"].margin == pytest.approx((8 - 6) / 6)  # n* = 8 in [6, 32]: nearer 6
    assert claims["teacher-m1-gap"].premise == "critical"  # Fig. 2 is about minimal losses
    assert claims["teacher-caratheodory-outputs"].kind == "identity"  # holds for any network

    rows = [row(w, 0, base[w]) for w in widths[1:]] + [row(1, 0, 3.0, "collapsed: constant output")]
    unhealthy = {"teacher-w1-t0": "collapsed: constant output"}
    claims = {c.id: c for c in _claim_gate(analyze(cfg, {r["id"]: r for r in rows}, None).claims, unhealthy)}
    assert claims["teacher-m1-gap"].passed is None  # rests on the collapsed minimiser: not measured


def test_cp_rank_lower_bound_and_reach_tolerance():
    """m_low is the nuclear-norm prox: for bipartite(6), Q = 3I + Adj(K_{3,3}) has singular values 6, 3 (x4),
    0; at λN = 0.06 they shrink to 5.94, 2.94, and m_low = (5·0.06²)/6 + 2λ(5.94 + 4·2.94) = 0.357, below the
    rescaled construction's m*. The reach tolerance is half the best narrow net's gap, so width 8 could never
    pass a claim width 9 passes, and a width-9 net only as near m_low as width 8 fails it, though 1 % would not."""
    from featurelab.data.constructions import bipartite
    from featurelab.experiments.cp_rank import (
        Config,
        analyze,
        best_rescaled_loss,
        lower_bound_loss,
        reach_tolerance,
    )

    cfg = Config.model_validate({"construction_sizes": [4], "onehot_sizes": [2, 3]})
    c = bipartite(cfg.N)
    bound = lower_bound_loss(c.data.Y_train, cfg.lam)
    assert bound == pytest.approx(5 * 0.06**2 / 6 + 2 * 0.01 * (5.94 + 4 * 2.94), rel=1e-12)
    assert bound < best_rescaled_loss(c.data.Y_train, cfg.lam, c.sq_norm)  # the construction only bounds above
    m8 = bound * (1 + 3.5e-3)  # the quick preset's certified m(8)
    tol = 0.5 * 3.5e-3
    assert reach_tolerance(0.01, [m8], bound) == pytest.approx(tol)
    assert reach_tolerance(0.01, [], bound) == 0.01

    def rows(m9):
        losses = {4: 5 * bound, 8: m8, 9: m9, 12: bound * (1 + 1e-12)}
        return {
            f"w{w}": {
                "id": f"w{w}",
                "width": w,
                "trial": 0,
                "loss": m,
                "reduced_output_error": 0.0,
                "reduced_width": [w],
            }
            for w, m in losses.items()
        }

    claims = {x.id: x for x in analyze(cfg, rows(bound * (1 + 1e-9)), None).claims}
    assert claims["wide-reach-optimum"].passed and claims["wide-reach-optimum"].premise == "critical"
    assert claims["wide-reach-optimum"].margin == pytest.approx((tol - 1e-9) / tol)
    assert claims["narrow-above-optimum"].margin == pytest.approx((m8 - bound * (1 + 1e-9)) / (bound * (1 + 1e-9)))
    assert claims["loss-lower-bound"].passed and claims["loss-lower-bound"].kind == "identity"
    assert {x.kind for x in claims.values() if x.id.startswith("construction")} == {"identity"}
    # an uncertified width-8 minimiser leaves the narrow claim unmeasured, not the wide one (it rests on w >= 9)
    from featurelab.runs.runner import two_tiers

    certificates = {
        u: {"certificate": {"certified": u != "w8", "stationarity": 1e-4, "tolerance": 1e-6}} for u in rows(0)
    }
    listed = list(claims.values())
    gated = {x.id: x for x in two_tiers(listed, listed, listed, certificates, {})}
    assert gated["wide-reach-optimum"].certified_passed is True
    assert gated["narrow-above-optimum"].certified_passed is None
    claims = {x.id: x for x in analyze(cfg, rows(bound * (1 + 3e-3)), None).claims}
    assert not claims["wide-reach-optimum"].passed  # within 1 % of m_low, but not twice as near as width 8
    claims = {x.id: x for x in analyze(cfg, rows(bound * (1 - 1e-6)), None).claims}
    assert not claims["loss-lower-bound"].passed  # below a bound that holds for every network: a bug


def test_radial_balance_claim_reads_the_worst_hidden_layer_against_one_percent():
    """radial-balance: the larger of the hidden layers' radial imbalances against 1%, premise "critical"; a layer
    at 0.5% passes with margin 0.5, one at 2% fails with margin -1 whichever layer it is."""
    from featurelab.experiments.forces import balance_claim

    lays = [{"layer": 1, "radial_imbalance": 0.005}, {"layer": 2, "radial_imbalance": 1e-4}]
    c = balance_claim(lays, "ref")
    assert c.passed and c.id == "radial-balance" and c.premise == "critical"
    assert c.margin == pytest.approx(0.5) and "layer 1" in c.statement
    lays[1]["radial_imbalance"] = 0.02
    c = balance_claim(lays, "ref")
    assert not c.passed and c.margin == pytest.approx(-1.0) and "layer 2" in c.statement


def test_failed_trials_claim_reads_the_individual_trials_on_the_plateau():
    """teacher-failed-trials: over the healthy trials at widths >= n*(10%), the largest L_λ/m_inf must exceed 1.1.
    Here n*(10%) = 8 and m_inf = 0.1: a trial at 0.15 on width 16 (ratio 1.5) passes with margin (1.5 − 1.1)/1.1;
    the same trial at width 4 (off the plateau) does not count; a collapsed trial is left out, and one trial per
    width leaves the claim not measured."""
    import pandas as pd

    from featurelab.experiments.width_plateau import failed_trials_claim

    def rows(extra_width, unhealthy=""):
        base = [(w, 0, 1.0 if w == 1 else 0.15 if w < 8 else 0.1) for w in (1, 2, 4, 8, 16, 32)]
        rs = [{"id": f"t-w{w}-t{t}", "width": w, "trial": t, "loss": x, "unhealthy": ""} for w, t, x in base]
        rs.append(
            {"id": f"t-w{extra_width}-t1", "width": extra_width, "trial": 1, "loss": 0.15, "unhealthy": unhealthy}
        )
        return pd.DataFrame(rs)

    c = failed_trials_claim(rows(16), 0.1, 8)
    assert c.passed is True and c.id == "teacher-failed-trials" and c.premise == ""
    assert c.margin == pytest.approx((1.5 - 1.1) / 1.1)
    assert c.units is not None and set(c.units) == {"t-w8-t0", "t-w16-t0", "t-w32-t0", "t-w16-t1"}
    c = failed_trials_claim(rows(4), 0.1, 8)
    assert c.passed is False and c.margin == pytest.approx((1.0 - 1.1) / 1.1)
    c = failed_trials_claim(rows(16, "collapsed: constant output"), 0.1, 8)
    assert c.passed is False and c.units is not None and "t-w16-t1" not in c.units
    one = rows(16)
    c = failed_trials_claim(one[one["trial"] == 0], 0.1, 8)
    assert c.passed is None and "one trial" in c.reason


@pytest.mark.parametrize("objective", ["mse", "cross_entropy"])
def test_output_slack_is_the_first_order_change_of_the_data_cost(objective):
    """Moving the outputs by ε·sign(∂C/∂f) changes C by Σ|∂C/∂f|·ε to first order: `output_slack` must give
    that (finite differences of the cost itself), and a move against the gradient must lower C by as much."""
    from featurelab.experiments.width_plateau import output_slack
    from featurelab.training.objectives import data_cost

    g = torch.Generator().manual_seed(0)
    out = torch.randn(20, 4, generator=g, dtype=torch.float64)
    Y = torch.randint(0, 4, (20,), generator=g) if objective == "cross_entropy" else torch.randn(20, 4, generator=g)
    f = out.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(data_cost(objective, f, Y.double() if objective == "mse" else Y), f)
    eps = 1e-7
    up = out + eps * grad.sign()
    target = Y.double() if objective == "mse" else Y
    rise = float(data_cost(objective, up, target) - data_cost(objective, out, target))
    slack = output_slack(objective, out, up, target)
    assert slack == pytest.approx(float(grad.abs().sum()) * eps, rel=1e-12)
    assert rise == pytest.approx(slack, rel=1e-5)
    down = out - eps * grad.sign()
    assert float(data_cost(objective, down, target) - data_cost(objective, out, target)) == pytest.approx(
        -slack, rel=1e-5
    )


def test_caratheodory_loss_check_allows_exactly_the_output_slack():
    """A reduced loss that rises by the outputs' first-order slack passes; a rise of 1e-10·L beyond it fails."""
    import pandas as pd

    from featurelab.experiments.width_plateau import reduction_claims

    def claims(rise_beyond):
        rows = pd.DataFrame(
            [
                {
                    "id": "w4",
                    "loss": 2.0,
                    "reduced_loss": 2.0 + 3e-11 + rise_beyond * 2.0,
                    "reduced_output_slack": 3e-11,
                    "reduced_output_error": 1e-12,
                },
            ]
        )
        return {c.id: c for c in reduction_claims("teacher", rows)}

    assert claims(0.0)["teacher-caratheodory-loss"].passed
    assert claims(1e-10)["teacher-caratheodory-loss"].passed is False
