"""Batched ensembles: `train_ensemble` gives each member the run `train` gives it.

Members differ in seed, init scale, λ, learning rate, L̃, data and mini-batch seed; float64 agreement
is to 1e-10 (batched matmuls only sum in another order), float32 to the tolerance in docs/scale.md.
"""

import shutil
from contextlib import contextmanager
from dataclasses import replace

import pandas as pd
import pytest
import torch

from featurelab import MLP, FeaturelabError, LeakyResNet, Phase, TrainConfig, train
from featurelab.data import bottleneck_teacher
from featurelab.data.separable import separable
from featurelab.models.conv import Conv
from featurelab.models.residual import Dense, Flatten, HomogeneousNet, ResBlock
from featurelab.training import engine, stack
from featurelab.training.checkpoint import load_checkpoint
from featurelab.training.ensemble import ensemble_key, train_ensemble

DATA = bottleneck_teacher((5, 2, 5), "fcnn", 8, 40, 16, teacher_seed=0, data_seed=1)


def max_difference(models_a, models_b) -> float:
    return max(
        float((a - b).abs().max())
        for ma, mb in zip(models_a, models_b)
        for a, b in zip(ma.state_dict().values(), mb.state_dict().values())
    )


def compare(make, configs, data, tol):
    """Train one-by-one and as an ensemble; return (max parameter difference, max history difference)."""
    singles = [make(i) for i in range(len(configs))]
    histories = [train(m, d, c).history for m, d, c in zip(singles, data, configs)]
    members = [make(i) for i in range(len(configs))]
    results = train_ensemble(members, data, configs)
    cols = ["loss", "cost", "penalty", "train_error", "param_norm", "test_cost", "lr"]
    hist = max(float((r.history[cols] - h[cols]).abs().max().max()) for r, h in zip(results, histories))
    assert max_difference(members, singles) < tol and hist < tol * 10
    assert all(len(r.history) == len(h) for r, h in zip(results, histories))


def mlp_configs(dtype):
    return [
        TrainConfig(
            lam=lam,
            seed=s,
            log_every=25,
            phases=[
                Phase(optimizer="adam", steps=75, lr=lr, schedule="cosine", lr_min=lr / 10),
                Phase(optimizer="sgd", steps=50, lr=lr / 2, momentum=0.5, guard_window=10, dtype=dtype),
            ],
        )
        for lam, lr, s in [(0.0, 2e-3, 0), (0.01, 5e-3, 1), (0.03, 1e-3, 2)]
    ]


def test_mlp_ensemble_matches_one_by_one_float64():
    """Per-member seed, init scale, λ, lr, lr_min; Adam (cosine) then SGD with momentum and the guard."""
    make = lambda i: MLP(5, 5, 10, 3, bias=1.0, init_scale=[1.0, 0.5, 2.0][i], seed=i, dtype=torch.float64)
    compare(make, mlp_configs(None), [DATA] * 3, 1e-10)


def test_leaky_resnet_ensemble_per_member_effective_depth_data_and_adaptive_steps():
    data = [bottleneck_teacher((5, 2, 5), "fcnn", 8, 40, 16, teacher_seed=i, data_seed=i + 1) for i in range(3)]
    configs = [
        TrainConfig(lam=lam, log_every=30, phases=[Phase(optimizer="adam", steps=60, lr=3e-3, adapt_every=20)])
        for lam in (0.01, 0.02, 0.05)
    ]
    make = lambda i: LeakyResNet(5, 5, 8, 6, [1.0, 2.0, 4.0][i], steps="adaptive", seed=i, dtype=torch.float64)
    compare(make, configs, data, 1e-10)


def test_minibatch_members_draw_their_own_batches():
    configs = [
        TrainConfig(lam=0.01, seed=s, log_every=20, phases=[Phase(optimizer="sgd", steps=40, lr=0.05, batch_size=8)])
        for s in (0, 1, 1)
    ]
    make = lambda i: MLP(5, 5, 10, 3, seed=i, dtype=torch.float64)
    compare(make, configs, [DATA] * 3, 1e-10)


class FirstLayerNorm:
    """An ``on_log`` callback: adds ‖W_1‖_F to each history row."""

    def on_log(self, step, model, row):
        row["w1_norm"] = float(model.weight_matrices()[0].detach().norm())


