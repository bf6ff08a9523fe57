"""`AnalysisTracker`: `analyze` recorded over training, the bottleneck as it forms."""

from __future__ import annotations

import numpy as np
import pandas as pd
from torch import nn

from ..checks import int_at_least
from ..errors import FeaturelabError
from ..figures import plt
from .core import analyze
from .report import ModelAnalysis


class AnalysisTracker:
    """`analyze` recorded over training: the bottleneck as it forms.

    For featurelab's trainer pass it as a callback (``train(..., callbacks=[tracker])``): ``on_log`` analyses
    at every history row and adds ``k_mid`` and ``min_rep_rank`` to it. In your own loop call
    ``tracker.step(model)`` once per step; it analyses at steps 0, every, 2·every, ...

    X, Y: the data to analyse on (None: weights only). every: steps between analyses in `step`.
    options: keyword arguments of `analyze`.
    """

    def __init__(self, X=None, Y=None, every: int = 100, **options):
        self.X, self.Y, self.options = X, Y, options
        self.every = int_at_least("every", every, 1)
        self.steps: list[int] = []
        self.results: list[ModelAnalysis] = []
        self._calls = 0

    def record(self, step: int, model: nn.Module) -> ModelAnalysis:
        """Analyse `model` now and store the result under `step`."""
        res = analyze(model, self.X, self.Y, **self.options)
        self.steps.append(int(step))
        self.results.append(res)
        return res

    def step(self, model: nn.Module) -> ModelAnalysis | None:
        """Count one training step; analyse when the count is a multiple of `every` (from 0)."""
        k, self._calls = self._calls, self._calls + 1
        return self.record(k, model) if k % self.every == 0 else None

    def on_log(self, step: int, model: nn.Module, row: dict) -> None:
        """featurelab trainer callback: analyse and add the headline numbers to the history row."""
        res = self.record(step, model)
        row["k_mid"] = res.summary["bottleneck"]["k_mid"] if res.summary["bottleneck"] else np.nan
        if "representation_bottleneck" in res.summary:
            row["min_rep_rank"] = res.summary["representation_bottleneck"]["effective_rank"]

    def balance_drift(self) -> pd.DataFrame:
        """Per recorded step: max over units of |q_i(t) − q_i(t_0)| / ‖θ(t_0)‖², q_i = ‖w_in,i‖² + b_i² − ‖w_out,i‖²
        (every paired unit, biases and any number of outputs included), ‖θ‖² the weights' plus biases' squared
        norm at the first record. q_i is invariant under gradient flow of an unregularized loss of a positively
        homogeneous net (docs/analyze.md, Balancedness), so under gradient descent with step η the drift over a
        fixed time is O(η) (each step changes q_i by η²(‖g_in,i‖² − ‖g_out,i‖²)); with λ‖θ‖² it decays as e^{−4λt}."""
        if not self.results:
            raise FeaturelabError("the tracker has recorded nothing yet: call step() or train with it first")
        first = self.results[0]
        scale = float(first.layers["frobenius_sq"].sum() + first.layers["bias_sq"].sum())
        rows = []
        for s, r in zip(self.steps, self.results):
            drift = max((float(np.abs(r.balance[k] - v).max()) for k, v in first.balance.items()), default=np.nan)
            rows.append({"step": s, "drift": drift / scale})
        return pd.DataFrame(rows)

    def _stacked(self, attr: str) -> pd.DataFrame:
        frames = [getattr(r, attr).assign(step=s) for s, r in zip(self.steps, self.results)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @property
    def layers(self) -> pd.DataFrame:
        """Every recorded `layers` table, with a `step` column."""
        return self._stacked("layers")

    @property
    def representations(self) -> pd.DataFrame:
        """Every recorded `representations` table, with a `step` column."""
        return self._stacked("representations")

    def plot(self, column: str = "effective_rank"):
        """`column` of each weight layer (left) and each hidden representation (right) against the step:
        the bottleneck forming along training. Returns the matplotlib Figure."""
        if not self.results:
            raise FeaturelabError("the tracker has recorded nothing yet: call step() or train with it first")
        frames = [("weight layers", self.layers)]
        reps = self.representations
        if len(reps):
            frames.append(("representations", reps[~reps["type"].isin(["input", "output"])]))
        fig, axes = plt.subplots(1, len(frames), figsize=(6 * len(frames), 4), squeeze=False)
        for ax, (title, df) in zip(axes[0], frames):
            names = list(dict.fromkeys(df["name"]))
            for i, name in enumerate(names):
                part = df[df["name"] == name]
                ax.plot(part["step"], part[column], color=plt.cm.viridis(i / max(len(names) - 1, 1)), label=name)
            ax.set_xlabel("step")
            ax.set_ylabel(column)
            ax.set_title(f"{title}: {column} (dark = early layers)")
            if len(names) <= 12:
                ax.legend(fontsize=6)
        fig.tight_layout()
        return fig
