"""`width-plateau`: the minimal L2-regularized loss stops improving beyond a small width n*, and every
trained network can be shrunk exactly (Jacot, Golikov, Hongler, Gabriel 2022, arXiv 2205.15809, Fig. 2;
docs/theory/sparsity.md §4-§6).

For each dataset and hidden width w (uniform over the L-1 hidden layers) several trials are trained
(Adam, then full-batch GD); m(w) = min over trials of L_λ = C + λ‖θ‖² (float64, on the training set) and
the plateau start is n*(τ) = min{w : m(w) <= (1+τ)·min_w m(w)}. Every trained network is then passed
through `caratheodory_reduce` (and `merge_aligned_neurons`) to measure the width it really needs.

Datasets: "digits" (sklearn digits, 1000 train / 797 test, mean cross-entropy), "teacher" (x ~ N(0, I_10),
a random ReLU teacher of depth 3 and width 8 with standardized outputs, MSE) and "mnist" (local files).
quick: digits and teacher with the widths and schedules of docs/theory/sparsity.md §6, except that digits trains twice
as long (Adam 4000 + GD 1000; ours, §8.5): with 2000 + 500 steps the wide nets were still improving, and
m(32) ended 1.01 m(64) (a cosine Adam schedule did worse). paper (for a GPU): both panels of Fig. 2, MNIST 60k
and the teacher with N = 1000, 15 widths in [1, 200] x 3 trials each, Adam 10k + GD 5k.
For classification the analysis also computes Prop. 14's width bound for the one-hot labels, cp-rank(M_Y)
(`cp_rank_bounds`), the paper's explanation of a plateau near the number of classes.
m(w) is a minimal loss: every unit is certified (Clarke residual <= the config's `certify`, `CERTIFY` by default;
`featurelab.training.certify`) and the claims on m(w) (premise "critical") are judged on the trained nets and again
on the certified points, where they are "not measured" when a minimiser is not certified (docs/reproduction.md, "How
a verdict is judged"). The Carathéodory claims hold for any network (kind "identity"); the test error is a property
of the trained nets (no premise).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, PositiveFloat, PositiveInt

from ..catalog import Entry
from ..claims import Threshold, all_of_claim, threshold_claim
from ..config import ExperimentConfig
from ..data import Dataset, digits, mnist
from ..data.mnist import require_mnist
from ..figures import plt
from ..measurements.representations import regularized_loss
from ..measurements.sparsity import caratheodory_reduce, cp_rank_bounds, merge_aligned_neurons, output_gram_root
from ..models import MLP
from ..models.mlp import mlp_with_weights
from ..training import OptimizerConfig
from ..training.objectives import data_cost, error_rate
from ..training.plateaus import plateau_start
from .base import Analysis, Experiment, TrainingUnit

TAUS = (0.01, 0.025, 0.05, 0.10)
REF = "Jacot, Golikov, Hongler, Gabriel 2022 (arXiv 2205.15809) Fig. 2; docs/theory/sparsity.md §6"
# "Claims for a reproduction" of docs/theory/sparsity.md §6: the paper's Fig. 2 shows the plateau; these readings of
# it (where it starts, how far a narrow width stays above it) are ours, calibrated on the figure's m(w).
_FIG2 = "Jacot et al. 2022 Fig. 2, read in docs/theory/sparsity.md §6 (ours)"
DIGITS_M4_GAP = Threshold(1.4, ">=", source=f"{_FIG2}: m(4) >= 1.4 m_inf on digits")
DIGITS_START = (
    Threshold(8, ">=", source=f"{_FIG2}: n*(5%) in [8, 16]"),
    Threshold(16, "<=", source=f"{_FIG2}: n*(5%) in [8, 16]"),
)
DIGITS_NSTAR_1PCT = Threshold(48, "<=", source=f"{_FIG2}: n*(1%) <= 48")
DIGITS_TEST_ERROR = Threshold(0.05, "<=", ceiling=0.0, source=f"{_FIG2}: test error <= 5% at w >= 16 (observed 2.5-3%)")
TEACHER_M1_GAP = Threshold(5, ">=", source="ours: m(1) >= 5 m_inf on the teacher (observed 14x, sparsity.md §6)")
TEACHER_START = (
    Threshold(6, ">=", source="ours: n*(10%) in [6, 32] on the teacher (observed 12)"),
    Threshold(32, "<=", source="ours: n*(10%) in [6, 32] on the teacher (observed 12)"),
)
FAILED_TRIALS = Threshold(
    1.1,
    ">",
    source="Jacot et al. 2022 Fig. 2 right and App. A: 'failed' trials, small dots with a loss above the plateau "
    "even for large widths; above = beyond the 10% of n*(10%) (ours)",
)
MNIST_START = (
    Threshold(8, ">=", source=f"{_FIG2}: n*(5%) in [8, 20] on MNIST"),
    Threshold(20, "<=", source=f"{_FIG2}: n*(5%) in [8, 20] on MNIST"),
)
CARATHEODORY = Threshold(
    1e-8, "<=", ceiling=0.0, source="ours: the reduction keeps the outputs, up to float64 rounding"
)
NO_LOSS_RISE = Threshold(
    1e-12,
    "<=",
    source="Jacot et al. 2022 §5: the reduction never raises L_λ; beyond the first-order change of the data cost "
    "that the outputs' own rounding (the check above) allows, 1e-12 rounding",
)
CERTIFY = 1e-6  # stationarity a unit must reach for the claims about minima (`featurelab.training.critical`)


class Sweep(OptimizerConfig):
    """One dataset's width sweep (docs/theory/sparsity.md §5d) and its schedule of docs/theory/sparsity.md §6: Adam
    (constant or cosine lr), then full-batch GD (either may have 0 steps)."""

    widths: list[PositiveInt] = Field(min_length=1)
    trials: int = Field(default=2, ge=1, le=1000)
    depth: int = Field(default=3, ge=2)
    bias: float = Field(default=1.0, ge=0)
    lam: float = Field(default=1e-3, gt=0)
    adam_steps: int = Field(default=2000, ge=0)
    adam_lr: float = Field(default=1e-2, gt=0)
    adam_lr_min: float = Field(default=1e-4, ge=0)
    gd_steps: int = Field(default=500, ge=0)
    log_every: int = Field(default=500, ge=1)


class Config(ExperimentConfig):
    datasets: list[Literal["digits", "teacher", "mnist"]] = Field(default=["digits", "teacher"], min_length=1)
    digits: Sweep = Sweep(widths=[2, 4, 6, 8, 10, 12, 16, 24, 32, 64], trials=2, adam_steps=4000, gd_steps=1000)
    teacher: Sweep = Sweep(widths=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64], trials=3, adam_steps=3000, gd_steps=1000)
    mnist: Sweep = Sweep(
        widths=[1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128, 200],
        trials=3,
        adam_steps=10000,
        adam_lr=1e-3,
        gd_steps=5000,
    )
    digits_n_train: int = Field(default=1000, ge=10)
    teacher_d_in: int = Field(default=10, ge=1)
    teacher_width: int = Field(default=8, ge=1)
    teacher_depth: int = Field(default=3, ge=1)
    teacher_d_out: int = Field(default=1, ge=1)
    teacher_n_train: int = Field(default=200, ge=2)
    teacher_n_test: int = Field(default=1000, ge=0)
    mnist_path: str | None = None
    dtype: Literal["float32", "float64"] = "float32"
    certify: PositiveFloat | None = Field(
        default=CERTIFY, description="Clarke-residual tolerance of each unit's critical-point certificate (None: none)"
    )


PRESETS = {
    "quick": {},
    "tiny": {
        "digits": {"widths": [4, 16], "trials": 1, "adam_steps": 200, "gd_steps": 50},
        "teacher": {"widths": [1, 8], "trials": 1, "adam_steps": 200, "gd_steps": 50},
    },
    "paper": {
        "datasets": ["mnist", "teacher"],
        "teacher": {
            "widths": [1, 2, 3, 4, 6, 8, 10, 12, 16, 24, 32, 48, 64, 128, 200],
            "trials": 3,
            "adam_steps": 10000,
            "adam_lr": 1e-3,
            "gd_steps": 5000,
        },
        "teacher_n_train": 1000,
    },
}
# paper-cpu: "paper"'s teacher panel only (the MNIST panel, 45 full-batch nets on 60k images, is days on 2 CPU cores)
PRESETS["paper-cpu"] = {**PRESETS["paper"], "datasets": ["teacher"]}
OBJECTIVE: dict[str, Literal["mse", "cross_entropy"]] = {
    "digits": "cross_entropy",
    "mnist": "cross_entropy",
    "teacher": "mse",
}


def teacher_data(cfg: Config) -> Dataset:
    """Gaussian inputs through a random He-initialized ReLU MLP (biases drawn N(0, 0.1)), outputs
    standardized with train+test statistics; rows are samples (docs/theory/sparsity.md §6 teacher-quick)."""
    teacher = MLP(
        cfg.teacher_d_in,
        cfg.teacher_d_out,
        cfg.teacher_width,
        cfg.teacher_depth,
        bias=1.0,
        dtype=torch.float64,
        seed=cfg.seed + 7,
    )
    gen = torch.Generator().manual_seed(cfg.seed + 8)
    with torch.no_grad():
        for W in teacher.weights:
            W[:, -1] = 0.1 * torch.randn(W.shape[0], generator=gen, dtype=torch.float64)
        X = torch.randn(cfg.teacher_n_train + cfg.teacher_n_test, cfg.teacher_d_in, generator=gen, dtype=torch.float64)
        Y = teacher(X)
    Y = (Y - Y.mean(0)) / Y.std(0).clamp_min(1e-12)
    n = cfg.teacher_n_train
    return Dataset(
        X[:n],
        Y[:n],
        X[n:],
        Y[n:],
        None,
        {"name": "gaussian_teacher", "width": cfg.teacher_width, "depth": cfg.teacher_depth, "seed": cfg.seed + 7},
    )


def make_data(cfg: Config, dataset: str) -> Dataset:
    if dataset == "digits":
        return digits(cfg.digits_n_train, seed=cfg.seed)
    if dataset == "teacher":
        return teacher_data(cfg)
    return mnist(cfg.mnist_path)


def units(cfg: Config) -> list[dict]:
    return [
        {"id": f"{d}-w{w}-t{t}", "dataset": d, "width": w, "trial": t}
        for d in cfg.datasets
        for w in getattr(cfg, d).widths
        for t in range(getattr(cfg, d).trials)
    ]


def build(cfg: Config, unit: dict) -> TrainingUnit:
    sweep: Sweep = getattr(cfg, unit["dataset"])
    data = make_data(cfg, unit["dataset"])
    model = MLP(
        data.d_in,
        data.d_out,
        unit["width"],
        sweep.depth,
        bias=sweep.bias,
        dtype=getattr(torch, cfg.dtype),
        seed=cfg.seed + 1000 * unit["trial"] + unit["width"],
    )
    config = sweep.train_config(OBJECTIVE[unit["dataset"]], sweep.lam, top_singular_values=0)
    return TrainingUnit(model, data, config, certify=cfg.certify)


def shrink(model, data: Dataset, objective: str, lam: float) -> dict:
    """Float64 loss, gradient norm, test error, and the exact reductions (5a, 5b) of one trained MLP."""
    net = mlp_with_weights(model, [w.detach() for w in model.weights])
    X, Y = data.X_train.double(), data.Y_train if data.n_classes else data.Y_train.double()
    total = data_cost(objective, net(X), Y) + net.penalty(lam)
    loss = float(total.detach())
    grads = torch.autograd.grad(total, list(net.parameters()))
    grad_norm = float(torch.sqrt(torch.stack([(g**2).sum() for g in grads]).sum()))
    reduced, report = caratheodory_reduce(net, X)
    merged, _ = merge_aligned_neurons(net, X)
    with torch.no_grad():
        out, out_r = net(X), reduced(X)
        test_error = (
            float(
                error_rate(
                    objective, net(data.X_test.double()), data.Y_test if data.n_classes else data.Y_test.double()
                )
            )
            if len(data.X_test)
            else float("nan")
        )
        train_error = float(error_rate(objective, out, Y))
    return {
        "loss": loss,
        "cost": loss - lam * float(net.sq_norm().detach()),
        "sq_norm": float(net.sq_norm().detach()),
        "grad_norm": grad_norm,
        "train_error": train_error,
        "test_error": test_error,
        "alive": (report["width_before"] - report["dead"]).tolist(),
        "merged_width": merged.dims[1:-1],
        "reduced_width": reduced.dims[1:-1],
        "reduced_rank": report["rank"].tolist(),
        "gram_error": float(report["gram_error"].max()),
        "reduced_output_error": float((out_r - out).abs().max() / out.abs().max()),
        "reduced_loss": regularized_loss(reduced, X, Y, lam, objective=objective),
        "reduced_output_slack": output_slack(objective, out, out_r, Y),
    }


def output_slack(objective: str, out: torch.Tensor, out_reduced: torch.Tensor, Y: torch.Tensor) -> float:
    """``Σ_ij |∂C/∂f_ij|·|f'_ij − f_ij|``: to first order, the most the data cost C can move when the outputs `out`
    (N x d_out) move to `out_reduced` (a reduction that keeps the outputs, up to rounding). The reduction's loss is
    compared with the trained net's beyond this."""
    f = out.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(data_cost(objective, f, Y), f)
    return float((grad.abs() * (out_reduced - out).abs()).sum())


