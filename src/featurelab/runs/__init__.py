"""Run folders: the runner, the sweep that distributes an experiment's units, HTML reports, and the
reproduction across seeds and float64 (`run_robustness`, `reproduce`)."""

from .report import render_report
from .reproduce import reproduce, run_robustness
from .runner import RunRecord, resolve_config, run_experiment
from .sweep import SweepOutcome, run_units

__all__ = [
    "run_experiment",
    "render_report",
    "RunRecord",
    "resolve_config",
    "SweepOutcome",
    "run_units",
    "run_robustness",
    "reproduce",
]
