"""``featurelab bench``: how fast featurelab runs here, each figure against a baseline timed in the same run.

(a) one full-batch training step (forward, backward, Adam) of the paper-size Leaky ResNet (L = 50,
    w = 200, N = 1000, d = 20; docs/theory/leaky-resnets.md §5.2) as featurelab's engine runs it
    (`train`; on CUDA a captured graph), against an eager plain-PyTorch step of the same network
    (``torch.optim.Adam``) timed in the same run; and featurelab's GFLOP/s as a fraction of this
    machine's fp32 matmul peak (an n x n matmul timed in the same run, n = 2048 on CPU, 8192 on CUDA).
    FLOPs counted: the matmuls, 6·L·N·w·(w+1) per step (2 forward, 4 backward), i.e. 12.06 GFLOP.
(a2) 16 paper-size Leaky ResNets trained as one ensemble (`train_ensemble`): GFLOP/s and fraction of
    the same matmul peak.
(b) 16 small MLPs of the digits width sweep (64 -> 16 -> 16 -> 10, bias, cross-entropy, N = 1000,
    Adam, 200 steps; docs/theory/sparsity.md §6) trained as one ensemble (`train_ensemble`) versus one
    after another with `train`, same steps: speedup ratio.
On the CPU, (a) and (b) are also timed against JAX (`featurelab.bench_jax`: the same networks, initial
weights and Adam under ``jit``/``vmap``/``lax.scan``) when it is installed; (b)'s target is then JAX's time.
(c) 64 escape-direction restarts (circle data N = 8, depth 3, width 10; docs/theory/saddle-to-saddle.md §5)
    batched in one `find_escape_directions` call versus 64 calls with ``restarts=1``: speedup ratio.
(d) `geodesic_diagnostics` of the paper-size network: seconds, and as a multiple of one step of (a).
(e) the end-to-end wall time of each experiment's quick preset (budget: 5 minutes each).
(f) with ``paper=True`` (``--paper``): the wall time and claims of every paper preset that needs no
    local files (budget: 10 minutes each).
(g) `featurelab.analyze` of a 12-block width-192 ViT (patch 2) on N = 1000 digits, weights and
    representations; weights only of a ResNet-18 against a numpy SVD loop (every conv per k² slice) and
    WeightWatcher's ``analyze()`` when it is installed.
(h) the certification of the demo net (`make demo`: leaky-bottleneck's quick unit, L̃ = 8, seed 0) by
    `featurelab.training.certify.certify` at tolerance 1e-8: its seconds against the unit's training
    seconds in the same run, its Clarke residual and, when it is refused, the rule that refused it.
Targets (benchmarks, never tests): (a) >= 6x the eager step on CUDA, >= 75% of peak on CPU; (a2) >= 40%
of peak; (b) <= JAX's time (>= 5x without JAX); (c) >= 10x; (d) <= 20 steps; (g) ViT <= 120 s and
ResNet-18 CPU <= WeightWatcher's; (h) certified, in at most the unit's training time (so that a preset that
certifies its units takes at most twice its wall time).
Engine steps are timed as the difference of two runs (2S and S steps) divided by S, so set-up and
logging cancel. Nothing here changes torch's global thread settings: every figure, and its baseline,
uses the process's threads (the CLI sets them with ``--threads``, default 1 like a sweep worker; (e)
and (f) run their own workers).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from .errors import FeaturelabError
from .io import write_json
from .runs.reproduce import NEEDS_LOCAL_FILES
from .runtime import resolve_device, tune_cpu, versions

FIGURES = ("a", "a2", "b", "c", "d", "e", "g", "h")
TARGETS = {"a": 0.75, "a_cuda": 6.0, "a2": 0.40, "b": 5.0, "c": 10.0, "d": 20.0, "e": 300.0, "f": 600.0, "g": 120.0}
PAPER = {"d": 20, "width": 200, "depth": 50, "n": 1000, "effective_depth": 5.0, "lam": 0.002}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Wall and CPU seconds (this process) of a block: on a shared machine the CPU time shows what the
    wall time hides."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def timed(fn, device: torch.device, repeat: int = 5, warmup: int = 1) -> tuple[float, float]:
    """Median wall and CPU seconds of `fn()` over `repeat` calls after `warmup` calls (device synchronised)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    walls, cpus = [], []
    for _ in range(repeat):
        with Stopwatch() as sw:
            fn()
            _sync(device)
        walls.append(sw.wall)
        cpus.append(sw.cpu)
    return statistics.median(walls), statistics.median(cpus)


