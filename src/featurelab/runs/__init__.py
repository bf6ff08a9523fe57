"""Run records: atomic I/O, claims, figures, the sweep mechanism, the runner and HTML reports."""
from .claims import Claim, claim, fmt
from .figures import save_figure
from .report import render_report
from .runner import RunRecord, resolve_config, run_experiment
from .sweep import SweepOutcome, run_units

__all__ = ["Claim", "claim", "fmt", "save_figure", "render_report", "RunRecord", "resolve_config",
           "run_experiment", "SweepOutcome", "run_units"]
