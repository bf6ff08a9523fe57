"""Work items: what the sweep hands to a worker process or a Ray task, and what comes back.

A `WorkItem` is one unit, or several units trained as one batched ensemble: fresh units of equal
`featurelab.training.ensemble.ensemble_key`, or the members of an interrupted ensemble, resumed
together. `execute` runs it wherever it lands and writes each unit's ``result.json`` (atomically, last);
it returns one `UnitOutcome` per unit. A unit that raises is recorded as failed, except for a
`WriteError` (the folder cannot be written) and a `BuildError` (the experiment's ``build`` raised: a bug or a
unit it cannot construct, which no retry mends): those stop the run.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from ..config import ExperimentConfig
from ..errors import FeaturelabError, WriteError
from ..experiments.base import Experiment, UnitContext
from ..io import digest, make_folder, write_json, write_text
from ..runtime import set_threads, tune_cpu
from .manifest import unit_files


@dataclass(frozen=True)
class UnitOutcome:
    """One unit's outcome: its result dict, or a one-line error; the wall time it took (an
    ensemble's members share the ensemble's time)."""

    id: str
    result: dict | None
    error: str | None
    seconds: float


@dataclass(frozen=True)
class WorkItem:
    """One unit, or an ensemble (fresh same-shape units, or an interrupted ensemble's members) of
    experiment `experiment`."""

    experiment: Experiment
    config: ExperimentConfig
    units: tuple[dict, ...]
    folders: tuple[str, ...]
    device: str = "cpu"
    resume: bool = False
    threads: int = 1
    jobs: tuple | None = None  # the units' `TrainingUnit`s when already built (in-process sweeps)

    def with_folders(self, folders) -> WorkItem:
        return WorkItem(
            self.experiment,
            self.config,
            self.units,
            tuple(str(f) for f in folders),
            self.device,
            self.resume,
            self.threads,
            self.jobs,
        )


class BuildError(FeaturelabError):
    """An experiment's ``build`` raised for a unit: one line naming the unit and the exception's first line. It
    stops the sweep at once (never retried, never recorded as one failed unit among others)."""


def build_error(exp: Experiment, unit: dict, exc: BaseException, folder: str | Path | None = None) -> BuildError:
    """The `BuildError` for `exc`, raised by ``exp.build`` for `unit`; its traceback is kept in `folder`'s
    ``error.txt`` when a folder is given."""
    where = ""
    if folder is not None:
        path = make_folder(folder)
        write_text(path / "error.txt", "".join(traceback.format_exception(exc)))
        where = f" (traceback in '{path / 'error.txt'}')"
    return BuildError(f"unit {unit['id']!r} of {exp.name} cannot be built: {one_line(exc)}{where}")


def build_unit(exp: Experiment, cfg: ExperimentConfig, unit: dict, folder: str | Path | None = None):
    """``exp.build(cfg, unit)``; an exception it raises becomes a `BuildError` (`build_error`)."""
    assert exp.build is not None
    try:
        return exp.build(cfg, unit)
    except Exception as exc:
        raise build_error(exp, unit, exc, folder) from exc


def raised_in_build(exc: BaseException, exp: Experiment) -> bool:
    """Whether `exc` was raised inside ``exp.build`` (a frame of its traceback runs the build's code)."""
    code = getattr(exp.build, "__code__", None)
    tb = exc.__traceback__
    while code is not None and tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def write_result(folder: Path, item: WorkItem, unit: dict, seconds: float, result: dict, **extra) -> None:
    """Write the unit's ``result.json`` (last), with the config's `digest`, the sha256 of the folder's other files
    (`featurelab.runs.manifest.unit_files`) and its own sha256 checksum."""
    record = {"unit": unit, "seconds": seconds, **extra, "config": digest(item.config.model_dump(mode="json"))}
    record["files"] = unit_files(folder)
    write_json(folder / "result.json", {**record, "result": result}, checksum=True)


def one_line(exc: BaseException) -> str:
    """The first line of ``"Type: message"`` for an exception."""
    return (f"{type(exc).__name__}: {exc}".splitlines() or [type(exc).__name__])[0]


def execute_unit(item: WorkItem, unit: dict, folder: str, resume: bool, progress: bool = False) -> UnitOutcome:
    """Run one unit of `item` in this process and write its ``result.json``; exceptions become
    one-line errors (the traceback is kept in ``error.txt``), except a `WriteError` and an exception raised by
    the experiment's ``build`` (a `BuildError`), which are raised."""
    set_threads(item.threads)
    t0 = time.perf_counter()
    path = make_folder(folder)
    try:
        result = item.experiment.execute(item.config, unit, UnitContext(path, item.device, resume, progress))
        seconds = time.perf_counter() - t0
        write_result(path, item, unit, seconds, result)
        return UnitOutcome(unit["id"], result, None, seconds)
    except WriteError:
        raise
    except Exception as exc:  # recorded, reported as failed, the sweep goes on; a failed build stops it
        if raised_in_build(exc, item.experiment):
            raise build_error(item.experiment, unit, exc, path) from exc
        write_text(path / "error.txt", traceback.format_exc())
        return UnitOutcome(unit["id"], None, one_line(exc), time.perf_counter() - t0)


def execute_ensemble(item: WorkItem, progress: bool = False) -> list[UnitOutcome]:
    """Build the item's units (fresh runs of equal `ensemble_key`, or an interrupted ensemble's members,
    continued from their checkpoints when `item.resume`), train them as one ensemble, ``finish`` each and
    write each ``result.json`` (a build that raises stops the run: `BuildError`). Falls back to `execute_unit`
    per unit when the ensemble cannot run (the
    reason is kept in each folder's ``ensemble_fallback.txt``): fresh units from scratch (whatever the
    failed ensemble left), an interrupted ensemble's members each from its checkpoint."""
    from ..training.ensemble import train_ensemble

    set_threads(item.threads)
    exp, cfg = item.experiment, item.config
    assert exp.build is not None and exp.finish is not None  # only build/finish units are batched
    t0 = time.perf_counter()
    paths = [make_folder(f) for f in item.folders]
    resume = item.resume and any((p / "checkpoint.safetensors").exists() for p in paths)  # not fresh units
    why = None  # why the ensemble cannot run, written down outside the `except` block
    jobs = list(item.jobs) if item.jobs is not None else [build_unit(exp, cfg, u, p) for u, p in zip(item.units, paths)]
    try:
        trained = train_ensemble(
            [j.model for j in jobs],
            [j.data for j in jobs],
            [j.config for j in jobs],
            device=item.device,
            run_dirs=paths,
            resume=resume,
            callbacks=[j.callbacks for j in jobs],
            progress=progress,
        )
    except WriteError:
        raise
    except Exception:  # not batchable after all, or not resumable together: one by one
        why = traceback.format_exc()
    if why is not None:
        for p in paths:
            write_text(p / "ensemble_fallback.txt", why)
        return [execute_unit(item, u, f, resume, progress) for u, f in zip(item.units, item.folders)]
    seconds = time.perf_counter() - t0
    out = []
    for unit, job, res, path in zip(item.units, jobs, trained, paths):
        try:
            if isinstance(res, Exception):
                raise res
            result = exp.finish_trained(cfg, unit, job, res, UnitContext(path, item.device, False, progress))
            write_result(path, item, unit, seconds, result, ensemble=len(item.units))
            out.append(UnitOutcome(unit["id"], result, None, seconds))
        except WriteError:
            raise
        except Exception as exc:
            write_text(path / "error.txt", traceback.format_exc())
            out.append(UnitOutcome(unit["id"], None, one_line(exc), seconds))
    return out


def execute(item: WorkItem, progress: bool = False) -> list[UnitOutcome]:
    """Run one work item: a single unit, or a batched ensemble of several (in a process tuned by `tune_cpu`)."""
    tune_cpu(item.device)
    if len(item.units) == 1:
        return [execute_unit(item, item.units[0], item.folders[0], item.resume, progress)]
    return execute_ensemble(item, progress)
