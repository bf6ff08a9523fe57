"""Sweep batching: same-shape build/finish units train as one ensemble, chosen automatically,
and give the results of one-by-one runs; the switch turns it off; --resume mixes both.

`SEEDS` is a test-only experiment (4 units: 2 seeds x 2 lambdas of a small float64 MLP) registered in
the experiment registry; test_scale_ray.py uses it too.
"""

import json
import os
from pathlib import Path

import pytest
import torch

from featurelab import MLP, Phase, TrainConfig
from featurelab.claims import claim
from featurelab.config import ExperimentConfig
from featurelab.data import bottleneck_teacher
from featurelab.experiments import REGISTRY
from featurelab.experiments.base import Analysis, Experiment, TrainingUnit
from featurelab.runs.runner import run_experiment


class SeedsConfig(ExperimentConfig):
    seeds: list[int] = [0, 1]
    lams: list[float] = [0.0, 0.01]
    steps: int = 60
    kill_marker: str = ""  # if set: the first unit's finish fails once (and leaves this marker file)
    kill_mode: str = "exit"  # "exit": kill the worker process (test_scale_ray); "raise": an exception


def units(cfg):
    return [{"id": f"s{s}-lam{lam:g}", "seed": s, "lam": lam} for s in cfg.seeds for lam in cfg.lams]


def build(cfg, unit):
    data = bottleneck_teacher((5, 2, 5), "fcnn", 8, 32, 16, teacher_seed=cfg.seed, data_seed=cfg.seed + 1)
    model = MLP(5, 5, 12, 3, bias=1.0, init_scale=1.0 + unit["seed"] / 2, seed=unit["seed"], dtype=torch.float64)
    config = TrainConfig(
        lam=unit["lam"],
        phases=[Phase(optimizer="adam", steps=cfg.steps, lr=2e-3 * (1 + unit["seed"]))],
        log_every=20,
        checkpoint_every=20,
    )
    return TrainingUnit(model, data, config)


def finish(cfg, unit, model, result, ctx):
    if cfg.kill_marker and unit["id"] == units(cfg)[0]["id"] and not Path(cfg.kill_marker).exists():
        Path(cfg.kill_marker).write_text("failed once")
        if cfg.kill_mode == "raise":
            raise RuntimeError("injected failure")
        os._exit(1)  # the worker process dies mid-sweep
    return {
        "weights": [w.detach().flatten().tolist() for w in model.weights],
        "final_loss": float(result.history["loss"].iloc[-1]),
    }


def analyze(cfg, results, ctx):
    ok = all(r["final_loss"] < 10 for r in results.values())
    return Analysis([claim("training losses stay bounded", "test", "< 10", len(results), ok)])


SEEDS = Experiment(
    name="test-scale-seeds",
    summary="test-only seed x lambda sweep",
    reference="tests",
    config=SeedsConfig,
    presets={"quick": {}},
    units=units,
    analyze=analyze,
    build=build,
    finish=finish,
)
REGISTRY[SEEDS.name] = SEEDS


def max_weight_difference(run_a: Path, run_b: Path) -> float:
    worst = 0.0
    for folder in sorted((run_a / "units").iterdir()):
        a = json.loads((folder / "result.json").read_text())["result"]["weights"]
        b = json.loads((run_b / "units" / folder.name / "result.json").read_text())["result"]["weights"]
        worst = max(worst, max(float((torch.tensor(x) - torch.tensor(y)).abs().max()) for x, y in zip(a, b)))
    return worst


def test_batched_sweep_equals_one_by_one(tmp_path):
    batched = run_experiment(SEEDS.name, out=tmp_path / "batched", workers=1, progress=False)
    single = run_experiment(SEEDS.name, out=tmp_path / "single", workers=1, progress=False, batch=False)
    record = json.loads((tmp_path / "batched" / "results.json").read_text())
    assert record["ensembles"] == [4]  # all four units trained as one ensemble
    assert json.loads((tmp_path / "single" / "results.json").read_text())["ensembles"] == []
    assert max_weight_difference(tmp_path / "batched", tmp_path / "single") < 1e-10
    assert batched.claims == single.claims


def test_failed_unit_is_reported_then_resumed_from_its_checkpoint(tmp_path):
    """A unit whose finish fails is reported failed (the sweep goes on); --resume re-runs only it, one
    by one from the checkpoint the ensemble wrote in `train`'s format, and gets the same weights."""
    marker = tmp_path / "marker"
    run = tmp_path / "run"
    first = run_experiment(
        SEEDS.name, out=run, workers=1, progress=False, overrides={"kill_marker": str(marker), "kill_mode": "raise"}
    )
    failed = json.loads((run / "results.json").read_text())["failed"]
    assert list(failed) == ["s0-lam0"] and "injected failure" in failed["s0-lam0"]
    assert not first.all_passed  # "every run of the sweep completed" fails
    again = run_experiment(
        SEEDS.name,
        out=run,
        workers=1,
        progress=False,
        resume=True,
        overrides={"kill_marker": str(marker), "kill_mode": "raise"},
    )
    record = json.loads((run / "results.json").read_text())
    assert record["skipped_on_resume"] == ["s0-lam0.01", "s1-lam0", "s1-lam0.01"] and record["failed"] == {}
    assert again.all_passed
    reference = tmp_path / "reference"
    run_experiment(SEEDS.name, out=reference, workers=1, progress=False, batch=False)
    assert max_weight_difference(run, reference) < 1e-10


