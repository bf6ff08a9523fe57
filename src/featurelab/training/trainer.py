"""Full-batch (and mini-batch) training in phases, with run records and resume.

A run is a list of `Phase`s (e.g. Adam for n₁ steps, then plain GD with a smaller learning rate, as
the papers do). The loss is ``C + model.penalty(lam)``: each model adds its own L2 convention
explicitly (never an optimizer's weight decay, docs/theory/conventions.md). Metrics are gathered only every
`log_every` steps, so the loop makes no per-step host-device synchronisation.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, model_validator
from tqdm.auto import tqdm

from ..config import Validated
from ..data.dataset import Dataset
from ..errors import FeaturelabError
from ..io import digest, write_text
from ..runtime import resolve_device
from .checkpoint import load_checkpoint, restore_optimizer, save_checkpoint, save_model
from .objectives import data_cost, error_rate


class Phase(Validated):
    """One training phase.

    optimizer: "adam", "sgd" (plain, optional momentum; full batch = GD) or "lbfgs" (strong-Wolfe).
    schedule: "constant"; "cosine" from lr down to lr_min; "inverse_norm": lr/‖θ‖^p with p = norm_power
        (default depth - 2, docs/theory/saddle-to-saddle.md A3), floored at lr_min; sgd only.
    batch_size: None for full batch; else mini-batches from a per-epoch reshuffle.
    drop_last: drop each epoch's last partial batch (default); False keeps it (Part 4 §6 digits preset).
    guard_window: > 0: every window, if the loss rose, restore the parameters and halve lr (Part 1 §5.2).
    adapt_every: > 0: call ``model.adapt_steps(X_train)`` every k steps for the first `adapt_stop`
        fraction of this phase (adaptive Leaky-ResNet steps, Part 1 §2.3).
    dtype: switch the model to this dtype for the phase (e.g. a float64 L-BFGS polish).
    max_step: > 0: a relative trust region for plain SGD, ‖Δθ‖ <= max_step·‖θ‖ (the step's lr is cut where
        the full step would be longer); history column ``capped_steps`` counts the steps it cut
        (Part 4 §6 digits preset, docs/saddle-to-saddle.md).
    """

    optimizer: Literal["adam", "sgd", "lbfgs"] = "adam"
    steps: int = Field(ge=0)
    lr: float = Field(gt=0)
    schedule: Literal["constant", "cosine", "inverse_norm"] = "constant"
    lr_min: float = Field(default=0.0, ge=0)
    norm_power: float | None = None
    batch_size: int | None = Field(default=None, ge=1)
    drop_last: bool = True
    momentum: float = Field(default=0.0, ge=0, lt=1)
    guard_window: int = Field(default=0, ge=0)
    adapt_every: int = Field(default=0, ge=0)
    adapt_stop: float = Field(default=0.9, gt=0, le=1)
    dtype: Literal["float32", "float64"] | None = None
    max_step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self):
        for field, on in (
            ("schedule 'inverse_norm'", self.schedule == "inverse_norm"),
            ("max_step", self.max_step is not None),
        ):
            if on and (self.optimizer != "sgd" or self.momentum):
                raise ValueError(f"{field} needs optimizer 'sgd' without momentum")
        return self


class TrainConfig(Validated):
    """What to minimise and how: ``C + model.penalty(lam)`` over `phases`.

    log_every: steps between history rows (and the only host-device syncs).
    checkpoint_every: steps between checkpoints when a run folder is given (0: only at the end).
    top_singular_values: how many singular values of each ``model.layer_matrices()`` to log.
    seed: seed of the mini-batch order.
    """

    objective: Literal["mse", "cross_entropy", "logistic"] = "mse"
    lam: float = Field(default=0.0, ge=0)
    phases: list[Phase]
    log_every: int = Field(default=100, ge=1)
    checkpoint_every: int = Field(default=0, ge=0)
    top_singular_values: int = Field(default=3, ge=0)
    seed: int = 0


@dataclass
class TrainResult:
    """history: one row per log step; seconds: wall time of this call; resumed_from: step it resumed at."""

    model: torch.nn.Module
    history: pd.DataFrame
    seconds: float
    resumed_from: int = 0


# -------------------------------------------------------------------------------- helpers
def param_norm(model: torch.nn.Module) -> torch.Tensor:
    """‖θ‖ over trainable parameters."""
    return torch.sqrt(torch.stack([(p.detach() ** 2).sum() for p in model.parameters() if p.requires_grad]).sum())


def _lr(phase: Phase, k: int, model: torch.nn.Module):
    if phase.schedule == "constant":
        return phase.lr
    if phase.schedule == "cosine":
        return phase.lr_min + (phase.lr - phase.lr_min) * 0.5 * (1 + math.cos(math.pi * k / max(phase.steps, 1)))
    power = phase.norm_power if phase.norm_power is not None else getattr(model, "depth", 2) - 2
    return torch.clamp(phase.lr / param_norm(model) ** power, min=phase.lr_min)


def trust_region(lr, max_step: float, theta_norm: torch.Tensor, grad_norm: torch.Tensor):
    """Phase.max_step: the step's lr cut to ``max_step·‖θ‖/‖g‖`` where ``lr·‖g‖`` would exceed
    ``max_step·‖θ‖``. Works per member on ``(M,)`` norms. Returns ``(lr, cut)``, `cut` a bool tensor
    (inf/NaN caps never cut)."""
    cap = max_step * theta_norm / grad_norm
    cut = cap < lr
    return torch.where(cut, cap, lr), cut


def _optimizer(phase: Phase, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if phase.optimizer == "adam":
        return torch.optim.Adam(params, lr=phase.lr)
    if phase.optimizer == "sgd":
        return torch.optim.SGD(params, lr=phase.lr, momentum=phase.momentum)
    return torch.optim.LBFGS(params, lr=phase.lr, max_iter=1, history_size=50, line_search_fn="strong_wolfe")


@lru_cache(maxsize=16)
def _epoch_permutation(n: int, seed: int, epoch: int, device: torch.device) -> torch.Tensor:
    """The sample order of one epoch, drawn on the CPU from (seed, epoch) and moved to `device` once."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).to(device)


