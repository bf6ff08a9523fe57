"""The reference training loop: what training does, written plainly on ``torch.func`` and ``torch.optim``.

One model, its phases in order. Each step takes the step's mini-batch, the gradient of the loss
``C + model.penalty(λ)`` by ``torch.func.grad`` (the model's own formula: no fused kernel runs under a transform),
the schedule's learning rate times the guard's scale, and torch.optim's update (Adam, or SGD with momentum).
At the end of each guard window the loss guard restores the window's start where the loss rose, halves the lr
and restarts the optimizer (Jacot & Kaiser, arXiv 2405.17573 §5; docs/theory/conventions.md). A history row is
logged at step 0 and every ``log_every`` steps; the model is saved at the end when a folder is given.

The engine (`featurelab.training.engine.run`, behind `train` and `train_ensemble`) is the fast implementation
of this loop: stacked members, the fused CPU kernels (`featurelab.training._kernels`), chained pullbacks, Adam
on one flat buffer, CUDA graphs. tests/test_reference_loop.py checks in float64 that it gives the same weights
and history as this loop (1e-12) on MLPs and Leaky ResNets, one run and ensembles. Left to the engine and its
own tests: resume, L-BFGS, the inverse-norm schedule, the trust region ``max_step``, adaptive Leaky-ResNet
steps and callbacks, which this loop refuses.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

import pandas as pd
import torch
from torch import nn
from torch.func import functional_call, grad

from ..data.dataset import Dataset
from ..errors import FeaturelabError
from .checkpoint import save_model
from .engine import _batches, param_norm
from .objectives import data_cost
from .phases import Phase, TrainConfig
from .stack import Trainable


def reference_train(model: nn.Module, data: Dataset, config: TrainConfig, folder: Path | None = None) -> pd.DataFrame:
    """Train `model` in place on `data` (rows are samples) by the reference loop; returns the history, one row per
    log step (step, phase, lr, loss, cost, penalty). `folder`: where ``model.safetensors`` is written at the end."""
    config = TrainConfig.model_validate(config)
    _check_covered(config)
    rows = [_row(model, data, config, step=0, phase_idx=0, lr=_first_lr(config))]
    total, offset, lr_scale = sum(p.steps for p in config.phases), 0, 1.0
    for phase_idx, phase in enumerate(config.phases):
        if phase.dtype is not None:
            model.to(getattr(torch, phase.dtype))
        dtype = next(model.parameters()).dtype
        X, Y = data.X_train.to(dtype), data.Y_train if not data.Y_train.is_floating_point() else data.Y_train.to(dtype)
        optimizer = _optimizer(phase, model)
        window_start = None  # the guard's (loss, parameters) at the start of its window
        for k in range(phase.steps):
            step = offset + k
            idx = _batches(len(X), phase.batch_size, config.seed, step, X.device, phase.drop_last)
            Xb, Yb = (X, Y) if idx is None else (X[idx], Y[idx])
            if phase.guard_window and window_start is None:
                window_start = (_loss(model, Xb, Yb, config), _parameters(model))
            lr = _schedule(phase, k) * lr_scale
            _step(model, optimizer, lr, Xb, Yb, config)
            if phase.guard_window and (k + 1) % phase.guard_window == 0:
                window_start, rose = _guard(model, cast(tuple, window_start), _loss(model, Xb, Yb, config))
                if rose:
                    lr_scale, optimizer = lr_scale / 2, _optimizer(phase, model)
            if (step + 1) % config.log_every == 0 or step + 1 == total:
                rows.append(_row(model, data, config, step + 1, phase_idx, lr))
        offset += phase.steps
    if folder is not None:
        save_model(model, Path(folder) / "model.safetensors")
    return pd.DataFrame(rows)


def _check_covered(config: TrainConfig) -> None:
    """A one-line error for a phase this loop leaves to the engine (module docstring)."""
    for i, p in enumerate(config.phases):
        for field, used in (
            ("optimizer='lbfgs'", p.optimizer == "lbfgs"),
            ("schedule='inverse_norm'", p.schedule == "inverse_norm"),
            ("max_step", p.max_step is not None),
            ("adapt_every", p.adapt_every > 0),
        ):
            if used:
                raise FeaturelabError(f"phases[{i}].{field} is not covered by the reference loop; use train()")


def _penalty(model: nn.Module, lam: float) -> torch.Tensor:
    return cast(Trainable, model).penalty(lam)


def _optimizer(phase: Phase, model: nn.Module) -> torch.optim.Optimizer:
    """A fresh torch.optim optimizer for the phase (its lr is set every step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if phase.optimizer == "adam":
        return torch.optim.Adam(params, lr=phase.lr)
    return torch.optim.SGD(params, lr=phase.lr, momentum=phase.momentum)


def _schedule(phase: Phase, k: int) -> float:
    """The lr of step k of the phase: constant, or cosine from lr down to lr_min over the phase."""
    if phase.schedule == "cosine":
        return phase.lr_min + (phase.lr - phase.lr_min) * 0.5 * (1 + math.cos(math.pi * k / max(phase.steps, 1)))
    return phase.lr


def _first_lr(config: TrainConfig) -> float:
    return _schedule(config.phases[0], 0) if config.phases else float("nan")


def _loss_of(model: nn.Module, params: dict[str, torch.Tensor], X, Y, config: TrainConfig) -> torch.Tensor:
    """``C + model.penalty(λ)`` with `params` in place of the model's parameters (the model's formula)."""

    def loss(X, Y):
        cost = data_cost(config.objective, model(X), Y)
        return cost + _penalty(model, config.lam) if config.lam > 0 else cost

    return _called(model, params, loss, X, Y)


def _called(model: nn.Module, params: dict[str, torch.Tensor], fn, X, Y) -> torch.Tensor:
    """`fn(X, Y)` with `params` swapped into `model` for the call (``torch.func.functional_call``)."""
    return functional_call(_Call(model, fn), {f"model.{k}": v for k, v in params.items()}, (X, Y))


class _Call(nn.Module):
    """A module whose forward is ``fn(X, Y)`` over `model`, so functional_call can swap `model`'s parameters."""

    def __init__(self, model: nn.Module, fn):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, X, Y):
        return self.fn(X, Y)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, lr: float, X, Y, config: TrainConfig) -> None:
    """One step: the gradient of the loss by torch.func.grad, then torch.optim's update at `lr`."""
    params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    grads = grad(lambda ps: _loss_of(model, ps, X, Y, config))(params)
    for k, p in model.named_parameters():
        if p.requires_grad:
            p.grad = grads[k]
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()


