"""Trainer: objectives in docs/theory/conventions.md's normalisation, determinism, schedules, checkpoints and
an interrupted run resumed to the same result as an uninterrupted one."""

import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import featurelab as fl
from featurelab.training import data_cost, load_model, save_model


def small_problem(n=40):
    data = fl.data.bottleneck_teacher((4, 2, 3), hidden=16, n_train=n, n_test=n, teacher_seed=0, data_seed=1)
    return data


def test_mse_sums_outputs_and_averages_samples():
    out, Y = torch.randn(7, 3, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    assert data_cost("mse", out, Y).item() == pytest.approx(((out - Y) ** 2).sum().item() / 7, rel=1e-14)
    # torch's MSELoss divides by N·d_out: ours is d_out times larger
    assert data_cost("mse", out, Y).item() == pytest.approx(3 * F.mse_loss(out, Y).item(), rel=1e-14)


def test_cross_entropy_and_logistic_against_hand_formulas():
    out, y = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 3, 1, 1, 2, 0])
    hand = np.mean([math.log(sum(math.exp(v) for v in row)) - row[c] for row, c in zip(out.tolist(), y.tolist())])
    assert data_cost("cross_entropy", out, y).item() == pytest.approx(hand, rel=1e-12)
    stacked = torch.stack([out, 2 * out, -out])  # M x N x C members: one cost each, shared or per-member labels
    for labels in (y, torch.stack([y, y.flip(0), y])):
        per_member = [data_cost("cross_entropy", o, l).item() for o, l in zip(stacked, labels.expand(3, -1))]
        np.testing.assert_allclose(data_cost("cross_entropy", stacked, labels).numpy(), per_member, rtol=1e-12)
    f, s = torch.tensor([[0.3], [-2.0], [40.0]], dtype=torch.float64), torch.tensor([1.0, 1.0, -1.0])
    hand = np.mean([math.log1p(math.exp(-m)) for m in (0.3, -2.0)] + [40.0 + math.log1p(math.exp(-40.0))])
    assert data_cost("logistic", f, s).item() == pytest.approx(hand, rel=1e-12)


def config(**kw):
    base = dict(
        objective="mse",
        lam=0.01,
        log_every=10,
        phases=[
            {"optimizer": "adam", "steps": 30, "lr": 1e-2, "schedule": "cosine", "lr_min": 1e-4},
            {"optimizer": "sgd", "steps": 20, "lr": 1e-2, "batch_size": 16},
        ],
    )
    base.update(kw)
    return fl.TrainConfig.model_validate(base)


def test_same_seed_gives_identical_history():
    data = small_problem()
    runs = [
        fl.train(fl.MLP(4, 3, 8, depth=3, bias=1.0, seed=7), data, config(), progress=False).history for _ in range(2)
    ]
    cols = [c for c in runs[0].columns if c != "seconds"]
    pd.testing.assert_frame_equal(runs[0][cols], runs[1][cols], check_exact=True)
    assert list(runs[0]["step"]) == [0, 10, 20, 30, 40, 50]


def test_loss_is_cost_plus_model_penalty():
    data = small_problem()
    model = fl.MLP(4, 3, 8, depth=3, bias=1.0, seed=1, dtype=torch.float64)
    res = fl.train(model, data, config(), progress=False)
    last = res.history.iloc[-1]
    with torch.no_grad():
        cost = data_cost("mse", model(data.X_train), data.Y_train).item()
        pen = 0.01 * model.sq_norm().item()
    assert last["cost"] == pytest.approx(cost, rel=1e-12) and last["penalty"] == pytest.approx(pen, rel=1e-12)
    assert last["loss"] == pytest.approx(cost + pen, rel=1e-12)
    assert res.history["loss"].iloc[-1] < res.history["loss"].iloc[0]


