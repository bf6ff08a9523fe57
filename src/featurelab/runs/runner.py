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
measured".

Two tiers: every empirical claim is judged "as the paper did" (on the trained nets; `passed`, which decides
the exit status) and, where the experiment certifies its units (`TrainingUnit.certify`), "certified" (on the
units' certified critical points, against the error bar of its margin; `two_tiers`). A run with failed or
unhealthy units says so
(`RunRecord.problems`); one whose empirical claims do not all pass, or whose checks of the code fail, is not
`RunRecord.all_passed`; the CLI exits with status 1 in both cases.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..claims import Claim, certified_tier, claim, fmt, tally
from ..config import merge, validate
from ..errors import FeaturelabError, WriteError
from ..experiments import get_experiment
from ..experiments.base import AnalysisContext
from ..figures import save_figure
from ..io import TEMPORARY, read_json, read_yaml, write_error, write_json, write_text, write_yaml
from ..runtime import check_memory, resolve_device, tune_cpu, versions
from ..spelling import option, out_folder
from .lock import LOCK_NAME, RunLock
from .manifest import MANIFEST, verify_run, write_manifest
from .report import check_claims, record_html, render_report
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

    def __repr__(self) -> str:
        n = tally(self.claims)
        return (
            f"RunRecord('{self.dir}': claims {n['claims_passed']}/{n['claims_total']} pass, "
            f"all_passed={self.all_passed}, report='{self.report}')"
        )

    def _repr_html_(self) -> str:
        """The run inline in a notebook (`featurelab.runs.report.record_html`): headline, claims in both tiers
        where the run has them, the summary and the figures of its folder."""
        return record_html(self.dir, self.claims, self.summary, self.problems)


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
    for unit in _list_units(exp, cfg):
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


def _list_units(exp, cfg) -> list[dict]:
    """``exp.units(cfg)``; an exception it raises (a bug, or a config it cannot split into units) is one line
    naming the experiment and the exception's first line (its traceback chained)."""
    try:
        return exp.units(cfg)
    except FeaturelabError:
        raise
    except Exception as exc:
        raise FeaturelabError(f"the units of {exp.name} cannot be listed: {one_line(exc)}") from exc


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


def _check_arguments(out, workers, threads, resume, overwrite, batch, retries) -> Path | None:
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise FeaturelabError(f"out={out!r} is not allowed: it must be a folder path (str or Path)")
    for arg, value in (("workers", workers), ("threads", threads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise FeaturelabError(f"{arg}={value!r} is not allowed: it must be an integer >= 1")
    for arg, value in (("resume", resume), ("overwrite", overwrite), ("batch", batch)):
        if not isinstance(value, bool):
            raise FeaturelabError(f"{arg}={value!r} is not allowed: it must be True or False")
    if resume and overwrite:
        raise FeaturelabError(
            f"{option('resume')} and {option('overwrite')} exclude each other: continue the run or start it over"
        )
    return Path(out) if out is not None else None


def check_run_folder(run: Path) -> None:
    """A one-line error unless `run` can be a run folder: a folder (or nothing yet) under a folder this
    user may write, not inside another run's folder."""
    where = out_folder(run)
    for folder in run.resolve().parents:
        if os.path.isfile(folder / "config.yaml") and (
            os.path.isdir(folder / "units") or os.path.isfile(folder / "results.json")
        ):
            raise FeaturelabError(f"{where} lies inside the run folder '{folder}'; choose a folder outside it")
    if run.exists() and not run.is_dir():
        raise FeaturelabError(f"{where} is a file, not a folder; choose a folder path")
    parent = run
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise FeaturelabError(f"{where} lies under the file '{parent}'; choose a folder path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FeaturelabError(f"{where} cannot be written (no write permission in '{parent}'); choose another")


RUN_ENTRIES = ("config.yaml", "units", "figures", "tables", "claims.json", "report.html", "results.json", MANIFEST)


def clear_run_folder(run: Path) -> None:
    """Remove the run in folder `run` (``overwrite=True``), keeping its lock: ``results.json`` and the manifest
    first (it no longer looks finished), ``config.yaml`` last (until then it still reads as a run, so an
    interrupted removal is simply repeated). A folder holding anything a run does not write (`RUN_ENTRIES`,
    the lock, temporaries) is refused in one line and left as it is."""
    entries = [p for p in run.iterdir() if p.name != LOCK_NAME and not TEMPORARY.fullmatch(p.name)]
    foreign = sorted(p.name for p in entries if p.name not in RUN_ENTRIES)
    if foreign or not (run / "config.yaml").is_file():
        what = f"holds {foreign[0]!r}, which no run writes" if foreign else "holds no config.yaml"
        raise FeaturelabError(
            f"{option('overwrite')} removes only a featurelab run folder, and '{run}' {what}; choose another folder"
        )
    for p in sorted(entries, key=lambda p: (p.name != "results.json", p.name != MANIFEST, p.name == "config.yaml")):
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError as exc:
            raise write_error(p, exc) from None


def _first_difference(a: dict, b: dict, prefix: str = "") -> str | None:
    for k in sorted(set(a) | set(b)):
        if isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
            d = _first_difference(a[k], b[k], f"{prefix}{k}.")
            if d:
                return d
        elif a.get(k) != b.get(k):
            return f"{prefix}{k}: stored {a.get(k)!r}, now {b.get(k)!r}"
    return None


def _claim_gate(claims: list[Claim], unhealthy: dict[str, str]) -> list[Claim]:
    """Tier "as the paper did": each claim "not measured" while a unit it rests on (`Claim.units`; None: every
    unit) is unhealthy: a claim cannot rest on a trivial solution. Claims whose premise is "critical" are
    measured on the trained nets like any other (their stationarity is shown beside them, `two_tiers`)."""
    gated = []
    for c in claims:
        bad = _rested(c, unhealthy)
        if bad:
            c = c.not_measured(f"unit unhealthy: {_first(bad)}")
        gated.append(c)
    return gated


def _rested(c: Claim, per_unit: dict) -> dict:
    """The entries of `per_unit` (unit id -> anything) of the units claim `c` rests on."""
    return {u: v for u, v in per_unit.items() if c.units is None or u in c.units}


def _first(bad: dict[str, str]) -> str:
    uid, why = next(iter(bad.items()))
    return f"{uid}: {why}" + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")


def _why_not(sick: dict, uncertified: dict, failure: str) -> str:
    if sick:
        return f"unit unhealthy: {_first(sick)}"
    return f"unit not certified: {_first(uncertified)}" if uncertified else failure


def not_certified(result: dict) -> str:
    """ "" when the unit `result` carries a certified critical point, else why not: the rule its certificate
    failed (`Certificate.rule`), or that it has none."""
    cert = result.get("certificate")
    if not isinstance(cert, dict):
        return "no certificate"
    if cert.get("certified") is True:
        return ""
    return str(cert.get("rule") or f"Clarke residual {fmt(cert.get('clarke'), 2)} > {fmt(cert.get('tolerance'), 2)}")


def _ratio(results: dict[str, dict], trained: bool = False) -> float | None:
    """The largest ``δ/(δ_prev − δ)`` over the certificates of `results` (None where δ_prev <= δ); δ_prev is the
    Clarke residual of the earlier point of the certification's path, or with `trained` the trained net's
    stationarity (which bounds its Clarke residual above)."""
    ratios = []
    for r in results.values():
        delta = float(r["certificate"].get("clarke") or 0.0)
        earlier = r.get("trained_stationarity") if trained else r["certificate"].get("previous_clarke")
        prev = float(earlier or 0.0)
        if delta > 0 and prev <= delta:
            return None
        ratios.append(delta / (prev - delta) if delta > 0 else 0.0)
    return max(ratios, default=0.0)


def two_tiers(
    paper: list[Claim],
    certified: list[Claim],
    previous: list[Claim],
    results: dict[str, dict],
    unhealthy: dict,
    failure: str = "",
) -> list[Claim]:
    """The claims of tier "as the paper did" (`paper`, gated by `_claim_gate`) with tier "certified" filled in
    (`featurelab.claims.certified_tier`) from the claims of the same ids measured on the certified nets
    (`certified`) and on the earlier point of their path (`previous`); `results` are the units' results (unit id
    -> result, with ``"certificate"``). A claim resting on an unhealthy or uncertified unit is "not measured" in
    tier "certified", with the reason; so is every claim when the certified analysis failed (`failure`, why).
    Runs that certify no unit are returned as they are."""
    if not any(isinstance(r.get("certificate"), dict) for r in results.values()):
        return paper
    by_id = [{c.id or c.statement: c for c in claims} for claims in (certified, previous)]
    out = []
    for c in paper:
        mine = _rested(c, results)
        trained = [float(r["trained_stationarity"]) for r in mine.values() if "trained_stationarity" in r]
        c = replace(c, stationarity=max(trained) if trained else None)
        if c.kind == "identity":
            out.append(c)
            continue
        sick = _rested(c, unhealthy)
        uncertified = {u: why for u, r in mine.items() if (why := not_certified(r))}
        if sick or uncertified or failure:
            out.append(replace(c, certified_reason=_why_not(sick, uncertified, failure)))
            continue
        key = c.id or c.statement
        c = replace(c, clarke=max((float(r["certificate"].get("clarke") or 0.0) for r in mine.values()), default=None))
        earlier, ratio = by_id[1].get(key), _ratio(mine)
        if ratio is None:  # a snap that began as close to its critical point as it ended: the trained net is earlier
            earlier, ratio = c, _ratio(mine, trained=True)
        out.append(certified_tier(c, by_id[0].get(key), earlier, ratio))
    return out


def finished_record(run: Path) -> RunRecord:
    """The record of the finished run in `run`, from its files (checked against its manifest, not changed)."""
    verify_run(run)
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
    overwrite: bool = False,
) -> RunRecord:
    """Run experiment `name` and write its run folder (default ``runs/<name>-<preset>``).

    resume: continue an unfinished run in `out` (finished units are skipped, a unit's training
        continues from its checkpoint); the config must equal the stored one. A finished run is only
        reported (`RunRecord.already_finished`), never changed. Without it (or `overwrite`) an existing run
        folder is an error.
    overwrite: remove the run in `out` first and start over (only a folder a featurelab run wrote is removed:
        `clear_run_folder`); excludes `resume`.
    progress: bars over the units and each unit's training steps, with the time left (None: shown in a terminal
        or a notebook; False: quiet).
    workers: worker processes for the sweep (default: cores); threads: torch threads per worker.
    batch: train same-shape runs of the sweep as batched ensembles (default True; docs/scale.md).
    backend: "local" (worker processes) or "ray" (tasks on the Ray cluster at `address` or
        ``RAY_ADDRESS``, each re-run up to `retries` times if its worker dies).
    Every argument and config field is checked before the folder is created or changed. A unit whose
    ``build`` raises stops the run at once, naming the unit (`featurelab.runs.work.BuildError`).
    """
    run = _check_arguments(out, workers, threads, resume, overwrite, batch, retries)
    exp, cfg = resolve_config(name, preset, overrides, seed)
    dev = str(resolve_device(device))
    tune_cpu(dev)  # process-wide: denormals flushed, freed memory kept (docs/scale.md, "CPU tuning")
    check_backend(backend, retries)
    if backend == "ray":
        from .ray_backend import reachable

        reachable(address)
    run = run if run is not None else Path("runs") / f"{name}-{preset}"
    check_run_folder(run)
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
    return _locked_run(exp, cfg, run, preset, sweep_args, overwrite)


def _locked_run(exp, cfg, run: Path, preset: str, sweep_args: dict, overwrite: bool) -> RunRecord:
    """Hold the lock of folder `run` while it is prepared (`_prepare`) and the run is made (`_run`). A write
    that fails says how to go on; a folder this call created and wrote nothing into is removed again."""
    created = not run.exists()
    wait = f"wait for it to finish (then {option('resume')}) or choose another folder ({option('new_out')})"
    lock = RunLock(run, wait=wait).acquire()
    started = False  # config.yaml written: from now on the folder holds a resumable run
    try:
        record = _prepare(run, cfg, sweep_args["resume"], overwrite)
        if record is not None:
            return record
        created, started = False, True
        return _run(exp, cfg, run, preset, sweep_args)
    except WriteError as exc:  # a full disk, say: nothing is half-written, the run goes on once the cause is gone
        if started:
            raise exc.then(f"continue with {option('again')}", exit_code=1) from None
        raise exc.then("run the same command again" if option("resume") == "--resume" else "call again") from None
    finally:
        lock.release()
        if created:  # nothing but the lock file was written: leave no folder behind
            try:
                (run / LOCK_NAME).unlink(missing_ok=True)
                run.rmdir()
            except OSError:
                pass


def _prepare(run: Path, cfg, resume: bool, overwrite: bool) -> RunRecord | None:
    """Make the locked folder `run` ready and write its ``config.yaml``; or return the record of the finished
    run it holds (`resume`). An existing run is continued (`resume`, same config only), removed (`overwrite`)
    or refused; a non-empty folder that holds no run is refused."""
    cfg_dict = cfg.model_dump(mode="json")
    stored = run / "config.yaml"
    if overwrite and any(p.name != LOCK_NAME for p in run.iterdir()):
        clear_run_folder(run)
    if stored.exists():
        if not resume:
            raise FeaturelabError(
                f"run folder '{run}' already exists: pass {option('resume')} to continue it, {option('overwrite')} "
                f"to start over, or {option('new_out')} for a new run"
            )
        if (run / "results.json").exists():
            verify_run(run)  # a finished run's files, its config included, as they were written
        diff = _first_difference(
            read_yaml(stored, kind=dict, fix="restore it, or start again in a new folder"), cfg_dict
        )
        if diff:
            raise FeaturelabError(
                f"{option('resume')} with a different config than the one in '{run}' ({diff}); use the same "
                f"settings, {option('overwrite')} to start over, or {option('new_out')}"
            )
        if (run / "results.json").exists():
            record = finished_record(run)
            if not record.failed:  # complete: never changed; a run with failed units re-runs them
                return record
    elif any(p.name != LOCK_NAME for p in run.iterdir()):
        raise FeaturelabError(f"{out_folder(run)} is a non-empty folder that is not a featurelab run; choose another")
    write_yaml(stored, cfg_dict)
    return None


def tier_results(results: dict[str, dict], point: str) -> dict[str, dict]:
    """The units' results as measured at `point` ("certified" or "previous": ``finish`` on the certified net or
    on the earlier point of its path), each with its ``"certificate"``; a unit without one keeps its own."""
    return {
        u: {**r[point], "certificate": r["certificate"]} if isinstance(r.get(point), dict) else r
        for u, r in results.items()
    }


def _tier_claims(exp, cfg, results: dict[str, dict], ctx: AnalysisContext) -> tuple[list[Claim], list[Claim], str]:
    """The claims of `exp.analyze` on the certified nets and on the earlier points of their paths, and "" or why
    that analysis failed (then tier "certified" of every claim says so; the paper tier stands)."""
    if not any(isinstance(r.get("certified"), dict) for r in results.values()):
        return [], [], ""
    import matplotlib.pyplot as plt

    out = []
    for point in ("certified", "previous"):
        try:
            analysis = exp.analyze(cfg, tier_results(results, point), ctx)
        except Exception as exc:  # the paper tier stands; each claim's certified tier reads why
            return [], [], f"the analysis of the {point} nets failed: {one_line(exc)}"
        for fig in analysis.figures.values():
            plt.close(fig)
        out.append(list(analysis.claims))
    return out[0], out[1], ""


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
            f"fix their cause (units/<id>/error.txt) and continue with {option('again')}"
        ) from None
    certified, previous, why = _tier_claims(exp, cfg, sweep.results, AnalysisContext(run, dev, dict(sweep.failed)))
    paper = _claim_gate(list(analysis.claims), unhealthy)
    claims = two_tiers(paper, certified, previous, sweep.results, unhealthy, why)
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
        "certify_seconds": {u: r["certify_seconds"] for u, r in sweep.results.items() if "certify_seconds" in r},
        "summary": analysis.summary,
        "notes": analysis.notes,
        "versions": versions(),
        **tally(claim_dicts),
    }
    report = render_report(run, results)
    write_json(run / "results.json", results)  # the run is finished
    write_manifest(run)  # last: the sha256 of every file a verdict rests on
    return RunRecord(run, report, claim_dicts, analysis.summary, dict(sweep.failed), unhealthy)