def test_trust_region_floor_partial_batches_and_log_callbacks_match_one_by_one():
    """Part 4 A3's lr = max(c/‖θ‖^{L-2}, lr_min) with the trust region ``max_step`` (cutting some steps,
    per member), keeping each epoch's partial batch, and ``on_log`` columns: as `train` gives them."""
    configs = [
        TrainConfig(
            objective="cross_entropy",
            seed=s,
            log_every=10,
            phases=[
                Phase(
                    optimizer="sgd",
                    steps=60,
                    lr=c,
                    schedule="inverse_norm",
                    lr_min=0.5,
                    batch_size=12,
                    drop_last=False,
                    max_step=0.2,
                )
            ],
        )
        for c, s in ((40.0, 0), (5.0, 1), (80.0, 1))
    ]
    data = fl_digits_like()
    make = lambda i: MLP(6, 3, 8, 4, init="absolute", init_scale=0.3, seed=i, dtype=torch.float64)
    singles = [make(i) for i in range(3)]
    histories = [train(m, data, c, callbacks=[FirstLayerNorm()]).history for m, c in zip(singles, configs)]
    members = [make(i) for i in range(3)]
    results = train_ensemble(members, data, configs, callbacks=[[FirstLayerNorm()] for _ in range(3)])
    assert max_difference(members, singles) < 1e-10
    for r, h in zip(results, histories):
        assert list(r.history["capped_steps"]) == list(h["capped_steps"])
        assert float((r.history[["loss", "lr", "w1_norm"]] - h[["loss", "lr", "w1_norm"]]).abs().max().max()) < 1e-9
    caps = [int(h["capped_steps"].iloc[-1]) for h in histories]
    assert 0 < caps[0] < 60 and len(set(caps)) == 3  # some steps cut, not all; counted per member
    with pytest.raises(FeaturelabError, match="on_step cannot run in an ensemble"):
        train_ensemble([make(0)], data, configs[0], callbacks=[[type("S", (), {"on_step": lambda *a: None})()]])


def fl_digits_like():
    """A 3-class problem with 30 samples (not a multiple of the batch of 12): rows are samples."""
    from featurelab import Dataset

    g = torch.Generator().manual_seed(0)
    X = torch.randn(30, 6, generator=g, dtype=torch.float64)
    Y = torch.arange(30) % 3
    return Dataset(X, Y, X[:0], Y[:0], 3)


def test_float32_ensemble_agrees_to_float32_rounding():
    make = lambda i: MLP(5, 5, 10, 3, bias=1.0, seed=i, dtype=torch.float32)
    compare(make, mlp_configs(None), [DATA] * 3, 1e-4)


def test_ensemble_checkpoint_resumes_with_train(tmp_path, monkeypatch):
    """The ensemble's periodic checkpoint (train's format, optimizer state included) continued by
    `train(resume=True)` gives the weights of the uninterrupted run."""
    saved = []
    original = engine.save_checkpoint

    def keep_step_40(folder, model, optimizer, info, *extra):
        original(folder, model, optimizer, info, *extra)
        if info["step"] == 40 and not saved:
            shutil.copytree(folder, tmp_path / "at40")
            saved.append(folder)

    monkeypatch.setattr(engine, "save_checkpoint", keep_step_40)
    config = TrainConfig(
        lam=0.01,
        log_every=20,
        checkpoint_every=20,
        phases=[Phase(optimizer="adam", steps=60, lr=3e-3, schedule="cosine")],
    )
    members = [MLP(5, 5, 10, 3, seed=i, dtype=torch.float64) for i in range(2)]
    train_ensemble(members, DATA, config, run_dirs=[tmp_path / "m0", tmp_path / "m1"])
    resumed = MLP(5, 5, 10, 3, seed=0, dtype=torch.float64)
    result = train(resumed, DATA, config, run_dir=tmp_path / "at40", resume=True)
    assert result.resumed_from == 40
    assert max_difference([resumed], members[:1]) < 1e-10


