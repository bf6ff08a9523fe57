"""The ``featurelab`` command line: list, run, bench, report, analyze.

A user's mistake (bad key, value, path, device, damaged run folder) prints one line
``featurelab: error: ...`` and exits with status 2; never a stack trace. A run that finished with failed
or unhealthy units exits with status 1 and says so on its last line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import FeaturelabError


def _cmd_list(args) -> int:
    from .experiments import EXPERIMENTS

    for e in EXPERIMENTS:
        print(f"{e.name:24s} presets: {', '.join(e.presets):22s} {e.summary}")
    return 0


def _cmd_run(args) -> int:
    from .config import parse_overrides
    from .runs.runner import run_experiment

    record = run_experiment(
        args.experiment,
        preset=args.preset,
        overrides=parse_overrides(args.set or []),
        out=args.out,
        device=args.device,
        seed=args.seed,
        resume=args.resume,
        workers=args.workers,
        threads=args.threads,
        progress=None if not args.quiet else False,
        batch=not args.no_batch,
        backend=args.backend,
        address=args.address,
        retries=args.retries,
    )
    from .claims import verdict

    if record.already_finished:
        print(f"run folder '{record.dir}' holds a finished run; nothing was changed")
    n_pass = sum(c["passed"] is True for c in record.claims)
    for c in record.claims:
        why = f" [{c['reason']}]" if c.get("reason") else ""
        print(f"  [{verdict(c['passed'])}] {c['statement']}  (measured {c['measured']}, expected {c['expected']}){why}")
    n_none = sum(c["passed"] is None for c in record.claims)
    print(f"claims: {n_pass}/{len(record.claims)} pass" + (f", {n_none} not measured" if n_none else ""))
    print(f"report: {record.report.resolve()}")
    if record.problems:
        print(f"featurelab: {record.problems}")
        return 1
    return 0


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
    )
    return 0


def _cmd_report(args) -> int:
    from .runs.lock import RunLock
    from .runs.report import render_report

    if not Path(args.run_dir).is_dir():
        raise FeaturelabError(f"run folder '{args.run_dir}' does not exist or is not a folder")
    with RunLock(args.run_dir):
        print(f"report: {render_report(args.run_dir).resolve()}")
    return 0


def _cmd_analyze(args) -> int:
    from .analysis import analyze, load_factory, load_inputs, weights_module
    from .runtime import set_threads

    set_threads(args.threads)
    shape = tuple(int(s) for s in args.shape.split(",")) if args.shape else None
    if args.target.endswith(".safetensors"):
        if args.data:
            raise FeaturelabError("--data needs a model: give package.module:factory (a weights file is weights only)")
        model, X, Y = weights_module(args.target), None, None
    else:
        model = load_factory(args.target, args.weights)
        X, Y = load_inputs(args.data, args.n, shape) if args.data else (None, None)
    result = analyze(model, X, Y, jacobian=args.jacobian)
    print(result)
    print(f"report: {result.report(args.out, title=f'analysis of {args.target}').resolve()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="featurelab",
        description="Feature learning in deep networks: train, "
        "measure, reproduce the papers' figures and check their claims.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the experiments and their presets").set_defaults(func=_cmd_list)
    r = sub.add_parser("run", help="run an experiment and write its run folder and report.html")
    r.add_argument("experiment")
    r.add_argument("--preset", default="quick", help="quick (CPU, minutes), paper (the paper's settings), ...")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field (repeatable)")
    r.add_argument("--out", default=None, help="run folder (default runs/EXP-PRESET)")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    r.add_argument("--seed", type=int, default=None, help="master seed (overrides the preset's)")
    r.add_argument("--resume", action="store_true", help="continue an unfinished run in --out")
    r.add_argument("--workers", type=int, default=None, help="worker processes for sweeps (default: cores)")
    r.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.add_argument("--no-batch", action="store_true", help="train same-shape runs one by one, not as ensembles")
    r.add_argument("--backend", default="local", help="local (worker processes, default) or ray")
    r.add_argument("--address", default=None, help="Ray cluster HOST:PORT (default: RAY_ADDRESS)")
    r.add_argument("--retries", type=int, default=2, help="Ray: re-runs of a task whose worker died (default 2)")
    r.set_defaults(func=_cmd_run)
    b = sub.add_parser("bench", help="measure speed: matmul peak, batched ensembles, diagnostics, quick presets")
    b.add_argument("--only", default=None, help="comma-separated figures among a,a2,b,c,d,e,g (default all)")
    b.add_argument("--paper", action="store_true", help="also (f): wall time and claims of every paper preset")
    b.add_argument("--experiments", default=None, help="comma-separated experiments for (e) (default all)")
    b.add_argument("--out", default="bench.json", help="JSON file for the results (default bench.json)")
    b.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    b.add_argument("--threads", type=int, default=1, help="torch threads for (a)-(d) (default 1, as sweep workers)")
    b.set_defaults(func=_cmd_bench)
    rep = sub.add_parser("report", help="rebuild report.html of a finished run folder")
    rep.add_argument("run_dir")
    rep.set_defaults(func=_cmd_report)
    a = sub.add_parser("analyze", help="ranks, spectra and representations of a model: table, figures, report.html")
    a.add_argument("target", help="weights.safetensors (weights only) or package.module:factory")
    a.add_argument("--data", default=None, help="digits or a .npz file with X (and Y) for a factory's model")
    a.add_argument("--n", type=int, default=1000, help="digits samples (default 1000)")
    a.add_argument("--shape", default=None, help="reshape each row, e.g. 1,8,8 for a conv net on digits")
    a.add_argument("--weights", default=None, help="safetensors state dict to load into the factory's model")
    a.add_argument("--jacobian", type=int, default=0, help="samples for the Jacobian rank and NTK trace (0: off)")
    a.add_argument("--out", default="analysis", help="output folder (default ./analysis)")
    a.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    a.set_defaults(func=_cmd_analyze)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except FeaturelabError as exc:
        print(f"featurelab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("featurelab: interrupted; continue with the same command plus --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