def test_cosine_and_inverse_norm_schedules():
    data = small_problem()
    res = fl.train(
        fl.MLP(4, 3, 8, depth=3, seed=1),
        data,
        config(phases=[{"optimizer": "adam", "steps": 40, "lr": 1e-2, "schedule": "cosine", "lr_min": 1e-4}]),
        progress=False,
    )
    lrs = res.history["lr"].iloc[1:].to_numpy()
    k = np.array([9, 19, 29, 39])  # the lr used by the step that ends at the log step
    np.testing.assert_allclose(lrs, 1e-4 + (1e-2 - 1e-4) * 0.5 * (1 + np.cos(np.pi * k / 40)), rtol=1e-12)

    # inverse_norm (Part 4 A3): one plain GD step with lr = c/‖θ‖^{L-2}, recomputed independently
    model = fl.MLP(4, 3, 8, depth=5, seed=1, init="absolute", init_scale=0.3, dtype=torch.float64)
    theta0 = [p.detach().clone() for p in model.parameters()]
    ref = fl.MLP(4, 3, 8, depth=5, seed=1, init="absolute", init_scale=0.3, dtype=torch.float64)
    grads = torch.autograd.grad(data_cost("mse", ref(data.X_train), data.Y_train), list(ref.parameters()))
    lr0 = 0.5 / torch.sqrt(torch.stack([(t**2).sum() for t in theta0]).sum()) ** 3  # L = 5
    rule = fl.Phase(optimizer="sgd", steps=1, lr=0.5, schedule="inverse_norm")
    fl.train(model, data, fl.TrainConfig(objective="mse", phases=[rule], log_every=1), progress=False)
    for p, t0, g in zip(model.parameters(), theta0, grads):
        torch.testing.assert_close(p.detach(), t0 - lr0 * g, rtol=1e-12, atol=1e-15)
    floored = fl.Phase(optimizer="sgd", steps=1, lr=0.5, schedule="inverse_norm", lr_min=100.0)
    other = fl.MLP(4, 3, 8, depth=5, seed=1, init="absolute", init_scale=0.3, dtype=torch.float64)
    fl.train(other, data, fl.TrainConfig(objective="mse", phases=[floored], log_every=1), progress=False)
    for p, t0, g in zip(other.parameters(), theta0, grads):
        torch.testing.assert_close(p.detach(), t0 - 100.0 * g, rtol=1e-12, atol=1e-15)


def test_max_step_is_a_relative_trust_region():
    """Phase.max_step: a step is θ − lr·g when lr‖g‖ <= κ‖θ‖, else θ − κ‖θ‖ g/‖g‖ (computed by hand)."""
    data = small_problem()
    theta0 = [
        p.detach().clone()
        for p in fl.MLP(4, 3, 8, depth=5, seed=1, init="absolute", init_scale=0.3, dtype=torch.float64).parameters()
    ]
    ref = fl.MLP(4, 3, 8, depth=5, seed=1, init="absolute", init_scale=0.3, dtype=torch.float64)
    grads = torch.autograd.grad(data_cost("mse", ref(data.X_train), data.Y_train), list(ref.parameters()))
    g_norm = torch.sqrt(torch.stack([(g**2).sum() for g in grads]).sum())
    t_norm = torch.sqrt(torch.stack([(t**2).sum() for t in theta0]).sum())
    cuts = []
    for lr, kappa in ((100.0, 1e-3), (1e-6, 0.5)):
        model = fl.MLP(4, 3, 8, depth=5, seed=1, init="absolute", init_scale=0.3, dtype=torch.float64)
        phase = fl.Phase(optimizer="sgd", steps=1, lr=lr, max_step=kappa)
        res = fl.train(model, data, fl.TrainConfig(objective="mse", phases=[phase], log_every=1), progress=False)
        cut = bool(lr * g_norm > kappa * t_norm)
        cuts.append(cut)
        step = kappa * t_norm / g_norm if cut else lr
        for p, t0, g in zip(model.parameters(), theta0, grads):
            torch.testing.assert_close(p.detach(), t0 - step * g, rtol=1e-12, atol=1e-15)
        assert res.history["capped_steps"].iloc[-1] == int(cut)
        if cut:
            moved = torch.sqrt(
                torch.stack([((p.detach() - t) ** 2).sum() for p, t in zip(model.parameters(), theta0)]).sum()
            )
            assert float(moved) == pytest.approx(kappa * float(t_norm), rel=1e-12)
    assert cuts == [True, False]  # both branches
    with pytest.raises(Exception, match="max_step needs optimizer 'sgd'"):
        fl.Phase(optimizer="adam", steps=1, lr=1.0, max_step=0.1)