def test_an_lbfgs_polish_after_batched_phases_matches_one_by_one(tmp_path):
    """Adam (batched), then a float64 L-BFGS polish and a last GD phase, which each member runs alone from
    the ensemble's state: weights, history (with its step-0 row and the Adam rows) and run folders as `train`
    gives them; Leaky ResNets with per-member L̃, λ, lr and adaptive steps."""
    configs = [
        TrainConfig(
            lam=lam,
            log_every=20,
            checkpoint_every=20,
            phases=[
                Phase(optimizer="adam", steps=40, lr=lr, schedule="cosine", adapt_every=20),
                Phase(optimizer="lbfgs", steps=15, lr=1.0, dtype="float64"),
                Phase(optimizer="sgd", steps=10, lr=1e-3),
            ],
        )
        for lam, lr in ((0.01, 3e-3), (0.03, 5e-3))
    ]
    make = lambda i: LeakyResNet(5, 5, 8, 6, [1.5, 3.0][i], steps="adaptive", seed=i, dtype=torch.float64)
    singles = [make(i) for i in range(2)]
    expected = [train(m, DATA, c, run_dir=tmp_path / f"single{i}") for i, (m, c) in enumerate(zip(singles, configs))]
    members = [make(i) for i in range(2)]
    results = train_ensemble(members, DATA, configs, run_dirs=[tmp_path / "m0", tmp_path / "m1"])
    assert ensemble_key(members[0], DATA, configs[0]) is not None
    for i, (r, e, m, s) in enumerate(zip(results, expected, members, singles)):
        assert len(m.rho_history) == len(s.rho_history) == 1
        assert list(r.history.step) == list(e.history.step) == [0, 20, 40, 60, 65]
        assert max(float((r.history[c] - e.history[c]).abs().max()) for c in ("loss", "param_norm", "lr")) < 1e-9
        assert list(pd.read_csv(tmp_path / f"m{i}" / "history.csv").step) == [0, 20, 40, 60, 65]
        assert load_checkpoint(tmp_path / f"m{i}")[1]["done"]
    assert max_difference(members, singles) < 1e-10
    assert abs(float(expected[0].history.loss.iloc[2]) - float(expected[0].history.loss.iloc[3])) > 1e-4  # it polished


def test_ensemble_key_and_bad_input():
    c = TrainConfig(lam=0.01, phases=[Phase(steps=5, lr=1e-3)])
    a, b = MLP(5, 5, 10, 3, seed=0), MLP(5, 5, 10, 3, seed=1, init_scale=2.0)
    assert ensemble_key(a, DATA, c) == ensemble_key(b, DATA, c.model_copy(update={"lam": 0.1, "seed": 3}))
    assert ensemble_key(a, DATA, c) != ensemble_key(MLP(5, 5, 11, 3), DATA, c)
    assert ensemble_key(a, DATA, TrainConfig(phases=[Phase(optimizer="lbfgs", steps=5, lr=1.0)])) is None
    with pytest.raises(FeaturelabError, match="start with an lbfgs phase"):
        train_ensemble([a, b], DATA, TrainConfig(phases=[Phase(optimizer="lbfgs", steps=5, lr=1.0)]))
    with pytest.raises(FeaturelabError, match=r"models\[1\] cannot join"):
        train_ensemble([a, MLP(5, 5, 11, 3)], DATA, c)
    with pytest.raises(FeaturelabError, match="data has 3 entries"):
        train_ensemble([a, b], [DATA] * 3, c)
    # the same one-line input checks as train, before any training
    X = DATA.X_train.clone()
    X[0, 0] = float("nan")
    with pytest.raises(FeaturelabError, match="NaN or inf"):
        train_ensemble([a, b], [DATA, replace(DATA, X_train=X)], c)
    narrow = replace(DATA, Y_train=DATA.Y_train[:, :4], Y_test=DATA.Y_test[:, :4])
    with pytest.raises(FeaturelabError, match="5 outputs but data.Y_train has 4 columns"):
        train_ensemble([a, b], narrow, c)


def test_diverging_member_fails_alone():
    configs = [TrainConfig(log_every=10, phases=[Phase(optimizer="sgd", steps=20, lr=lr)]) for lr in (1e-2, 10.0)]
    members = [MLP(5, 5, 10, 3, leak=1.0, seed=i, dtype=torch.float64) for i in range(2)]
    ok, bad = train_ensemble(members, DATA, configs)
    reference = MLP(5, 5, 10, 3, leak=1.0, seed=0, dtype=torch.float64)
    train(reference, DATA, configs[0])
    assert isinstance(bad, FeaturelabError) and "diverged" in str(bad)
    assert max_difference([reference], members[:1]) < 1e-10 and not isinstance(ok, Exception)


