"""The sweep mechanism: run an experiment's independent units, batched, on workers, resumably.

Each unit runs in ``<run>/units/<id>/`` and is finished when its ``result.json`` exists (written
atomically, last, with a sha256 checksum of its content and the config's digest, both checked when it
is loaded). Finished units are skipped, so re-running with ``--resume`` only does what is
left, whichever backend ran the rest. A unit that raises is recorded in ``error.txt`` and reported
as failed; the sweep goes on, unless the folder cannot be written (`featurelab.errors.WriteError`: a
full disk, say): then the sweep stops its workers and raises it.

Batching: pending units of an experiment with ``build``/``finish`` whose built runs have equal
`featurelab.training.ensemble.ensemble_key` (same shapes and phases; seeds, λ, lr, L̃, init scale
may differ) are trained as one batched ensemble (`train_ensemble`), then ``finish`` runs per
member. ``batch=False`` (``--no-batch``) trains them one by one. The members of an ensemble interrupted
mid-training (their checkpoints name each other, at one step, none of them finished) resume together
(`train_ensemble(resume=True)`): the run then ends bit-identical to an uninterrupted one. Any other unit
with a checkpoint (a damaged one, a member of a group partly finished or at different steps, a run
handed over to L-BFGS) is resumed one-by-one by `train`. A group whose forward cannot be batched (a
float model attribute used in Python control flow, say) falls back to one-by-one runs.

Backends: "local" runs work items on worker processes, one torch thread each by default (featurelab's
small matrices lose to thread overhead, so runs are parallelised across processes, docs/theory/conventions.md);
"ray" runs each work item as a Ray task (`featurelab.runs.ray_backend`).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from tqdm import tqdm

from ..config import ExperimentConfig
from ..errors import FeaturelabError, WriteError
from ..experiments.base import Experiment
from ..io import digest, read_json
from ..progress import progress_bar, show_progress
from ..spelling import option
from .manifest import verify_unit
from .work import BuildError, UnitOutcome, WorkItem, build_unit, execute, one_line

BACKENDS = ("local", "ray")


@dataclass
class SweepOutcome:
    """results: unit id -> result dict (finished units); failed: unit id -> one-line error;
    seconds: unit id -> wall time of units run now (an ensemble's members share its time);
    skipped: ids found finished; ensembles: the sizes of the batched ensembles that ran."""

    results: dict[str, dict] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    ensembles: list[int] = field(default_factory=list)


def watch_parent(parent_pid: int, interval: float = 0.5) -> None:
    """Initializer of the local backend's worker processes: they leave Ctrl-C to the parent (which stops
    them) and exit as soon as the parent is gone, even when it was killed with SIGKILL (Linux: the
    kernel's parent-death signal; elsewhere a thread that polls the parent's id every `interval` s).
    Their progress bars (off) take a thread lock, not tqdm's default semaphore, which a worker stopped by
    `_stop` would leave for the resource tracker to report as leaked."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tqdm.set_lock(threading.RLock())
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="featurelab-watch-parent", daemon=True).start()


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel the pool's queued work items and end its workers now (files are written atomically, so
    what they leave is resumable)."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in workers:
        proc.terminate()


def unit_dir(run_dir: Path, unit_id: str) -> Path:
    return Path(run_dir) / "units" / unit_id


def check_backend(backend: str, retries: int) -> None:
    """A one-line error unless `backend` is one of `BACKENDS` and `retries` >= 0."""
    if backend not in BACKENDS:
        raise FeaturelabError(f"backend={backend!r} is not allowed; choose one of: {', '.join(BACKENDS)}")
    if not isinstance(retries, int) or retries < 0:
        raise FeaturelabError(f"retries={retries!r} is not allowed; it must be an integer >= 0")


def finished(run_dir: Path, unit_id: str, cfg: ExperimentConfig) -> dict | None:
    """The stored result of a finished unit, or None; a result that fails its checksum, is malformed or
    was written for another config is a one-line error naming the file and the fix."""
    folder = unit_dir(run_dir, unit_id)
    path = folder / "result.json"
    if not path.exists():
        return None
    fix = f"delete the folder '{folder}' and continue with {option('again')} to redo this unit"
    record = read_json(path, checksum=True, kind=dict, fix=fix)
    if record.get("config") != digest(cfg.model_dump(mode="json")):
        raise FeaturelabError(f"'{path}' was written for a different config than this run's; {fix}")
    if not isinstance(record.get("result"), dict):
        raise FeaturelabError(f"'{path}' holds no result; {fix}")
    verify_unit(folder, record.get("files"), fix)
    return record["result"]


