"""`saddle-digits` and `saddle-mnist`: saddle-to-saddle training of a deep bias-free ReLU MLP from small
initialization (Bantzis, Simon, Jacot 2025, arXiv 2505.21722, Fig. 1 and App. B Figs. 3-4;
docs/theory/saddle-to-saddle.md §6, A3, A4).

Minibatch SGD with ``lr_t = max(c/‖θ_t‖^{L-2}, lr_min)`` on mean cross-entropy from init std σ_0. The
full-train loss sits at ln 10 (the origin saddle), escapes along a nearly rank-one direction to a second
plateau, then escapes again. Each unit is one seed; every `log_every` steps the history gets r_W(ℓ)
(column ``rW{ℓ}``), the speed of θ_t on the √L-sphere with G = ∇C(0) of the full train set (column
``speed``) and the top-10 singular values of every layer (``sv{ℓ}_{i}``).

saddle-digits quick (docs/theory/saddle-to-saddle.md §6 `digits_quick`, 2 seeds, ≈45 s per seed on one thread):
scikit-learn digits (all 1797, standardized), 64→64×5→10, σ_0 = 0.01, batch 128, c = 20, floor 0.05;
each epoch's last batch of 1797 mod 128 = 5 samples is kept, as torch's DataLoader does (see the docs);
a relative trust region ‖Δθ‖ <= 0.25‖θ‖ (ours) cuts the rare runaway steps at the floor; 90k steps
instead of the reference 60k (ours: the second escape is late in about half the seeds, docs/saddle-to-saddle.md).
The seeds train as batched ensembles (`build`/`finish`; `SaddleLog` is an ``on_log`` callback).
saddle-digits paper: the same with 5 seeds. saddle-mnist paper (`mnist_paper`): MNIST from local IDX files,
784→1000×5→10, σ_0 = 1e-3, batch 32, 1000 epochs, c = 10, no floor (a GPU job); its quick preset (ours,
unverified) trains 784→256×5→10 on a 10k subset.
Claims (docs/theory/saddle-to-saddle.md §7, each in every seed: the paper describes the dynamics, not a share of runs):
a ln 10 plateau first, a second plateau, the deep layers nearly rank one at its midpoint, every layer 2..L nearer
rank one than layer 1, a depth trend (Spearman ρ(ℓ, r_W(ℓ)) <= -0.8), s_2/s_1 falling at least as fast as
ℓ^{-1/4} (log-log slope <= -1/4, Thm 3.1's rate), later escapes (the final loss, the median of the last 5
logged losses, A4's smoothing, below the second plateau: the paper's "subsequent saddle escapes"; it states no
final value, so the final loss itself is reported, not claimed), and a second singular value grown in layers
3-5 at the end. The depth-4 MNIST preset (`distinct_plateaus=False`) claims what the paper reports there
instead: the ln 10 plateau, no distinct second plateau, a loss that falls below it. Every claim's margin is
its worst seed's.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from pydantic import Field
from scipy.stats import spearmanr

from ..catalog import Entry
from ..claims import Claim, Threshold, all_of_claim, boolean_claim
from ..config import ExperimentConfig
from ..data import digits, mnist
from ..data.dataset import Dataset
from ..data.mnist import require_mnist
from ..figures import plt
from ..io import read_csv
from ..measurements.escape import cross_entropy_gradient, escape_speed, tail_ratio
from ..models import MLP
from ..training import Phase, TrainConfig
from ..training.plateaus import detect_plateaus, smooth
from .base import Analysis, Experiment, TrainingUnit

REF = "Bantzis, Simon, Jacot 2025 (arXiv 2505.21722) Fig. 1, App. B Figs. 3-4; docs/theory/saddle-to-saddle.md §6-§7"


class Config(ExperimentConfig):
    dataset: str = Field(default="digits", pattern="^(digits|mnist)$")
    mnist_path: str | None = None
    n_train: int | None = Field(default=None, ge=10)
    depth: int = Field(default=6, ge=2)
    width: int = Field(default=64, ge=1)
    init_std: float = Field(default=0.01, gt=0)
    batch_size: int = Field(default=128, ge=1)
    drop_last: bool = False
    steps: int = Field(default=60000, ge=1)
    lr_c: float = Field(default=20.0, gt=0)
    lr_min: float = Field(default=0.05, ge=0)
    max_step: float | None = Field(default=0.25, gt=0)
    log_every: int = Field(default=250, ge=1)
    checkpoint_every: int = Field(default=10000, ge=0)
    seeds: int = Field(default=3, ge=1, le=1000)
    dtype: str = Field(default="float32", pattern="^(float32|float64)$")
    plateau_min_steps: int = Field(default=3000, ge=1)
    claim_min_steps: int = Field(default=5000, ge=1)
    second_level: list[float] = Field(default=[1.6, 2.1], min_length=2, max_length=2)
    distinct_plateaus: bool = True
    depth_trend_max: float = Field(default=-0.8, ge=-1, le=1)


class MnistConfig(Config):
    dataset: str = Field(default="mnist", pattern="^(digits|mnist)$")


# Training runs in float32 (the reference ≈30 s per seed is float32 speed); diagnostics are float64. The
# late phase at the lr floor is chaotic; see docs/saddle-to-saddle.md for the measured success rates.
DIGITS_PRESETS = {
    "quick": {"steps": 90000, "seeds": 2},  # one seed per worker on 2 cores: within 5 minutes
    "tiny": {"steps": 3000, "seeds": 1, "log_every": 100, "plateau_min_steps": 500, "claim_min_steps": 500},
    "paper": {"steps": 90000, "seeds": 5},
}
MNIST_PRESETS = {
    "quick": {
        "dataset": "mnist",
        "n_train": 10000,
        "width": 256,
        "init_std": 1e-3,
        "batch_size": 32,
        "steps": 60000,
        "lr_c": 10.0,
        "lr_min": 0.05,
        "log_every": 250,
        "seeds": 1,
        "second_level": [0.3, 2.25],
    },
    "paper": {
        "dataset": "mnist",
        "width": 1000,
        "init_std": 1e-3,
        "batch_size": 32,
        "steps": 1_875_000,
        "lr_c": 10.0,
        "lr_min": 0.0,
        "max_step": None,
        "log_every": 500,
        "checkpoint_every": 25000,
        "seeds": 1,
        "plateau_min_steps": 3750,
        "claim_min_steps": 20000,
        "second_level": [0.3, 2.25],
    },
}
MNIST_PRESETS["depth4"] = {**MNIST_PRESETS["paper"], "depth": 4, "distinct_plateaus": False}
# paper-cpu: "paper" on a seeded 10k subset of the training images (paper 60k), 1000 epochs of it: 312 500 steps
# (paper 1.875M)
MNIST_PRESETS["paper-cpu"] = {**MNIST_PRESETS["paper"], "n_train": 10000, "steps": 312_500}


class SaddleLog:
    """`train` callback adding r_W(ℓ) (``rW{ℓ}``) and speed(θ_t) (``speed``, G = ∇C(0)) to each history row."""

    def __init__(self, X: torch.Tensor, G: torch.Tensor):
        self.X, self.G = X, G

    def on_log(self, step, model, row):
        Ws = [W.detach().double() for W in model.weight_matrices()]  # on the model's device
        if self.X.device != Ws[0].device:
            self.X, self.G = self.X.to(Ws[0].device), self.G.to(Ws[0].device)
        for l, W in enumerate(Ws, start=1):
            row[f"rW{l}"] = tail_ratio(W)
        row["speed"] = escape_speed(Ws, self.X, self.G)


def make_data(cfg: Config) -> Dataset:
    if cfg.dataset == "digits":
        data = digits(n_train=None, normalize="standardize")
    else:
        data = mnist(cfg.mnist_path, normalize="standardize")
    if cfg.n_train is not None and cfg.n_train < len(data.X_train):
        idx = torch.randperm(len(data.X_train), generator=torch.Generator().manual_seed(cfg.seed))[: cfg.n_train]
        data = Dataset(
            data.X_train[idx],
            data.Y_train[idx],
            data.X_test[:0],
            data.Y_test[:0],
            data.n_classes,
            data.meta | {"n_train": cfg.n_train},
        )
    return data


def units(cfg: Config) -> list[dict]:
    return [{"id": f"seed{cfg.seed + i}", "seed": cfg.seed + i} for i in range(cfg.seeds)]


def build(cfg: Config, unit: dict) -> TrainingUnit:
    """One seed's run: the bias-free MLP from std-σ_0 init, A3's lr rule, and the `SaddleLog` columns."""
    data = make_data(cfg)
    model = MLP(
        data.d_in,
        data.d_out,
        cfg.width,
        cfg.depth,
        bias=0.0,
        init="absolute",
        init_scale=cfg.init_std,
        seed=unit["seed"],
        dtype=getattr(torch, cfg.dtype),
    )
    config = TrainConfig(
        objective="cross_entropy",
        phases=[
            Phase(
                optimizer="sgd",
                steps=cfg.steps,
                lr=cfg.lr_c,
                schedule="inverse_norm",
                lr_min=cfg.lr_min,
                batch_size=cfg.batch_size,
                drop_last=cfg.drop_last,
                max_step=cfg.max_step,
            )
        ],
        log_every=cfg.log_every,
        checkpoint_every=cfg.checkpoint_every,
        top_singular_values=10,
        seed=unit["seed"],
    )
    G = cross_entropy_gradient(data.Y_train, data.d_out)
    return TrainingUnit(model, data, config, callbacks=(SaddleLog(data.X_train.double(), G),))


def finish(cfg: Config, unit: dict, model, result, ctx) -> dict:
    return summarize(cfg, result.history)


def _row_at(hist: pd.DataFrame, step: int) -> pd.Series:
    return hist.iloc[int(np.argmin(np.abs(hist["step"].to_numpy() - step)))]


def _s2_s1(row: pd.Series, l: int) -> float:
    s1, s2 = row.get(f"sv{l}_1", np.nan), row.get(f"sv{l}_2", np.nan)
    return float(s2 / s1) if s1 and s1 > 0 else float("nan")


def summarize(cfg: Config, hist: pd.DataFrame) -> dict:
    """Plateaus (A4) of one run's history, with r_W and s2/s1 of every layer at each plateau midpoint."""
    L = cfg.depth
    plateaus = []
    for p in detect_plateaus(hist["step"], hist["loss"], min_length=cfg.plateau_min_steps):
        row = _row_at(hist, p.mid)
        plateaus.append(
            {
                "start": p.start,
                "end": p.end,
                "mid": p.mid,
                "length": p.length,
                "level": p.level,
                "escape": p.escape,
                "speed": float(row.get("speed", np.nan)),
                "r_W": [float(row[f"rW{l}"]) for l in range(1, L + 1)],
                "s2_s1": [_s2_s1(row, l) for l in range(1, L + 1)],
            }
        )
    last = hist.iloc[-1]
    final = float(np.median(hist["loss"].to_numpy()[-5:]))  # A4's 5-point median, so a last spike is not read
    return {
        "plateaus": plateaus,
        "final_loss": final,
        "last_loss": float(last["loss"]),
        "final_error": float(last["train_error"]),
        "capped_steps": int(last.get("capped_steps", 0)),
        "final_s2_s1": [_s2_s1(last, l) for l in range(1, L + 1)],
        "final_r_W": [float(last[f"rW{l}"]) for l in range(1, L + 1)],
    }


