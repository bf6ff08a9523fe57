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
from pathlib import Path

import torch

from ..data.dataset import Dataset
from ..errors import FeaturelabError
from .engine import Trainable, evaluate, param_norm, run, trust_region
from .phases import Phase, TrainConfig, TrainResult

__all__ = ["Phase", "TrainConfig", "TrainResult", "evaluate", "param_norm", "train", "trust_region"]


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
    progress: tqdm bar; default on when stderr is a terminal.
    Raises `FeaturelabError` when the loss becomes NaN or inf.
    """
    if not isinstance(config, TrainConfig):
        config = TrainConfig.model_validate(config)
    if not isinstance(model, Trainable):
        raise FeaturelabError(f"model must define forward(X) and penalty(lam), got {type(model).__name__}")
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
