"""`leaky-bottleneck`: a Leaky ResNet trained on a bottleneck teacher learns a k*-dimensional
bottleneck in its middle layers (Jacot & Kaiser 2024, arXiv 2405.17573, Fig. 1 at one L̃; docs/theory/leaky-resnets.md
§5).

quick: docs/theory/leaky-resnets.md §5.4 at L̃ = 8 (teacher 10→3→10, N = 256, w = 40, L = 16, λ = 0.02 **[ours]**),
Adam 20k cosine from lr 6e-3 (the defaults, 15k from 3e-3, stop before the bottleneck's edge layers separate:
docs/leaky-resnets.md), then 3000 float64 L-BFGS steps towards the critical point that F4 describes **[ours]** (the min
F4 gap rises from about 10 after Adam to above 20).
paper: docs/theory/leaky-resnets.md §5.2 (teacher 20→5→20, N = 1000, w = 200, L = 50, adaptive ρ, L̃ = 5), two units: λ
= 0.04, our calibration (App. B's "Mean Squared Error" read as a mean over the N·d_out entries: 0.002·d_out), and the
paper's literal λ = 0.002 (its loss (1/N)‖f(X) − Y‖²_F + (λ/2L̃)Σρ_l‖W_l‖²_F is ours, docs/theory/leaky-resnets.md §2);
Adam 20k at lr 1e-3 cosine-decayed to 1e-5 **[ours]**, then 10k steps of guarded GD at the smaller lr 1e-4, as App. B:
"briefly SGD with a smaller learning rate".
Claim `f4-bottleneck-gap` (Jacot & Kaiser 2024 Fig. 1, App. B "a clear separation between k* large values";
docs/theory/leaky-resnets.md §5.3 F4): in every bottleneck layer (W_l placed at p_{l-1} in [1/4, 3/4)) W_l has k*
dominant singular values, s_{k*} >= 10 s_{k*+1}; or k*+1 of them, s_{k*+1} >= 10 s_{k*+2}, where the extra one is the
bias direction: with the layer's mean input direction m = mean_i σ(A_{l-1})_i (the constant input, bias entry included)
removed, W_l(I - m̂m̂ᵀ) has k* dominant values, s_{k*} >= 10 s_{k*+1} (`mean_free_weights`; docs/leaky-resnets.md).
F4 is the paper's observation on trained nets (Fig. 1, App. B), not a statement at critical points: no premise;
the units are certified all the same, so that the report gives how far from a critical point the F4 net is.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields
from typing import Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from ..catalog import Entry
from ..claims import Threshold, all_of_claim
from ..config import ExperimentConfig
from ..data import bottleneck_teacher
from ..figures import plt
from ..io import read_csv
from ..measurements import effective_rank, singular_values
from ..models import LeakyResNet
from ..runtime import check_memory
from ..training import Phase, TrainConfig
from .base import Analysis, Experiment, TrainingUnit


class Config(ExperimentConfig):
    teacher_dims: list[PositiveInt] = Field(default=[10, 3, 10], min_length=3)
    teacher_kind: Literal["fcnn", "resnet"] = "fcnn"
    teacher_hidden: int = Field(default=64, ge=1)
    n_train: int = Field(default=256, ge=2)
    n_test: int = Field(default=256, ge=0)
    width: int = Field(default=40, ge=1)
    depth: int = Field(default=16, ge=1)
    effective_depth: float = Field(default=8.0, gt=0)
    steps: Literal["equidistant", "irregular", "adaptive"] = "equidistant"
    lam: float = Field(default=0.02, gt=0)
    lams: list[PositiveFloat] = Field(
        default=[], description="further λ, one unit each next to `lam` (the paper preset: the paper's literal 0.002)"
    )
    adam_steps: int = Field(default=15000, ge=0)
    adam_lr: float = Field(default=3e-3, gt=0)
    adam_lr_min: float = Field(default=3e-6, ge=0)
    adam_schedule: Literal["constant", "cosine"] = "cosine"
    gd_steps: int = Field(default=0, ge=0)
    gd_lr: float = Field(default=1e-4, gt=0)
    lbfgs_steps: int = Field(default=0, ge=0)
    lbfgs_lr: float = Field(default=1.0, gt=0)
    log_every: int = Field(default=250, ge=1)
    checkpoint_every: int = Field(default=2500, ge=0)
    dtype: Literal["float32", "float64"] = "float32"
    certify: PositiveFloat | None = Field(
        default=1e-6,
        description="Clarke-residual tolerance of each unit's critical-point certificate (None: not certified)",
    )

    @model_validator(mode="after")
    def _valid_steps(self):
        """ρ_l·L̃ < 1 for the chosen scheme (docs/theory/leaky-resnets.md §2): checked here, before any training."""
        check_depth(self.depth, self.effective_depth, self.steps)
        return self


def check_depth(depth: int, Lt: float, steps: str) -> None:
    """Raise ValueError unless `steps` with `depth` steps keeps ρ_l·L̃ < 1 at effective depth Lt
    (docs/theory/leaky-resnets.md §2)."""
    ok = {"equidistant": depth > Lt, "irregular": depth > (1 + 0.5 / 4) * Lt, "adaptive": depth >= Lt / 0.9}[steps]
    if not ok:
        raise ValueError(
            f"depth={depth} is too small for effective_depth={Lt:g} with {steps} steps "
            "(Jacot & Kaiser 2024 §2 needs rho_l·effective_depth < 1): raise depth or lower effective_depth"
        )


REFERENCE = "Jacot & Kaiser 2024 (arXiv 2405.17573) Fig. 1 and App. B; docs/theory/leaky-resnets.md §5.3 F4"
PAPER_LAM = 0.002  # Jacot & Kaiser 2024 App. B's λ; the loss it multiplies is ours (docs/theory/leaky-resnets.md §2)

PRESETS = {
    # F4 carries no critical-point premise, so the quick and paper presets skip certification: the quick net is
    # certified (a strict minimum) but its continuation takes about 29 times the unit's training
    # (docs/theory/conventions.md, "What it reaches"); `--set certify=1e-8` runs it
    "quick": {"adam_steps": 20000, "adam_lr": 6e-3, "lbfgs_steps": 3000, "certify": None},
    "tiny": {
        "n_train": 64,
        "n_test": 64,
        "width": 16,
        "depth": 8,
        "effective_depth": 2.0,
        "adam_steps": 300,
        "log_every": 50,
        "checkpoint_every": 100,
        "certify": None,  # a smoke test: its nets stop far from a critical point (stationarity ~0.1), no polish
    },
    "paper": {
        "certify": None,
        "teacher_dims": [20, 5, 20],
        "teacher_hidden": 100,
        "n_train": 1000,
        "n_test": 1000,
        "width": 200,
        "depth": 50,
        "effective_depth": 5.0,
        "steps": "adaptive",
        "lam": 0.04,  # [ours] calibration: App. B's "MSE" read as a per-entry mean, 0.002·d_out (docs/leaky-resnets.md)
        # the paper's literal λ: its loss is ours (docs/theory/leaky-resnets.md §2), run and reported next to it
        "lams": [PAPER_LAM],
        "adam_steps": 20000,  # App. B: "20000 epochs" (full batch: one step each)
        "adam_lr": 1e-3,
        "adam_schedule": "cosine",  # [ours] at a constant lr the penalty was still falling after 20k steps
        "adam_lr_min": 1e-5,
        "gd_steps": 10000,  # App. B: "briefly (usually 10000 epochs)"
        "gd_lr": 1e-4,  # App. B: SGD "with a smaller learning rate" than Adam's 1e-3
        "log_every": 500,
    },
}

F4_GAP = Threshold(
    10.0,
    ">=",
    source="Jacot & Kaiser 2024 (arXiv 2405.17573) Fig. 1, App. B: 'a clear separation' between the k* large "
    "singular values and the rest; the factor 10 is ours (docs/theory/leaky-resnets.md §5.3 F4)",
)
GAP = F4_GAP.bound  # F4's "clear separation": s_{k*} >= 10 s_{k*+1}


def lambda_note(cfg: Config) -> str:
    """The report's note on λ: which of the run's λ is the paper's and which our calibration (Jacot & Kaiser 2024 App.
    B)."""
    lams = [cfg.lam, *cfg.lams]
    ours = [f"{x:g}" for x in lams if x != PAPER_LAM]
    return (
        f"λ: the paper's is {PAPER_LAM:g} (App. B) and its loss (1/N)‖f(X) − Y‖²_F + (λ/2L̃)Σρ_l‖W_l‖²_F is ours, "
        f"so it is {PAPER_LAM:g} here"
        + (
            f"; λ = {', '.join(ours)} is our calibration, not the paper's value (docs/leaky-resnets.md)."
            if ours
            else "."
        )
    )


def bottleneck_rank(cfg: Config) -> int:
    """k*: the smallest inner dimension of the teacher."""
    return min(cfg.teacher_dims[1:-1])


def middle_half(L: int) -> list[int]:
    """1-based layers l with L/4 < l <= 3L/4 (the "mid-half" of docs/theory/leaky-resnets.md §5.4)."""
    return [l for l in range(1, L + 1) if L / 4 < l <= 3 * L / 4]


def mid_half_share(ranks: list[int], k: int) -> float:
    """Share of the middle-half layers whose effective rank is k* or k*+1 (docs/theory/leaky-resnets.md §5.4 Q4);
    ranks[l-1] is W_l's."""
    return float(np.mean([ranks[l - 1] in (k, k + 1) for l in middle_half(len(ranks))]))