# The thresholds of the seed checks (Bantzis, Simon, Jacot 2025, arXiv 2505.21722, Fig. 1 and App. B Figs. 3-4;
# docs/theory/saddle-to-saddle.md §7, 'digits quick'). The paper gives the levels, not tolerances: these are ours.
LN10_PLATEAU = Threshold(
    math.log(10), "==", atol=0.01, source="Bantzis et al. 2025 §4: the origin saddle's loss ln 10; ±0.01 ours"
)
DEEP_RANK_ONE = Threshold(
    0.1, "<=", ceiling=0.0, source="ours: r_W of the deep layers at the second plateau (§7 table)"
)
LAST_RANK_ONE = Threshold(
    0.02, "<=", ceiling=0.0, source="ours: r_W(L), the last layer, at the second plateau (§7 table)"
)
S2_S1_SLOPE = Threshold(-0.25, "<=", source="Bantzis et al. 2025 Theorem 3.1: s_2/s_1 = O(ℓ^{-1/4}); on a net ours")
SECOND_SV = Threshold(0.3, ">=", ceiling=1.0, source="ours: final max s_2/s_1 over layers 3..L-1 (§7 table)")
TWO_ESCAPES = Threshold(2, ">=", source="Bantzis et al. 2025 Fig. 1: at least two saddles passed")


