"""The ``featurelab`` command line: list, run, reproduce, bench, report, analyze.

A user's mistake (bad key, value, path, device, damaged run folder) prints one line
``featurelab: error: ...`` and exits with status 2; never a stack trace. A run that finished with failed
or unhealthy units, or whose empirical claims do not all pass (or a check of the code fails), exits with
status 1 and says so on its last line; so do ``run --seeds`` and ``reproduce`` when a claim is not reproduced.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

from ._version import __version__
from .catalog import CATALOG, presets
from .errors import FeaturelabError


def _cmd_list(args) -> int:
    for e in CATALOG:
        print(f"{e.name:21s} {', '.join(e.presets):21s} {e.what}")
    print("featurelab run NAME [--preset quick|tiny|paper]: --preset defaults to quick (minutes on a 2-core CPU)")
    return 0


def _cmd_run(args) -> int:
    from .config import parse_overrides
    from .runs.runner import run_experiment

    if args.seeds is not None:
        return _run_seeds(args, parse_overrides(args.set or []))
    record = run_experiment(
        args.experiment,
        preset=args.preset,
        overrides=parse_overrides(args.set or []),
        out=args.out,
        device=args.device,
        seed=args.seed,
        resume=args.resume,
        overwrite=args.force,
        workers=args.workers,
        threads=args.threads,
        progress=None if not args.quiet else False,
        batch=not args.no_batch,
        backend=args.backend,
        address=args.address,
        retries=args.retries,
    )
    from .claims import fmt_margin, tally, verdict

    if record.already_finished:
        print(f"run folder '{record.dir}' holds a finished run; nothing was changed")
    for c in record.claims:
        why = f" [{c['reason']}]" if c.get("reason") else ""
        kind = " (check of the code)" if c.get("kind") == "identity" else ""
        margin = f", margin {fmt_margin(c.get('margin'), c.get('headroom'))}" if c.get("margin") is not None else ""
        print(
            f"  [{verdict(c['passed'])}] {c['statement']}{kind}  "
            f"(measured {c['measured']}, expected {c['expected']}{margin}){why}{_certified_text(c)}"
        )
    n = tally(record.claims)
    none = f", {n['claims_not_measured']} not measured" if n["claims_not_measured"] else ""
    checks = f"; checks of the code: {n['identity_passed']}/{n['identity_total']} pass" if n["identity_total"] else ""
    tier = (
        f"; certified: {n['certified_claims_passed']}/{n['certified_claims_total']} pass"
        if n["certified_claims_total"]
        else ""
    )
    print(f"claims: {n['claims_passed']}/{n['claims_total']} pass{none}{tier}{checks}")
    print(f"report: {record.report.resolve()}")
    if record.problems:
        print(f"featurelab: {record.problems}")
        return 1
    if not record.all_passed:
        print("featurelab: not every claim passed (exit status 1)")
        return 1
    return 0


def _certified_text(c: dict) -> str:
    """ " | certified: PASS +12% ±0.1%" for a claim dict with tier "certified" (its reason if not measured)."""
    from .claims import fmt_error_bar, fmt_margin, has_tier, verdict

    if not has_tier(c):
        return ""
    why = f" [{c['certified_reason']}]" if c.get("certified_reason") else ""
    parts = (
        verdict(c.get("certified_passed")),
        fmt_margin(c.get("certified_margin"), c.get("headroom")),
        fmt_error_bar(c.get("error_bar")),
    )
    return " | certified: " + " ".join(x for x in parts if x) + why


def _seed_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise FeaturelabError(f"--seeds={text!r} is not allowed: give comma-separated integers, e.g. 0,1,2") from None


def _run_kwargs(args) -> dict:
    keys = ("device", "workers", "threads", "backend", "address", "retries")
    progress = None if not args.quiet else False
    return {k: getattr(args, k) for k in keys} | {"progress": progress, "batch": not args.no_batch}


def _refuse_run_folder(out) -> None:
    """One line when `out`, the root of several runs, is a run folder or lies inside one."""
    if out is None:
        return
    path = Path(out).resolve()
    for folder in (path, *path.parents):
        if (folder / "config.yaml").is_file() or (folder / "results.json").is_file():
            where = "is a run folder" if folder == path else f"lies inside the run folder '{folder}'"
            raise FeaturelabError(f"--out '{out}' {where}; give a new folder outside any run for several runs")


def _variant_errors(tables: list[dict]) -> int:
    """0, or 1 after one line on the variants that ended in an error (they reproduce nothing)."""
    bad = [f"{t['experiment']}/{v['label']}" for t in tables for v in t["variants"] if v["error"]]
    if bad:
        print(f"{len(bad)} variant(s) ended in an error ({', '.join(bad[:5])}): see their lines above")
    return 1 if bad else 0


def _run_seeds(args, overrides: dict) -> int:
    """``run EXP --seeds 0,1,2``: the preset under each seed and in float64, and the robustness table."""
    from .runs.reproduce import margin_text, run_robustness, tier_text

    if args.seed is not None:
        raise FeaturelabError("--seed and --seeds exclude each other: give the seeds in --seeds")
    _refuse_run_folder(args.out)
    table = run_robustness(
        args.experiment, args.preset, _seed_list(args.seeds), overrides, out=args.out, **_run_kwargs(args)
    )
    for c in table["claims"]:
        tag = "reproduced" if c["reproduced"] else "NOT reproduced"
        tag = "check of the code" if c["kind"] == "identity" else tag
        runs = [f"{k} {v} {margin_text(c, k)} {tier_text(c, k)}".rstrip() for k, v in c["verdicts"].items()]
        print(f"  [{tag}] {c['id']}: " + ", ".join(runs))
    tier = f"; certified: {table['certified_reproduced']}/{table['certified']}" if table.get("certified") else ""
    print(f"claims reproduced (pass under every variant): {table['reproduced']}/{table['empirical']}{tier}")
    return _variant_errors([table]) or int(table["reproduced"] != table["empirical"])


def _cmd_reproduce(args) -> int:
    from .runs.reproduce import reproduce, update_markdown

    out = Path(args.out)
    if args.markdown:
        update_markdown(args.markdown, out / "index.json")
        print(f"tables of '{args.markdown}' regenerated from '{out / 'index.json'}'")
        return 0
    only = args.only.split(",") if args.only else None
    _refuse_run_folder(out)
    index = reproduce(args.preset, _seed_list(args.seeds), out, only=only, collect=args.collect, **_run_kwargs(args))
    tier = f"; certified: {index['certified_reproduced']}/{index['certified']}" if index.get("certified") else ""
    print(f"empirical claims reproduced: {index['reproduced']}/{index['empirical']}{tier}")
    print(f"index: {(out / 'index.html').resolve()}")
    return _variant_errors(index["tables"]) or int(index["reproduced"] != index["empirical"])


def _cmd_bench(args) -> int:
    from .bench import run_bench
    from .runtime import set_threads

    set_threads(args.threads)
    run_bench(
        only=args.only.split(",") if args.only else None,
        experiments=args.experiments.split(",") if args.experiments else None,
        out=args.out,
        device=args.device,
        paper=args.paper,
        e_preset=args.e_preset,
    )
    return 0


def _cmd_report(args) -> int:
    from .runs.lock import RunLock
    from .runs.manifest import verify_run
    from .runs.report import render_report

    if not Path(args.run_dir).is_dir():
        raise FeaturelabError(f"run folder '{args.run_dir}' does not exist or is not a folder")
    with RunLock(args.run_dir):
        if (Path(args.run_dir) / "results.json").exists():
            verify_run(Path(args.run_dir))
        print(f"report: {render_report(args.run_dir).resolve()}")
    return 0


def _cmd_analyze(args) -> int:
    from .analysis import analyze, check_out, load_factory, load_inputs, parse_shape, weights_module
    from .analysis.loaders import parse_heads
    from .checks import int_at_least
    from .runtime import set_threads

    for name, low in (("threads", 1), ("n", 1), ("jacobian", 0)):
        int_at_least(f"--{name}", getattr(args, name), low)
    out = check_out(args.out, args.force)
    shape = parse_shape(args.shape) if args.shape else None
    heads = parse_heads(args.heads) if args.heads else None
    set_threads(args.threads)
    if args.target.endswith(".safetensors"):
        if args.data:
            raise FeaturelabError("--data needs a model: give package.module:factory (a weights file is weights only)")
        model, X, Y = weights_module(args.target), None, None
    else:
        model = load_factory(args.target, args.weights)
        X, Y = load_inputs(args.data, args.n, shape) if args.data else (None, None)
    chosen = args.representations.split(",") if args.representations else None
    result = analyze(model, X, Y, jacobian=args.jacobian, representations=chosen, heads=heads)
    print(result)
    print(f"report: {result.report(out, title=f'analysis of {args.target}').resolve()}")
    return 0


def _experiments_text() -> str:
    rows = "\n".join(f"  {e.name:21s} {', '.join(e.presets)}" for e in CATALOG)
    return f"experiments and their presets (quick is the default):\n{rows}\n\n"


_EXAMPLES = {
    "featurelab": """  featurelab list                                    # the experiments and their presets
  featurelab run leaky-bottleneck --preset tiny      # seconds; runs/leaky-bottleneck-tiny/report.html
  featurelab analyze weights.safetensors --out analysis-1