def member_bytes(job) -> int:
    """Device memory one member of an ensemble needs: the storages autograd saves in one forward pass
    (measured on the CPU with saved-tensor hooks; a storage saved by several operations, such as a ReLU
    output that the next matmul also saves, or views of one weight tensor, is counted once), plus the
    parameters, their gradients and two Adam moments, plus its data."""
    import torch

    from ..training import data_cost

    saved: dict[int, int] = {}  # storage address -> bytes

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    model, data = job.model, job.data
    dtype = next(model.parameters()).dtype
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        cost = data_cost(job.config.objective, model(data.X_train.to(dtype)), data.Y_train)
        (cost + model.penalty(job.config.lam)).backward()
    model.zero_grad(set_to_none=True)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    data_bytes = sum(t.numel() * t.element_size() for t in (data.X_train, data.Y_train, data.X_test, data.Y_test))
    return sum(saved.values()) + 4 * params + data_bytes


def cuda_capacity(job, device: str, headroom: float = 0.8) -> int:
    """How many members like `job` fit in `headroom` of the GPU's free memory (``torch.cuda.mem_get_info``)."""
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return max(1, int(headroom * free // max(1, member_bytes(job))))


def _interrupted_ensembles(pending: list[dict], run_dir: Path) -> dict[str, tuple]:
    """Unit id -> ("resume", member ids in the ensemble's order, step) for each pending unit whose
    checkpoint was written by an ensemble (`train_ensemble` names its members' folders in each) whose
    members are all pending, with unfinished checkpoints at that same step naming the same members."""
    from ..training.checkpoint import load_checkpoint

    named = {}
    for u in pending:
        try:
            ck = load_checkpoint(unit_dir(run_dir, u["id"]))
        except FeaturelabError:  # a damaged checkpoint: the unit runs alone and reports it
            ck = None
        if ck is not None and ck[1].get("ensemble") and not ck[1]["done"]:
            named[u["id"]] = (tuple(ck[1]["ensemble"]), ck[1]["step"])
    ids = {unit_dir(run_dir, i).name: i for i in named}
    out = {}
    for i, (members, step) in named.items():
        group = tuple(ids.get(name) for name in members)
        if i in group and all(g is not None and named[g] == (members, step) for g in group):
            out[i] = ("resume", group, step)
    return out


def plan(
    exp: Experiment,
    cfg: ExperimentConfig,
    pending: list[dict],
    run_dir: Path,
    *,
    batch: bool,
    workers: int,
    device: str = "cpu",
) -> tuple[list[list[dict]], dict[str, object]]:
    """Work items, and the units built to plan them (by id, so that each unit is built once): lists of
    units, one unit each, or several fresh units of equal `ensemble_key`.

    On CPUs a group is cut into near-equal ensembles so that there are about `workers` items in all
    (each worker then trains one ensemble). On CUDA a group is packed into as few ensembles as fit in
    the free GPU memory (`cuda_capacity`). The members of an interrupted ensemble
    (`_interrupted_ensembles`) form one item again, in their order; other units with a checkpoint, and
    units whose `ensemble_key` cannot be taken, stay single. A build that raises stops the sweep at once
    (`featurelab.runs.work.BuildError`, naming the unit)."""
    if not batch or exp.build is None or len(pending) < 2:
        return [[u] for u in pending], {}
    groups: dict[object, list[dict]] = {}
    built: dict[str, object] = {}
    singles = []
    resumed = _interrupted_ensembles(pending, run_dir)
    for u in pending:
        key = None
        if u["id"] in resumed:  # an interrupted ensemble resumes as itself (bit-identical)
            built[u["id"]] = build_unit(exp, cfg, u, unit_dir(run_dir, u["id"]))
            key = resumed[u["id"]]
        elif not (unit_dir(run_dir, u["id"]) / "checkpoint.safetensors").exists():
            built[u["id"]] = build_unit(exp, cfg, u, unit_dir(run_dir, u["id"]))
            key = _ensemble_key(built[u["id"]])
        if key is None:
            singles.append([u])
        else:
            groups.setdefault(key, []).append(u)
    return _cut(groups, built, len(pending), workers, device) + singles, built


def _ensemble_key(job) -> object:
    """`ensemble_key` of a built unit, or None when its model or data cannot be keyed (it then runs alone)."""
    from ..training.ensemble import ensemble_key

    try:
        return ensemble_key(job.model, job.data, job.config)
    except Exception:  # not batchable: the unit runs alone, its training reports its own errors
        return None


def _cut(groups: dict[object, list[dict]], built: dict, n_pending: int, workers: int, device: str) -> list[list]:
    """The work items of `plan`'s groups: an interrupted ensemble's members in its order; on CUDA as many
    members per item as fit (`cuda_capacity`); on CPUs near-equal items, about `workers` in all."""
    items = []
    for key, members in groups.items():
        if isinstance(key, tuple) and key[:1] == ("resume",):  # its members, in the ensemble's order
            by_id = {u["id"]: u for u in members}
            items.append([by_id[i] for i in key[1] if i in by_id])
            continue
        if device.startswith("cuda"):
            size = cuda_capacity(built[members[0]["id"]], device)
        else:
            chunks = min(len(members), max(1, round(workers * len(members) / n_pending)))
            size = math.ceil(len(members) / chunks)
        items += [members[i : i + size] for i in range(0, len(members), size)]
    return items


def run_units(
    exp: Experiment,
    cfg: ExperimentConfig,
    units: list[dict],
    run_dir: Path,
    *,
    device: str = "cpu",
    resume: bool = False,
    workers: int | None = None,
    threads: int = 1,
    progress: bool | None = None,
    batch: bool = True,
    backend: str = "local",
    address: str | None = None,
    retries: int = 2,
) -> SweepOutcome:
    """Run every unfinished unit of a sweep; finished ones are loaded from disk.

    workers: local worker processes (default: as many as cores, at most one per work item; 1 runs
        in-process); ignored by the ray backend, which uses the cluster's CPUs.
    threads: torch threads per worker or Ray task (default 1).
    progress: bars (None: in a terminal or a notebook, `featurelab.progress.show_progress`): one over the
        units, and in-process one over each unit's training steps, with the time left.
    batch: train fresh same-shape ``build``/``finish`` units as batched ensembles (default True).
    backend: "local" or "ray"; address: the Ray cluster (``HOST:PORT``; default ``RAY_ADDRESS``);
    retries: how often Ray re-runs a task whose worker died before the units are reported failed.
    A unit whose ``build`` raises stops the sweep at once (`featurelab.runs.work.BuildError`).
    """
    check_backend(backend, retries)
    outcome, pending = _finished_units(units, run_dir, cfg)
    if not pending:
        return outcome
    n_workers = workers or os.cpu_count() or 1
    # on a GPU large ensembles (as many members as fit) beat processes sharing the device; on CPUs,
    # one ensemble per worker
    groups, built = plan(exp, cfg, pending, run_dir, batch=batch, workers=n_workers, device=device)
    outcome.ensembles = [len(g) for g in groups if len(g) > 1]
    show = show_progress(progress)
    n = min(n_workers, len(groups))
    in_process = backend == "local" and n == 1  # then the units built by `plan` are trained as built
    items = [
        WorkItem(
            exp,
            cfg,
            tuple(g),
            tuple(str(unit_dir(run_dir, u["id"])) for u in g),
            device,
            resume,
            threads,
            tuple(built[u["id"]] for u in g) if in_process and len(g) > 1 else None,
        )
        for g in groups
    ]
    bar = progress_bar(total=len(pending), show=show and len(pending) > 1, desc=exp.name, unit="unit", leave=False)
    record = _recorder(outcome, bar)
    try:
        if backend == "ray":
            from .ray_backend import run_items

            run_items(items, run_dir, record, address=address, retries=retries, threads=threads)
        elif n == 1:
            for it in items:
                record(execute(it, progress=show))
        else:
            _run_pool(items, n, record)
    finally:
        bar.close()
    # keep the units' order
    outcome.results = {u["id"]: outcome.results[u["id"]] for u in units if u["id"] in outcome.results}
    return outcome


def _finished_units(units: list[dict], run_dir: Path, cfg: ExperimentConfig) -> tuple[SweepOutcome, list[dict]]:
    """A `SweepOutcome` holding the units already finished in `run_dir` (`finished`), and the pending units."""
    outcome, pending = SweepOutcome(), []
    for unit in units:
        done = finished(run_dir, unit["id"], cfg)
        if done is not None:
            outcome.results[unit["id"]] = done
            outcome.skipped.append(unit["id"])
        else:
            pending.append(unit)
    return outcome, pending


def _recorder(outcome: SweepOutcome, bar):
    """The callback that files a work item's `UnitOutcome`s into `outcome` and advances the units' `bar`."""

    def record(outcomes: list[UnitOutcome]) -> None:
        for o in outcomes:
            outcome.seconds[o.id] = o.seconds
            if o.error is not None:
                outcome.failed[o.id] = o.error
            elif o.result is not None:
                outcome.results[o.id] = o.result
        bar.update(len(outcomes))

    return record


def _run_pool(items: list[WorkItem], n: int, record) -> None:
    """Run `items` on `n` worker processes (spawned; no bars of their own), filing each item's outcomes with
    `record` as it finishes. A worker that dies fails its item's units; a `WriteError`, a `BuildError`, Ctrl-C
    or an error here stops every worker at once and is raised."""
    ctx = get_context("spawn")  # fork after torch threads start is unsafe
    pool = ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=watch_parent, initargs=(os.getpid(),))
    try:
        futures = {pool.submit(execute, it): it for it in items}
        for fut in as_completed(futures):
            try:
                record(fut.result())
            except (WriteError, BuildError):
                raise
            except Exception as exc:  # the worker process died (BrokenProcessPool): its units failed
                why = f"worker process failed: {one_line(exc)}"
                record([UnitOutcome(u["id"], None, why, 0.0) for u in futures[fut].units])
    except BaseException:  # Ctrl-C (KeyboardInterrupt), a WriteError, a BuildError or an error here
        _stop(pool)
        raise
    pool.shutdown()