def seed_comparisons(cfg: Config, res: dict) -> dict[str, list[tuple[float, Threshold]]]:
    """The per-seed checks of docs/theory/saddle-to-saddle.md §7 ('digits quick'), each as the comparisons
    ``(value, threshold)`` that must all hold (NaN where a plateau it reads was not found)."""
    L, lo, hi = cfg.depth, *cfg.second_level
    ps, nan = res["plateaus"], float("nan")
    first = ps[0] if ps else {"level": nan, "length": nan}
    second = _second_plateau(cfg, ps)
    long_enough = Threshold(cfg.claim_min_steps, ">=")
    rw = second["r_W"] if second else [nan] * L
    sv = second.get("s2_s1", [nan] * L) if second else [nan] * L
    last = second if cfg.distinct_plateaus else (ps[0] if ps else None)
    first_ln10 = [(first["level"], LN10_PLATEAU), (first["length"], long_enough)]
    deep = range(max(2, L - 2), L)
    return {
        "first_ln10": first_ln10,
        "two_plateaus_first_ln10": [*first_ln10, (len([p for p in ps if p["escape"] is not None]), TWO_ESCAPES)],
        "second_plateau": [
            (second["level"] if second else nan, Threshold(lo, ">=")),
            (second["level"] if second else nan, Threshold(hi, "<=")),
            (second["length"] if second else nan, long_enough),
        ],
        "deep_rank_one": [*((rw[l - 1], DEEP_RANK_ONE) for l in deep), (rw[L - 1], LAST_RANK_ONE)],
        "first_layer_less_rank_one": [(rw[0], Threshold(max(rw[1:]), ">"))],
        "depth_trend_ok": [(_depth_trend(rw) if second else nan, Threshold(cfg.depth_trend_max, "<=", ceiling=-1.0))],
        "s2_s1_slope_ok": [(_s2_s1_slope(sv) if second else nan, S2_S1_SLOPE)],
        "later_escape": [(res["final_loss"], Threshold(last["level"] if last else nan, "<"))],
        "second_sv_grows": [(_mid_s2_s1(L, res), SECOND_SV)],
    }


