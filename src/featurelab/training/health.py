"""Is a trained network a measurement at all? Checks for the trivial solutions a run can end in.

A diverged run (non-finite output), a network whose output no longer depends on its input (every
hidden unit dead, or weights collapsed to zero) and a classifier no better than the majority-class
guess measure nothing about feature learning: a claim resting on them is "not measured", never PASS.
The sweep runs `training_health` on every trained unit and stores the reason as the unit result's
``"unhealthy"`` entry.
"""

from __future__ import annotations

import torch

from ..data.dataset import Dataset
from .objectives import error_rate

CONSTANT_RTOL = 1e-7  # output spread over samples, relative to its size, below which the output is constant
CHANCE_FRACTION = 0.95  # a training error >= this fraction of the majority-class error is chance level


@torch.no_grad()
def training_health(model: torch.nn.Module, data: Dataset, objective: str) -> str:
    """ "" for a healthy trained `model`, else the reason: non-finite output on ``data.X_train`` (N x d),
    constant output over the N samples (while the targets vary), or a training error at chance level
    (>= `CHANCE_FRACTION` x the majority-class error) for the classification objectives."""
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
    return ""