def _batches(
    n: int, batch_size: int | None, seed: int, step: int, device, drop_last: bool = True
) -> torch.Tensor | None:
    """Indices of the mini-batch of global `step` (epoch permutations are seeded by (seed, epoch));
    ``drop_last=False`` keeps each epoch's last, smaller batch (as torch's DataLoader does). Slicing the
    cached device permutation makes no host-device copy per step."""
    if batch_size is None or batch_size >= n:
        return None
    per_epoch = n // batch_size if drop_last else -(-n // batch_size)
    epoch, pos = divmod(step, per_epoch)
    return _epoch_permutation(n, seed, epoch, torch.device(device))[pos * batch_size : (pos + 1) * batch_size]


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Dataset, config: TrainConfig) -> dict[str, float]:
    """One history row's metrics: loss = cost + penalty, errors, ‖θ‖, top singular values per layer."""
    out = model(data.X_train)
    cost = data_cost(config.objective, out, data.Y_train)
    pen = model.penalty(config.lam) if config.lam > 0 else torch.zeros((), dtype=cost.dtype)  # pyright: ignore[reportCallIssue]  (duck-typed model)
    row = {
        "loss": float(cost + pen),
        "cost": float(cost),
        "penalty": float(pen),
        "train_error": float(error_rate(config.objective, out, data.Y_train)),
        "param_norm": float(param_norm(model)),
    }
    if len(data.X_test):
        out_t = model(data.X_test)
        row["test_cost"] = float(data_cost(config.objective, out_t, data.Y_test))
        row["test_error"] = float(error_rate(config.objective, out_t, data.Y_test))
    k = config.top_singular_values
    if k and hasattr(model, "layer_matrices") and math.isfinite(row["loss"]):
        for l, M in enumerate(model.layer_matrices(), start=1):  # pyright: ignore[reportCallIssue]  (duck-typed model)
            s = torch.linalg.svdvals(M.detach().double())
            for i in range(min(k, s.numel())):
                row[f"sv{l}_{i + 1}"] = float(s[i])
    return row