def _second_plateau(cfg: Config, ps: list[dict]) -> dict | None:
    lo, hi = cfg.second_level
    return next((p for p in ps[1:] if lo <= p["level"] <= hi and p["length"] >= cfg.claim_min_steps), None)


def _depth_trend(rw: list[float]) -> float:
    return float(spearmanr(np.arange(1, len(rw) + 1), rw).statistic)


def _s2_s1_slope(sv: list[float]) -> float:
    """The log-log slope of s_2/s_1(W_ℓ) against ℓ (NaN when a value is missing)."""
    if not np.all(np.isfinite(sv)):
        return float("nan")
    return float(np.polyfit(np.log(np.arange(1, len(sv) + 1)), np.log(np.maximum(sv, 1e-12)), 1)[0])


def _mid_s2_s1(L: int, res: dict) -> float:
    """The final max s_2/s_1 over layers 3..L-1 (layer L for L < 4)."""
    return max(res["final_s2_s1"][l - 1] for l in (range(3, L) if L >= 4 else [L]))


def worst_margin(comparisons: list[tuple[float, Threshold]]) -> float:
    """The smallest margin of `comparisons` (NaN when one is NaN): the check holds iff every comparison holds."""
    margins = [th.margin(v) for v, th in comparisons]
    return float("nan") if any(math.isnan(m) for m in margins) else min(margins)