def finish(cfg: Config, unit: dict, model, result, ctx) -> dict:
    sweep: Sweep = getattr(cfg, unit["dataset"])
    data = make_data(cfg, unit["dataset"])
    return {**unit, **shrink(model, data, OBJECTIVE[unit["dataset"]], sweep.lam), "train_seconds": result.seconds}


def per_width(rows: pd.DataFrame) -> pd.DataFrame:
    """m(w) = min over trials, with the chosen (argmin) run's numbers and unit id."""
    chosen = rows.loc[rows.groupby("width")["loss"].idxmin()].sort_values("width")
    return (
        chosen[
            [
                "id",
                "width",
                "loss",
                "cost",
                "sq_norm",
                "train_error",
                "test_error",
                "grad_norm",
                "trial",
                "reduced_width",
                "merged_width",
                "alive",
            ]
        ]
        .rename(columns={"loss": "m"})
        .reset_index(drop=True)
    )


def onehot_cp_rank(labels: torch.Tensor) -> list[int | None]:
    """[lower, upper] bounds on cp-rank(M_Y) for one-hot labels (Prop. 14's width bound for X = I_N); the
    factor Y diag(N_c^{-1/4}) gives the upper bound, the rank the lower one."""
    Y = torch.nn.functional.one_hot(labels.long()).to(torch.float64)
    b = cp_rank_bounds(output_gram_root(Y), factor=Y * Y.sum(0).clamp_min(1) ** -0.25, rtol=1e-9)
    return [b.lower, b.upper]


