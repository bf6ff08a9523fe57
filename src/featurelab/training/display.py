"""A training result inline in a notebook: its final loss terms, steps, time and a small loss curve."""

from __future__ import annotations

import html

import pandas as pd

from ..figures import inline_png, plt

TERMS = ("loss", "cost", "penalty", "train_error", "test_cost", "test_error", "param_norm")  # the history's columns
CURVES = ("loss", "cost", "test_cost")


def result_html(history: pd.DataFrame, seconds: float, resumed_from: int, model_name: str) -> str:
    """Self-contained, escaped HTML of a `TrainResult`: a headline (model, steps, wall time, the step it resumed
    at), the final row's loss terms (`TERMS` present in `history`, 4 significant digits) and the loss curve
    (`CURVES`, log scale) as an inline PNG."""
    steps = int(history["step"].iloc[-1]) if len(history) else 0
    resumed = f", resumed at step {resumed_from}" if resumed_from else ""
    head = f"<h4>{html.escape(model_name)}: {steps} steps in {seconds:.1f} s{resumed}</h4>"
    if not len(history):
        return head + "<p>(no history logged)</p>"
    last = history.iloc[[-1]][["step", *(c for c in TERMS if c in history)]]
    table = last.to_html(index=False, float_format=lambda v: f"{v:.4g}", escape=True, border=0)
    box = f"<div style='overflow-x:auto;max-width:100%'>{table}</div>"
    return head + box + _curve(history)


def _curve(history: pd.DataFrame) -> str:
    """The logged loss terms against the step (log scale where all are positive), as an inline PNG."""
    fig, ax = plt.subplots(figsize=(4.5, 2.4))
    for col in (c for c in CURVES if c in history and history[c].notna().any()):
        ax.plot(history["step"], history[col], label=col, lw=1)
    if (history[[c for c in CURVES if c in history]] > 0).all().all():
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
    return inline_png(fig, "loss curve")
