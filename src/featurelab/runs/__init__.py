"""Run folders: the runner, the sweep that distributes an experiment's units, and HTML reports."""

from .report import render_report
from .runner import RunRecord, resolve_config, run_experiment
from .sweep import SweepOutcome, run_units

__all__ = ["run_experiment", "render_report", "RunRecord", "resolve_config", "SweepOutcome", "run_units"]