def matmul_peak(device: torch.device, n: int | None = None) -> tuple[float, float]:
    """This machine's fp32 matmul rate in GFLOP/s, by wall and by CPU time: an n x n product (2n³ FLOPs;
    n = 2048 on CPU, 8192 on CUDA) as featurelab takes it (`featurelab.training._kernels.gemm.product`: oneDNN where it
    beats torch's BLAS on this CPU)."""
    from .training._kernels.gemm import product

    n = n or (8192 if device.type == "cuda" else 2048)
    g = torch.Generator(device="cpu").manual_seed(0)
    A, B = (torch.randn(n, n, generator=g).to(device) for _ in range(2))
    wall, cpu = timed(lambda: product(A, B), device)
    return 2 * n**3 / wall / 1e9, 2 * n**3 / cpu / 1e9


def paper_network(device: torch.device):
    """The paper-size Leaky ResNet (float32), its data (bottleneck teacher 20 -> 5 -> 20) and an eager Adam step
    of plain PyTorch (torch.optim, the residual steps through plain autograd)."""
    from .data import bottleneck_teacher
    from .models import LeakyResNet
    from .training import data_cost

    p = PAPER
    data = bottleneck_teacher((p["d"], 5, p["d"]), "fcnn", 100, p["n"], 0, teacher_seed=0, data_seed=1)
    data = data.to(dtype=torch.float32, device=device)
    model = LeakyResNet(p["d"], p["d"], p["width"], p["depth"], p["effective_depth"], seed=2).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(data.X_train, return_layers=True).output  # the plain autograd path, not the one-node steps
        loss = data_cost("mse", out, data.Y_train) + model.penalty(p["lam"])
        loss.backward()
        opt.step()

    return model, data, step


def _paper_config(steps: int):
    from .training import Phase, TrainConfig

    return TrainConfig(
        lam=PAPER["lam"], log_every=steps, top_singular_values=0, phases=[Phase(optimizer="adam", steps=steps, lr=1e-3)]
    )


def engine_step_seconds(device: torch.device, members: int, steps: int) -> tuple[float, float]:
    """Wall and CPU seconds per step of featurelab's engine on `members` paper-size networks (one:
    `train`; more: `train_ensemble`): (time of 2·steps − time of steps) / steps, so set-up and logging
    cancel."""
    from .data import bottleneck_teacher
    from .models import LeakyResNet
    from .training import train, train_ensemble

    p = PAPER
    data = bottleneck_teacher((p["d"], 5, p["d"]), "fcnn", 100, p["n"], 0, teacher_seed=0, data_seed=1)
    shape = (p["d"], p["d"], p["width"], p["depth"], p["effective_depth"])

    def once(n: int) -> Stopwatch:
        models = [LeakyResNet(*shape, seed=2 + i) for i in range(members)]
        _sync(device)
        with Stopwatch() as sw:
            if members == 1:
                train(models[0], data, _paper_config(n), device=str(device), progress=False)
            else:
                train_ensemble(models, data, _paper_config(n), device=str(device), progress=False)
            _sync(device)
        return sw

    once(min(steps, 5))  # warm-up
    short, long = once(steps), once(2 * steps)
    return max(long.wall - short.wall, 1e-12) / steps, max(long.cpu - short.cpu, 1e-12) / steps


def bench_step(device: torch.device) -> dict:
    """(a): featurelab's step of the paper-size network against an eager plain-PyTorch step, and its
    fraction of the matmul peak."""
    p = PAPER
    _, _, step = paper_network(device)
    eager, eager_cpu = timed(step, device, repeat=5, warmup=2)
    seconds, cpu = engine_step_seconds(device, 1, 200 if device.type == "cuda" else 5)
    flops = 6 * p["depth"] * p["n"] * p["width"] * (p["width"] + 1)
    peak, peak_cpu = matmul_peak(device)
    achieved = flops / seconds / 1e9
    cuda = device.type == "cuda"
    return {
        **_jax_step(device, seconds),
        "step_seconds": seconds,
        "baseline_eager_step_seconds": eager,
        "speedup_over_eager": eager / seconds,
        "gflop_per_step": flops / 1e9,
        "achieved_gflops": achieved,
        "baseline_peak_gflops": peak,
        "fraction_of_peak": achieved / peak,
        "step_cpu_seconds": cpu,
        "baseline_eager_step_cpu_seconds": eager_cpu,
        "fraction_of_peak_by_cpu_time": (flops / cpu / 1e9) / peak_cpu,
        "target": f">= {TARGETS['a_cuda']:g}x the eager step" if cuda else f">= {TARGETS['a']:.0%} of peak",
        "reached": eager / seconds >= TARGETS["a_cuda"] if cuda else achieved / peak >= TARGETS["a"],
    }