def test_guard_restores_and_halves_per_member():
    """The loss guard (Part 1 §5.2) acts on each member alone: members whose loss rose over a window are
    restored, get half the lr and a fresh optimizer; the calm member goes on untouched."""
    configs = [
        TrainConfig(
            log_every=5,
            phases=[
                Phase(optimizer="sgd", steps=30, lr=lr, momentum=0.9, guard_window=5),
                Phase(optimizer="adam", steps=30, lr=lr / 5, guard_window=5),
            ],
        )
        for lr in (0.05, 0.6, 1.5)
    ]
    make = lambda i: MLP(5, 5, 10, 3, leak=1.0, seed=1, dtype=torch.float64)
    histories = [train(make(i), DATA, c).history for i, c in enumerate(configs)]
    halved = [
        bool((h["lr"][(h["phase"] == 0) & (h["step"] > 0)] < c.phases[0].lr).any()) for h, c in zip(histories, configs)
    ]
    assert halved == [False, True, True]  # the test exercises both branches of the guard
    compare(make, configs, [DATA] * 3, 1e-10)


HOST_READS = ("__bool__", "__float__", "__int__", "__index__", "item", "tolist")


@contextmanager
def no_host_reads():
    """Every conversion of a tensor to a Python value raises inside: a CUDA graph records no such wait."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("the captured step read a tensor on the host")

    saved = {name: torch.Tensor.__dict__.get(name) for name in HOST_READS}
    for name in HOST_READS:
        setattr(torch.Tensor, name, refuse)
    try:
        yield
    finally:
        for name, method in saved.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)


def replay_captured_steps(monkeypatch):
    """Make the engine take its CUDA-graph path on the CPU: the recorded step body is called at each replay,
    where it may read no tensor on the host (a real capture would fail there)."""
    from featurelab.training import capture

    class Replay:
        def __init__(self, body):
            self.body = body

        def replay(self):
            with no_host_reads():
                self.body()

    monkeypatch.setattr(capture, "eager_reason", lambda *a, **k: None)
    monkeypatch.setattr(capture, "warmup", lambda body: body())
    monkeypatch.setattr(capture, "capture", Replay)


def eager_and_replayed(monkeypatch, make, configs, data=DATA, device="cpu"):
    """Train the members eagerly, then again through the graph path replayed as plain calls; returns
    ``(eager models, their histories, replayed models, their histories)``."""
    eager = [make(i) for i in range(len(configs))]
    eager_hist = [r.history for r in train_ensemble(eager, data, configs, device=device)]
    replay_captured_steps(monkeypatch)
    replayed = [make(i) for i in range(len(configs))]
    return eager, eager_hist, replayed, [r.history for r in train_ensemble(replayed, data, configs, device=device)]


def guarded_adaptive_ensemble(dtype=torch.float64):
    """Three Leaky ResNets with adaptive steps and the loss guard: Adam, then SGD with momentum, at lr
    0.01, 0.3 and 1.0 (only the last member is rolled back, in the SGD phase). Returns ``(make, configs)``."""
    configs = [
        TrainConfig(
            lam=1e-3,
            log_every=5,
            phases=[
                Phase(optimizer="adam", steps=30, lr=lr / 5, adapt_every=5, guard_window=5),
                Phase(optimizer="sgd", steps=30, lr=lr, momentum=0.9, guard_window=5),
            ],
        )
        for lr in (0.01, 0.3, 1.0)
    ]
    return (lambda i: LeakyResNet(5, 5, 6, 4, 1.5, steps="adaptive", seed=i, dtype=dtype)), configs


def test_the_captured_path_keeps_the_guard_and_adaptive_steps(monkeypatch):
    """Between replays the loss guard rolls members back (halving their lr, restarting their optimizer) and
    the Leaky ResNets adapt their steps; the graph path gives the eager run, per member."""
    make, configs = guarded_adaptive_ensemble()
    eager, eager_hist, replayed, hist = eager_and_replayed(monkeypatch, make, configs)
    assert max_difference(replayed, eager) < 1e-12
    cols = ["loss", "lr"]
    assert all(float((h[cols] - e[cols]).abs().max().max()) < 1e-12 for h, e in zip(hist, eager_hist))
    halved = [bool((h.loc[h["phase"] == 1, "lr"] < c.phases[1].lr).any()) for h, c in zip(hist, configs)]
    assert halved == [False, False, True]  # a rollback happened between replays
    assert all(m.rho_history for m in replayed)  # the steps did adapt


def test_the_captured_step_body_replays_the_eager_run(monkeypatch):
    """The CUDA-graph path's step (static step counter, refilled mini-batch indices, in-place optimizer
    state, lr written to a static tensor) replayed as plain calls gives the eager run: cosine Adam with
    mini-batches, then SGD with momentum and the trust region, per member."""
    configs = [
        TrainConfig(
            lam=lam,
            seed=s,
            log_every=10,
            phases=[
                Phase(optimizer="adam", steps=30, lr=lr, schedule="cosine", lr_min=lr / 10, batch_size=16),
                Phase(optimizer="sgd", steps=20, lr=lr, momentum=0.5),
                Phase(optimizer="sgd", steps=20, lr=100 * lr, schedule="inverse_norm", max_step=1e-3),
            ],
        )
        for lam, lr, s in [(0.0, 2e-3, 0), (0.01, 5e-3, 1)]
    ]
    make = lambda i: MLP(5, 5, 10, 3, bias=1.0, seed=i, dtype=torch.float64)
    eager, eager_hist, replayed, hist = eager_and_replayed(monkeypatch, make, configs)
    assert max_difference(replayed, eager) < 1e-12
    cols = ["loss", "lr", "capped_steps"]
    assert all(float((h[cols] - e[cols]).abs().max().max()) < 1e-12 for h, e in zip(hist, eager_hist))
    assert int(hist[0]["capped_steps"].iloc[-1]) > 0


def homogeneous_net(arch: str, i: int) -> HomogeneousNet:
    """Member i of a float64 HomogeneousNet ensemble: members differ in init (seed, scale) and in the
    Dense and Conv slopes (buffers, unit-wise for the first layer; every member's first stages take the
    leaky path, as an ensemble's members share each stage's path)."""
    kw = {"init_scale": [1.0, 0.7, 1.3][i], "generator": torch.Generator().manual_seed(i)}
    slopes = [[0.3] * 8, [0.0, 0.1] * 4, [0.2] * 8][i]
    if arch == "dense":
        return HomogeneousNet([Dense(6, 8, slopes, **kw), Dense(8, 8, 0.0, **kw), Dense(8, 1, 1.0, **kw)])
    if arch == "conv":
        return HomogeneousNet(
            [
                Conv(2, 3, 3, padding=1, leak=[0.3, 0.5, 0.1][i], **kw),
                Conv(3, 3, 3, stride=2, padding=1, leak=1.0, **kw),
                Flatten(),
                Dense(12, 8, slopes, **kw),
                Dense(8, 1, 1.0, **kw),
            ],
            input_shape=(2, 4, 3),
        )
    return HomogeneousNet(
        [
            Dense(6, 8, slopes, **kw),
            ResBlock(arch, 8, 5, 8 if arch != "free" else 7, sigma_in="relu", sigma_out="linear", **kw),
            ResBlock(arch, 8 if arch != "free" else 7, 5, sigma_in=0.1, sigma_out="relu", **kw),
            Dense(8 if arch != "free" else 7, 1, 1.0, **kw),
        ]
    )


HOMOGENEOUS_ARCHS = ("dense", "identity", "diagonal", "free", "conv")


@pytest.mark.parametrize("arch", HOMOGENEOUS_ARCHS)
def test_homogeneous_net_ensemble_matches_one_by_one_float64(arch):
    """Dense, ResBlock (each kind) and Conv stages stacked: per-member init, slopes, λ, lr, data and
    mini-batch seed; Adam (cosine) with mini-batches, then SGD with momentum and the guard."""
    data = [separable(24, 8, 6 if arch != "conv" else 24, 0.1, seed=i) for i in range(3)]
    configs = [
        TrainConfig(
            objective="logistic",
            lam=lam,
            seed=i,
            log_every=20,
            phases=[
                Phase(optimizer="adam", steps=30, lr=lr, schedule="cosine", lr_min=lr / 10, batch_size=16),
                Phase(optimizer="sgd", steps=30, lr=10 * lr, momentum=0.5, guard_window=10),
            ],
        )
        for i, (lam, lr) in enumerate([(0.0, 1e-2), (1e-2, 2e-2), (3e-2, 5e-3)])
    ]
    compare(lambda i: homogeneous_net(arch, i), configs, data, 1e-10)


@pytest.mark.parametrize("arch", HOMOGENEOUS_ARCHS)
def test_homogeneous_net_ensembles_take_the_stacked_forward(arch, monkeypatch):
    """HomogeneousNet is `Stackable`: its ensembles run one stacked forward pass, never vmap; the stacked
    forward and penalty give each member's own output ``M x N x 1`` and ``(M,)`` penalty."""
    members = [homogeneous_net(arch, i) for i in range(3)]
    assert isinstance(members[0], stack.Stackable)
    data = separable(16, 0, members[0].d_in, 0.1, seed=0)
    tensors = [dict(m.named_parameters()) | dict(m.named_buffers()) for m in members]
    state = {f"model.{k}": torch.stack([t[k] for t in tensors]) for k in tensors[0]}
    lam = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    objective = stack._Objective(members[0], "logistic", [])
    out = torch.func.functional_call(members[0], {k[6:]: v for k, v in state.items()}, (data.X_train,))
    cost, pen = torch.func.functional_call(objective, state, (data.X_train, data.Y_train, lam, []))
    with torch.no_grad():
        assert out.shape == (3, 16, 1) and cost.shape == pen.shape == (3,)
        assert float((out - torch.stack([m(data.X_train) for m in members])).abs().max()) < 1e-12
        assert float((pen - torch.stack([m.penalty(float(l)) for m, l in zip(members, lam)])).abs().max()) < 1e-12
        one_by_one = [engine.data_cost("logistic", m(data.X_train), data.Y_train) for m in members]
        assert float((cost - torch.stack(one_by_one)).abs().max()) < 1e-12

    def no_vmap(*args, **kwargs):
        raise AssertionError("the ensemble was vmapped")

    monkeypatch.setattr(stack, "vmap", no_vmap)
    config = TrainConfig(objective="logistic", lam=0.01, phases=[Phase(optimizer="sgd", steps=3, lr=1e-2)])
    results = train_ensemble(members, data, config)
    assert all(not isinstance(r, Exception) for r in results)


