"""``make gpu-check``: check featurelab on a GPU in one bounded command and write one markdown table.

Steps, in order, each a subprocess of this Python under a timeout (the budget left, and at most
`STEP_LIMIT` seconds, so that every step fits a 10-minute remote command):

1. test: the CUDA tests, as ``make test-gpu`` runs them (``pytest -m cuda``; on a CPU they skip).
2. bench: ``featurelab bench --device DEVICE --only a,a2,b,d,e`` with (e) restricted to `BENCH_PRESETS`,
   within half the budget left when presets follow.
3. presets: the paper presets of `PRESETS_BY_VALUE` (or those named by ``--only``), in that order, while the
   budget lasts, each resumed from its folder under ``--runs`` where an earlier call left it.

With ``--device cpu`` the same plumbing runs as a dry run at CPU sizes: bench (b), (d) and (e), and tiny
presets for (e) and the presets. The table (device, figure, baseline, wall time, claims) is rewritten
after every step, so a run cut short still leaves it; its path is printed. Exit 0 when every step that
ran did its work (a claim that fails is a result, not an error; a bench or preset cut short by the
budget is said so in the table); 1 when the CUDA tests fail or run past their limit, or a bench or preset
ends in an error. Runs from the checkout with ``PYTHONPATH=src`` and the machine's own python
(docs/scale.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_LIMIT = 570  # seconds: a step and its start-up fit a 10-minute command
NEEDS = ("torch", "numpy", "scipy", "pandas", "matplotlib", "sklearn", "tqdm", "pydantic", "safetensors", "yaml")
BENCH_FIGURES = "a,a2,b,d,e"
BENCH_PRESETS = ("escape-circle", "alignment")  # (e): two experiments whose quick presets take about a minute
PRESETS_BY_VALUE = (  # the paper presets that need no data files, most informative first (headline figures)
    "leaky-bottleneck",
    "bn-rank-depth",
    "saddle-digits",
    "leaky-hamiltonian",
    "symmetry-learning",
    "invariances",
    "escape-circle",
    "alignment",
    "cp-rank",
    "relu-noninvariance",
    "r1-properties",
    "leaky-discretization",
)
HEADER = ("device", "figure", "baseline (same run)", "wall time", "claims")


class Budget:
    """Seconds left of `minutes`, and each step's limit: the time left, at most `STEP_LIMIT`."""

    def __init__(self, minutes: float):
        self.end = time.monotonic() + 60 * minutes

    def left(self) -> float:
        return self.end - time.monotonic()

    def limit(self) -> float:
        return min(self.left(), STEP_LIMIT)