def seed_checks(cfg: Config, res: dict) -> dict:
    """The per-seed checks (`seed_comparisons`): each check's verdict, the numbers it reads, and under
    ``"margins"`` the margin of each (`featurelab.claims.Threshold.margin`, the smallest of its comparisons)."""
    comparisons = seed_comparisons(cfg, res)
    verdicts = {k: all(th.holds(v) for v, th in c) for k, c in comparisons.items()}
    ps, second = res["plateaus"], _second_plateau(cfg, res["plateaus"])
    L, nan = cfg.depth, float("nan")
    rw = second["r_W"] if second else [nan] * L
    sv = second.get("s2_s1", [nan] * L) if second else [nan] * L
    last = second if cfg.distinct_plateaus else (ps[0] if ps else None)
    return {
        "saddles": len([p for p in ps if p["escape"] is not None]),
        "first_level": ps[0]["level"] if ps else nan,
        "first_length": ps[0]["length"] if ps else 0,
        "two_plateaus_first_ln10": verdicts["two_plateaus_first_ln10"],
        "second_level": second["level"] if second else nan,
        "second_length": second["length"] if second else 0,
        "second_plateau": second is not None,
        "r_W_second": rw,
        "deep_rank_one": verdicts["deep_rank_one"],
        "deep_max": max(rw[l - 1] for l in range(max(2, L - 2), L + 1)),
        "first_layer_less_rank_one": verdicts["first_layer_less_rank_one"],
        "depth_trend": comparisons["depth_trend_ok"][0][0],
        "depth_trend_ok": verdicts["depth_trend_ok"],
        "s2_s1_second": sv,
        "s2_s1_slope": comparisons["s2_s1_slope_ok"][0][0],
        "s2_s1_slope_ok": verdicts["s2_s1_slope_ok"],
        "no_second_plateau": second is None,
        "first_ln10": verdicts["first_ln10"],
        "final_loss": res["final_loss"],
        "last_plateau_level": last["level"] if last else nan,
        "later_escape": verdicts["later_escape"],
        "capped_steps": res.get("capped_steps", 0),
        "final_s2_s1_max_mid": _mid_s2_s1(L, res),
        "second_sv_grows": verdicts["second_sv_grows"],
        "margins": {k: worst_margin(c) for k, c in comparisons.items()},
    }