def test_bad_backend_and_missing_ray_are_one_line_errors(tmp_path, monkeypatch):
    import sys

    from featurelab import FeaturelabError
    from featurelab.bench import run_bench
    from featurelab.runs import ray_backend

    with pytest.raises(FeaturelabError, match="backend='spark' is not allowed; choose one of: local, ray"):
        run_experiment(SEEDS.name, out=tmp_path / "a", backend="spark")
    with pytest.raises(FeaturelabError, match="retries=-1 is not allowed"):
        run_experiment(SEEDS.name, out=tmp_path / "b", retries=-1)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    with pytest.raises(FeaturelabError, match=r'needs the optional Ray extra: pip install "featlab\[ray\]"'):
        ray_backend.connect()
    with pytest.raises(FeaturelabError, match="only='x' is not allowed"):
        run_bench(only=["x"], out=tmp_path / "bench.json")


class _Square(torch.nn.Module):
    """f(X) = (X Wᵀ)²: the product saves its operand h = X Wᵀ twice, the matmul saves X, the cost
    ``((f - Y)**2)`` saves f - Y, the penalty ``W**2`` saves W."""

    def __init__(self, d: int, m: int):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(m, d, dtype=torch.float64))

    def forward(self, X):
        h = X @ self.W.mT
        return h * h

    def penalty(self, lam):
        return lam / 2 * (self.W**2).sum()


def test_member_bytes_counts_each_saved_storage_once():
    """The estimate that sizes GPU ensembles: X (N x d), h and f - Y (N x m each), W (m x d) are the saved
    storages, h once although the product saves it twice; then parameters, gradient, two Adam moments, data."""
    from featurelab.data import Dataset
    from featurelab.runs.sweep import member_bytes

    N, d, m = 50, 7, 3
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(N, d, generator=g, dtype=torch.float64), torch.randn(N, m, generator=g, dtype=torch.float64)
    job = TrainingUnit(
        _Square(d, m), Dataset(X, Y, X[:0], Y[:0]), TrainConfig(lam=0.1, phases=[Phase(steps=1, lr=0.1)])
    )
    saved = 8 * (N * d + 2 * N * m + m * d)
    assert member_bytes(job) == saved + 4 * 8 * m * d + 8 * N * (d + m)


def test_cuda_sweep_packs_each_group_into_what_fits_the_free_memory(tmp_path, monkeypatch):
    """On CUDA a group of same-shape units is cut into ensembles of floor(0.8·free / member_bytes) members."""
    from featurelab.runs import sweep

    cfg = SeedsConfig()
    pending = units(cfg)  # 4 units of one ensemble key
    need = sweep.member_bytes(build(cfg, pending[0]))
    for free_members, sizes in ((10, [4]), (2.5, [2, 2]), (1.9, [1, 1, 1, 1]), (0.1, [1, 1, 1, 1])):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, f=free_members: (int(f * need / 0.8), 0))
        items, built = sweep.plan(SEEDS, cfg, pending, tmp_path, batch=True, workers=1, device="cuda")
        assert [len(item) for item in items] == sizes
        assert [u["id"] for item in items for u in item] == [u["id"] for u in pending]
        assert sorted(built) == sorted(u["id"] for u in pending)


@pytest.mark.parametrize(
    "name, sizes",
    [
        ("leaky-hamiltonian", [8]),  # every L̃, with the float64 L-BFGS polish after the batched Adam phase
        ("bn-rank-depth", [15] * 7),  # per depth: 5 seeds x 3 λ
        ("saddle-digits", [5]),  # every seed
    ],
)
def test_paper_sweeps_group_their_same_shape_units(name, sizes):
    """The paper presets' units fall into the ensembles a GPU sweep packs (before memory splits them)."""
    from collections import Counter

    from featurelab.runs.runner import resolve_config
    from featurelab.training import ensemble_key

    exp, cfg = resolve_config(name, "paper")
    keys = Counter()
    assert exp.build is not None  # the paper experiments train through build and finish
    for unit in exp.units(cfg):
        job = exp.build(cfg, unit)
        keys[ensemble_key(job.model, job.data, job.config)] += 1
    assert None not in keys and sorted(keys.values(), reverse=True) == sizes