def _run(cmd: list[str], limit: float) -> tuple[int | None, str, float]:
    """(exit status or None when it ran past `limit` seconds, its output's last lines, wall seconds)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        text = out if isinstance(out, str) else out.decode(errors="replace")
        return None, text[-4000:], time.perf_counter() - t0
    return proc.returncode, (proc.stdout + proc.stderr)[-4000:], time.perf_counter() - t0


def test_step(device: str, budget: Budget) -> tuple[list[tuple], bool]:
    """The CUDA tests: one row with pytest's summary; ok unless they fail or run past their limit."""
    limit = budget.limit()
    code, out, seconds = _run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"], limit)
    lines = [line for line in out.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    summary = lines[-1].strip("= ") if lines else "no summary"
    if code is None:
        summary = f"ran past {limit:.0f} s; {summary}"
    ok = code in (0, 5)  # 5: nothing collected
    return [(device, "make test-gpu (pytest -m cuda)", "-", f"{seconds:.0f} s", summary)], ok


def bench_step(device: str, budget: Budget, folder: Path, share: float) -> tuple[list[tuple], bool]:
    """``featurelab bench``: one row per figure it measured (its figures are written as they finish), within
    `share` of the budget left. On the CPU, a dry run: (b), (d) and (e) on tiny presets ((a) and (a2) train
    the paper-size network for minutes there)."""
    from .bench import table_rows

    out = folder / "bench.json"
    figures = "b,d,e" if device == "cpu" else BENCH_FIGURES
    cmd = [sys.executable, "-m", "featurelab.cli", "bench", "--device", device, "--only", figures]
    cmd += ["--experiments", ",".join(BENCH_PRESETS), "--out", str(out)]
    if device == "cpu":
        cmd += ["--e-preset", "tiny"]
    limit = min(budget.limit(), share * budget.left())
    code, text, seconds = _run(cmd, limit)
    results = json.loads(out.read_text()) if out.exists() else {}
    rows = [
        (device, f, base, measured, f"target {target}: {'met' if ok == 'True' else 'missed'}")
        for f, measured, base, target, ok in table_rows(results)
    ]
    if code != 0:
        why = f"ran past {limit:.0f} s" if code is None else f"exit {code}: {text.strip().splitlines()[-1:]}"
        rows.append((device, "featurelab bench", "-", f"{seconds:.0f} s", f"stopped ({why})"))
    return rows, code in (0, None)  # cut by the budget: said in the table, not an error


def preset_step(
    device: str, budget: Budget, folder: Path, preset: str, names: tuple[str, ...] = PRESETS_BY_VALUE
) -> tuple[list[tuple], bool]:
    """The presets `names` (in `PRESETS_BY_VALUE`'s order) one after another while the budget lasts, each into
    ``folder/NAME`` with ``--resume`` (a run cut short there goes on from its checkpoints in the next call, a
    finished one is only reported); one row each."""
    from .claims import tally

    rows, ok = [], True
    for name in names:
        if budget.left() < 30:
            rows.append((device, f"{name} --preset {preset}", "-", "-", "not run: budget spent"))
            continue
        out = folder / name
        cmd = [sys.executable, "-m", "featurelab.cli", "run", name, "--preset", preset, "--device", device]
        code, text, seconds = _run(cmd + ["--out", str(out), "--resume", "--quiet"], budget.limit())
        claims = out / "claims.json"
        if code in (0, 1) and claims.exists():
            t = tally(json.loads(claims.read_text()))
            result = f"{t['claims_passed']}/{t['claims_total']} passed"
        else:
            result = "stopped: ran past its limit" if code is None else f"error (exit {code}): {text.strip()[-300:]}"
            ok = ok and code is None  # a preset longer than the budget left is not an error
        rows.append((device, f"{name} --preset {preset}", "-", f"{seconds:.0f} s", result))
    return rows, ok


def markdown(rows: list[tuple]) -> str:
    cells = [HEADER, *rows]
    fix = lambda c: str(c).replace("|", "/").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(fix(c) for c in row) + " |" for row in cells]
    lines.insert(1, "|" + "---|" * len(HEADER))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m featurelab.gpucheck", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run at CPU sizes)")
    p.add_argument("--budget", type=float, default=30.0, help="minutes for all steps (default 30)")
    p.add_argument("--out", default="gpu-check.md", help="the markdown table (default gpu-check.md)")
    p.add_argument("--steps", default="test,bench,presets", help="which steps, comma-separated")
    p.add_argument("--only", default="", help="the presets step's experiments, comma-separated (default: all)")
    p.add_argument(
        "--runs",
        default=None,
        help="a folder that keeps the presets' run folders, so that a second call on the same machine resumes a "
        "preset the limit cut short (default: a temporary folder, removed at the end)",
    )
    args = p.parse_args(argv)
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        need = ", ".join(missing)
        print(f"gpu-check: {need} cannot be imported by {sys.executable}: put a folder with them on PYTHONPATH")
        return 2
    steps = args.steps.split(",")
    bad = [s for s in steps if s not in ("test", "bench", "presets")]
    if bad or args.budget <= 0:
        print(f"gpu-check: --steps {args.steps!r} or --budget {args.budget} is not allowed: steps among test,bench,")
        print("presets; a budget > 0 minutes")
        return 2
    names = tuple(n for n in args.only.split(",") if n) or PRESETS_BY_VALUE
    unknown = [n for n in names if n not in PRESETS_BY_VALUE]
    if unknown:
        print(f"gpu-check: --only {args.only!r} names {', '.join(unknown)}: allowed are {','.join(PRESETS_BY_VALUE)}")
        return 2
    names = tuple(n for n in PRESETS_BY_VALUE if n in names)
    budget, out, rows, ok = Budget(args.budget), Path(args.out), [], True
    out.parent.mkdir(parents=True, exist_ok=True)
    preset = "tiny" if args.device == "cpu" else "paper"
    with tempfile.TemporaryDirectory(prefix="featurelab-gpu-check-") as tmp:
        runs = Path(args.runs) if args.runs else Path(tmp)
        for step in steps:
            if step == "test":
                new, good = test_step(args.device, budget)
            elif step == "bench":
                new, good = bench_step(args.device, budget, Path(tmp), 0.5 if "presets" in steps else 1.0)
            else:
                new, good = preset_step(args.device, budget, runs, preset, names)
            rows += new
            ok = ok and good
            out.write_text(markdown(rows))
            print(f"gpu-check: {step} done ({'ok' if good else 'FAILED'}), {budget.left() / 60:.1f} min left")
    print(markdown(rows))
    print(f"gpu-check: table in {out.resolve()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
