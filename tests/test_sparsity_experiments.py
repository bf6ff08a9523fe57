"""Part 3 experiment helpers on known numbers: the plateau start of docs/theory/sparsity.md §6's measured table,
ray share and class separation on constructed representations."""

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
        }
        return {**r, "unhealthy": unhealthy} if unhealthy else r

    cfg = Config(datasets=["teacher"])
    widths = [1, 2, 4, 8, 16, 32]
    base = {w: (1.0 if w == 1 else 0.15 if w < 8 else 0.1) for w in widths}  # n*(10%) = 8
    rows = [row(w, 0, base[w]) for w in widths] + [row(1, 1, 3.0, "collapsed: constant output")]
    unhealthy = {r["id"]: r["unhealthy"] for r in rows if r.get("unhealthy")}
    claims = {c.id: c for c in _claim_gate(analyze(cfg, {r["id"]: r for r in rows}, None).claims, unhealthy)}
    assert claims["teacher-m1-gap"].passed is True  # m(1)/m_inf = 1.0/0.1 from trial 0
    assert claims["teacher-plateau-start"].passed is True
    assert claims["teacher-caratheodory-outputs"].passed is True  # the collapsed trial is left out
    assert "teacher-w1-t1" not in claims["teacher-caratheodory-outputs"].units

    rows = [row(w, 0, base[w]) for w in widths[1:]] + [row(1, 0, 3.0, "collapsed: constant output")]
    unhealthy = {"teacher-w1-t0": "collapsed: constant output"}
    claims = {c.id: c for c in _claim_gate(analyze(cfg, {r["id"]: r for r in rows}, None).claims, unhealthy)}
    assert claims["teacher-m1-gap"].passed is None  # rests on the collapsed minimiser: not measured