def check_training_inputs(model, data, objective: str) -> Dataset:
    """One-line errors for what `train` cannot train: `model` not a module, `data` not a `Dataset`, X not
    an ``N x d_in`` float matrix (N >= 1), Y without one row per sample (``N x d_out`` floats, ``N`` integer
    labels in [0, d_out), ``N`` or ``N x 1`` ±1 for "logistic"), non-finite entries, or a model whose
    input or output width does not fit. numpy arrays are taken as tensors; returns the checked data."""
    if not isinstance(model, torch.nn.Module):
        raise FeaturelabError(f"model={type(model).__name__} is not allowed: it must be a torch.nn.Module")
    if not isinstance(data, Dataset):
        raise FeaturelabError(f"data must be a featurelab.data.Dataset (rows are samples), got {type(data).__name__}")
    parts = {}
    for name in ("X_train", "Y_train", "X_test", "Y_test"):
        value = getattr(data, name)
        value = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        if not isinstance(value, torch.Tensor):
            raise FeaturelabError(f"data.{name} must be a tensor or numpy array, got {type(value).__name__}")
        parts[name] = value
    data = replace(data, **parts)
    d_in = parts["X_train"].shape[-1] if parts["X_train"].ndim == 2 else None
    for split in ("train", "test"):
        X, Y = parts[f"X_{split}"], parts[f"Y_{split}"]
        if split == "test" and X.numel() == 0 and len(Y) == 0:
            continue
        if X.ndim != 2 or not X.is_floating_point() or (split == "train" and len(X) == 0) or X.shape[1] != d_in:
            raise FeaturelabError(
                f"data.X_{split} must be an N x d_in float matrix (rows are samples, N >= 1, d_in = {d_in}), "
                f"got shape {tuple(X.shape)} of {X.dtype}"
            )
        if len(Y) != len(X):
            raise FeaturelabError(f"data.Y_{split} has {len(Y)} rows but data.X_{split} has {len(X)}; one per sample")
        labels = Y.dtype in (torch.int32, torch.int64)
        want = "N integer labels" if labels else ("N or N x 1 values ±1" if objective == "logistic" else "N x d_out")
        if (labels and Y.ndim != 1) or (not labels and (not Y.is_floating_point() or Y.ndim not in (1, 2))):
            raise FeaturelabError(f"data.Y_{split} must be {want}, got shape {tuple(Y.shape)} of {Y.dtype}")
        if not labels and objective == "cross_entropy":
            raise FeaturelabError("objective='cross_entropy' needs integer class labels in data.Y_train")
        if not labels and objective == "mse" and Y.ndim != 2:
            raise FeaturelabError(f"data.Y_{split} must be N x d_out for objective 'mse', got shape {tuple(Y.shape)}")
        for name, t in ((f"X_{split}", X), (f"Y_{split}", Y)):
            if t.is_floating_point() and not torch.isfinite(t).all():
                raise FeaturelabError(f"data.{name} contains NaN or inf; all entries must be finite")
    p = next(model.parameters(), None)
    X = parts["X_train"][:2]
    X = X.to(device=p.device, dtype=p.dtype) if p is not None else X
    try:
        with torch.no_grad():
            out = model(X)
    except Exception as exc:
        raise FeaturelabError(
            f"{type(model).__name__} cannot take data.X_train (d_in = {d_in}): {type(exc).__name__}: "
            f"{(str(exc).splitlines() or [''])[0]}"
        ) from None
    Y = parts["Y_train"]
    width = out.shape[1] if out.ndim == 2 else 1
    if Y.dtype in (torch.int32, torch.int64):
        if objective == "logistic" or int(Y.min()) < 0 or int(Y.max()) >= width:
            raise FeaturelabError(
                f"class labels of data.Y_train span [{int(Y.min())}, {int(Y.max())}]; the model has {width} outputs, "
                f"so labels must lie in [0, {width - 1}]"
                + (" (objective 'logistic' needs float ±1 targets)" if objective == "logistic" else "")
            )
    elif (objective == "logistic" and width != 1) or (objective == "mse" and Y.shape[1] != width):
        raise FeaturelabError(
            f"the model has {width} outputs but data.Y_train has {Y.shape[-1] if Y.ndim == 2 else 1} columns"
        )
    return data


