"""`run_experiment`: resolve a config, run the sweep, analyse, write the run record and report.

A run folder holds ``config.yaml``, ``units/<id>/`` (each unit's result, history, checkpoints),
``figures/`` (PNG + SVG), ``tables/`` (CSV), ``claims.json``, ``report.html`` and ``results.json``.
``results.json`` is written last, after the report has rendered: its presence marks a finished run,
which is never changed again (``--resume`` of it only reports it), unless units failed: ``--resume``
then re-runs those (the previous record stays in place until the new one replaces it). While a process
writes the folder it holds the folder's lock (`featurelab.runs.lock.RunLock`). Everything the config
decides is checked before the folder is touched.

Health: a unit whose result is marked ``"unhealthy"`` (a diverged, collapsed, chance-level or untrained
network, `featurelab.training.health`) leaves every claim resting on it (`Claim.units`; by default all) "not
measured"; so does a unit without a certified critical point (its result's ``"certificate"``) for a claim
whose premise is "critical" (`Claim.premise`). A run with failed or unhealthy units says so
(`RunRecord.problems`); one whose empirical claims do not all pass, or whose checks of the code fail, is not
`RunRecord.all_passed`; the CLI exits with status 1 in both cases.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..claims import Claim, claim, fmt, tally
from ..config import merge, validate
from ..errors import FeaturelabError, WriteError
from ..experiments import get_experiment
from ..experiments.base import AnalysisContext
from ..figures import save_figure
from ..io import read_json, read_yaml, write_json, write_text, write_yaml
from ..runtime import check_memory, resolve_device, versions
from .lock import LOCK_NAME, RunLock
from .report import check_claims, render_report
from .sweep import check_backend, run_units
from .work import one_line


@dataclass
class RunRecord:
    """A finished run: its folder, report path, claims (dicts), headline summary, the units that failed or
    are unhealthy (id -> reason), and whether it had been finished before this call (``--resume``)."""

    dir: Path
    report: Path
    claims: list[dict]
    summary: dict
    failed: dict = field(default_factory=dict)
    unhealthy: dict = field(default_factory=dict)
    already_finished: bool = False

    @property
    def all_passed(self) -> bool:
        """Every empirical claim passed and no identity claim (a check of the code) failed."""
        return all(
            c["passed"] is True if c.get("kind") != "identity" else c["passed"] is not False for c in self.claims
        )

    @property
    def problems(self) -> str:
        """ "" for a clean run, else one line on its failed and unhealthy units."""
        parts = [
            f"{len(d)} {what} ({', '.join(d)})"
            for what, d in (("failed", self.failed), ("unhealthy", self.unhealthy))
            if d
        ]
        return f"units {'; '.join(parts)}: claims resting on them are not measured" if parts else ""


def resolve_config(name: str, preset: str = "quick", overrides: dict | None = None, seed: int | None = None):
    """The validated config of experiment `name` at `preset` with `overrides` (and `seed`) applied.

    Everything decidable before a run is checked here, each failure one line: field types and ranges
    (no NaN/inf), unit ids that collide, and the experiment's own `check` (data paths, memory)."""
    for arg, value, kind in (
        ("name", name, str),
        ("preset", preset, str),
        ("overrides", overrides, (dict, type(None))),
    ):
        if not isinstance(value, kind):
            raise FeaturelabError(f"{arg}={value!r} is not allowed: it must be a {_kind_name(kind)}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FeaturelabError(f"seed={seed!r} is not allowed: it must be an integer")
    exp = get_experiment(name)
    if preset not in exp.presets:
        raise FeaturelabError(f"preset={preset!r} is not defined for {name}; choose one of: {', '.join(exp.presets)}")
    values = merge(exp.presets[preset], overrides or {})
    if seed is not None:
        values["seed"] = seed
    cfg = validate(exp.config, values, name)
    seen: set[str] = set()
    for unit in exp.units(cfg):
        if unit["id"] in seen:
            raise FeaturelabError(
                f"two units of {name} would share the id {unit['id']!r} (and its folder): "
                "make the values of the swept lists distinct"
            )
        seen.add(unit["id"])
    if exp.check is not None:
        exp.check(cfg)
    if exp.build is not None:
        _check_build_memory(exp, cfg)
    return exp, cfg


def _kind_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("None" if k is type(None) else k.__name__ for k in kinds)


def _check_build_memory(exp, cfg) -> None:
    """Parameters + gradients + two Adam moments of the largest unit's model, built on torch's meta
    device (no memory is allocated); skipped when a build cannot run on the meta device."""
    units = exp.units(cfg)
    for unit in {u["id"]: u for u in (units[:1] + units[-1:])}.values():
        try:
            with torch.device("meta"):
                model = exp.build(cfg, unit).model
            n_bytes = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
        except Exception:  # the real build reports its own errors
            continue
        check_memory(f"unit {unit['id']} of {exp.name} (parameters, gradients, optimizer state)", n_bytes)


def _check_arguments(out, workers, threads, resume, batch, retries) -> Path | None:
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise FeaturelabError(f"out={out!r} is not allowed: it must be a folder path (str or Path)")
    for arg, value in (("workers", workers), ("threads", threads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise FeaturelabError(f"{arg}={value!r} is not allowed: it must be an integer >= 1")
    for arg, value in (("resume", resume), ("batch", batch)):
        if not isinstance(value, bool):
            raise FeaturelabError(f"{arg}={value!r} is not allowed: it must be True or False")
    return Path(out) if out is not None else None


def check_run_folder(run: Path) -> None:
    """A one-line error unless `run` can be a run folder: a folder (or nothing yet) under a folder this
    user may write, not inside another run's folder."""
    for folder in run.resolve().parents:
        if os.path.isfile(folder / "config.yaml") and (
            os.path.isdir(folder / "units") or os.path.isfile(folder / "results.json")
        ):
            raise FeaturelabError(f"--out '{run}' lies inside the run folder '{folder}'; choose a folder outside it")
    if run.exists() and not run.is_dir():
        raise FeaturelabError(f"--out '{run}' is a file, not a folder; choose a folder path")
    parent = run
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise FeaturelabError(f"--out '{run}' lies under the file '{parent}'; choose a folder path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FeaturelabError(f"--out '{run}' cannot be written (no write permission in '{parent}'); choose another")


def _first_difference(a: dict, b: dict, prefix: str = "") -> str | None:
    for k in sorted(set(a) | set(b)):
        if isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
            d = _first_difference(a[k], b[k], f"{prefix}{k}.")
            if d:
                return d
        elif a.get(k) != b.get(k):
            return f"{prefix}{k}: stored {a.get(k)!r}, now {b.get(k)!r}"
    return None


def _claim_gate(claims: list[Claim], unhealthy: dict[str, str], results: dict[str, dict] | None = None) -> list[Claim]:
    """Each claim "not measured" while a unit it rests on (`Claim.units`; None: every unit) is unhealthy: a
    claim cannot rest on a trivial solution; and a claim whose premise is "critical" while a unit it rests on
    (among `results`, unit id -> result) has no ``"certificate"`` with ``certified`` true: a statement about
    critical points is not measured away from one."""
    gated = []
    for c in claims:
        bad = {u: why for u, why in unhealthy.items() if c.units is None or u in c.units}
        if not bad and c.premise == "critical":
            bad = {
                u: not_critical(r)
                for u, r in (results or {}).items()
                if (c.units is None or u in c.units) and not_critical(r)
            }
            what = "not at a critical point"
        else:
            what = "unhealthy"
        if bad:
            uid, why = next(iter(bad.items()))
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            c = c.not_measured(f"unit {what}: {uid}: {why}{more}")
        gated.append(c)
    return gated


def not_critical(result: dict) -> str:
    """ "" when the unit `result` carries a certified critical point, else why not ("stationarity 3e-2 >
    1e-6", or that it has no certificate)."""
    cert = result.get("certificate")
    if not isinstance(cert, dict):
        return "no stationarity certificate"
    if cert.get("certified") is True:
        return ""
    return f"stationarity {fmt(cert.get('stationarity'), 2)} > {fmt(cert.get('tolerance'), 2)}"


def finished_record(run: Path) -> RunRecord:
    """The record of the finished run in `run`, from its files (checked, not changed)."""
    results = read_json(
        run / "results.json", kind=dict, fix="the run is damaged: restore it or run again with a new --out"
    )
    claims = check_claims(run)
    return RunRecord(
        run,
        run / "report.html",
        claims,
        results.get("summary", {}),
        results.get("failed", {}),
        results.get("unhealthy", {}),
        already_finished=True,
    )


def run_experiment(
    name: str,
    preset: str = "quick",
    overrides: dict | None = None,
    out: str | Path | None = None,
    device: str = "cpu",
    seed: int | None = None,
    resume: bool = False,
    workers: int | None = None,
    threads: int = 1,
    progress: bool | None = None,
    batch: bool = True,
    backend: str = "local",
    address: str | None = None,
    retries: int = 2,
) -> RunRecord:
    """Run experiment `name` and write its run folder (default ``runs/<name>-<preset>``).

    resume: continue an unfinished run in `out` (finished units are skipped, a unit's training
        continues from its checkpoint); the config must equal the stored one. A finished run is only
        reported (`RunRecord.already_finished`), never changed. Without it an existing run folder is an
        error, never overwritten.
    workers: worker processes for the sweep (default: cores); threads: torch threads per worker.
    batch: train same-shape runs of the sweep as batched ensembles (default True; docs/scale.md).
    backend: "local" (worker processes) or "ray" (tasks on the Ray cluster at `address` or
        ``RAY_ADDRESS``, each re-run up to `retries` times if its worker dies).
    Every argument and config field is checked before the folder is created or changed.
    """
    run = _check_arguments(out, workers, threads, resume, batch, retries)
    exp, cfg = resolve_config(name, preset, overrides, seed)
    dev = str(resolve_device(device))
    check_backend(backend, retries)
    if backend == "ray":
        from .ray_backend import reachable

        reachable(address)
    run = run if run is not None else Path("runs") / f"{name}-{preset}"
    check_run_folder(run)
    created = not run.exists()
    lock = RunLock(run, wait="wait for it to finish (then --resume) or choose another --out").acquire()
    started = False  # config.yaml written: from now on the folder holds a resumable run
    try:
        cfg_dict = cfg.model_dump(mode="json")
        stored = run / "config.yaml"
        if stored.exists():
            if not resume:
                raise FeaturelabError(
                    f"run folder '{run}' already exists: pass --resume to continue it, or --out DIR for a new run"
                )
            fix = "restore it, or start again with a new --out"
            diff = _first_difference(read_yaml(stored, kind=dict, fix=fix), cfg_dict)
            if diff:
                raise FeaturelabError(
                    f"--resume with a different config than the one in '{run}' ({diff}); "
                    "use the same settings or a new --out"
                )
            if (run / "results.json").exists():
                record = finished_record(run)
                if not record.failed:  # complete: never changed; a run with failed units re-runs them
                    return record
        elif any(p.name != LOCK_NAME for p in run.iterdir()):
            raise FeaturelabError(f"--out '{run}' is a non-empty folder that is not a featurelab run; choose another")
        write_yaml(stored, cfg_dict)
        created, started = False, True
        sweep_args = dict(
            device=dev,
            resume=resume,
            workers=workers,
            threads=threads,
            progress=progress,
            batch=batch,
            backend=backend,
            address=address,
            retries=retries,
        )
        return _run(exp, cfg, run, preset, sweep_args)
    except WriteError as exc:  # a full disk, say: nothing is half-written, the run goes on once the cause is gone
        if started:
            raise exc.then("continue with the same command plus --resume", exit_code=1) from None
        raise exc.then("run the same command again") from None
    finally:
        lock.release()
        if created:  # nothing but the lock file was written: leave no folder behind
            try:
                (run / LOCK_NAME).unlink(missing_ok=True)
                run.rmdir()
            except OSError:
                pass


def _run(exp, cfg, run: Path, preset: str, sweep_args: dict) -> RunRecord:
    """Sweep, analyse, write figures, tables, claims and the report, then ``results.json``."""
    t0 = time.perf_counter()
    name, dev, backend = exp.name, sweep_args["device"], sweep_args["backend"]
    units = exp.units(cfg)
    sweep = run_units(exp, cfg, units, run, **sweep_args)
    if not sweep.results:
        first = next(iter(sweep.failed.items()))
        raise FeaturelabError(
            f"all {len(units)} runs of {name} failed; first: {first[0]}: {first[1]} "
            f"(traceback in {run / 'units' / first[0] / 'error.txt'})"
        )
    unhealthy = {u: str(r["unhealthy"]) for u, r in sweep.results.items() if r.get("unhealthy")}
    try:
        analysis = exp.analyze(cfg, sweep.results, AnalysisContext(run, dev, dict(sweep.failed)))
    except Exception as exc:
        if isinstance(exc, FeaturelabError) or not sweep.failed:
            raise
        raise FeaturelabError(
            f"the analysis of {name} cannot do without its {len(sweep.failed)} failed units "
            f"({', '.join(sweep.failed)}; first: {next(iter(sweep.failed.values()))}) [{one_line(exc)}]; "
            "fix their cause (units/<id>/error.txt) and run again with --resume"
        ) from None
    claims = _claim_gate(list(analysis.claims), unhealthy, sweep.results)
    if len(units) > 1:
        claims.append(
            claim(
                "every run of the sweep completed",
                "featurelab sweep",
                len(units),
                len(sweep.results),
                len(sweep.results) == len(units),
                id="sweep-complete",
                kind="identity",
            )
        )
    for fname, fig in analysis.figures.items():
        save_figure(fig, run / "figures", fname)
    for tname, df in analysis.tables.items():
        write_text(run / "tables" / f"{tname}.csv", df.to_csv(index=False))
    claim_dicts = [c.to_dict() for c in claims]
    write_json(run / "claims.json", claim_dicts)
    results = {
        "experiment": name,
        "preset": preset,
        "reference": exp.reference,
        "summary_text": exp.summary,
        "device": dev,
        "backend": backend,
        "ensembles": sweep.ensembles,
        "n_units": len(units),
        "failed": sweep.failed,
        "unhealthy": unhealthy,
        "skipped_on_resume": sweep.skipped,
        "seconds": time.perf_counter() - t0,
        "unit_seconds": sweep.seconds,
        "summary": analysis.summary,
        "notes": analysis.notes,
        "versions": versions(),
        **tally(claim_dicts),
    }
    report = render_report(run, results)
    write_json(run / "results.json", results)  # last: the run is finished
    return RunRecord(run, report, claim_dicts, analysis.summary, dict(sweep.failed), unhealthy)