def interval_claim(statement: str, reference: str, measured: float, interval: tuple[Threshold, Threshold], **kw):
    """The claim lo <= `measured` <= hi for ``interval = (Threshold(lo, ">="), Threshold(hi, "<="))``, its margin
    the smaller of the two sides'."""
    lo, hi = interval
    return all_of_claim(
        statement,
        reference,
        [(measured, lo), (measured, hi)],
        expected=f"[{lo.bound:g}, {hi.bound:g}]",
        measured=measured,
        **kw,
    )


def plateau_claims(d: str, table: pd.DataFrame, m_at: dict, m_inf: float, nstar: dict) -> list:
    """The claims of Fig. 2 on one dataset's m(w): the gap of a narrow width and where the plateau starts
    (statements about the minimal loss: premise "critical"), and the test error of the wide nets."""
    if d == "teacher":
        gap = (
            []
            if 1 not in m_at
            else [
                threshold_claim(
                    "teacher: width 1 is far from the plateau: m(1)/m_inf",
                    REF,
                    m_at[1] / m_inf,
                    TEACHER_M1_GAP,
                    id="teacher-m1-gap",
                    premise="critical",
                )
            ]
        )
        start = interval_claim(
            "teacher: n*(10%)", REF, nstar["0.1"], TEACHER_START, id="teacher-plateau-start", premise="critical"
        )
        return [*gap, start]
    if d != "digits":
        return [
            interval_claim(
                "MNIST: n*(5%)", REF, nstar["0.05"], MNIST_START, id="mnist-plateau-start", premise="critical"
            )
        ]
    claims = (
        []
        if 4 not in m_at
        else [
            threshold_claim(
                "digits: a width-4 net is clearly worse than the plateau: m(4)/m_inf",
                REF,
                m_at[4] / m_inf,
                DIGITS_M4_GAP,
                id="digits-m4-gap",
                premise="critical",
            )
        ]
    )
    claims += [
        interval_claim(
            "digits: the plateau starts near 10, n*(5%)",
            REF,
            nstar["0.05"],
            DIGITS_START,
            id="digits-plateau-start",
            premise="critical",
        ),
        threshold_claim(
            "digits: n*(1%)", REF, nstar["0.01"], DIGITS_NSTAR_1PCT, id="digits-nstar-1pct", premise="critical"
        ),
    ]
    big = table[table["width"] >= 16]
    if len(big):
        claims.append(
            threshold_claim(
                "digits: test error of the chosen run at every width >= 16 (max)",
                REF,
                float(big["test_error"].max()),
                DIGITS_TEST_ERROR,
                id="digits-test-error",
            )
        )
    return claims