# ---------------------------------------------------------------------------------- train
def train(
    model: torch.nn.Module,
    data: Dataset,
    config: TrainConfig,
    *,
    device: str = "cpu",
    run_dir: str | Path | None = None,
    resume: bool = False,
    callbacks=(),
    progress: bool | None = None,
    lr_rule: Callable | None = None,
) -> TrainResult:
    """Train `model` on `data` (rows are samples) through `config.phases`; returns a `TrainResult`.

    run_dir: folder for ``history.csv``, ``model.safetensors`` and the resumable
        ``checkpoint.safetensors``; with ``resume=True`` an existing checkpoint is continued (a finished
        run is loaded, not retrained).
    callbacks: objects with optional ``on_step(step, model, optimizer, loss)`` (after every step; opt-in
        per-step work) and ``on_log(step, model, row)`` (may add columns to the history row).
    lr_rule: optional ``f(step_in_phase, phase, model) -> lr`` overriding the phase's schedule.
    progress: tqdm bar; default on when stderr is a terminal.
    """
    if not isinstance(config, TrainConfig):
        config = TrainConfig.model_validate(config)
    if config.lam > 0 and not hasattr(model, "penalty"):
        raise FeaturelabError(
            f"model of type {type(model).__name__} has no penalty(lam), so lam={config.lam:g} cannot be applied: "
            "convert a Linear/activation chain with featurelab.from_torch(model), or train with lam=0"
        )
    dev = resolve_device(device)
    data = check_training_inputs(model, data, config.objective)
    model.to(dev)
    folder = Path(run_dir) if run_dir is not None else None
    t0 = time.perf_counter()
    rows: list[dict] = []
    start_step, done = 0, False
    state = {"lr_scale": 1.0, "capped": torch.zeros((), dtype=torch.int64, device=dev)}
    ckpt = load_checkpoint(folder) if (folder is not None and resume) else None
    config_digest = digest(config.model_dump(mode="json"))
    if ckpt is not None:
        tensors, info = ckpt
        if info.get("config") != config_digest:
            raise FeaturelabError(
                f"'{folder / 'checkpoint.safetensors'}' was written by a training run with another config; "
                "delete it to train this one afresh"
            )
        if info.get("dtype") and next(model.parameters()).dtype != getattr(torch, info["dtype"]):
            model.to(getattr(torch, info["dtype"]))
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        rows, start_step, done = info["history"], info["step"], info["done"]
        state["lr_scale"] = info.get("lr_scale", 1.0)
        state["capped"] += info.get("capped_steps", 0)
        if hasattr(model, "rho_history"):
            model.rho_history = info.get("rho_history", [])
    resumed_from = start_step
    total = sum(p.steps for p in config.phases)
    dtype_now = next(model.parameters()).dtype
    data_dev = data.to(dtype=dtype_now, device=dev)

    def log(step: int, phase_idx: int, lr) -> dict:
        row = {"step": step, "phase": phase_idx, "lr": float(lr) if lr is not None else float("nan")}
        row.update(evaluate(model, data_dev, config))
        if any(p.max_step is not None for p in config.phases):
            row["capped_steps"] = int(state["capped"])
        row["seconds"] = time.perf_counter() - t0
        for cb in callbacks:
            if hasattr(cb, "on_log"):
                cb.on_log(step, model, row)
        rows.append(row)
        return row

    def checkpoint(step: int, finished: bool, optimizer=None) -> None:
        if folder is None:
            return
        info = {
            "step": step,
            "done": finished,
            "history": rows,
            "lr_scale": state["lr_scale"],
            "capped_steps": int(state["capped"]),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "rho_history": getattr(model, "rho_history", []),
            "config": config_digest,
        }
        save_checkpoint(folder, model, optimizer, info)

    if not done:
        if start_step == 0:
            log(0, 0, _lr(config.phases[0], 0, model) if config.phases else None)
        bar = tqdm(
            total=total,
            initial=start_step,
            disable=not (sys.stderr.isatty() if progress is None else progress),
            leave=False,
            desc=type(model).__name__,
        )
        offset = 0
        for phase_idx, phase in enumerate(config.phases):
            if start_step >= offset + phase.steps:
                offset += phase.steps
                continue
            if phase.dtype is not None and next(model.parameters()).dtype != getattr(torch, phase.dtype):
                model.to(getattr(torch, phase.dtype))
                data_dev = data.to(dtype=getattr(torch, phase.dtype), device=dev)
            params = [p for p in model.parameters() if p.requires_grad]
            opt = _optimizer(phase, params)
            k0 = start_step - offset
            if k0 > 0 and ckpt is not None and ckpt[1].get("optimizer") and ckpt[1]["step"] == start_step:
                restore_optimizer(opt, ckpt[0], ckpt[1]["optimizer"])
            snapshot = None
            for k in range(k0, phase.steps):
                step = offset + k
                lr = lr_rule(k, phase, model) if lr_rule is not None else _lr(phase, k, model)
                if isinstance(lr, torch.Tensor) or state["lr_scale"] != 1.0:
                    lr = lr * state["lr_scale"]
                manual = isinstance(lr, torch.Tensor) or phase.max_step is not None  # no host sync
                if not manual:
                    for g in opt.param_groups:
                        g["lr"] = lr
                idx = _batches(len(data_dev.X_train), phase.batch_size, config.seed, step, dev, phase.drop_last)
                X = data_dev.X_train if idx is None else data_dev.X_train[idx]
                Y = data_dev.Y_train if idx is None else data_dev.Y_train[idx]

                def closure():
                    opt.zero_grad(set_to_none=True)
                    loss = data_cost(config.objective, model(X), Y)
                    if config.lam > 0:
                        loss = loss + model.penalty(config.lam)
                    loss.backward()
                    return loss

                if phase.guard_window and snapshot is None:
                    snapshot = (float(closure().detach()), [p.detach().clone() for p in params])
                if manual:  # plain SGD step θ ← θ − lr·∇ with a device-resident lr
                    loss = closure()
                    with torch.no_grad():
                        if phase.max_step is not None:  # trust region ‖Δθ‖ <= max_step·‖θ‖
                            grad_norm = torch.sqrt(torch.stack([(p.grad**2).sum() for p in params]).sum())
                            lr, cut = trust_region(lr, phase.max_step, param_norm(model), grad_norm)
                            state["capped"] += cut.long()
                        for p in params:
                            p.sub_(lr * p.grad)  # pyright: ignore[reportOperatorIssue]  (set by backward)
                else:
                    loss = opt.step(closure)  # pyright: ignore[reportCallIssue, reportArgumentType]  (closures may return the loss tensor)
                if phase.guard_window and (k + 1) % phase.guard_window == 0:
                    with torch.no_grad():
                        cur = float(
                            data_cost(config.objective, model(X), Y)
                            + (model.penalty(config.lam) if config.lam > 0 else 0.0)  # pyright: ignore[reportCallIssue]  (duck-typed model)
                        )
                    if not cur <= snapshot[0]:  # the loss rose over the window (or is NaN)
                        with torch.no_grad():
                            for p, s in zip(params, snapshot[1]):
                                p.copy_(s)
                        state["lr_scale"] *= 0.5
                        opt = _optimizer(phase, params)
                    else:
                        snapshot = (cur, [p.detach().clone() for p in params])
                for cb in callbacks:
                    if hasattr(cb, "on_step"):
                        cb.on_step(step + 1, model, opt, loss)
                if (
                    phase.adapt_every
                    and hasattr(model, "adapt_steps")
                    and (k + 1) % phase.adapt_every == 0
                    and k + 1 < phase.adapt_stop * phase.steps
                ):
                    model.adapt_steps(data_dev.X_train)  # pyright: ignore[reportCallIssue]  (duck-typed model)
                bar.update(1)
                if (step + 1) % config.log_every == 0 or step + 1 == total:
                    row = log(step + 1, phase_idx, lr)
                    if not math.isfinite(row["loss"]):
                        raise FeaturelabError(
                            f"training diverged at step {step + 1} (loss {row['loss']}); lower the learning rate "
                            f"(phase {phase_idx}: lr={phase.lr}) or set guard_window"
                        )
                if folder is not None and config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
                    checkpoint(step + 1, False, opt)
            offset += phase.steps
            start_step = offset
        bar.close()
        checkpoint(total, True)
    history = pd.DataFrame(rows)
    if folder is not None:
        write_text(folder / "history.csv", history.to_csv(index=False))
        save_model(model, folder / "model.safetensors")
    return TrainResult(model, history, time.perf_counter() - t0, resumed_from)
