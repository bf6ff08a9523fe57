"""`ModelAnalysis`: the tables and summary `analyze` returns, its figure and its self-contained report."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ..figures import plt, save_figure
from ..io import write_json, write_text
from ..runs.report import figures_html, mapping_table, page_head, tables_html
from .weightwatcher import EVALS_THRESH, MIN_FIT


@dataclass(frozen=True)
class ModelAnalysis:
    """What `analyze` measured.

    layers: one row per weight layer in forward order (`layers.layer_model`): name, type, kind (linear,
        conv, grouped conv, attention q/k/v/out, embedding, token, parameter), shape (as stored), matrix (rows
        x cols of the operator read), groups, folded (the BatchNorm folded in), sv1..svK, frobenius_sq,
        bias_sq, stable_rank, nuclear_rank, effective_rank, entropy_rank, numerical_rank, count_rebalanced
        (#{s_i > threshold} after rebalancing, leaky-ReLU chains only), next (the paired layer), via (the maps between),
        balance_mean / balance_residual (this layer's units: mean of in − out and max |in − out|/(in + out)),
        alignment (with the next layer), the conv operator's operator_input, operator_method,
        operator_sv1..svK, operator_stable_rank (with data; `conv_operator`), and WeightWatcher's columns ww_*
        (`weightwatcher.columns`; docs/analyze.md maps them).
    representations: one row per hooked representation (input, each activation or block call, output):
        name, type, shape (per sample), rows (N, or N·T read per token), units, sv1..svK (of the centred A/√N),
        the five ranks, coi_gamma, dead_share.
    norms: one row per normalisation module: name, type, status (folded into which layer, or why no pair
        crosses it). attention: one row per attention head (`attention.head_rows`).
    summary: scalars: bottleneck estimate, representation bottleneck, fit, Jacobian/NTK, seconds, notes.
    spectra, representation_spectra, balance: full singular values and per-neuron in − out, by name.
    esd: WeightWatcher's eigenvalues of each layer (`weightwatcher.esd`), by name (empty with weightwatcher=False).
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
    esd: dict = field(default_factory=dict, repr=False)

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

    def plot_esd(self, columns: int = 6):
        """One small log-log panel per layer: the histogram of WeightWatcher's eigenvalues above 1e-5 (a density
        on log-spaced bins), the fitted power law p(λ) = (α − 1)/λ_min·(λ/λ_min)^(−α) on λ >= λ_min, weighted by
        the tail's share of the eigenvalues so it overlays the histogram, and λ_min as a dotted line; titled with
        α ± σ, or "n < 20: no fit" when the fit columns are NaN. One legend below the panels. Returns the Figure."""
        rows = self.layers.set_index("name")
        names = list(self.esd)
        ncols = min(columns, len(names))
        nrows = -(-len(names) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(2.3 * ncols, 2.0 * nrows), squeeze=False)
        for ax in axes.ravel()[len(names) :]:
            ax.set_visible(False)
        for ax, name in zip(axes.ravel(), names):
            _esd_panel(ax, name, np.asarray(self.esd[name]), rows.loc[name])
        handles = [
            Line2D([], [], color="tab:blue", lw=6, alpha=0.5, label="ESD (density)"),
            Line2D([], [], color="tab:red", ls="--", label="power-law fit on the tail"),
            Line2D([], [], color="k", ls=":", label="λ_min"),
        ]
        fig.tight_layout()
        fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
        return fig

    def report(self, folder: str | Path, title: str = "model analysis") -> Path:
        """Write ``folder/report.html`` (self-contained: figures inline) with ``tables/layers.csv``,
        ``tables/representations.csv`` (and ``norms.csv``, ``attention.csv`` when there are any),
        ``figures/analysis.png|svg``, ``figures/esd.png|svg`` (`plot_esd`, when there are eigenvalues) and
        ``summary.json``; returns the report's path."""
        folder = Path(folder)
        write_text(folder / "tables" / "layers.csv", self.layers.to_csv(index=False))
        for name in ("representations", "norms", "attention"):
            table = getattr(self, name)
            if len(table):
                write_text(folder / "tables" / f"{name}.csv", table.to_csv(index=False))
        save_figure(self.plot(), folder / "figures", "analysis")
        if self.esd:
            save_figure(self.plot_esd(), folder / "figures", "esd")
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


def _esd_panel(ax, name: str, evals: np.ndarray, row) -> None:
    """One panel of `ModelAnalysis.plot_esd`: layer `name`'s eigenvalues and its row's ww_alpha, ww_xmin,
    ww_sigma, ww_num_pl_spikes."""
    x = np.sort(evals[evals > EVALS_THRESH])
    if len(x) == 0:
        ax.set_title(f"{name}: no eigenvalue > 1e-5", fontsize=7)
        return
    lo, hi = (x[0], x[-1]) if x[-1] > x[0] else (x[0] / 1.1, x[0] * 1.1)
    bins = np.geomspace(lo, hi, max(5, min(40, len(x) // 2)) + 1)
    ax.hist(x, bins=bins, density=True, color="tab:blue", alpha=0.5)
    alpha, xmin = float(row["ww_alpha"]), float(row["ww_xmin"])
    if np.isfinite(alpha):
        grid = np.geomspace(xmin, x[-1], 50)
        share = float(row["ww_num_pl_spikes"]) / len(x)
        ax.plot(grid, share * (alpha - 1) / xmin * (grid / xmin) ** (-alpha), color="tab:red", ls="--")
        ax.axvline(xmin, color="k", ls=":", lw=1)
        title = f"{name}\nα = {alpha:.2f} ± {float(row['ww_sigma']):.2f}"
    else:
        title = f"{name}\nn = {len(x)} < {MIN_FIT}: no fit"
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        if hi < 10 * lo:  # less than a decade: short labels at 2 and 5 times the powers of ten, else decades only
            axis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
            axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:.2g}"))
        else:
            axis.set_minor_formatter(NullFormatter())
    ax.set_title(title, fontsize=7)
    ax.tick_params(which="both", labelsize=6)