def seed_claims(cfg: Config, results: dict[str, dict], checks: dict[str, dict]) -> list[Claim]:
    """One claim per check of the saddle-to-saddle picture, each required in every seed (the paper describes
    the dynamics, not a share of runs): every seed's comparisons at once (`all_of_claim`), so that a claim's
    margin is its worst seed's. Depth 4 (App. B Fig. 4, "less distinct plateaus") claims the ln 10 plateau, no
    distinct second plateau and a loss that falls below the first."""
    comparisons = {u: seed_comparisons(cfg, results[u]) for u in checks}
    texts = claim_texts(cfg)

    def seed_claim(key: str) -> Claim:
        statement, expected, measured_key = texts[key]
        passed = sum(bool(c[key]) for c in checks.values())
        measured = {u: c[measured_key] for u, c in checks.items()} | {"seeds passing": f"{passed}/{len(checks)}"}
        expected = f"{expected}, in every seed ({len(checks)})"
        cid = key.removesuffix("_ok").replace("_", "-")
        if key == "no_second_plateau":  # an absence: no threshold to measure a margin against
            return boolean_claim(statement, REF, expected, measured, passed >= len(checks), id=cid)
        every = [pair for u in checks for pair in comparisons[u][key]]
        return all_of_claim(statement, REF, every, expected=expected, measured=measured, id=cid)

    if not cfg.distinct_plateaus:
        return [seed_claim(k) for k in ("first_ln10", "no_second_plateau", "later_escape")]
    return [seed_claim(k) for k in texts if k not in ("first_ln10", "no_second_plateau")]


def claim_texts(cfg: Config) -> dict[str, tuple[str, str, str]]:
    """Each seed check's claim: its statement, its expected value and the `seed_checks` entry it reports, in the
    order of the report (the numbers from the thresholds above)."""
    L, (lo, hi), steps = cfg.depth, cfg.second_level, cfg.claim_min_steps
    ln10 = f"ln 10 = {math.log(10):.4f} (±{LN10_PLATEAU.atol:g})"
    deep, last = DEEP_RANK_ONE.bound, LAST_RANK_ONE.bound
    return {
        "first_ln10": (
            f"training from small init first sits at {ln10} for >= {steps} steps",
            "first level ln 10",
            "first_length",
        ),
        "no_second_plateau": (
            "plateaus are less distinct than at depth 6: no second plateau at loss in "
            f"[{lo}, {hi}] lasts >= {steps} steps",
            "no second plateau",
            "second_length",
        ),
        "two_plateaus_first_ln10": (
            f"training from small init passes >= {TWO_ESCAPES.bound:g} saddles; the first plateau sits at {ln10} for "
            f">= {steps} steps",
            f">= {TWO_ESCAPES.bound:g} escapes, first level ln 10",
            "saddles",
        ),
        "second_plateau": (
            f"a second plateau at loss in [{lo}, {hi}] lasts >= {steps} steps",
            f"level in [{lo}, {hi}]",
            "second_level",
        ),
        "deep_rank_one": (
            f"at the second plateau's midpoint the deep layers {max(2, L - 2)}..{L} are nearly rank one: "
            f"r_W <= {deep:g}, and r_W(L) <= {last:g}",
            f"r_W(deep) <= {deep:g}, r_W(L) <= {last:g}",
            "r_W_second",
        ),
        "first_layer_less_rank_one": (
            f"at that midpoint every later layer, 2..{L} (layers 2-3 included), is nearer rank one than the "
            "first: r_W(1) > max r_W(2..L)",
            "r_W(1) > max_{ℓ>=2} r_W(ℓ)",
            "r_W_second",
        ),
        "depth_trend_ok": (
            "deeper layers are nearer rank one (Fig. 3): Spearman correlation of r_W(ℓ) with ℓ at that midpoint",
            f"<= {cfg.depth_trend_max:g}",
            "depth_trend",
        ),
        "s2_s1_slope_ok": (
            "s_2/s_1 falls with depth at least as fast as Thm 3.1's ℓ^{-1/4}: log-log slope of s_2/s_1(W_ℓ) "
            "against ℓ at that midpoint",
            f"<= {S2_S1_SLOPE.bound:g}",
            "s2_s1_slope",
        ),
        "later_escape": (
            "the loss keeps falling after the last plateau ('towards the end of training, a second dominant singular "
            "value appears. This suggests that the rank of the weight matrices increases following subsequent saddle "
            "escapes', §4 on Fig. 1): the final loss (median of the last 5 logged) is below that plateau's level",
            f"final loss < level of the {'second' if cfg.distinct_plateaus else 'first'} plateau",
            "final_loss",
        ),
        "second_sv_grows": (
            "after the later escapes a second singular value has grown in layers 3..L-1: final max s2/s1 "
            f">= {SECOND_SV.bound:g}",
            f"max s2/s1 >= {SECOND_SV.bound:g}",
            "final_s2_s1_max_mid",
        ),
    }


