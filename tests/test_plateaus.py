"""Plateau/saddle detection on a loss history (docs/theory/saddle-to-saddle.md A4): synthetic curves with known
answers."""

import math

import numpy as np
import pytest

from featurelab import FeaturelabError
from featurelab.training import detect_plateaus

STEPS = np.arange(0, 60001, 250)


def staircase(levels_until, final, steps=STEPS, ramp=1000.0):
    """A loss at levels[k] until step ends[k], with linear ramps of `ramp` steps between levels."""
    y = np.full(len(steps), final, dtype=np.float64)
    knots = [(0.0, levels_until[0][0])]
    for (level, end), nxt in zip(levels_until, [l for l, _ in levels_until[1:]] + [final]):
        knots += [(end, level), (end + ramp, nxt)]
    xs, ys = zip(*knots)
    y = np.interp(steps, xs, ys)
    return steps, y


def test_two_saddles_then_convergence():
    steps, loss = staircase([(math.log(10), 12000), (1.8, 36000)], final=0.01)
    ps = detect_plateaus(steps, loss, min_length=3000)
    assert [round(p.level, 6) for p in ps[:2]] == [round(math.log(10), 6), 1.8]
    assert ps[0].start == 0 and ps[0].end == 12000
    assert ps[1].start == 13000 and ps[1].end == 36000
    # escapes: first logged step at least 0.1 below each level on the linear ramps
    assert ps[0].escape == 12250 and ps[1].escape == 36250
    assert ps[-1].escape is None and ps[-1].level == pytest.approx(0.01)
    assert ps[1].mid == (13000 + 36000) // 2


def test_spikes_and_upward_jumps_are_ignored():
    steps, loss = staircase([(math.log(10), 12000), (1.8, 36000)], final=0.01)
    loss = loss.copy()
    loss[np.searchsorted(steps, 20000)] = 5.0  # one-point spike: removed by the 5-point median
    loss[(steps >= 40000) & (steps < 41000)] += 0.5  # a short upward jump after the second escape
    ps = detect_plateaus(steps, loss, min_length=3000)
    assert ps[1].start == 13000 and ps[1].end == 36000
    assert all(p.escape is None or p.escape > p.start for p in ps)
    assert sum(p.escape is not None for p in ps) == 2


def test_close_levels_merge_and_short_flats_do_not_count():
    steps = np.arange(0, 30001, 100)
    # 0.08 apart: two flat runs (> delta), merged into one plateau (< merge_tol); the last window
    # that stays flat before the drop at 20000 starts at 16900
    loss = np.where(steps < 10000, 2.0, np.where(steps < 20000, 1.92, 1.0))
    ps = detect_plateaus(steps, loss, min_length=3000, delta=0.05, merge_tol=0.1)
    assert (ps[0].start, ps[0].end, ps[0].escape) == (0, 19900, 20000)
    assert 1.92 <= ps[0].level <= 2.0
    apart = detect_plateaus(steps, loss, min_length=3000, delta=0.05, merge_tol=0.05)
    assert [(p.start, p.end) for p in apart[:2]] == [(0, 9900), (10000, 19900)]
    short = np.where(steps < 2000, 2.0, 1.0)  # flat for 2000 < min_length steps: no plateau at 2.0
    assert all(abs(p.level - 2.0) > 0.1 for p in detect_plateaus(steps, short, min_length=3000))


def test_bad_input():
    with pytest.raises(FeaturelabError, match="strictly increasing"):
        detect_plateaus([0, 2, 1], [1.0, 1.0, 1.0])
    with pytest.raises(FeaturelabError, match="min_length"):
        detect_plateaus([0, 1, 2], [1.0, 1.0, 1.0], min_length=0)
    with pytest.raises(FeaturelabError, match="same length"):
        detect_plateaus([0, 1, 2], [1.0, 1.0])
