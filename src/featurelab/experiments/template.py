"""`template`: the shape of an experiment, to copy. An L2-regularised ReLU MLP is trained on a bottleneck
teacher and one claim is checked: training lowers the training cost to below `FIT` of its value at
initialisation.

To make your own: copy this file to ``experiments/<your_name>.py``, replace the config, the data, the model, what
`finish` measures and what `analyze` claims, and add a ``CATALOG = (Entry(...),)`` block next to ``EXPERIMENT``
(name, presets, one line, listing order: `featurelab.catalog`). That block registers it: no other file changes.
This file has none, so it is not listed. ``tests/test_template.py`` runs it end to end at its tiny preset.

The parts, in the order the runner uses them:
- `Config` (pydantic, typed and bounded fields) and `PRESETS` (overrides of its defaults, by name);
- `units(cfg)`: the independent training runs, each a dict with a unique ``"id"``;
- `build(cfg, unit)`: the model, data and `TrainConfig` of one unit (the sweep trains it);
- `finish(cfg, unit, model, result, ctx)`: what the trained model measures, a JSON-able dict (`UnitResult`);
- `analyze(cfg, results, ctx)`: claims (each from a named `Threshold`), figures, tables and a summary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import pandas as pd
import torch
from pydantic import Field

from ..claims import Threshold, threshold_claim
from ..config import ExperimentConfig
from ..data import bottleneck_teacher
from ..figures import plt
from ..models import MLP
from ..training import OptimizerConfig
from .base import Analysis, Experiment, TrainingUnit

FIT = Threshold(0.1, "<=", ceiling=0.0, source="ours: a trained net keeps at most a tenth of its initial training cost")


class Config(ExperimentConfig):
    """The teacher, the net, λ and the optimizer (an `OptimizerConfig`: ``--set optimizer.adam_steps=500``)."""

    teacher_dims: list[int] = Field(default=[6, 2, 6], min_length=3)
    n_train: int = Field(default=128, ge=2)
    width: int = Field(default=32, ge=1)
    depth: int = Field(default=3, ge=2)
    lam: float = Field(default=1e-3, ge=0)
    seeds: list[int] = Field(default=[0, 1], min_length=1)
    optimizer: OptimizerConfig = OptimizerConfig(adam_steps=2000, adam_lr=3e-3, log_every=100)


PRESETS = {
    "quick": {},
    "tiny": {"n_train": 32, "width": 8, "seeds": [0], "optimizer": {"adam_steps": 200, "log_every": 50}},
}


@dataclass(frozen=True)
class UnitResult:
    """What one trained net measured: the training cost (mean squared error) at initialisation and at the end."""

    seed: int
    initial_cost: float
    final_cost: float

    @classmethod
    def of(cls, result: dict) -> UnitResult:
        """The fields of a unit's result dict (which the runner may extend, e.g. with ``"unhealthy"``)."""
        return cls(**{f.name: result[f.name] for f in fields(cls)})

    @property
    def fit_ratio(self) -> float:
        return self.final_cost / self.initial_cost


def make_data(cfg: Config):
    return bottleneck_teacher(tuple(cfg.teacher_dims), n_train=cfg.n_train, n_test=0, teacher_seed=cfg.seed)


def make_model(cfg: Config, data, seed: int) -> MLP:
    return MLP(data.d_in, data.d_out, cfg.width, cfg.depth, bias=1.0, seed=seed, dtype=torch.float64)


def units(cfg: Config) -> list[dict]:
    return [{"id": f"seed{s}", "seed": s} for s in cfg.seeds]


def build(cfg: Config, unit: dict) -> TrainingUnit:
    data = make_data(cfg)
    return TrainingUnit(make_model(cfg, data, unit["seed"]), data, cfg.optimizer.train_config("mse", cfg.lam))


def training_cost(model: MLP, data) -> float:
    """The mean squared error (1/N)‖f(X) − Y‖²_F on the training set (N x d rows)."""
    with torch.no_grad():
        return float(((model(data.X_train) - data.Y_train) ** 2).sum() / len(data.X_train))


def finish(cfg: Config, unit: dict, model: MLP, result, ctx) -> dict:
    data = make_data(cfg)
    initial = training_cost(make_model(cfg, data, unit["seed"]), data)
    return asdict(UnitResult(unit["seed"], initial, training_cost(model, data)))


def fit_figure(rows: list[UnitResult]):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar([str(r.seed) for r in rows], [r.fit_ratio for r in rows])
    ax.axhline(FIT.bound, color="k", ls="--", label="claimed bound")
    ax.set_xlabel("seed")
    ax.set_ylabel("final / initial training cost")
    ax.legend()
    return fig


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    rows = [UnitResult.of(res) for res in results.values()]
    worst = max((r.fit_ratio for r in rows), default=float("nan"))
    claims = [
        threshold_claim(
            "training lowers every net's training cost to a tenth of its initial value or less",
            "featurelab's template experiment (no paper)",
            worst,
            FIT,
            id="template-fit",
        )
    ]
    table = pd.DataFrame([{**asdict(r), "fit_ratio": r.fit_ratio} for r in rows])
    return Analysis(claims, {"fit": fit_figure(rows)}, {"units": table}, {"worst_fit_ratio": worst})


EXPERIMENT = Experiment(
    name="template",
    summary="An L2-regularised ReLU MLP fits a bottleneck teacher: the shape of an experiment, to copy.",
    reference="featurelab's template experiment (no paper)",
    config=Config,
    presets=PRESETS,
    units=units,
    build=build,
    finish=finish,
    analyze=analyze,
)
