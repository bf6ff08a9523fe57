"""`ModelAnalysis`: the tables and summary `analyze` returns, its figure and its self-contained report."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..figures import plt, save_figure
from ..io import write_json, write_text
from ..runs.report import figures_html, mapping_table, page_head, tables_html


@dataclass(frozen=True)
class ModelAnalysis:
    """What `analyze` measured.

    layers: one row per weight layer in forward order (`layers.layer_model`): name, type, kind (linear,
        conv, grouped conv, attention q/k/v/out, embedding, token, parameter), shape (as stored), matrix (rows
        x cols of the operator read), groups, folded (the BatchNorm folded in), sv1..svK, frobenius_sq,
        bias_sq, stable_rank, nuclear_rank, effective_rank, entropy_rank, numerical_rank, count_rebalanced
        (#{s_i > threshold} after rebalancing, leaky-ReLU chains only), next (the paired layer), via (the maps between),
        balance_mean / balance_residual (this layer's units: mean of in − out and max |in − out|/(in + out)),
        alignment (with the next layer), and WeightWatcher's columns ww_norm, ww_spectral_norm,
        ww_stable_rank, ww_alpha, ww_alpha_weighted (docs/analyze.md maps them).
    representations: one row per hooked representation (input, each activation or block call, output):
        name, type, shape (per sample), units, sv1..svK (of the centred A/√N), the five ranks, coi_gamma,
        dead_share.
    norms: one row per normalisation module: name, type, status (folded into which layer, or why no pair
        crosses it). attention: one row per attention head (`attention.head_rows`).
    summary: scalars: bottleneck estimate, representation bottleneck, fit, Jacobian/NTK, seconds, notes.
    spectra, representation_spectra, balance: full singular values and per-neuron in − out, by name.
    """

    layers: pd.DataFrame
    representations: pd.DataFrame
    summary: dict
    spectra: dict = field(repr=False)
    representation_spectra: dict = field(repr=False)
    balance: dict = field(repr=False)
    rebalanced_spectra: dict = field(repr=False)
    norms: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    attention: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)

    def __str__(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.summary.items() if k != "notes"]
        lines += [f"note: {n}" for n in self.summary.get("notes", [])]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The analysis inline in a notebook: the summary as a two-column table, the notes, and the layers,
        representations and attention tables (4 significant digits), each in a box that scrolls sideways."""
        flat = {k: v for k, v in self.summary.items() if k != "notes"}
        parts = ["<h3>Summary</h3>", mapping_table(flat)]
        if self.summary.get("notes"):
            parts.append("<ul>" + "".join(f"<li>{html.escape(str(n))}</li>" for n in self.summary["notes"]) + "</ul>")
        for name in ("layers", "representations", "attention"):
            table = getattr(self, name)
            if len(table):
                body = table.to_html(index=False, float_format=lambda v: f"{v:.4g}", escape=True)
                parts.append(f"<h3>{name}</h3><div style='overflow-x:auto;max-width:100%'>{body}</div>")
        return "\n".join(parts)

    def plot(self):
        """The bottleneck picture: (a) every singular value of each weight layer along depth (after
        rebalancing when available, with the 0.1 threshold of k_mid); (b) the representation ranks along depth
        (when data was given). Returns the matplotlib Figure."""
        panels = 2 if len(self.representations) else 1
        fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
        ax = axes[0, 0]
        spectra = self.rebalanced_spectra or self.spectra
        names = list(spectra)
        count = max(len(s) for s in spectra.values())
        for i in range(count):  # s_i along depth, dark = large singular values
            ys = [s[i] if len(s) > i else np.nan for s in spectra.values()]
            ax.plot(range(len(names)), ys, marker="o", ms=2, lw=0.8, color=plt.cm.viridis(i / max(count - 1, 1)))
        if self.rebalanced_spectra:
            ax.axhline(self.summary["bottleneck"]["threshold"], color="k", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
        ax.set_title("weight spectra along depth" + (" (rebalanced)" if self.rebalanced_spectra else ""))
        if panels == 2:
            ax = axes[0, 1]
            reps = self.representations
            for col in ("effective_rank", "entropy_rank", "stable_rank", "numerical_rank", "coi_gamma"):
                ax.plot(range(len(reps)), reps[col], marker="o", ms=3, label=col)
            ax.set_xticks(range(len(reps)), reps["name"], rotation=60, fontsize=7)
            ax.set_yscale("log")
            ax.set_title("representation ranks along depth (centred)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        return fig

    def report(self, folder: str | Path, title: str = "model analysis") -> Path:
        """Write ``folder/report.html`` (self-contained: figures inline) with ``tables/layers.csv``,
        ``tables/representations.csv`` (and ``norms.csv``, ``attention.csv`` when there are any),
        ``figures/analysis.png|svg`` and ``summary.json``; returns the
        report's path."""
        folder = Path(folder)
        write_text(folder / "tables" / "layers.csv", self.layers.to_csv(index=False))
        for name in ("representations", "norms", "attention"):
            table = getattr(self, name)
            if len(table):
                write_text(folder / "tables" / f"{name}.csv", table.to_csv(index=False))
        save_figure(self.plot(), folder / "figures", "analysis")
        write_json(folder / "summary.json", self.summary)
        flat = {k: v for k, v in self.summary.items() if k != "notes"}
        parts = [
            page_head(title),
            f"<h1>{html.escape(title)}</h1>",
            "<p>Columns, formulas and sources: docs/analyze.md of featurelab.</p>",
            "<h2>Summary</h2>",
            mapping_table(flat),
        ]
        if self.summary.get("notes"):
            notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.summary["notes"])
            parts.append(f"<h2>Notes</h2><ul>{notes}</ul>")
        parts += figures_html(folder) + tables_html(folder) + ["</body></html>"]
        path = folder / "report.html"
        write_text(path, "\n".join(parts))
        return path