@pytest.mark.parametrize("arch", HOMOGENEOUS_ARCHS)
def test_homogeneous_net_ensembles_take_the_captured_path(arch, monkeypatch):
    """The stacked HomogeneousNet step reads nothing on the host, so on CUDA it is captured; replayed as plain
    calls it gives the eager run (mini-batches, SGD with momentum)."""
    data = separable(24, 8, 6 if arch != "conv" else 24, 0.1, seed=0)
    configs = [
        TrainConfig(
            objective="logistic",
            lam=lam,
            log_every=10,
            phases=[Phase(optimizer="sgd", steps=20, lr=1e-2, momentum=0.5, batch_size=16)],
        )
        for lam in (0.0, 1e-2, 3e-2)
    ]
    eager, eager_hist, replayed, hist = eager_and_replayed(
        monkeypatch, lambda i: homogeneous_net(arch, i), configs, data
    )
    assert max_difference(replayed, eager) < 1e-12
    assert all(float((h["loss"] - e["loss"]).abs().max()) < 1e-12 for h, e in zip(hist, eager_hist))


KILLED_ENSEMBLE = """
import os, signal, sys, torch
from pathlib import Path
torch.set_num_threads(1)  # as this process (conftest): a resume repeats the run's settings, its threads among them
sys.path.insert(0, {tests!r})
from test_ensemble import killed_ensemble_run
from featurelab.training import engine
original = engine.save_checkpoint

def save_then_die(folder, model, optimizer, info, *extra):
    original(folder, model, optimizer, info, *extra)
    if info["step"] == {stop} and Path(folder).name == "m2":  # the last member's checkpoint is written
        os.kill(os.getpid(), signal.SIGKILL)

engine.save_checkpoint = save_then_die
killed_ensemble_run(Path({out!r}))
"""


