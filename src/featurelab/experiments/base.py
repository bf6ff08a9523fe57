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

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import torch

from ..claims import Claim
from ..config import ExperimentConfig
from ..data.dataset import Dataset
from ..errors import WriteError
from ..io import write_json
from ..training.trainer import TrainConfig, train

C = TypeVar("C", bound=ExperimentConfig)


@dataclass
class TrainingUnit:
    """One training run, as built by an experiment's `build`: the model, its data, how to train it and
    the callbacks that add columns to its history (``on_log`` only, so that it can join an ensemble), and
    `certify`: the Clarke-residual tolerance of a certified critical point. When set, the unit is finished three
    ways (`Experiment.finish_trained`): ``finish`` on the trained net (tier "as the paper did"), then
    `featurelab.training.certify.certify` on a float64 copy, and ``finish`` on the certified net and on the
    earlier point of its path (for the error bars); the run folder stores the certified parameters
    (`save_certified`)."""

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
        return self.finish_trained(cfg, unit, job, result, ctx)

    def finish_trained(self, cfg: C, unit: dict, job: TrainingUnit, result, ctx: UnitContext) -> dict:
        """``finish`` on the trained `job.model` (moved to the CPU, where `finish` measures next to the unit's
        data) with its health; where `job.certify` is set and the trained net is healthy, also the certified
        tier (`certified_results`). A certification that raises leaves the trained tier standing: its
        certificate then reads ``certified: false`` with the error as its rule."""
        assert self.finish is not None  # __post_init__ checked it
        job.model.cpu()
        trained = with_health(self.finish(cfg, unit, job.model, result, ctx), job, result.history)
        if job.certify is None or trained.get("unhealthy"):
            return trained
        t0 = time.perf_counter()
        try:
            return {**trained, **certified_results(self.finish, cfg, unit, job, result, ctx)}
        except WriteError:
            raise
        except Exception as exc:  # the paper tier stands; the certified tier says why it is missing
            first = (f"{type(exc).__name__}: {exc}".splitlines() or [type(exc).__name__])[0]
            failed = {"certified": False, "rule": f"certification failed: {first}"}
            return {**trained, "certificate": failed, "certify_seconds": time.perf_counter() - t0}


def certified_results(finish: Callable[..., dict], cfg, unit: dict, job: TrainingUnit, result, ctx: UnitContext):
    """What certification adds to a unit's result: ``"trained_stationarity"`` (``‖∇(C+R)‖/‖∇R‖`` of the trained
    net, float64), ``"certificate"`` (`Certificate.to_dict`), ``"certify_seconds"`` and, where it is certified,
    ``"certified"`` and ``"previous"`` (``finish`` on the certified net and on the earlier point of its path;
    an uncertified unit's claims read "not measured" in tier "certified" whatever they would measure). The
    trained `job.model` is left as it is: `certify` runs on a float64 copy, and the unit folder ``ctx.dir`` gains
    ``certified.safetensors`` and ``certificate.json`` (`save_certified`) either way; while `certify` runs it also
    holds each continuation stage's end (`StageCheckpoint`), from which ``ctx.resume`` goes on."""
    from ..training.certify import StageCheckpoint, certify
    from ..training.critical import stationarity

    objective, lam = job.config.objective, job.config.lam
    t0 = time.perf_counter()
    trained = stationarity(job.model, job.data, objective, lam).stationarity
    model = copy.deepcopy(job.model).cpu().to(torch.float64)
    assert job.certify is not None
    kept = ctx.dir / StageCheckpoint.FILE  # each continuation stage's end, for --resume
    options = {"checkpoint": kept, "resume": ctx.resume, "progress": ctx.progress}
    found = certify(model, job.data, objective, lam, tolerance=job.certify, **options)
    seconds = time.perf_counter() - t0
    save_certified(ctx.dir, model, found, {"objective": objective, "lam": lam, "seconds": seconds})
    out = {"trained_stationarity": trained, "certificate": found.certificate.to_dict(), "certify_seconds": seconds}
    if not out["certificate"].get("certified"):
        return out
    earlier = copy.deepcopy(model)
    earlier.load_state_dict(found.previous)
    with found.slopes_mode():  # σ' at the kink entries is s*, the slope of the vanishing Clarke gradient
        certified = finish(cfg, unit, model, result, ctx)
    return {**out, "certified": certified, "previous": finish(cfg, unit, earlier, result, ctx)}


CERTIFIED_FILE, CERTIFICATE_FILE = "certified.safetensors", "certificate.json"


def save_certified(folder: Path, model: torch.nn.Module, found, info: dict) -> None:
    """Write ``folder/certified.safetensors`` (the certified parameters as ``param/<name>`` of the model's
    state_dict, the slopes s* at the kink entries as ``slopes`` (K,), the kink masks as ``kinks/<i>``, one per
    activation call in forward order; the model's class, the objective, λ and the certified loss in its
    metadata) and ``folder/certificate.json`` (the certificate and `info`), each atomically."""
    from ..training.checkpoint import save_tensors

    cert = found.certificate.to_dict()
    tensors = {f"param/{k}": v for k, v in model.state_dict().items()}
    tensors["slopes"] = found.slopes.detach().to(torch.float64)
    tensors.update({f"kinks/{i}": m.detach().to(torch.bool) for i, m in enumerate(found.kink_masks)})
    meta = {"model": type(model).__name__, "kinks": len(found.kink_masks), "loss": cert.get("loss_after"), **info}
    save_tensors(folder / CERTIFIED_FILE, tensors, meta)
    write_json(folder / CERTIFICATE_FILE, {**cert, **info})


def load_certified(folder: Path) -> tuple[dict[str, torch.Tensor], torch.Tensor, list[torch.Tensor], dict]:
    """What `save_certified` wrote in `folder`: (state_dict, slopes (K,), kink masks, metadata), checksummed."""
    from ..training.checkpoint import load_metadata, load_tensors

    path = folder / CERTIFIED_FILE
    tensors, meta = load_tensors(path, fix="run the unit again"), load_metadata(path) or {}
    state = {k.removeprefix("param/"): v for k, v in tensors.items() if k.startswith("param/")}
    masks = [tensors[f"kinks/{i}"] for i in range(int(meta.get("kinks", 0)))]
    return state, tensors["slopes"], masks, meta


def with_health(result: dict, job: TrainingUnit, history=None) -> dict:
    """`result` with ``"unhealthy"`` set to `training_health`'s reason when the trained `job` is unhealthy,
    its training `history` (a DataFrame with ``loss``) included (a reason the experiment gave itself is kept)."""
    from ..training.health import training_health

    if result.get("unhealthy"):
        return result
    reason = training_health(job.model, job.data, getattr(job.config, "objective", "mse"), history)
    return {**result, "unhealthy": reason} if reason else result