def _jax_step(device: torch.device, seconds: float) -> dict:
    """(a)'s JAX peer on the CPU (the network `engine_step_seconds` times first), when JAX is installed."""
    from . import bench_jax

    jax = bench_jax.load_jax(torch.get_num_threads()) if device.type == "cpu" else None
    if jax is None:
        return {}
    model, data, _ = paper_network(device)
    W, rho, U, V = (t.detach().float().numpy() for t in (model.W, model.rho, model.U_in, model.V_out))
    X, Y = data.X_train.numpy(), data.Y_train.numpy()
    p = PAPER
    peer = bench_jax.leaky_resnet_step(
        jax, W, rho, U, V, X, Y, effective_depth=p["effective_depth"], lam=p["lam"], lr=1e-3, steps=5
    )
    return {
        "baseline_jax_step_seconds": peer["step_seconds"],
        "baseline_jax_step_cpu_seconds": peer["step_cpu_seconds"],
        "ratio_to_jax": seconds / peer["step_seconds"],
    }


def bench_paper_ensemble(device: torch.device, members: int = 16) -> dict:
    """(a2): `members` paper-size networks as one ensemble: GFLOP/s and fraction of the matmul peak."""
    p = PAPER
    seconds, cpu = engine_step_seconds(device, members, 50 if device.type == "cuda" else 2)
    flops = members * 6 * p["depth"] * p["n"] * p["width"] * (p["width"] + 1)
    peak, peak_cpu = matmul_peak(device)
    achieved = flops / seconds / 1e9
    return {
        "members": members,
        "step_seconds": seconds,
        "achieved_gflops": achieved,
        "baseline_peak_gflops": peak,
        "fraction_of_peak": achieved / peak,
        "step_cpu_seconds": cpu,
        "fraction_of_peak_by_cpu_time": (flops / cpu / 1e9) / peak_cpu,
        "target": f">= {TARGETS['a2']:.0%} of peak",
        "reached": achieved / peak >= TARGETS["a2"],
    }


def _speedup(batched: Stopwatch, looped: Stopwatch, target: float) -> dict:
    return {
        "batched_seconds": batched.wall,
        "baseline_looped_seconds": looped.wall,
        "speedup": looped.wall / batched.wall,
        "batched_cpu_seconds": batched.cpu,
        "baseline_looped_cpu_seconds": looped.cpu,
        "cpu_speedup": looped.cpu / batched.cpu,
        "target": f">= {target:g}x",
        "reached": looped.wall / batched.wall >= target,
    }


