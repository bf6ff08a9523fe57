"""What an experiment is: a validated config with presets, a list of independent units of work
(one training run each, say), the function that runs one unit, and the analysis that turns the
units' results into figures, tables and claims.

Units are what the sweep mechanism distributes across worker processes and skips on ``--resume``.
A unit is run either by `run_unit(cfg, unit, ctx) -> dict`, or, for units that are one training run,
by the pair `build(cfg, unit) -> TrainingUnit` and `finish(cfg, unit, model, train_result, ctx) -> dict`:
the sweep then trains the model itself (on the unit's device; same-shape units as one batched ensemble)
and hands it to `finish` on the CPU.
Results are JSON-able dicts. A result with a non-empty ``"unhealthy"`` entry (a reason) rests on a
trivial solution (a diverged, collapsed or chance-level network): the runner then reports every claim
as "not measured". Units trained through `build` get it from
`featurelab.training.health.training_health`; `run_unit` experiments set it themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import torch

from ..claims import Claim
from ..config import ExperimentConfig
from ..data.dataset import Dataset
from ..training.trainer import TrainConfig, train

C = TypeVar("C", bound=ExperimentConfig)


@dataclass
class TrainingUnit:
    """One training run, as built by an experiment's `build`: the model, its data, how to train it and
    the callbacks that add columns to its history (``on_log`` only, so that it can join an ensemble), and
    `certify`: a stationarity tolerance; when set the trained model is polished to a critical point in float64
    (`featurelab.training.critical.polish`) before ``finish``, and the result gains its ``"certificate"``."""

    model: torch.nn.Module
    data: Dataset
    config: TrainConfig
    callbacks: tuple = ()
    certify: float | None = None


@dataclass(frozen=True)
class UnitContext:
    """Where and how one unit runs: its own folder (checkpoints, history), device, resume flag."""

    dir: Path
    device: str = "cpu"
    resume: bool = False
    progress: bool = False


@dataclass(frozen=True)
class AnalysisContext:
    """The run folder, device, and the ids of units that failed (with their one-line errors)."""

    dir: Path
    device: str = "cpu"
    failed: dict[str, str] = field(default_factory=dict)


@dataclass
class Analysis:
    """What `analyze` returns: claims, matplotlib figures by name, tables (DataFrames) by name, a
    JSON-able summary of the headline numbers, and free-text notes for the report."""

    claims: list[Claim]
    figures: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Experiment(Generic[C]):
    """A named, registered experiment (see `featurelab.experiments.REGISTRY`); `C` is its config class."""

    name: str
    summary: str
    reference: str
    config: type[C]
    presets: dict[str, dict]
    units: Callable[[C], list[dict]]
    analyze: Callable[[C, dict[str, dict], AnalysisContext], Analysis]
    run_unit: Callable[[C, dict, UnitContext], dict] | None = None
    build: Callable[[C, dict], TrainingUnit] | None = None
    finish: Callable[..., dict] | None = None
    check: Callable[[C], None] | None = None
    """Pre-flight checks beyond the config's field types, run before anything is written: data paths
    that must exist, memory estimates (`featurelab.runtime.check_memory`); each failure one line."""

    def __post_init__(self):
        if (self.run_unit is None) == (self.build is None or self.finish is None):
            raise TypeError(f"experiment {self.name}: give either run_unit or both build and finish")

    def execute(self, cfg: C, unit: dict, ctx: UnitContext) -> dict:
        """Run one unit: `run_unit`, or train what `build` returns and pass the result to `finish`."""
        if self.run_unit is not None:
            return self.run_unit(cfg, unit, ctx)
        assert self.build is not None and self.finish is not None  # __post_init__ checked it
        job = self.build(cfg, unit)
        result = train(
            job.model,
            job.data,
            job.config,
            device=ctx.device,
            run_dir=ctx.dir,
            resume=ctx.resume,
            callbacks=job.callbacks,
            progress=ctx.progress,
        )
        job.model.cpu()  # `finish` measures on the CPU, next to the unit's data
        cert = certify(job)
        return with_health({**self.finish(cfg, unit, job.model, result, ctx), **cert}, job, result.history)


def certify(job: TrainingUnit) -> dict:
    """``{"certificate": ...}`` after polishing the trained `job.model` (on the CPU, in place, to float64) to a
    critical point at tolerance `job.certify` (`featurelab.training.critical.polish`); ``{}`` when not asked."""
    if job.certify is None:
        return {}
    from ..training.critical import polish

    cert = polish(job.model, job.data, job.config.objective, job.config.lam, tolerance=job.certify)
    return {"certificate": cert.to_dict()}


def with_health(result: dict, job: TrainingUnit, history=None) -> dict:
    """`result` with ``"unhealthy"`` set to `training_health`'s reason when the trained `job` is unhealthy,
    its training `history` (a DataFrame with ``loss``) included (a reason the experiment gave itself is kept)."""
    from ..training.health import training_health

    if result.get("unhealthy"):
        return result
    reason = training_health(job.model, job.data, getattr(job.config, "objective", "mse"), history)
    return {**result, "unhealthy": reason} if reason else result
