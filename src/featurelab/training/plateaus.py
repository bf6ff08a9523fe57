"""Saddle/plateau detection on a training-loss history (docs/theory/saddle-to-saddle.md A4).

A network started near the origin sits on a sequence of saddles: the loss stays flat for a long
stretch (a plateau), then drops (an escape). This module finds those stretches in a logged loss curve.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.ndimage import median_filter

from ..checks import int_at_least, non_negative, positive
from ..errors import FeaturelabError


@dataclass(frozen=True)
class Plateau:
    """A maximal flat stretch of the smoothed loss: steps [start, end], its median `level`, and the
    step at which the smoothed loss first fell `drop` below the level afterwards (None: never)."""

    start: int
    end: int
    level: float
    escape: int | None

    @property
    def mid(self) -> int:
        return (self.start + self.end) // 2

    @property
    def length(self) -> int:
        return self.end - self.start


def smooth(loss, window: int = 5) -> np.ndarray:
    """Running median of `window` points (edges repeat the end values), A4's smoothing."""
    return median_filter(np.asarray(loss, dtype=np.float64), size=window, mode="nearest")


def detect_plateaus(
    steps, loss, delta: float = 0.05, min_length: int = 3000, merge_tol: float = 0.1, drop: float = 0.1, window: int = 5
) -> list[Plateau]:
    """Plateaus of a loss curve (docs/theory/saddle-to-saddle.md A4).

    steps, loss: 1-D sequences of the same length (logged step numbers, increasing; full-train loss).
    The loss is smoothed by a `window`-point running median. A logged point at step t is *flat* when the
    smoothed loss varies by at most `delta` over [t, t + min_length] (the whole window must lie inside
    the history). A plateau is a maximal run of flat points t_a..t_b, covering [t_a, t_b + min_length];
    its level is the median smoothed loss there. Neighbouring plateaus whose levels differ by less than
    `merge_tol` are merged; upward jumps are ignored. Each plateau records its escape: the first later
    step with smoothed loss <= level - `drop` (an escape is a drop of at least `drop`).
    Returns the plateaus in time order.
    """
    t = np.asarray(steps, dtype=np.float64)
    y = np.asarray(loss, dtype=np.float64)
    if t.ndim != 1 or y.shape != t.shape:
        raise FeaturelabError(f"steps and loss must be 1-D of the same length, got shapes {t.shape} and {y.shape}")
    if len(t) > 1 and not (np.diff(t) > 0).all():
        raise FeaturelabError("steps must be strictly increasing")
    if not np.isfinite(y).all():
        raise FeaturelabError("loss contains NaN or inf")
    non_negative("delta", delta)
    positive("min_length", min_length)
    non_negative("merge_tol", merge_tol)
    positive("drop", drop)
    int_at_least("window", window, 1)
    s = smooth(y, window)
    n = len(t)
    flat = np.zeros(n, dtype=bool)
    for i in range(n):
        j = np.searchsorted(t, t[i] + min_length, side="right")
        if t[-1] < t[i] + min_length:
            break
        seg = s[i:j]
        flat[i] = seg.max() - seg.min() <= delta
    runs: list[list[int]] = []
    for i in np.flatnonzero(flat).tolist():
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    spans = []
    for a, b in runs:
        end = t[b] + min_length
        mask = (t >= t[a]) & (t <= end)
        spans.append([t[a], end, float(np.median(s[mask]))])
    merged: list[list[float]] = []
    for span in spans:
        if merged and abs(merged[-1][2] - span[2]) < merge_tol:
            mask = (t >= merged[-1][0]) & (t <= span[1])
            merged[-1] = [merged[-1][0], span[1], float(np.median(s[mask]))]
        else:
            merged.append(span)
    out = []
    for start, end, level in merged:
        below = np.flatnonzero((t > start) & (s <= level - drop))
        out.append(Plateau(int(start), int(end), level, int(t[below[0]]) if below.size else None))
    return out


def plateau_start(widths: list[int], m: list[float], tau: float) -> int:
    """n*(τ) = min{w : m(w) <= (1+τ)·min m} (Part 3 §5d)."""
    best = min(m)
    return min(w for w, v in zip(widths, m) if v <= (1 + tau) * best)