def bench_ensemble(device: torch.device, members: int = 16, steps: int = 200, repeat: int = 3) -> dict:
    """(b): `members` digits MLPs trained batched versus one after another (same steps; both warmed up),
    and against JAX's ``vmap`` + ``jit`` of the same training on the CPU when JAX is installed."""
    from .data import digits
    from .models import MLP
    from .training import Phase, TrainConfig, data_cost, train
    from .training.ensemble import train_ensemble

    data = digits(1000, seed=0)
    config = TrainConfig(
        objective="cross_entropy",
        lam=1e-3,
        log_every=steps,
        top_singular_values=0,
        phases=[Phase(optimizer="adam", steps=steps, lr=1e-2)],
    )
    make = lambda i: MLP(64, 10, 16, 3, bias=1.0, seed=i)  # noqa: E731
    warm = config.model_copy(update={"phases": [Phase(optimizer="adam", steps=2, lr=1e-2)], "log_every": 2})
    train(make(0), data, warm, device=str(device), progress=False)
    train_ensemble([make(0), make(1)], data, warm, device=str(device), progress=False)
    with Stopwatch() as looped:
        for i in range(members):
            train(make(i), data, config, device=str(device), progress=False)
        _sync(device)
    runs = []
    for _ in range(repeat):  # the median of `repeat` ensembles (a shared machine)
        models = [make(i) for i in range(members)]
        with Stopwatch() as sw:
            train_ensemble(models, data, config, device=str(device), progress=False)
            _sync(device)
        runs.append(sw)
    batched = sorted(runs, key=lambda sw: sw.wall)[len(runs) // 2]
    out = {"members": members, "steps": steps, **_speedup(batched, looped, TARGETS["b"])}
    from . import bench_jax

    jax = bench_jax.load_jax(torch.get_num_threads()) if device.type == "cpu" else None
    if jax is None:
        return out
    weights = [torch.stack([make(i).weights[l].detach() for i in range(members)]).numpy() for l in range(3)]
    peer = bench_jax.mlp_ensemble(
        jax, weights, data.X_train.float().numpy(), data.Y_train.numpy(), lam=config.lam, lr=1e-2, steps=steps
    )
    with torch.no_grad():  # the same work: the members' final losses agree to float32 rounding over the steps
        ours = [
            float(data_cost("cross_entropy", m(data.X_train.float()), data.Y_train) + m.penalty(config.lam))
            for m in models
        ]
    return {
        **out,
        "baseline_jax_seconds": peer["seconds"],
        "baseline_jax_cpu_seconds": peer["cpu_seconds"],
        "jax_compile_seconds": peer["compile_seconds"],
        "ratio_to_jax": batched.wall / peer["seconds"],
        "cpu_ratio_to_jax": batched.cpu / peer["cpu_seconds"],
        "jax_final_loss_difference": max(abs(a - b) / abs(b) for a, b in zip(ours, peer["final_losses"])),
        "target": "<= JAX's time",
        "reached": batched.wall <= peer["seconds"],
    }


def bench_escape(restarts: int = 64, steps: int = 500) -> dict:
    """(c): `restarts` escape-direction restarts in one batched search versus one call per restart."""
    from .data import circle_dataset
    from .measurements import find_escape_directions

    data = circle_dataset(8)
    X, G = data.X_train, -data.Y_train  # G = ∇(½‖Y - Y*‖²) at the origin
    search = partial(find_escape_directions, X, G, depth=3, width=10)
    search(restarts=2, seed=0, steps=2, tail=2)  # warm-up
    with Stopwatch() as batched:
        search(restarts=restarts, seed=0, steps=steps, tail=min(100, steps))
    with Stopwatch() as looped:
        for r in range(restarts):
            search(restarts=1, seed=r, steps=steps, tail=min(100, steps))
    return {"restarts": restarts, "steps": steps, **_speedup(batched, looped, TARGETS["c"])}


def bench_diagnostics(device: torch.device, step_seconds: float | None = None) -> dict:
    """(d): seconds of `geodesic_diagnostics` on the paper-size network, and in training steps; on CUDA also
    against the same call on the CPU (same run), which is the target there: a float64 diagnostic of 50
    layers is a few SVDs and solves per layer, not a matter of steps of a captured fp32 graph."""
    from .measurements import geodesic_diagnostics

    model, data, step = paper_network(device)
    if step_seconds is None:
        step_seconds = timed(step, device, repeat=3, warmup=1)[0]

    def diagnose(dev: torch.device) -> float:
        m, X, Y = model.to(dev), data.X_train.to(dev), data.Y_train.to(dev)
        t0 = time.perf_counter()
        geodesic_diagnostics(m, X, Y, PAPER["lam"])
        _sync(dev)
        return time.perf_counter() - t0

    seconds = diagnose(device)
    out = {"seconds": seconds, "baseline_step_seconds": step_seconds, "in_steps": seconds / step_seconds}
    if device.type == "cuda":
        cpu = diagnose(torch.device("cpu"))
        return {**out, "baseline_cpu_seconds": cpu, "target": "<= the CPU's seconds", "reached": seconds <= cpu}
    return {**out, "target": f"<= {TARGETS['d']:g} steps", "reached": seconds / step_seconds <= TARGETS["d"]}


def bench_presets(names: list[str], device: str, preset: str = "quick", echo=print, figure: str = "e") -> dict:
    """(e) / (f): wall seconds of each experiment's `preset` (run into a temporary folder) and its claims;
    each is echoed as it finishes."""
    from .runs.runner import run_experiment

    budget = TARGETS[figure]
    out = {}
    with tempfile.TemporaryDirectory(prefix="featurelab-bench-") as tmp:
        for name in names:
            t0 = time.perf_counter()
            error = None
            try:
                rec = run_experiment(name, preset, out=Path(tmp) / name, device=device, progress=False)
                claims = f"{sum(c['passed'] is True for c in rec.claims)}/{len(rec.claims)}"
            except FeaturelabError as exc:
                claims, error = "error", str(exc)
            seconds = time.perf_counter() - t0
            out[name] = {
                "seconds": seconds,
                "claims_passed": claims,
                "error": error,
                "baseline_budget_seconds": budget,
                "reached": error is None and seconds <= budget,
            }
            echo(f"({figure}) {name} {preset}: {seconds:.1f} s, claims {claims}" + (f" ({error})" if error else ""))
    return out


def bench_certify(device: str) -> dict:
    """(h): the demo's quick leaky-bottleneck run with its unit certified (tolerance 1e-8): training and
    certification seconds of the unit, as `results.json` records them, and the certificate."""
    from .runs.runner import run_experiment

    with tempfile.TemporaryDirectory(prefix="featurelab-bench-") as tmp:
        run = Path(tmp) / "run"
        run_experiment("leaky-bottleneck", "quick", {"certify": 1e-8}, out=run, device=device, progress=False)
        results = json.loads((run / "results.json").read_text())
        unit, unit_seconds = next(iter(results["unit_seconds"].items()))
        cert = json.loads((run / "units" / unit / "result.json").read_text())["result"].get("certificate", {})
    certify_seconds = float(results["certify_seconds"].get(unit, math.nan))
    train_seconds = float(unit_seconds) - certify_seconds
    return {
        "unit": unit,
        "certify_seconds": certify_seconds,
        "baseline_train_seconds": train_seconds,
        "certified": bool(cert.get("certified")),
        "clarke": cert.get("clarke"),
        "rule": cert.get("rule", ""),
        "target": "certified in <= the training seconds",
        "reached": bool(cert.get("certified")) and certify_seconds <= train_seconds,
    }


def bench_analyze(n: int = 1000) -> dict:
    """(g): `analyze` of a 12-block width-192 ViT on N digits (data and weights), and weights only of a
    ResNet-18 against a numpy baseline (the singular values of every weight matrix, convs per k² slice: what
    WeightWatcher computes) and against WeightWatcher's ``analyze()`` when it is installed."""
    import math

    import numpy as np
    from torch import nn

    from .analysis import analyze
    from .analysis.examples import ResNet18, ViT
    from .data.digits import digits

    torch.manual_seed(0)
    data = digits(n)
    X = data.X_train.float().reshape(-1, 1, 8, 8)
    analyze(nn.Linear(2, 2))  # imports and first LAPACK calls stay out of the timings
    with Stopwatch() as full:
        analyze(ViT(), X, data.Y_train)
    resnet = ResNet18()
    with Stopwatch() as weights:
        analyze(resnet)
    with Stopwatch() as base:
        for m in resnet.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                W = m.weight.detach().double().numpy()
                np.linalg.svd(W.reshape(W.shape[0], W.shape[1], -1).transpose(2, 0, 1), compute_uv=False)
    out = {
        "n": n,
        "seconds": full.wall,
        "cpu_seconds": full.cpu,
        "weights_only_seconds": weights.wall,
        "weights_only_cpu_seconds": weights.cpu,
        "baseline": "numpy SVD loop",
        "baseline_seconds": base.wall,
        "baseline_cpu_seconds": base.cpu,
    }
    try:
        import weightwatcher
    except ImportError:
        pass
    else:
        weightwatcher.WeightWatcher(model=nn.Sequential(nn.Linear(30, 30))).analyze()
        with Stopwatch() as ww:
            weightwatcher.WeightWatcher(model=resnet).analyze()
        out |= {"weightwatcher_seconds": ww.wall, "weightwatcher_cpu_seconds": ww.cpu}
    ww_cpu = out.get("weightwatcher_cpu_seconds", math.inf)
    out["target"] = f"ViT <= {TARGETS['g']:g} s; ResNet-18 CPU <= WeightWatcher's"
    out["reached"] = full.wall <= TARGETS["g"] and weights.cpu <= ww_cpu
    return out


Row = tuple[str, str, str, str, str]  # figure, measured, baseline (same run), target, reached


def _row_a(r: dict) -> Row:
    jax = (
        f"; JAX jit step {r['baseline_jax_step_seconds'] * 1e3:.1f} ms: {r['ratio_to_jax']:.2f}x JAX's time"
        if "baseline_jax_step_seconds" in r
        else ""
    )
    return (
        "(a) paper ResNet step",
        f"{r['step_seconds'] * 1e3:.1f} ms = {r['speedup_over_eager']:.1f}x eager, "
        f"{r['achieved_gflops']:.1f} GFLOP/s = {r['fraction_of_peak']:.0%} of peak "
        f"(CPU time: {r['fraction_of_peak_by_cpu_time']:.0%})",
        f"eager step {r['baseline_eager_step_seconds'] * 1e3:.1f} ms; "
        f"matmul peak {r['baseline_peak_gflops']:.1f} GFLOP/s" + jax,
        r["target"],
        str(r["reached"]),
    )


def _row_a2(r: dict) -> Row:
    return (
        f"(a2) {r['members']} paper ResNets, one ensemble",
        f"{r['step_seconds']:.3f} s/step = {r['achieved_gflops']:.1f} GFLOP/s = "
        f"{r['fraction_of_peak']:.0%} of peak (CPU time: {r['fraction_of_peak_by_cpu_time']:.0%})",
        f"matmul peak {r['baseline_peak_gflops']:.1f} GFLOP/s",
        r["target"],
        str(r["reached"]),
    )


def _row_b(r: dict) -> Row:
    jax = (
        f"; JAX vmap+jit {r['baseline_jax_seconds']:.2f} s (CPU {r['baseline_jax_cpu_seconds']:.2f} s): "
        f"{r['ratio_to_jax']:.2f}x JAX's time (CPU {r['cpu_ratio_to_jax']:.2f}x)"
        if "baseline_jax_seconds" in r
        else "; no JAX peer (it runs on the CPU only, when JAX is installed)"
    )
    return (
        f"(b) {r['members']} MLPs batched",
        f"{r['speedup']:.1f}x ({r['batched_seconds']:.2f} s, CPU {r['batched_cpu_seconds']:.2f} s; "
        f"CPU {r['cpu_speedup']:.1f}x)",
        f"looped {r['baseline_looped_seconds']:.2f} s" + jax,
        r["target"],
        str(r["reached"]),
    )


def _row_c(r: dict) -> Row:
    return (
        f"(c) {r['restarts']} escape restarts",
        f"{r['speedup']:.1f}x ({r['batched_seconds']:.2f} s; CPU {r['cpu_speedup']:.1f}x)",
        f"looped {r['baseline_looped_seconds']:.2f} s",
        r["target"],
        str(r["reached"]),
    )


def _row_d(r: dict) -> Row:
    return (
        "(d) geodesic diagnostics",
        f"{r['seconds']:.2f} s = {r['in_steps']:.1f} steps",
        f"step {r['baseline_step_seconds']:.3f} s"
        + (f"; CPU {r['baseline_cpu_seconds']:.2f} s" if "baseline_cpu_seconds" in r else ""),
        r["target"],
        str(r["reached"]),
    )


def _row_g(r: dict) -> Row:
    ww = f"; WeightWatcher CPU {r['weightwatcher_cpu_seconds']:.2f} s" if "weightwatcher_cpu_seconds" in r else ""
    return (
        f"(g) analyze: 12x192 ViT, N={r['n']}; ResNet-18 weights only",
        f"ViT {r['seconds']:.1f} s (CPU {r['cpu_seconds']:.1f} s); ResNet-18 {r['weights_only_seconds']:.2f} s "
        f"(CPU {r['weights_only_cpu_seconds']:.2f} s)",
        f"{r['baseline']} CPU {r['baseline_cpu_seconds']:.2f} s{ww}",
        r["target"],
        str(r["reached"]),
    )


def _row_h(r: dict) -> Row:
    verdict = f"certified, Clarke residual {r['clarke']:.2g}" if r["certified"] else f"refused: {r['rule']}"
    return (
        f"(h) certify the demo net ({r['unit']})",
        f"{r['certify_seconds']:.1f} s, {verdict}",
        f"training {r['baseline_train_seconds']:.1f} s",
        r["target"],
        str(r["reached"]),
    )


FIGURE_ROWS = {"a": _row_a, "a2": _row_a2, "b": _row_b, "c": _row_c, "d": _row_d, "g": _row_g, "h": _row_h}


def table_rows(results: dict) -> list[Row]:
    """The table's rows: one per measured figure (a, a2, b, c, d, g), failed figures, and one per experiment
    timed in (e) and (f)."""
    rows = [row(results[figure]) for figure, row in FIGURE_ROWS.items() if figure in results]
    for figure, error in results.get("errors", {}).items():
        rows.append((f"({figure})", f"failed: {error}", "", "", "False"))
    for figure, preset in (("e", results.get("e_preset", "quick")), ("f", "paper")):
        for name, r in results.get(figure, {}).items():
            rows.append(
                (
                    f"({figure}) {name} {preset}",
                    f"{r['seconds']:.1f} s, claims {r['claims_passed']}",
                    f"budget {r['baseline_budget_seconds']:.0f} s",
                    "<= budget",
                    str(r["reached"]),
                )
            )
    return rows


ONE_CORE_FIGURES = ("a", "b")  # the figures with a JAX peer: both sides on one core under --threads 1


@contextlib.contextmanager
def one_core(active: bool):
    """Pin this process to one of its CPUs while active (Linux): XLA starts threads of its own whatever its
    flags say, so under ``--threads 1`` featurelab and its JAX peer are compared on one core each, as the
    figures state. Restores the previous affinity."""
    if not active or not hasattr(os, "sched_setaffinity"):
        yield
        return
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


def run_bench(
    only: list[str] | None = None,
    experiments: list[str] | None = None,
    out: str | Path = "bench.json",
    device: str = "cpu",
    paper: bool = False,
    echo=print,
    e_preset: str = "quick",
) -> dict:
    """Measure the figures in `only` (default all of a-f), print a table, write JSON to `out`; returns it.

    experiments: the experiments whose quick presets (e) times (default: every registered one).
    e_preset: the preset (e) runs (quick; tiny for a dry run of the plumbing).
    paper: also (f), the paper presets of those experiments that need no local files.
    """
    from .experiments import REGISTRY, get_experiment

    only = list(only) if only else list(FIGURES)
    bad = [f for f in only if f not in FIGURES]
    if bad:
        raise FeaturelabError(f"only={','.join(bad)!r} is not allowed; choose among: {', '.join(FIGURES)}")
    names = list(experiments) if experiments else list(REGISTRY)
    for name in names:
        get_experiment(name)  # a one-line error for an unknown name, before anything runs
    dev = resolve_device(device)
    results: dict = {"device": str(dev), "threads": torch.get_num_threads(), "versions": versions()}
    if dev.type == "cpu":
        from .training._kernels.gemm import onednn_products

        tune_cpu(dev)  # as `featurelab run` tunes its processes (docs/scale.md, "CPU tuning")
        results["cpu_products"] = "oneDNN" if onednn_products() else "torch (MKL)"
    if e_preset != "quick":
        results["e_preset"] = e_preset
    figures = {
        "a": lambda: bench_step(dev),
        "a2": lambda: bench_paper_ensemble(dev),
        "b": lambda: bench_ensemble(dev),
        "c": bench_escape,
        "d": lambda: bench_diagnostics(dev, results.get("a", {}).get("step_seconds")),
        "g": bench_analyze,
        "h": lambda: bench_certify(str(dev)),
        "e": lambda: bench_presets(names, str(dev), e_preset, echo),
    }
    if paper:
        paper_names = [n for n in names if n not in NEEDS_LOCAL_FILES]
        figures["f"] = lambda: bench_presets(paper_names, str(dev), "paper", echo, figure="f")
    for figure, measure in figures.items():
        if figure not in only and figure != "f":
            continue
        pin = figure in ONE_CORE_FIGURES and dev.type == "cpu" and torch.get_num_threads() == 1
        try:
            with one_core(pin):
                results[figure] = measure()
        except (RuntimeError, FeaturelabError) as exc:  # one broken figure must not lose the others
            results.setdefault("errors", {})[figure] = f"{type(exc).__name__}: {exc}"
            echo(f"({figure}) failed: {type(exc).__name__}: {exc}")
        else:
            echo(f"({figure}) {json.dumps(results[figure], default=str)}")
        write_json(out, results)
    rows = [("figure", "measured", "baseline (same run)", "target", "reached")] + table_rows(results)
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    products = f", large float32 products through {results['cpu_products']}" if "cpu_products" in results else ""
    echo(f"featurelab bench on {results['device']}, {results['threads']} torch threads{products}")
    for r in rows:
        echo("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    write_json(out, results)
    echo(f"json: {Path(out).resolve()}")
    return results
