"""What a training run is: its phases (optimizer, steps, schedule, guard, trust region, dtype), the
objective and λ, the logging and checkpoint cadence, and what a run returns.

The loss is ``C + model.penalty(lam)``: each model adds its own L2 convention explicitly (never an
optimizer's weight decay, docs/theory/conventions.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pandas as pd
import torch
from pydantic import Field, model_validator

from ..config import Validated


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

    def __repr__(self) -> str:
        steps = int(self.history["step"].iloc[-1]) if len(self.history) else 0
        last = {c: f"{self.history[c].iloc[-1]:.4g}" for c in ("loss", "cost", "penalty") if c in self.history}
        terms = "".join(f", {k}={v}" for k, v in last.items())
        return f"TrainResult({type(self.model).__name__}: {steps} steps in {self.seconds:.1f} s{terms})"

    def _repr_html_(self) -> str:
        """The result inline in a notebook (`featurelab.training.display.result_html`)."""
        from .display import result_html

        return result_html(self.history, self.seconds, self.resumed_from, type(self.model).__name__)