def killed_ensemble_run(out, resume=False):
    """A float32 ensemble of three MLPs (cosine Adam on mini-batches, SGD with momentum under the loss guard,
    then plain SGD on partial mini-batches under the guard), checkpointed every 7 steps into ``out/m{i}``."""
    configs = [
        TrainConfig(
            lam=lam,
            seed=s,
            log_every=7,
            checkpoint_every=7,
            phases=[
                Phase(optimizer="adam", steps=20, lr=lr, schedule="cosine", lr_min=lr / 10, batch_size=16),
                Phase(optimizer="sgd", steps=20, lr=5 * lr, momentum=0.5, guard_window=6),
                Phase(optimizer="sgd", steps=10, lr=5 * lr, guard_window=4, batch_size=16, drop_last=False),
            ],
        )
        for lam, lr, s in [(0.0, 2e-2, 0), (0.01, 5e-2, 1), (0.03, 1e-1, 2)]
    ]
    members = [MLP(5, 5, 10, 3, seed=i) for i in range(3)]
    return train_ensemble(members, DATA, configs, run_dirs=[out / f"m{i}" for i in range(3)], resume=resume)


def test_an_ensemble_killed_mid_phase_resumes_bit_identically(tmp_path):
    """SIGKILL right after the checkpoint of step 42 (inside a guard window, 2 steps into the last phase),
    then ``resume=True`` as an ensemble in this process: every tensor saved (model, checkpoint with its
    optimizer state and guard window start) and every history entry equals the uninterrupted run's bit for
    bit. A member resumed alone would not be: its matmuls sum in another order; and a resumed guard that
    took its window start at the resumed step instead of the saved one decides its rollbacks differently."""
    import subprocess
    import sys
    from pathlib import Path

    from featurelab.training.checkpoint import load_tensors

    killed_ensemble_run(tmp_path / "whole")
    script = KILLED_ENSEMBLE.format(tests=str(Path(__file__).parent), stop=42, out=str(tmp_path / "cut"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    info = load_checkpoint(tmp_path / "cut" / "m0")[1]
    assert info["step"] == 42 and info["ensemble"] == ["m0", "m1", "m2"]  # what a resume regroups
    results = killed_ensemble_run(tmp_path / "cut", resume=True)
    assert all(r.resumed_from == 42 for r in results)
    for i in range(3):
        whole, cut = tmp_path / "whole" / f"m{i}", tmp_path / "cut" / f"m{i}"
        for name in ("model.safetensors", "checkpoint.safetensors"):
            a, b = load_tensors(whole / name), load_tensors(cut / name)
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), (i, name)
        cols = lambda h: h.drop(columns="seconds")
        pd.testing.assert_frame_equal(cols(pd.read_csv(whole / "history.csv")), cols(pd.read_csv(cut / "history.csv")))


def test_only_declared_floats_may_differ_between_members():
    """`member_floats` declares the floats that may differ (L̃ of a Leaky ResNet is passed as an ``(M,)`` tensor);
    an undeclared one (the MLP's slope a) that differs is an error naming it, and it splits the ensemble key."""
    cfg = TrainConfig(phases=[Phase(optimizer="adam", steps=1, lr=1e-3)])
    a, b = (MLP(5, 5, 10, 3, leak=leak, dtype=torch.float64) for leak in (0.1, 0.2))
    assert ensemble_key(a, DATA, cfg) != ensemble_key(b, DATA, cfg)
    with pytest.raises(FeaturelabError, match=r"models\[1\]\.leak = 0\.2 differs from models\[0\]\.leak = 0\.1"):
        train_ensemble([a, b], DATA, cfg)
    nets = [LeakyResNet(5, 5, 8, 6, Lt, dtype=torch.float64) for Lt in (2.0, 3.0)]
    assert ensemble_key(nets[0], DATA, cfg) == ensemble_key(nets[1], DATA, cfg)
    assert stack.member_floats(nets) == {"effective_depth": [2.0, 3.0]}
