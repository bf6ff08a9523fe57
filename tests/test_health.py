"""`training_health` at its thresholds: chance level (boundary included) and a loss that barely moved;
and the build path of every experiment hands its training history to the check (single units and
batched ensembles alike)."""

import pandas as pd
import pytest
import torch

from featurelab.config import ExperimentConfig
from featurelab.data import Dataset, bottleneck_teacher
from featurelab.experiments import REGISTRY
from featurelab.experiments.base import Analysis, Experiment, TrainingUnit
from featurelab.models import MLP
from featurelab.runs.runner import run_experiment
from featurelab.training import Phase, TrainConfig
from featurelab.training.health import CHANCE_FRACTION, STALL_RTOL, stalled, training_health

D = torch.float64


def classifier_with_errors(n: int, wrong: int):
    """A 1-D two-class problem, n/2 samples per class, and a linear classifier that gets exactly `wrong`
    of them wrong (wrong // 2 samples of class 0 on the class-1 side, the rest of them samples of class 1
    on the class-0 side): chance error 1/2."""
    labels = torch.tensor([0] * (n // 2) + [1] * (n // 2))
    x = torch.where(labels == 0, -1.0, 1.0).to(D)
    x[: wrong // 2] = 1.0
    x[n // 2 : n // 2 + wrong - wrong // 2] = -1.0
    X = torch.stack([x, torch.linspace(0, 1, n, dtype=D)], dim=1)
    net = torch.nn.Linear(2, 2, dtype=D)
    with torch.no_grad():  # logits (-x, x): class 1 exactly where x > 0
        net.weight.copy_(torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
        net.bias.zero_()
    return net, Dataset(X, labels, X[:0], labels[:0], n_classes=2)


@pytest.mark.parametrize(
    "wrong, healthy",
    [
        (18, True),  # error 0.45 < 0.95 x 0.5
        (19, False),  # error 0.475 = 0.95 x 0.5: the threshold itself is chance level
        (20, False),  # error 0.5 = chance exactly (a test `err > chance` lets it through)
        (21, False),
    ],
)
def test_chance_level_boundary(wrong, healthy):
    assert CHANCE_FRACTION == 0.95
    net, data = classifier_with_errors(40, wrong)
    reason = training_health(net, data, "cross_entropy")
    assert (reason == "") is healthy
    if not healthy:
        assert reason.startswith(f"chance level: training error {wrong / 40:.3g} vs 0.5")


@pytest.mark.parametrize(
    "losses, moved",
    [
        ([2.0, 1.5, 1.0], True),
        ([2.0, 2.1, 1.97], True),  # 1.5 % below the start
        ([2.0, 1.9, 2.0 * (1 - STALL_RTOL)], False),  # exactly 1 % below: the threshold is "not trained"
        ([2.0, 2.0, 2.0], False),  # a learning rate of ~0
        ([2.0, 5.0, 2.5], False),  # ends above its start
        ([2.0], True),  # one row: no evidence either way
    ],
)
def test_a_loss_that_barely_moved_is_unhealthy(losses, moved):
    reason = stalled(pd.DataFrame({"loss": losses}))
    assert (reason == "") is moved
    if not moved:
        assert reason.startswith("stalled: the loss went from 2 to")


def test_training_health_reads_the_history_after_the_network_checks():
    net, data = classifier_with_errors(40, 0)
    assert training_health(net, data, "cross_entropy", pd.DataFrame({"loss": [0.7, 0.69999]})).startswith("stalled")
    assert training_health(net, data, "cross_entropy", pd.DataFrame({"loss": [0.7, 0.1]})) == ""
    assert training_health(net, data, "cross_entropy") == ""  # no history: the network checks only


class StallConfig(ExperimentConfig):
    lr: float = 1e-12  # far too small to train


def stall_build(cfg, unit):
    data = bottleneck_teacher((4, 2, 4), "fcnn", 8, 24, 8, teacher_seed=0, data_seed=1)
    model = MLP(4, 4, 6, 3, seed=int(unit["id"][-1]), dtype=D)
    return TrainingUnit(model, data, TrainConfig(phases=[Phase(steps=20, lr=cfg.lr)], log_every=10))


STALL = Experiment(
    name="test-health-stall",
    summary="test-only: two same-shape regressions trained at a learning rate of ~0",
    reference="tests",
    config=StallConfig,
    presets={"quick": {}},
    units=lambda cfg: [{"id": "u0"}, {"id": "u1"}],
    analyze=lambda cfg, results, ctx: Analysis([]),
    build=stall_build,
    finish=lambda cfg, unit, model, result, ctx: {"loss": float(result.history["loss"].iloc[-1])},
)
REGISTRY[STALL.name] = STALL


@pytest.mark.parametrize("batch", [True, False])
def test_untrained_units_are_unhealthy_on_every_build_path(tmp_path, batch):
    """Batched (one ensemble of two) and one by one: both units are unhealthy, and a learning rate that
    trains leaves them healthy."""
    record = run_experiment(STALL.name, out=tmp_path / "stall", workers=1, progress=False, batch=batch)
    assert set(record.unhealthy) == {"u0", "u1"}
    assert all(r.startswith("stalled: the loss went from") for r in record.unhealthy.values())
    trained = run_experiment(
        STALL.name, out=tmp_path / "trained", workers=1, progress=False, batch=batch, overrides={"lr": 1e-2}
    )
    assert trained.unhealthy == {}