featurelab COMMAND --help shows each command's options and examples.""",
    "list": """  featurelab list""",
    "run": """  featurelab run leaky-bottleneck                    # quick preset -> runs/leaky-bottleneck-quick/
  featurelab run forces --preset tiny --out runs/smoke
  featurelab run leaky-bottleneck --preset paper --device cuda --set lam=0.001
  featurelab run leaky-bottleneck --out runs/x --resume   # continue an interrupted run
  featurelab run forces --preset tiny --seeds 0,1,2  # is each claim reproduced under every seed?""",
    "reproduce": """  featurelab reproduce --preset tiny --seeds 0,1      # every experiment, seconds each
  featurelab reproduce --only leaky-bottleneck,forces  # quick preset, seeds 0,1,2 -> runs/reproduce/index.html""",
    "bench": """  featurelab bench --only a,b                        # matmul peak and batched ensembles
  featurelab bench --paper --device cuda --out bench-gpu.json""",
    "report": """  featurelab report runs/leaky-bottleneck-quick""",
    "analyze": """  featurelab analyze weights.safetensors             # the layers of a weights file
  featurelab analyze mypkg.nets:make_mlp --data digits --weights mlp.safetensors --out analysis-mlp
  featurelab analyze mypkg.nets:make_conv --data digits --shape 1,8,8 --jacobian 50""",
}


