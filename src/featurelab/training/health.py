"""Is a trained network a measurement at all? Checks for the trivial solutions a run can end in.

A diverged run (non-finite output), a network whose output no longer depends on its input (every
hidden unit dead, or weights collapsed to zero), a classifier no better than the majority-class guess
and a run whose loss barely moved from its initial value (a learning rate too small to train, or a start
at a critical point it never left) measure nothing about feature learning: a claim resting on them is
"not measured", never PASS. The sweep runs `training_health` on every unit trained through an
experiment's ``build`` (with its history); experiments that train in ``run_unit`` call it themselves.
The reason is stored as the unit result's ``"unhealthy"`` entry.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from ..data.dataset import Dataset
from .objectives import error_rate

CONSTANT_RTOL = 1e-7  # output spread over samples, relative to its size, below which the output is constant
CHANCE_FRACTION = 0.95  # a training error >= this fraction of the majority-class error is chance level
STALL_RTOL = 1e-2
"""A run whose final loss is >= (1 - STALL_RTOL) x its initial loss did not train. 1 % is five orders of
magnitude above the float32 rounding of a loss (a run at learning rate ~0 moves it by ~1e-7 relative)
and far below what learning anything does: fitting one direction of a target removes its share of the
target's variance (the first saddle-to-saddle plateau of a rank-k teacher already lowers the loss by
about 1/k of its start), and a classifier that beats chance lowers the cross-entropy from ln C by tens of
percent. It is relative, so it holds for any scale of the targets."""


@torch.no_grad()
def training_health(model: torch.nn.Module, data: Dataset, objective: str, history: pd.DataFrame | None = None) -> str:
    """ "" for a healthy trained `model`, else the reason: non-finite output on ``data.X_train`` (N x d),
    constant output over the N samples (while the targets vary), a training error at chance level
    (>= `CHANCE_FRACTION` x the majority-class error) for the classification objectives, or, given the
    training `history` (one row per log step, first row the initial state, column ``loss``), a final loss
    >= (1 - `STALL_RTOL`) x the initial loss."""
    p = next(model.parameters(), None)
    X = data.X_train.to(device=p.device, dtype=p.dtype) if p is not None else data.X_train
    Y = data.Y_train.to(device=X.device)
    out = model(X)
    if not torch.isfinite(out).all():
        return "diverged: non-finite network output"
    if not torch.isfinite(torch.cat([q.detach().flatten() for q in model.parameters()])).all():
        return "diverged: non-finite parameters"
    n = out.shape[0]
    if n > 1:
        spread = (out - out.mean(0)).abs().max()
        varies = (Y != Y[0]).any() if Y.dtype in (torch.int32, torch.int64) else (Y - Y.mean(0)).abs().max() > 0
        if varies and spread <= CONSTANT_RTOL * max(float(out.abs().max()), 1.0):
            return f"collapsed: the output is the same for all {n} training samples (every unit dead?)"
    if objective in ("cross_entropy", "logistic") and n > 0:
        labels = Y.reshape(-1)
        counts = torch.unique(labels, return_counts=True)[1]
        chance = 1.0 - float(counts.max()) / labels.numel()
        err = float(error_rate(objective, out, Y))
        if chance > 0 and err >= CHANCE_FRACTION * chance:
            return f"chance level: training error {err:.3g} vs {chance:.3g} for the majority-class guess"
    return stalled(history)


def stalled(history: pd.DataFrame | None) -> str:
    """ "" unless the ``loss`` column of `history` ends >= (1 - `STALL_RTOL`) x where it started (then the
    reason); "" without a history or with fewer than two finite positive losses."""
    if history is None or "loss" not in history or len(history) < 2:
        return ""
    first, last = float(history["loss"].iloc[0]), float(history["loss"].iloc[-1])
    if not (math.isfinite(first) and math.isfinite(last)) or first <= 0:
        return ""
    if last >= (1 - STALL_RTOL) * first:
        return (
            f"stalled: the loss went from {first:.4g} to {last:.4g}, less than "
            f"{100 * STALL_RTOL:g} % below its initial value (not trained)"
        )
    return ""