def failed_trials_claim(sub: pd.DataFrame, m_inf: float, n_star: float):
    """Fig. 2 right shows every trial, not only their minimum: at widths on the plateau (w >= n*(10%)) some trials
    stay above it. Measured on the healthy teacher trials there (a collapsed trial is an unhealthy unit, left out):
    the largest L_λ/m_inf, against 1.1; the share above 1.1 is reported. "Not measured" with one trial per width."""
    on = sub[sub["width"] >= n_star]
    if "unhealthy" in on:
        on = on[on["unhealthy"].fillna("") == ""]
    ratios = (on["loss"] / m_inf).to_numpy()
    worst = float(ratios.max()) if len(ratios) else float("nan")
    c = threshold_claim(
        "teacher: individual trials, Fig. 2 right: some trials stay above the plateau even at large widths ('failed' "
        f"trials): the largest L_λ/m_inf over the {len(ratios)} healthy trials at widths >= n*(10%) = {n_star:g} "
        f"(share above 1.1: {float((ratios > 1.1).mean()) if len(ratios) else float('nan'):.3g}); the 10% is ours",
        f"{REF}; App. A",
        worst,
        FAILED_TRIALS,
        id="teacher-failed-trials",
    ).rests_on(on["id"])
    if sub.groupby("width")["trial"].nunique().max() < 2:
        return c.not_measured("one trial per width: the figure's individual trials need several")
    return c


