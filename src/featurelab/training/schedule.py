"""`OptimizerConfig`: the optimizer part of an experiment config, declared once (Adam, then full-batch GD,
then an optional float64 L-BFGS polish) and turned into the trainer's `Phase`s and `TrainConfig`.

An experiment config inherits it (``class Config(OptimizerConfig, ExperimentConfig)``, as `forces` and `cp-rank`
do, redeclaring the defaults it wants; presets and ``--set adam_lr=1e-3`` address its keys), or holds one per
part (`width-plateau`'s per-dataset `Sweep`: ``--set digits.adam_lr=1e-3``), or embeds it as a field
(``--set optimizer.adam_lr=1e-3``). ``cfg.train_config(objective, lam)`` then builds the `TrainConfig`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from ..config import Validated
from .trainer import Phase, TrainConfig


class OptimizerConfig(Validated):
    """Adam for `adam_steps`, then plain full-batch GD for `gd_steps`, then L-BFGS for `lbfgs_steps`
    (a phase with 0 steps is left out).

    adam_schedule: "constant", or "cosine" from adam_lr down to adam_lr_min.
    adapt_every: > 0: adaptive Leaky-ResNet layer steps every k Adam steps (`Phase.adapt_every`).
    gd_guard_window: > 0: the GD phase's loss guard (`Phase.guard_window`).
    lbfgs_dtype: the dtype of the L-BFGS polish (float64 by default: it ends at a critical point).
    log_every, checkpoint_every: as in `TrainConfig`.
    """

    model_config = ConfigDict(validate_assignment=True)  # merged with Validated's extra="forbid"
    adam_steps: int = Field(default=0, ge=0)
    adam_lr: float = Field(default=1e-3, gt=0)
    adam_schedule: Literal["constant", "cosine"] = "constant"
    adam_lr_min: float = Field(default=0.0, ge=0)
    adapt_every: int = Field(default=0, ge=0)
    gd_steps: int = Field(default=0, ge=0)
    gd_lr: float = Field(default=0.05, gt=0)
    gd_guard_window: int = Field(default=0, ge=0)
    lbfgs_steps: int = Field(default=0, ge=0)
    lbfgs_lr: float = Field(default=1.0, gt=0)
    lbfgs_dtype: Literal["float32", "float64"] = "float64"
    log_every: int = Field(default=100, ge=1)
    checkpoint_every: int = Field(default=0, ge=0)

    def phases(self) -> list[Phase]:
        """The trainer's phases, in order Adam, GD, L-BFGS; those with 0 steps are left out."""
        out = []
        if self.adam_steps:
            out.append(
                Phase(
                    optimizer="adam",
                    steps=self.adam_steps,
                    lr=self.adam_lr,
                    schedule=self.adam_schedule,
                    lr_min=self.adam_lr_min,
                    adapt_every=self.adapt_every,
                )
            )
        if self.gd_steps:
            out.append(Phase(optimizer="sgd", steps=self.gd_steps, lr=self.gd_lr, guard_window=self.gd_guard_window))
        if self.lbfgs_steps:
            out.append(Phase(optimizer="lbfgs", steps=self.lbfgs_steps, lr=self.lbfgs_lr, dtype=self.lbfgs_dtype))
        return out

    def train_config(
        self,
        objective: Literal["mse", "cross_entropy", "logistic"],
        lam: float = 0.0,
        *,
        top_singular_values: int = 3,
        seed: int = 0,
    ) -> TrainConfig:
        """The `TrainConfig` minimising `objective` + λ‖θ‖² with these phases and logging intervals."""
        return TrainConfig(
            objective=objective,
            lam=lam,
            phases=self.phases(),
            log_every=self.log_every,
            checkpoint_every=self.checkpoint_every,
            top_singular_values=top_singular_values,
            seed=seed,
        )