@torch.no_grad()
def _loss(model: nn.Module, X, Y, config: TrainConfig) -> float:
    cost = data_cost(config.objective, model(X), Y)
    return float(cost + _penalty(model, config.lam)) if config.lam > 0 else float(cost)


def _parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def _guard(model: nn.Module, start: tuple[float, dict], loss: float) -> tuple[tuple[float, dict], bool]:
    """The end of a guard window: where the loss rose (or is NaN) the window's start is restored. Returns the
    next window's start and whether the loss rose."""
    loss0, params0 = start
    rose = not loss <= loss0
    if rose:
        for k, p in model.named_parameters():
            if k in params0:
                p.copy_(params0[k])
    return ((loss0 if rose else loss), _parameters(model)), rose


@torch.no_grad()
def _row(model: nn.Module, data: Dataset, config: TrainConfig, step: int, phase_idx: int, lr: float) -> dict:
    """One history row: the loss C + λ-penalty on the whole training set, its parts, and ‖θ‖."""
    dtype = next(model.parameters()).dtype
    Y = data.Y_train.to(dtype) if data.Y_train.is_floating_point() else data.Y_train
    cost = data_cost(config.objective, model(data.X_train.to(dtype)), Y)
    pen = _penalty(model, config.lam) if config.lam > 0 else torch.zeros((), dtype=dtype)
    return {
        "step": step,
        "phase": phase_idx,
        "lr": lr,
        "loss": float(cost + pen),
        "cost": float(cost),
        "penalty": float(pen),
        "param_norm": float(param_norm(model)),
    }