def check(cfg: Config) -> None:
    """Memory: the L x w x (w+1) weights with gradients and Adam moments, and the N x w hidden
    representation of every layer kept for the backward pass."""
    itemsize = 4 if cfg.dtype == "float32" else 8
    n_bytes = itemsize * cfg.depth * cfg.width * (4 * (cfg.width + 1) + 2 * (cfg.n_train + cfg.n_test))
    check_memory(f"a Leaky ResNet of depth={cfg.depth}, width={cfg.width}", n_bytes)


def bottleneck_layers(positions) -> list[int]:
    """1-based layers l whose W_l, placed at p_{l-1}, lies in the middle half 1/4 <= p_{l-1} < 3/4 of [0, 1]."""
    return [l for l in range(1, len(positions)) if 0.25 <= positions[l - 1] < 0.75]


def spectral_gap(s, k: int) -> float:
    """s_k / s_{k+1} of decreasing singular values s (inf when s_{k+1} = 0)."""
    return float(s[k - 1] / s[k]) if s[k] > 0 else float("inf")


def mean_free_weights(W: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """``W (I - m̂m̂ᵀ)``: the layer's weights W (w x (w+1)) with their action on the mean input removed, where
    ``m = mean_i S_i`` over the rows of ``S = σ(A_{l-1})`` (N x (w+1), last column the constant 1) and
    ``m̂ = m/‖m‖``.

    Why (F4, Jacot & Kaiser App. B "k*+1 ... bias"): in the bottleneck the representations are non-negative
    (Prop. 5 of the paper), so they fill a k*-dimensional *affine* set ``{c + Uz}`` that misses the origin, and
    its inputs ``[ReLU(A), 1]`` span k*+1 dimensions. A W_l that acts on them therefore has k*+1 non-zero singular
    values, and so do its columns without the bias (``W[:, :w] c`` is generically outside ``W[:, :w] U``).
    Removing the one constant direction m̂ leaves the k* directions along which the inputs vary."""
    m = S.mean(0)
    m = m / m.norm().clamp_min(torch.finfo(S.dtype).tiny)
    return W - torch.outer(W @ m, m)


def bottleneck_kind(s, s_mean_free, k: int) -> str:
    """F4 for one W_l (docs/theory/leaky-resnets.md §5.3): "k*" when s_{k*} >= GAP·s_{k*+1}; "k*+1 (bias)" when
    s_{k*+1} >= GAP·s_{k*+2} and `mean_free_weights` (singular values `s_mean_free`) has the k* gap, so that the extra
    direction is the constant input's (the bias and the mean of the non-negative representation); "k*+1 (not bias)"
    when it does not; "none" otherwise. s, s_mean_free: decreasing, at least k+2 values."""
    if spectral_gap(s, k) >= GAP:
        return "k*"
    if spectral_gap(s, k + 1) >= GAP:
        return "k*+1 (bias)" if spectral_gap(s_mean_free, k) >= GAP else "k*+1 (not bias)"
    return "none"


def f4_gap(s, s_mean_free, k: int) -> float:
    """The layer's F4 gap: s_{k*}/s_{k*+1}, or, when larger, the k*+1 route's weaker ratio
    min(s_{k*+1}/s_{k*+2}, mean-free s_{k*}/s_{k*+1}); the layer passes `bottleneck_kind` iff it is >= GAP."""
    return max(spectral_gap(s, k), min(spectral_gap(s, k + 1), spectral_gap(s_mean_free, k)))


def mean_free_layer_weights(model: LeakyResNet, X: torch.Tensor) -> list[torch.Tensor]:
    """`mean_free_weights` of every layer l = 1..L on the inputs X (N x d), in float64 on the CPU."""
    model = copy.deepcopy(model).double()
    with torch.no_grad():
        reps = model.representations(X.to(next(model.parameters()).device, torch.float64))
        return [mean_free_weights(W, model.sigma(A)).cpu() for W, A in zip(model.layer_matrices(), reps)]


def f4_claim(k: int, kinds: list[str], gap_min: float, where: str = "", id: str = "f4-bottleneck-gap"):
    """The `f4-bottleneck-gap` claim from the `bottleneck_kind` of every bottleneck layer; gap_min is the smallest
    `f4_gap` among them, and the claim is ``gap_min >= GAP`` (a layer passes `bottleneck_kind` iff its `f4_gap`
    does, so the layer that decides the verdict decides the margin, ``gap_min/GAP − 1``); no layer fails."""
    good, total = sum(kind in ("k*", "k*+1 (bias)") for kind in kinds), len(kinds)
    return all_of_claim(
        f"F4{where}: every bottleneck layer (p in [1/4, 3/4)) has k* = {k} dominant singular values of W_l, "
        f">= {GAP:g}x above the rest (k*+1 only when the extra one is the bias direction)",
        REFERENCE,
        [(gap_min if total else float("nan"), F4_GAP)],
        expected=f"all {total} layers",
        measured={
            "layers with the gap": good,
            "of": total,
            "k*+1 values, the extra not the bias's": kinds.count("k*+1 (not bias)"),
            "min F4 gap": gap_min,
        },
        tolerance=f"gap >= {GAP:g}",
        id=id,
    )


def make_data(cfg: Config):
    return bottleneck_teacher(
        tuple(cfg.teacher_dims),
        cfg.teacher_kind,
        cfg.teacher_hidden,
        cfg.n_train,
        cfg.n_test,
        teacher_seed=cfg.seed,
        data_seed=cfg.seed + 1,
    )


def train_config(cfg: Config) -> TrainConfig:
    phases = [
        Phase(
            optimizer="adam",
            steps=cfg.adam_steps,
            lr=cfg.adam_lr,
            schedule=cfg.adam_schedule,
            lr_min=cfg.adam_lr_min,
            adapt_every=100 if cfg.steps == "adaptive" else 0,
        )
    ]
    if cfg.gd_steps:
        phases.append(Phase(optimizer="sgd", steps=cfg.gd_steps, lr=cfg.gd_lr, guard_window=500))
    # float64 L-BFGS towards a critical point (docs/theory/leaky-resnets.md §5.2: ρ fixed), where F4's gap opens
    if cfg.lbfgs_steps:
        phases.append(Phase(optimizer="lbfgs", steps=cfg.lbfgs_steps, lr=cfg.lbfgs_lr, dtype="float64"))
    return TrainConfig(
        objective="mse",
        lam=cfg.lam,
        phases=phases,
        log_every=cfg.log_every,
        checkpoint_every=cfg.checkpoint_every,
        top_singular_values=3,
    )


def make_model(cfg: Config, data) -> LeakyResNet:
    return LeakyResNet(
        data.d_in,
        data.d_out,
        cfg.width,
        cfg.depth,
        cfg.effective_depth,
        steps=cfg.steps,
        seed=cfg.seed + 2,
        dtype=getattr(torch, cfg.dtype),
    )


def units(cfg: Config) -> list[dict]:
    """One unit at `lam`, then one per further λ of `lams` (its id says which)."""
    base = f"Lt{cfg.effective_depth:g}-seed{cfg.seed}"
    return [{"id": base, "lam": cfg.lam}] + [{"id": f"{base}-lam{x:g}", "lam": x} for x in cfg.lams if x != cfg.lam]


def build(cfg: Config, unit: dict) -> TrainingUnit:
    ucfg = cfg.model_copy(update={"lam": unit.get("lam", cfg.lam)})
    data = make_data(ucfg)
    return TrainingUnit(make_model(ucfg, data), data, train_config(ucfg), certify=cfg.certify)


@dataclass(frozen=True)
class UnitResult:
    """What `finish` measures on one trained net (stored as this dict): its λ, the last history row, the layer
    steps ρ_l and positions p_l (L and L+1 values), the top-10 singular values of every W_l and of its mean-free
    form (`mean_free_weights`), every W_l's effective rank, the training time and the step it resumed from."""

    lam: float
    final: dict
    rho: list[float]
    positions: list[float]
    top_singular_values: list[list[float]]
    mean_free_singular_values: list[list[float]]
    effective_ranks: list[int]
    train_seconds: float
    resumed_from_step: int | None

    @classmethod
    def of(cls, result: dict) -> UnitResult:
        """The fields of a unit's result dict (which the runner extends, e.g. with ``"unhealthy"``)."""
        return cls(**{f.name: result[f.name] for f in fields(cls)})


def finish(cfg: Config, unit: dict, model: LeakyResNet, result, ctx) -> dict:
    W = [w.detach().double().cpu() for w in model.layer_matrices()]
    free = mean_free_layer_weights(model, make_data(cfg).X_train)
    return asdict(
        UnitResult(
            lam=unit.get("lam", cfg.lam),
            final=result.history.iloc[-1].to_dict(),
            rho=model.rho.tolist(),
            positions=model.positions.tolist(),
            top_singular_values=[singular_values(w, 10).tolist() for w in W],
            mean_free_singular_values=[singular_values(w, 10).tolist() for w in free],
            effective_ranks=[effective_rank(w, rtol=0.1) for w in W],
            train_seconds=result.seconds,
            resumed_from_step=result.resumed_from,
        )
    )


def unit_f4(cfg: Config, r: UnitResult) -> tuple[list[int], list[str], list[float]]:
    """The bottleneck layers of one trained net, their `bottleneck_kind` and their `f4_gap`."""
    k, mid = bottleneck_rank(cfg), bottleneck_layers(r.positions)
    top, free = r.top_singular_values, r.mean_free_singular_values
    return (
        mid,
        [bottleneck_kind(top[l - 1], free[l - 1], k) for l in mid],
        [f4_gap(top[l - 1], free[l - 1], k) for l in mid],
    )


def f4_claims(cfg: Config, results: dict[str, dict]) -> list:
    """`f4_claim` per unit, each resting on its own unit: ``f4-bottleneck-gap`` at `lam`, and
    ``f4-bottleneck-gap@lam<λ>`` at each further λ of `lams`."""
    out = []
    for uid, res in results.items():
        r = UnitResult.of(res)
        _, kinds, gaps = unit_f4(cfg, r)
        where, cid = (
            ("", "f4-bottleneck-gap") if r.lam == cfg.lam else (f" at λ = {r.lam:g}", f"f4-bottleneck-gap@lam{r.lam:g}")
        )
        out.append(f4_claim(bottleneck_rank(cfg), kinds, min(gaps, default=float("nan")), where, cid).rests_on([uid]))
    return out


def figure_spectra(cfg: Config, r: UnitResult):
    k = bottleneck_rank(cfg)
    mid = bottleneck_layers(r.positions)
    p = np.array(r.positions[:-1])
    S = np.array([s + [np.nan] * (10 - len(s)) for s in r.top_singular_values])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i in range(S.shape[1]):
        ax.plot(p, S[:, i], marker=".", lw=1, color=plt.cm.viridis(i / 9))
    if mid:
        ax.axvspan(p[mid[0] - 1], p[mid[-1] - 1], color="0.9", zorder=0, label="bottleneck layers (F4)")
    ax.set_yscale("log")
    ax.set_xlabel("layer position p (W_l plotted at p_{l-1})")
    ax.set_ylabel("top-10 singular values of W_l")
    ax.set_title(f"Bottleneck: k* = {k}, L̃ = {cfg.effective_depth:g}, L = {cfg.depth}, λ = {r.lam:g}")
    ax.legend(loc="upper right")
    return fig


def figure_training(hist: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for col in ("loss", "cost", "penalty", "test_cost"):
        if col in hist:
            ax.plot(hist["step"], hist[col], label=col)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_title("training curves")
    ax.legend()
    return fig


def layer_table(cfg: Config, r: UnitResult) -> pd.DataFrame:
    k, mid = bottleneck_rank(cfg), bottleneck_layers(r.positions)
    S = np.array([s + [np.nan] * (10 - len(s)) for s in r.top_singular_values])
    return pd.DataFrame(
        {
            "layer": range(1, cfg.depth + 1),
            "p": r.positions[:-1],
            "rho": r.rho,
            "effective_rank": r.effective_ranks,
            "bottleneck_layer": [l in mid for l in range(1, cfg.depth + 1)],
            "gap_k": [spectral_gap(s, k) for s in r.top_singular_values],
            "gap_k_plus_1": [spectral_gap(s, k + 1) for s in r.top_singular_values],
            "gap_k_mean_free": [spectral_gap(s, k) for s in r.mean_free_singular_values],
            **{f"s{i + 1}": S[:, i] for i in range(S.shape[1])},
        }
    )


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    figures, tables, per_unit = {}, {}, {}
    for uid, res in results.items():
        r = UnitResult.of(res)
        tag = "" if r.lam == cfg.lam else f"_lam{r.lam:g}"
        figures[f"bottleneck_spectra{tag}"] = figure_spectra(cfg, r)
        hist = read_csv(
            ctx.dir / "units" / uid / "history.csv", fix="delete that unit folder and run again with --resume"
        )
        figures[f"training_curves{tag}"] = figure_training(hist)
        tables[f"layers{tag}"] = layer_table(cfg, r)
        _, kinds, gaps = unit_f4(cfg, r)
        per_unit[uid] = {
            "lam": r.lam,
            "bottleneck_kinds": kinds,
            "bottleneck_gap_min": min(gaps, default=float("nan")),
            "effective_ranks": r.effective_ranks,
            "final_loss": r.final["loss"],
            "final_cost": r.final["cost"],
            "final_test_cost": r.final.get("test_cost"),
            "train_seconds": r.train_seconds,
        }
    main = next(v for v in per_unit.values() if v["lam"] == cfg.lam) if per_unit else {}
    summary = {"k_star": bottleneck_rank(cfg), **main, "units": per_unit}
    return Analysis(f4_claims(cfg, results), figures, tables, summary, [lambda_note(cfg)])


CATALOG = (
    Entry(
        "leaky-bottleneck", ("quick", "tiny", "paper"), "Jacot & Kaiser Fig. 1: a k*-dim bottleneck in the middle", 11
    ),
)

EXPERIMENT = Experiment(
    name="leaky-bottleneck",
    summary="A Leaky ResNet trained with L2 regularization on a bottleneck teacher learns a k*-dimensional "
    "bottleneck in its middle layers.",
    reference="Jacot & Kaiser 2024, Hamiltonian Mechanics of Feature Learning (arXiv 2405.17573), Fig. 1; "
    "docs/theory/leaky-resnets.md §5",
    config=Config,
    presets=PRESETS,
    units=units,
    check=check,
    build=build,
    finish=finish,
    analyze=analyze,
)
