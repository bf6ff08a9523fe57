"""`run_experiment`: resolve a config, run the sweep, analyse, write the run record and report.

A run folder holds ``config.yaml``, ``units/<id>/`` (each unit's result, history, checkpoints),
``figures/`` (PNG + SVG), ``tables/`` (CSV), ``claims.json``, ``results.json`` and ``report.html``.
``results.json`` is written after everything else: its presence marks a finished run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..claims import claim
from ..config import merge, validate
from ..errors import FeaturelabError
from ..experiments import get_experiment
from ..experiments.base import AnalysisContext
from ..figures import save_figure
from ..io import read_yaml, write_json, write_text, write_yaml
from ..runtime import resolve_device, versions
from .report import render_report
from .sweep import check_backend, run_units


@dataclass
class RunRecord:
    """A finished run: its folder, report path, claims (dicts) and headline summary."""

    dir: Path
    report: Path
    claims: list[dict]
    summary: dict

    @property
    def all_passed(self) -> bool:
        return all(c["passed"] for c in self.claims)


def resolve_config(name: str, preset: str = "quick", overrides: dict | None = None, seed: int | None = None):
    """The validated config of experiment `name` at `preset` with `overrides` (and `seed`) applied."""

    exp = get_experiment(name)
    if preset not in exp.presets:
        raise FeaturelabError(f"preset={preset!r} is not defined for {name}; choose one of: {', '.join(exp.presets)}")
    values = merge(exp.presets[preset], overrides or {})
    if seed is not None:
        values["seed"] = seed
    return exp, validate(exp.config, values, name)


def _first_difference(a: dict, b: dict, prefix: str = "") -> str | None:
    for k in sorted(set(a) | set(b)):
        if isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
            d = _first_difference(a[k], b[k], f"{prefix}{k}.")
            if d:
                return d
        elif a.get(k) != b.get(k):
            return f"{prefix}{k}: stored {a.get(k)!r}, now {b.get(k)!r}"
    return None


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
        continues from its checkpoint); the config must equal the stored one. Without it an existing
        run folder is an error, never overwritten.
    workers: worker processes for the sweep (default: cores); threads: torch threads per worker.
    batch: train same-shape runs of the sweep as batched ensembles (default True; docs/scale.md).
    backend: "local" (worker processes) or "ray" (tasks on the Ray cluster at `address` or
        ``RAY_ADDRESS``, each re-run up to `retries` times if its worker dies).
    """
    exp, cfg = resolve_config(name, preset, overrides, seed)
    dev = str(resolve_device(device))
    check_backend(backend, retries)
    run = Path(out) if out is not None else Path("runs") / f"{name}-{preset}"
    cfg_dict = cfg.model_dump(mode="json")
    stored = run / "config.yaml"
    if stored.exists():
        if not resume:
            raise FeaturelabError(
                f"run folder '{run}' already exists: pass --resume to continue it, or --out DIR for a new run"
            )
        diff = _first_difference(read_yaml(stored) or {}, cfg_dict)
        if diff:
            raise FeaturelabError(
                f"--resume with a different config than the one in '{run}' ({diff}); "
                "use the same settings or a new --out"
            )
    elif run.exists() and any(run.iterdir()):
        raise FeaturelabError(f"--out '{run}' is a non-empty folder that is not a featurelab run; choose another")
    run.mkdir(parents=True, exist_ok=True)
    write_yaml(stored, cfg_dict)
    (run / "results.json").unlink(missing_ok=True)  # the run is unfinished until it is rewritten

    t0 = time.perf_counter()
    units = exp.units(cfg)
    sweep = run_units(
        exp,
        cfg,
        units,
        run,
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
    if not sweep.results:
        first = next(iter(sweep.failed.items()))
        raise FeaturelabError(
            f"all {len(units)} runs of {name} failed; first: {first[0]}: {first[1]} "
            f"(traceback in {run / 'units' / first[0] / 'error.txt'})"
        )

    analysis = exp.analyze(cfg, sweep.results, AnalysisContext(run, dev, dict(sweep.failed)))
    claims = list(analysis.claims)
    if len(units) > 1:
        claims.append(
            claim(
                "every run of the sweep completed",
                "featurelab sweep",
                len(units),
                len(sweep.results),
                len(sweep.results) == len(units),
                id="sweep-complete",
            )
        )
    for fname, fig in analysis.figures.items():
        save_figure(fig, run / "figures", fname)
    for tname, df in analysis.tables.items():
        write_text(run / "tables" / f"{tname}.csv", df.to_csv(index=False))
    claim_dicts = [c.to_dict() for c in claims]
    write_json(run / "claims.json", claim_dicts)
    write_json(
        run / "results.json",
        {
            "experiment": name,
            "preset": preset,
            "reference": exp.reference,
            "summary_text": exp.summary,
            "device": dev,
            "backend": backend,
            "ensembles": sweep.ensembles,
            "n_units": len(units),
            "failed": sweep.failed,
            "skipped_on_resume": sweep.skipped,
            "seconds": time.perf_counter() - t0,
            "unit_seconds": sweep.seconds,
            "summary": analysis.summary,
            "notes": analysis.notes,
            "versions": versions(),
            "claims_passed": sum(c["passed"] for c in claim_dicts),
            "claims_total": len(claim_dicts),
        },
    )
    report = render_report(run)
    return RunRecord(run, report, claim_dicts, analysis.summary)