def reduction_claims(d: str, healthy: pd.DataFrame) -> list:
    """The Carathéodory reduction keeps every healthy net's outputs and never raises its regularized loss (checks of
    the code), each resting on those nets."""
    claims = [
        threshold_claim(
            f"{d}: Carathéodory reduction keeps every healthy trained network's training outputs "
            f"({len(healthy)} networks): max|Δf|/max|f| (float64)",
            "Jacot et al. 2022 (arXiv 2205.15809) §5; docs/theory/sparsity.md §5b",
            float(healthy["reduced_output_error"].max()),
            CARATHEODORY,
            id=f"{d}-caratheodory-outputs",
            kind="identity",
        ),
        threshold_claim(
            f"{d}: Carathéodory reduction never increases the regularized loss "
            f"({len(healthy)} healthy networks): max (L' - L - s)/L, up to rounding, with s = Σ|∂C/∂f||Δf| the "
            "first-order change of the data cost the outputs' rounding allows",
            "Jacot et al. 2022 (arXiv 2205.15809) §5; docs/theory/sparsity.md §5b step 6",
            float(
                ((healthy["reduced_loss"] - healthy["loss"] - healthy["reduced_output_slack"]) / healthy["loss"]).max()
            ),
            NO_LOSS_RISE,
            id=f"{d}-caratheodory-loss",
            kind="identity",
        ),
    ]
    return [c.rests_on(healthy["id"]) for c in claims]


def dataset_summary(cfg: Config, d: str, sub: pd.DataFrame, table: pd.DataFrame) -> dict:
    """One dataset's m(w) (`table`: the minimising trial per width), its minimum, n*(τ), the widths where m rises
    by > 1%, and the widths the reduction keeps."""
    widths, m = table["width"].tolist(), table["m"].tolist()
    out = {
        "m": dict(zip(map(str, widths), m)),
        "m_inf": min(m),
        "n_star": {f"{tau:g}": plateau_start(widths, m, tau) for tau in TAUS},
        "non_monotone_widths": [widths[i + 1] for i in range(len(m) - 1) if m[i + 1] > m[i] * 1.01],
        "reduced_width_max": [int(x) for x in np.max(np.stack(sub["reduced_width"].tolist()), axis=0)],
    }
    if d != "teacher":
        out["prop14_width_bound"] = onehot_cp_rank(make_data(cfg, d).Y_train)
    return out