def plateau_table(cfg: Config, results: dict[str, dict], ids: list[str]) -> pd.DataFrame:
    """One row per seed and detected plateau: span, level, escape, speed, r_W and s_2/s_1 of every layer."""
    L = cfg.depth
    rows = []
    for u in ids:
        for k, p in enumerate(results[u]["plateaus"], start=1):
            rows.append(
                {
                    "seed": u,
                    "plateau": k,
                    "start": p["start"],
                    "end": p["end"],
                    "level": p["level"],
                    "escape_step": p["escape"],
                    "speed_at_mid": p["speed"],
                    **{f"r_W{l}": p["r_W"][l - 1] for l in range(1, L + 1)},
                    **{f"s2/s1_{l}": p["s2_s1"][l - 1] for l in range(1, L + 1)},
                }
            )
    return pd.DataFrame(rows)


def loss_figure(results: dict[str, dict], hists: dict[str, pd.DataFrame]):
    """Fig. 1 left: every seed's full-train loss with its detected plateaus, midpoints and escapes."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for i, (u, h) in enumerate(hists.items()):
        ax.plot(h["step"], h["loss"], color=f"C{i}", lw=1, label=u)
        ax.plot(h["step"], smooth(h["loss"]), color=f"C{i}", lw=0.6, alpha=0.5)
        for p in results[u]["plateaus"]:
            ax.hlines(p["level"], p["start"], p["end"], color=f"C{i}", lw=5, alpha=0.3)
            ax.axvline(p["mid"], color=f"C{i}", ls=":", lw=0.8)
            if p["escape"] is not None:
                ax.axvline(p["escape"], color=f"C{i}", ls="--", lw=0.6, alpha=0.6)
    ax.axhline(math.log(10), color="0.4", lw=0.8, ls="-.", label="ln 10")
    ax.set_yscale("log")
    ax.set_xlabel("SGD step")
    ax.set_ylabel("full-train cross-entropy")
    ax.set_title("loss with detected plateaus (bands), midpoints (:) and escapes (--)")
    ax.legend(fontsize=8)
    return fig


def singular_value_figure(L: int, u0: str, h0: pd.DataFrame, plateaus: list[dict]):
    """Fig. 1 centre/right, App. B Fig. 3: the top-10 singular values of every layer over training (one seed)."""
    cols = min(L, 3)
    rows_n = math.ceil(L / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 3.2 * rows_n), squeeze=False)
    for l in range(1, L + 1):
        ax = axes[(l - 1) // cols][(l - 1) % cols]
        for i in range(1, 11):
            if f"sv{l}_{i}" in h0:
                ax.plot(h0["step"], h0[f"sv{l}_{i}"], lw=1, color=plt.cm.viridis((i - 1) / 9))
        for p in plateaus:
            ax.axvline(p["mid"], color="0.5", ls=":", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(f"W_{l}: top-10 singular values ({u0})", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    for k in range(L, rows_n * cols):
        axes[k // cols][k % cols].axis("off")
    fig.tight_layout()
    return fig


def rank_one_figure(L: int, u0: str, h0: pd.DataFrame):
    """r_W(ℓ) = Σ_{i>=2} s_i²/Σ s_i² of every layer over training (one seed)."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for l in range(1, L + 1):
        ax.plot(h0["step"], h0[f"rW{l}"], lw=1, label=f"r_W({l})")
    ax.set_xlabel("step")
    ax.set_ylabel("r_W = Σ_{i>=2} s_i² / Σ s_i²")
    ax.set_title(f"distance from rank one per layer ({u0})")
    ax.legend(fontsize=8, ncol=3)
    return fig


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    ids = sorted(results, key=lambda u: int(u[4:]))
    checks = {u: seed_checks(cfg, results[u]) for u in ids}
    claims = seed_claims(cfg, results, checks)
    seed_table = pd.DataFrame(
        [
            {"seed": u, **{k: (str(v) if isinstance(v, (list, dict)) else v) for k, v in c.items()}}
            for u, c in checks.items()
        ]
    )
    tables = {"plateaus": plateau_table(cfg, results, ids), "seed_checks": seed_table}
    hists = {
        u: read_csv(ctx.dir / "units" / u / "history.csv", fix="delete that unit folder and run again with --resume")
        for u in ids
        if (ctx.dir / "units" / u / "history.csv").exists()
    }
    figures = {}
    if hists:
        u0, h0 = next(iter(hists.items()))
        figures["loss_plateaus"] = loss_figure(results, hists)
        figures["singular_values"] = singular_value_figure(cfg.depth, u0, h0, results[u0]["plateaus"])
        figures["r_W"] = rank_one_figure(cfg.depth, u0, h0)
    summary = {"seeds": len(ids), "checks": checks}
    notes = [
        "lr_t = max(c/‖θ_t‖^{L-2}, lr_min): the floor lr_min is a deliberate deviation of the quick preset "
        "(docs/theory/saddle-to-saddle.md §6, §8.7); it can cause upward loss spikes, which plateau detection ignores.",
        f"max_step = {cfg.max_step}: a step never moves θ by more than max_step·‖θ‖ (a deviation of ours, "
        "docs/saddle-to-saddle.md); the seed table's capped_steps counts the steps it cut. Without it, one "
        "rare step at the floor (‖Δθ‖ up to 1.9‖θ‖) can kill every unit and send a seed back to ln 10.",
        "The final loss of each seed (seed table) is reported, not claimed: the paper states no final value, and "
        "when the last escape happens is chaotic (docs/saddle-to-saddle.md).",
    ]
    return Analysis(claims, figures, tables, summary, notes)