def _command(sub, name: str, help: str, *, before: str = "") -> argparse.ArgumentParser:
    """A subcommand whose --help states `help`, then `before` (kept as written) and its examples."""
    return sub.add_parser(
        name,
        help=help,
        description=help,
        epilog=f"{before}examples:\n{_EXAMPLES[name]}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="featurelab",
        description="Feature learning in deep networks: train, "
        "measure, reproduce the papers' figures and check their claims.",
        epilog=f"{_experiments_text()}examples:\n{_EXAMPLES['featurelab']}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"featurelab {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _command(sub, "list", "list the experiments and their presets").set_defaults(func=_cmd_list)
    _add_run(sub)
    _add_reproduce(sub)
    _add_bench(sub)
    rep = _command(sub, "report", "rebuild report.html of a finished run folder")
    rep.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (runs/EXP-PRESET by default)")
    rep.set_defaults(func=_cmd_report)
    _add_analyze(sub)
    return p


def _add_run(sub) -> None:
    r = _command(sub, "run", "run an experiment and write its run folder and report.html", before=_experiments_text())
    r.add_argument("experiment", metavar="EXPERIMENT", help="the experiment's name (listed below)")
    r.add_argument(
        "--preset",
        default="quick",
        help=f"one of {', '.join(presets())} (default quick: a 2-core CPU in minutes; tiny: seconds; "
        "paper: the paper's settings, for a GPU or a cluster; paper-cpu, where listed: the paper's nets, data and λ "
        "with fewer steps, samples or seeds, hours on a 2-core CPU)",
    )
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    r.add_argument("--out", default=None, help="run folder (default runs/EXP-PRESET)")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    r.add_argument("--seed", type=int, default=None, help="master seed (default: the preset's)")
    r.add_argument("--resume", action="store_true", help="continue an unfinished run in --out")
    r.add_argument("--force", action="store_true", help="remove the run in --out first and start over")
    r.add_argument("--workers", type=int, default=None, help="worker processes for sweeps (default: cores)")
    r.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.add_argument("--no-batch", action="store_true", help="train same-shape runs one by one, not as ensembles")
    r.add_argument("--backend", default="local", help="local (worker processes, default) or ray")
    r.add_argument(
        "--address", default=None, help="Ray cluster HOST:PORT (default: RAY_ADDRESS; its token: RAY_AUTH_TOKEN)"
    )
    r.add_argument("--retries", type=int, default=2, help="Ray: re-runs of a task whose worker died (default 2)")
    r.add_argument(
        "--seeds",
        default=None,
        metavar="S,S,...",
        help="run the preset under each seed and once in float64, each in a subfolder of --out, and write "
        "robustness.json/.html: a claim is reproduced when it passes under all (docs/reproduction.md)",
    )
    r.set_defaults(func=_cmd_run)


def _add_reproduce(sub) -> None:
    rp = _command(
        sub,
        "reproduce",
        "every experiment that needs no local files, under seeds and float64: index.html, index.json",
        before=_experiments_text(),
    )
    rp.add_argument("--preset", default="quick", help="preset of every experiment (default quick)")
    rp.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2); float64 runs seed 1st")
    rp.add_argument("--out", default="runs/reproduce", help="folder, one subfolder per experiment (resumable)")
    rp.add_argument("--only", default=None, help="comma-separated experiments (default: all that need no files)")
    rp.add_argument("--markdown", default=None, metavar="FILE", help="only regenerate FILE's tables from the index")
    rp.add_argument(
        "--collect", action="store_true", help="run nothing: index the runs finished in --out (made elsewhere)"
    )
    rp.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    rp.add_argument("--workers", type=int, default=None, help="worker processes for sweeps (default: cores)")
    rp.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    rp.add_argument(
        "--quiet", action="store_true", help="no progress (the time left: a bar in a terminal, a line a run in a log)"
    )
    rp.add_argument("--no-batch", action="store_true", help="train same-shape runs one by one, not as ensembles")
    rp.set_defaults(func=_cmd_reproduce, backend="local", address=None, retries=2)


def _add_bench(sub) -> None:
    b = _command(
        sub,
        "bench",
        "measure speed: matmul peak, batched ensembles, diagnostics, quick presets, certification",
        before=_experiments_text(),
    )
    b.add_argument("--only", default=None, help="comma-separated figures among a,a2,b,c,d,e,g,h (default all)")
    b.add_argument("--paper", action="store_true", help="also (f): wall time and claims of every paper preset")
    b.add_argument("--experiments", default=None, help="comma-separated experiments for (e) (default all)")
    b.add_argument("--e-preset", default="quick", help="the preset (e) runs (default quick; tiny: a dry run)")
    b.add_argument("--out", default="bench.json", help="JSON file for the results (default bench.json)")
    b.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    b.add_argument("--threads", type=int, default=1, help="torch threads for (a)-(d) (default 1, as sweep workers)")
    b.set_defaults(func=_cmd_bench)


def _add_analyze(sub) -> None:
    a = _command(sub, "analyze", "ranks, spectra and representations of a model: table, figures, report.html")
    a.add_argument("target", help="weights.safetensors (weights only) or package.module:factory")
    a.add_argument(
        "--data", default=None, help="digits or a .npz file with X (and Y) for a factory's model (default: none)"
    )
    a.add_argument("--n", type=int, default=1000, help="digits samples (default 1000)")
    a.add_argument("--shape", default=None, help="reshape each row, e.g. 1,8,8 for a conv net on digits")
    a.add_argument("--weights", default=None, help="safetensors state dict to load into the factory's model")
    a.add_argument("--jacobian", type=int, default=0, help="samples for the Jacobian rank and NTK trace (0: off)")
    a.add_argument("--out", default="analysis", help="output folder (default ./analysis; kept unless --force)")
    a.add_argument("--force", action="store_true", help="overwrite a previous analysis in --out")
    a.add_argument("--representations", default=None, help="comma-separated module names, globs (blocks.*) to read")
    a.add_argument(
        "--heads", default=None, help="head counts of attention modules, e.g. blocks.*.attn=4 (comma-separated)"
    )
    a.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    a.set_defaults(func=_cmd_analyze)


def _tolerant_output() -> None:
    """A terminal that cannot encode a character (PYTHONIOENCODING=ascii, a latin-1 locale) shows it
    replaced: a unicode path or a formula in a message never crashes the program."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="replace")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so that it stops like Ctrl-C (workers stopped, lock released)."""


_SIGNALS: list[int] = []  # the signals received while a command runs


def _on_sigterm(signum, frame) -> None:
    _SIGNALS.append(signum)
    raise Terminated


def _on_sigint(signum, frame) -> None:
    _SIGNALS.append(signum)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """The command line; SIGTERM stops it like Ctrl-C while it runs (in the main thread: elsewhere signals
    cannot be set), and the previous handlers are restored when it returns."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    _SIGNALS.clear()
    signal.signal(signal.SIGTERM, _on_sigterm)
    if previous[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        return _main(argv)
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: a handler set outside Python, which cannot be set back
                signal.signal(sig, handler)


@contextmanager
def _interrupts_held():
    """SIGINT and SIGTERM held back while torch's C extensions load (a KeyboardInterrupt raised inside their
    import can abort the process); one that arrives meanwhile is delivered when the block ends."""
    held = {signal.SIGINT, signal.SIGTERM}
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _main(argv: list[str] | None) -> int:
    command = None
    try:
        _tolerant_output()
        args = build_parser().parse_args(argv)
        command = args.command
        if command in ("run", "reproduce", "bench", "analyze"):  # the commands that compute: torch is loaded anyway
            with _interrupts_held():
                from .training._kernels.gemm import onednn_products

            onednn_products()  # a bad FEATURELAB_GEMM is one line before anything is written
        from .spelling import command_line

        with command_line():  # errors name the command's flags (--resume), not the Python keywords
            return args.func(args)
    except FeaturelabError as exc:
        print(f"featurelab: error: {exc}", file=sys.stderr)
        return exc.exit_code  # 2; 1 for a run that cannot go on writing its folder
    except BrokenPipeError:  # the reader of the output went away (featurelab list | head -1): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except SystemExit as exc:
        if command is None:  # argparse: --help, --version or a bad argument
            raise
        print(
            f"featurelab: error: {command} stopped: its code called exit({exc.code!r}); nothing more was done",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as exc:
        return _stopped(command, isinstance(exc, Terminated))
    except Exception:
        # a signal that lands inside an import (numpy's, say) can surface as another error: still a stop
        if not _SIGNALS:
            raise
        return _stopped(command, _SIGNALS[-1] == signal.SIGTERM)


def _stopped(command: str | None, terminated: bool) -> int:
    """The one line of a command stopped by Ctrl-C or SIGTERM, and its exit status (130 or 143)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # a second signal does not interrupt the message
    hint = "; continue with the same command plus --resume" if command == "run" else ""
    what = "terminated (SIGTERM)" if terminated else "interrupted"
    print(f"featurelab: {what}{hint}", file=sys.stderr)
    return 143 if terminated else 130


if __name__ == "__main__":
    sys.exit(main())
