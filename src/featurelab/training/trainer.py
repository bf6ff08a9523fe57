"""Full-batch (and mini-batch) training of one model in phases, with run records and resume.

A run is a list of `Phase`s (e.g. Adam for n₁ steps, then plain GD with a smaller learning rate, as
the papers do). The loss is ``C + model.penalty(lam)``: each model adds its own L2 convention
explicitly (never an optimizer's weight decay, docs/theory/conventions.md). `train` is the one-member
case of the training engine (`featurelab.training.engine`), which also trains batched ensembles.
Metrics are gathered only every `log_every` steps, so the loop makes no per-step host-device
synchronisation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..data.dataset import Dataset
from ..errors import FeaturelabError
from .engine import Trainable, evaluate, param_norm, run, trust_region
from .phases import Phase, TrainConfig, TrainResult

__all__ = ["Phase", "TrainConfig", "TrainResult", "evaluate", "param_norm", "train", "trust_region"]


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

    model: a `Trainable` (``forward`` and ``penalty(lam)``), trained in place.
    run_dir: folder for ``history.csv``, ``model.safetensors`` and the resumable
        ``checkpoint.safetensors``; with ``resume=True`` an existing checkpoint is continued (a finished
        run is loaded, not retrained).
    callbacks: objects with optional ``on_step(step, model, optimizer, loss)`` (after every step; opt-in
        per-step work; ``optimizer.param_groups[0]["lr"]`` is the step's learning rate) and
        ``on_log(step, model, row)`` (may add columns to the history row).
    lr_rule: optional ``f(step_in_phase, phase, model) -> lr`` overriding the phase's schedule.
    progress: a step-level bar with the time left; default (None) on in a terminal or a notebook, off with False
        (`featurelab.progress.show_progress`).
    Raises `FeaturelabError` when the loss becomes NaN or inf.
    """
    if not isinstance(config, TrainConfig):
        config = TrainConfig.model_validate(config)
    if not isinstance(model, torch.nn.Module):
        raise FeaturelabError(f"model={type(model).__name__} is not allowed: it must be a torch.nn.Module")
    if config.lam > 0 and not isinstance(model, Trainable):
        raise FeaturelabError(
            f"model of type {type(model).__name__} has no penalty(lam), so featurelab cannot apply its L2 "
            f"convention (lam={config.lam}): train with lam=0, or convert a Linear/activation chain with "
            "featurelab.from_torch(model)"
        )
    data = check_training_inputs(model, data, config.objective)
    (result,) = run(
        [model],
        [data],
        [config],
        device=device,
        dirs=[Path(run_dir) if run_dir is not None else None],
        resume=resume,
        callbacks=[tuple(callbacks)],
        progress=progress,
        lr_rule=lr_rule,
    )
    if isinstance(result, Exception):
        raise result
    return result