def test_save_and_load_model_round_trip(tmp_path):
    model = fl.LeakyResNet(3, 2, 5, depth=6, effective_depth=2.0, steps="irregular", io="learned", seed=3)
    save_model(model, tmp_path / "m.safetensors")
    other = fl.LeakyResNet(3, 2, 5, depth=6, effective_depth=2.0, steps="irregular", io="learned", seed=99)
    load_model(other, tmp_path / "m.safetensors")
    for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), k


class Interrupt:
    """Simulates a kill: raises after `at` steps (after the checkpoint at that step was written)."""

    def __init__(self, at):
        self.at = at

    def on_step(self, step, model, optimizer, loss):
        if step == self.at + 1:
            raise KeyboardInterrupt


def test_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path):
    data = small_problem()
    cfg = config(checkpoint_every=10)
    ref = fl.train(fl.MLP(4, 3, 8, depth=3, bias=1.0, seed=7), data, cfg, progress=False)
    model = fl.MLP(4, 3, 8, depth=3, bias=1.0, seed=7)
    with pytest.raises(KeyboardInterrupt):  # killed inside the Adam phase, after the step-20 checkpoint
        fl.train(model, data, cfg, run_dir=tmp_path, callbacks=[Interrupt(20)], progress=False)
    assert not (tmp_path / "history.csv").exists()  # nothing that looks complete
    fresh = fl.MLP(4, 3, 8, depth=3, bias=1.0, seed=7)
    res = fl.train(fresh, data, cfg, run_dir=tmp_path, resume=True, progress=False)
    assert res.resumed_from == 20
    for a, b in zip(ref.model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    cols = [c for c in ref.history.columns if c != "seconds"]
    pd.testing.assert_frame_equal(ref.history[cols], res.history[cols], check_exact=True)
    # a finished run is loaded, not retrained
    again = fl.train(
        fl.MLP(4, 3, 8, depth=3, bias=1.0, seed=0), data, cfg, run_dir=tmp_path, resume=True, progress=False
    )
    assert again.resumed_from == 50
    assert all(torch.equal(a, b) for a, b in zip(again.model.parameters(), fresh.parameters()))


def test_guard_restores_and_halves_lr_when_loss_rises():
    """GD at lr 0.6 diverges on this linear net; the guard (Part 1 §5.2) halves lr and recovers."""
    data = small_problem()

    def run(guard):
        model = fl.MLP(4, 3, 8, depth=2, leak=1.0, seed=1, dtype=torch.float64)
        phases = [{"optimizer": "sgd", "steps": 200, "lr": 0.6, "guard_window": guard}]
        cfg = fl.TrainConfig.model_validate({"objective": "mse", "log_every": 10, "phases": phases})
        return fl.train(model, data, cfg, progress=False)

    with pytest.raises(fl.FeaturelabError, match="diverged at step 10"):
        run(0)
    hist = run(10).history
    assert hist["lr"].iloc[-1] <= 0.3 and np.isfinite(hist["loss"]).all()
    assert hist["loss"].iloc[-1] < 0.2 * hist["loss"].iloc[0]


def test_adaptive_steps_are_updated_by_the_trainer_and_frozen_at_the_end():
    data = small_problem()
    model = fl.LeakyResNet(4, 3, 6, depth=10, effective_depth=3.0, steps="adaptive", seed=0)
    phases = [{"optimizer": "adam", "steps": 500, "lr": 1e-3, "adapt_every": 100}]
    cfg = fl.TrainConfig.model_validate({"objective": "mse", "lam": 0.01, "log_every": 50, "phases": phases})
    fl.train(model, data, cfg, progress=False)
    assert len(model.rho_history) == 4  # updates at 100..400; the last 10% (450..500) is frozen
    assert model.rho.sum().item() == pytest.approx(1.0, abs=1e-12)


def test_bad_train_config_is_a_one_line_error():
    with pytest.raises(Exception, match="inverse_norm"):
        fl.TrainConfig.model_validate(
            {"phases": [{"optimizer": "adam", "steps": 1, "lr": 1.0, "schedule": "inverse_norm"}]}
        )


def test_lbfgs_polish_reaches_the_ridge_minimiser():
    """A depth-1 MLP with a bias column is ridge regression: C + λ‖θ‖² = (1/N)‖Y − X̃Wᵀ‖² + λ‖W‖² with
    X̃ = [X, 1] has the unique minimiser W* = YᵀX̃(X̃ᵀX̃ + λN I)⁻¹ (solved, not inverted). Columns scaled over
    1.5 decades make unit trial steps fail the Armijo test, so the L-BFGS phase only gets there when its
    line search may spend evaluations beyond the first trial (with none, it stalls 0.17 away), and only to
    1e-8 when it keeps going while loss changes are above float64 rounding (torch's default tolerance of
    1e-9 stops it 7e-6 away). 1e-8 is about the limit: a W error δ changes the O(1) loss by O(δ²)."""
    g = torch.Generator().manual_seed(0)
    N, lam = 60, 1e-3
    X = torch.randn(N, 5, generator=g, dtype=torch.float64) * torch.logspace(0, 1.5, 5, dtype=torch.float64)
    Y = torch.randn(N, 2, generator=g, dtype=torch.float64)
    data = fl.Dataset(X, Y, X, Y)
    Xt = torch.cat([X, torch.ones(N, 1, dtype=torch.float64)], 1)
    W_star = torch.linalg.solve(Xt.T @ Xt + lam * N * torch.eye(6, dtype=torch.float64), Xt.T @ Y).T
    model = fl.MLP(5, 2, 4, 1, bias=1.0, seed=0, dtype=torch.float64)
    phases = [fl.Phase(optimizer="lbfgs", steps=200, lr=1.0, dtype="float64")]
    fl.train(model, data, fl.TrainConfig(objective="mse", lam=lam, phases=phases, log_every=200), progress=False)
    (W,) = model.weights  # stored layout: n_out x (n_in + 1), bias column last
    torch.testing.assert_close(W.detach(), W_star, rtol=0, atol=1e-8)


def test_set_threads_limits_torch_and_the_blas_pools_of_numpy_and_scipy():
    """`--threads 1` means one thread everywhere (docs/theory/conventions.md, "Threads"): torch's, and every BLAS
    and OpenMP pool numpy and scipy load, scipy's own included (its L-BFGS-B spins on a wider pool). Run in a fresh
    interpreter, where the pools start at the machine's width."""
    code = """
import os, threadpoolctl, torch
from featurelab.runtime import set_threads
set_threads(1)
pools = threadpoolctl.threadpool_info()
assert torch.get_num_threads() == 1, torch.get_num_threads()
assert any("scipy" in p["filepath"] for p in pools), [p["filepath"] for p in pools]
assert all(p["num_threads"] == 1 for p in pools), pools
"""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]


def test_training_changes_no_process_setting_and_tune_cpu_is_the_explicit_call():
    """`train` leaves denormal floats alone; `featurelab.runtime.tune_cpu()` flushes them to 0 for the process (run
    in a fresh interpreter: the setting cannot be undone)."""
    code = """
import torch
import featurelab as fl
from featurelab.runtime import tune_cpu
data = fl.data.bottleneck_teacher((4, 2, 3), hidden=8, n_train=16, n_test=0, teacher_seed=0, data_seed=1)
fl.train(fl.MLP(4, 3, 8, 3, dtype=torch.float64), data, fl.TrainConfig(phases=[fl.Phase(steps=2, lr=1e-3)]))
tiny = torch.tensor([1e-310], dtype=torch.float64)
assert float(tiny * 1.0) == 1e-310, "train flushed denormals"
assert tune_cpu() and float(tiny * 1.0) == 0.0, "tune_cpu did not flush denormals"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