def plot_dataset(axes, d: str, table: pd.DataFrame, n_star_5: float, sub: pd.DataFrame) -> None:
    """One dataset's curves: m(w) with every trial as a small dot (Fig. 2 right), the test error, the reduced
    widths."""
    widths, m = table["width"].tolist(), table["m"].tolist()
    axes[0].plot(widths, np.array(m) / min(m), marker="o", label=d)
    color = axes[0].lines[-1].get_color()
    axes[0].scatter(sub["width"], sub["loss"] / min(m), s=8, color=color, alpha=0.5)
    axes[0].axvline(n_star_5, ls=":", color=color)
    axes[1].plot(widths, table["test_error"], marker="o", label=d)
    for l in range(len(table["reduced_width"].iloc[0])):
        axes[2].plot(widths, [r[l] for r in table["reduced_width"]], marker="o", label=f"{d}, layer {l + 1}")


def finish_figure(fig, axes, top: int):
    axes[0].set(
        xscale="log",
        yscale="log",
        xlabel="hidden width w",
        ylabel="m(w) / min m",
        title="min over trials of C + λ‖θ‖² (dots: each trial; dotted: n*(5%))",
    )
    axes[1].set(xscale="log", xlabel="hidden width w", ylabel="test error (chosen run)", title="test error")
    axes[2].plot([1, top], [1, top], color="0.7", lw=1, label="no reduction")
    axes[2].set(
        xscale="log",
        yscale="log",
        xlabel="hidden width w",
        ylabel="width after Carathéodory",
        title="width each trained net really needs",
    )
    for ax in axes:
        ax.legend(fontsize=8)
    return fig


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    rows = pd.DataFrame(results.values())
    claims, tables, summary, notes = [], {"runs": rows}, {}, []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for d in cfg.datasets:
        sub = rows[rows["dataset"] == d]
        if sub.empty:
            notes.append(f"{d}: no finished runs")
            continue
        table = per_width(sub)
        tables[f"{d}_per_width"] = table
        summary[d] = stats = dataset_summary(cfg, d, sub, table)
        if stats["non_monotone_widths"]:
            notes.append(
                f"{d}: m(w) rises by > 1% at widths {stats['non_monotone_widths']} (optimization failures, "
                "docs/theory/sparsity.md §5d)"
            )
        m_at = dict(zip(table["width"].tolist(), table["m"].tolist()))
        # m(w) is a min over trials: its claims rest on the chosen runs, not on a collapsed trial beside them
        claims += [c.rests_on(table["id"]) for c in plateau_claims(d, table, m_at, stats["m_inf"], stats["n_star"])]
        if d == "teacher":
            claims.append(failed_trials_claim(sub, stats["m_inf"], stats["n_star"]["0.1"]))
        healthy = sub[sub["unhealthy"].fillna("") == ""] if "unhealthy" in sub else sub
        if healthy.empty:
            notes.append(f"{d}: every network is unhealthy, so the Carathéodory reduction is not checked")
        else:
            claims += reduction_claims(d, healthy)
        plot_dataset(axes, d, table, stats["n_star"]["0.05"], sub)
    return Analysis(claims, {"width_plateau": finish_figure(fig, axes, max(rows["width"]))}, tables, summary, notes)


CATALOG = (
    Entry(
        "width-plateau",
        ("quick", "tiny", "paper", "paper-cpu"),
        "Jacot et al. 2022 Fig. 2: the loss plateaus in the width",
        32,
    ),
)

EXPERIMENT = Experiment(
    name="width-plateau",
    summary="The minimal L2-regularized loss is flat beyond a small width n* (sparsity), and Carathéodory "
    "reduction shrinks every trained network exactly.",
    reference="Jacot, Golikov, Hongler, Gabriel 2022, Feature Learning in L2-regularized DNNs (NeurIPS 2022, "
    "arXiv 2205.15809), Fig. 2; "
    "docs/theory/sparsity.md §4-§6",
    config=Config,
    presets=PRESETS,
    units=units,
    check=require_mnist,
    build=build,
    finish=finish,
    analyze=analyze,
)