CATALOG = (
    Entry("saddle-digits", ("quick", "tiny", "paper"), "Bantzis et al. Fig. 1: plateaus at ln 10 and beyond", 42),
    Entry("saddle-mnist", ("quick", "paper", "depth4", "paper-cpu"), "Bantzis et al. Fig. 1 on local MNIST files", 43),
)

EXPERIMENT = Experiment(
    name="saddle-digits",
    summary="A deep bias-free ReLU MLP trained from small initialization on the digits goes from saddle to saddle: "
    "a plateau at ln 10, an escape along a nearly rank-one direction, a second plateau, a second escape.",
    reference="Bantzis, Simon, Jacot 2025, Saddle-to-Saddle Dynamics in Deep ReLU Networks (arXiv 2505.21722), "
    "Fig. 1, App. B; "
    "docs/theory/saddle-to-saddle.md §6 (digits_quick)",
    config=Config,
    presets=DIGITS_PRESETS,
    units=units,
    check=require_mnist,
    build=build,
    finish=finish,
    analyze=analyze,
)

MNIST_EXPERIMENT = Experiment(
    name="saddle-mnist",
    summary="Saddle-to-saddle dynamics of a depth-6 bias-free ReLU MLP on MNIST (local IDX files; paper preset "
    "needs a GPU).",
    reference="Bantzis, Simon, Jacot 2025, Saddle-to-Saddle Dynamics in Deep ReLU Networks (arXiv 2505.21722), "
    "Fig. 1, App. B; "
    "docs/theory/saddle-to-saddle.md §6 (mnist_paper)",
    config=MnistConfig,
    presets=MNIST_PRESETS,
    units=units,
    check=require_mnist,
    build=build,
    finish=finish,
    analyze=analyze,
)
