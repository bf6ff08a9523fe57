"""`alignment`: the linear tail of a ReLU net trained with the logistic loss on separable data tends to
rank one and its adjacent layers align, above the derived bound of Theorem 2 (Le & Jegelka 2022,
arXiv 2201.11968, Theorem 2 and Corollary 1; docs/theory/invariances.md §4, §6b).

Net 10→32→32 (ReLU) then linear 32→16→16→1 (`MLP(..., linear_tail=3)`, bias-free), init N(0, s²/fan_in)
with s = 0.2, float64 full-batch GD η = 0.2 for 5000 steps, seeds 0-2, logged every 50 steps. Tracked:
‖W‖²_op/‖W‖²_F per layer, |⟨v_{k+1}, u_k⟩| per adjacent pair, the §4 step-6 bound (constants at init) and
the paper-style bound beside it, ‖W‖_F, the loss. paper: s = 0.1 and 50k steps (the long run).
Theorem 2 lets g be any map: one more run per `tanh_seeds` replaces the ReLUs by tanh (not homogeneous) and
checks the tail bound from the tail matrices alone (`linear_tail_constants`); its ratios are reported.
"""

from __future__ import annotations

import math

import pandas as pd
import torch
from pydantic import Field, PositiveInt

from ..catalog import Entry
from ..claims import Threshold, all_of_claim, threshold_claim
from ..config import ExperimentConfig
from ..data.separable import separable
from ..figures import plt
from ..measurements.alignment import (
    adjacent_alignment,
    layer_ratios,
    linear_tail_alignment,
    linear_tail_bounds,
    linear_tail_constants,
    theorem2_bounds,
    theorem2_constants,
)
from ..measurements.ranks import stable_rank
from ..models import MLP, Conv, Dense, Flatten, ResBlock
from ..models.residual import HomogeneousNet
from ..training import Phase, TrainConfig, train
from ..training.health import training_health
from .base import Analysis, Experiment

REF = "Le & Jegelka 2022 (arXiv 2201.11968) Theorem 2 eq. (15), Corollary 1; docs/theory/invariances.md §6b"
# The pass thresholds of docs/theory/invariances.md §6b (ours: the paper proves the limits, not finite-time values)
CONVERGED = Threshold(1e-3, "<", ceiling=0.0, source="ours: a logistic loss below 1e-3 (invariances.md §6b)")
NO_ERROR = Threshold(0.0, "<=", source="Le & Jegelka 2022 Corollary 1: 100% training accuracy on separable data")
TAIL_RANK_ONE = Threshold(
    0.88, ">=", ceiling=1.0, source="ours: ‖W‖²_op/‖W‖²_F >= 0.88 (observed 0.90-0.93, invariances.md §6b)"
)
TAIL_GAIN = Threshold(0.5, ">=", source="ours: the ratio rises by >= 0.5 from init (≈ 0.2, invariances.md §6b)")
TAIL_ALIGNED = Threshold(
    0.99, ">=", ceiling=1.0, source="ours: |⟨v_(k+1), u_k⟩| >= 0.99 (observed 0.9999, invariances.md §6b)"
)
BOUND_SLACK = 0.005  # ours: Theorem 2's bound may be missed by the GD drift of C, up to 0.005 (invariances.md §6b)
NON_NEGATIVE = Threshold(0.0, ">=", source="Le & Jegelka 2022 Theorem 2: ratio − bound >= 0 (with BOUND_SLACK)")


class Config(ExperimentConfig):
    widths: list[PositiveInt] = Field(default=[32, 32, 16, 16], min_length=2)
    linear_tail: int = Field(default=3, ge=1)
    init_scale: float = Field(default=0.2, gt=0)
    lr: float = Field(default=0.2, gt=0)
    steps: int = Field(default=5000, ge=1)
    log_every: int = Field(default=50, ge=1)
    seeds: list[int] = Field(default=[0, 1, 2], min_length=1)
    tanh_seeds: list[int] = Field(default=[0])
    conv_seeds: list[int] = Field(default=[0])  # one more run each: the conv and ResNetFree tail of `conv_tail_net`
    conv_steps: int = Field(default=500, ge=1)
    conv_lr: float = Field(default=0.1, gt=0)
    conv_init_scale: float = Field(default=0.5, gt=0)
    conv_n_train: int = Field(default=64, ge=2)
    n_train: int = Field(default=200, ge=2)
    d: int = Field(default=10, ge=1)
    margin: float = Field(default=0.1, ge=0)


PRESETS = {
    "quick": {},
    "tiny": {"steps": 1500, "seeds": [0], "n_train": 64, "init_scale": 0.5, "conv_steps": 300},
    "paper": {"init_scale": 0.1, "steps": 50000, "log_every": 500},
}


def units(cfg: Config) -> list[dict]:
    """One unit per seed and activation (and one per conv seed); the master seed shifts every unit's seed by
    1000·cfg.seed."""
    relu = [{"id": f"seed{s}", "seed": 1000 * cfg.seed + s, "g": "relu"} for s in cfg.seeds]
    conv = [{"id": f"conv-seed{s}", "seed": 1000 * cfg.seed + s, "g": "conv"} for s in cfg.conv_seeds]
    return relu + [{"id": f"tanh-seed{s}", "seed": 1000 * cfg.seed + s, "g": "tanh"} for s in cfg.tanh_seeds] + conv


CONV_INPUT = (2, 4, 4)  # channels x height x width of `conv_tail_net`'s input (d = 32)


def conv_tail_net(init_scale: float, seed: int) -> HomogeneousNet:
    """Theorem 2's setting with conv and ResNetFree layers (Le & Jegelka 2022, arXiv 2201.11968, Theorem 2,
    eqs. (13)-(14)): g = a ReLU conv 2→4 (3 x 3, padding 1), then linear layers M_1, M_2 = conv 4→4 (3 x 3,
    padding 1) and conv 4→4 (stride 2), flattened to 16, FC 16→8, a linear ResNetFree block (a = c = 8, b = 6),
    and w = FC 8→1; bias-free, float64, N(0, s²/fan_in). Input ``N x 32``, rows read as 2 x 4 x 4 images."""
    kw = {"generator": torch.Generator().manual_seed(seed), "init_scale": init_scale}
    return HomogeneousNet(
        [
            Conv(2, 4, 3, padding=1, leak=0.0, **kw),
            Conv(4, 4, 3, padding=1, leak=1.0, **kw),
            Conv(4, 4, 3, stride=2, padding=1, leak=1.0, **kw),
            Flatten(),
            Dense(16, 8, 1.0, **kw),
            ResBlock("free", 8, 6, 8, sigma_in="linear", sigma_out="linear", **kw),
            Dense(8, 1, 1.0, **kw),
        ],
        input_shape=CONV_INPUT,
    )


class StageLog:
    """on_log for `conv_tail_net`: per stage k of the linear tail (numbered as `theorem2_constants`), ratio_s<k>,
    the derived bound bound_s<k> and the paper-style paper_bound_s<k>, constants at init."""

    def __init__(self, model):
        self.constants = theorem2_constants(model)

    def on_log(self, step, model, row):
        for stage, (ratio, bound, paper) in theorem2_bounds(model, self.constants).items():
            row[f"ratio_s{stage}"], row[f"bound_s{stage}"], row[f"paper_bound_s{stage}"] = ratio, bound, paper


class TailLog:
    """on_log for any g (here tanh, not homogeneous): ratio_k and fro_k of every layer, bound_k and align_j_k of
    the linear tail from the tail matrices alone (`linear_tail_constants`, constants at init)."""

    def __init__(self, model, first: int):
        self.first = first  # 0-based index of the first tail matrix
        self.constants = linear_tail_constants(model.weight_matrices()[first:])

    def on_log(self, step, model, row):
        Ws = model.weight_matrices()
        for k, W in enumerate(Ws):
            row[f"ratio_{k + 1}"] = 1.0 / stable_rank(W.detach().double())
            row[f"fro_{k + 1}"] = float(W.detach().double().norm())
        tail = Ws[self.first :]
        for k, (_, b) in enumerate(linear_tail_bounds(self.constants, tail), start=self.first + 1):
            row[f"bound_{k}"] = b
        for k, a in enumerate(linear_tail_alignment(tail), start=self.first + 1):
            row[f"align_{k}_{k + 1}"] = a


class AlignmentLog:
    """on_log: ratio_k, fro_k for every layer; bound_k / paper_bound_k for the tail; align_<junction>."""

    def __init__(self, model):
        self.constants = theorem2_constants(model)

    def on_log(self, step, model, row):
        for k, r in enumerate(layer_ratios(model)):
            row[f"ratio_{k + 1}"] = r
        for k, W in enumerate(model.weight_matrices()):
            row[f"fro_{k + 1}"] = float(W.detach().double().norm())
        for stage, (_, b, bp) in theorem2_bounds(model, self.constants).items():
            row[f"bound_{stage + 1}"], row[f"paper_bound_{stage + 1}"] = b, bp
        for name, a in adjacent_alignment(model).items():
            j, k = (int(x) + 1 for x in name.split("→"))
            row[f"align_{j}_{k}"] = a


def unit_setup(cfg: Config, unit: dict):
    """The unit's data, net, logger, steps and learning rate: the MLP of the module docstring (ReLU or tanh g), or
    `conv_tail_net` on 2 x 4 x 4 images."""
    if unit.get("g") == "conv":
        data = separable(cfg.conv_n_train, 0, math.prod(CONV_INPUT), cfg.margin, seed=unit["seed"])
        model = conv_tail_net(cfg.conv_init_scale, unit["seed"] + 1)
        return data, model, StageLog(model), cfg.conv_steps, cfg.conv_lr
    data = separable(cfg.n_train, 0, cfg.d, cfg.margin, seed=unit["seed"])
    depth = len(cfg.widths) + 1
    model = MLP(
        cfg.d,
        1,
        cfg.widths,
        depth,
        init="fan_in",
        init_scale=cfg.init_scale,
        linear_tail=cfg.linear_tail,
        activation="tanh" if unit.get("g") == "tanh" else "leaky_relu",
        seed=unit["seed"] + 1,
        dtype=torch.float64,
    )
    log = TailLog(model, depth - cfg.linear_tail) if unit.get("g") == "tanh" else AlignmentLog(model)
    return data, model, log, cfg.steps, cfg.lr


def run_unit(cfg: Config, unit: dict, ctx) -> dict:
    data, model, log, steps, lr = unit_setup(cfg, unit)
    tc = TrainConfig(
        objective="logistic",
        lam=0.0,
        phases=[Phase(optimizer="sgd", lr=lr, steps=steps)],
        log_every=cfg.log_every,
    )
    result = train(model, data, tc, device=ctx.device, callbacks=[log], progress=ctx.progress)
    hist = result.history
    keep = [c for c in hist.columns if c.split("_")[0] in ("ratio", "fro", "bound", "paper", "align")]
    below = hist.index[hist["loss"] < math.log(2) / len(data.X_train)]
    out = {
        "history": hist[["step", "loss", "train_error", *keep]].to_dict(orient="list"),
        "g": unit.get("g", "relu"),
        "risk_condition_step": int(hist["step"][below[0]]) if len(below) else None,
        "seconds": result.seconds,
        "unhealthy": training_health(model, data, "logistic", hist),
    }
    if isinstance(log, StageLog):
        out["limits"] = {str(c.stage): {"rho": c.rho, "rho_paper": c.rho_paper} for c in log.constants}
    return out


def final_table(results: dict[str, dict], depth: int, pairs: list) -> tuple[pd.DataFrame, list[float]]:
    """One row per seed (its last log: loss, error, ratios, bounds, alignments; its first log's ratios), and the
    smallest ``ratio − bound`` over the logs of every tail layer but the last (a vector: ratio = bound = 1)."""
    rows, margins = [], []
    for uid, res in results.items():
        h = pd.DataFrame(res["history"])
        last, first = h.iloc[-1], h.iloc[0]
        row = {
            "seed": uid,
            "loss": last["loss"],
            "train_error": last["train_error"],
            "risk_condition_step": res["risk_condition_step"],
        }
        for k in range(1, depth + 1):
            row[f"ratio_{k}"], row[f"ratio0_{k}"] = last[f"ratio_{k}"], first[f"ratio_{k}"]
            if f"bound_{k}" in h:
                row[f"bound_{k}"], row[f"paper_bound_{k}"] = last[f"bound_{k}"], last[f"paper_bound_{k}"]
                if k < depth:
                    margins.append(float((h[f"ratio_{k}"] - h[f"bound_{k}"]).min()))
        for j, k in pairs:
            row[f"align_{j}_{k}"] = last[f"align_{j}_{k}"]
        rows.append(row)
    return pd.DataFrame(rows), margins


def alignment_claims(table: pd.DataFrame, margins: list[float], tail: list[int], pairs: list) -> list:
    """Convergence, the rank-one tail, its gain from init, the alignment and Theorem 2's bound (every seed)."""
    tail_ratios = table[[f"ratio_{k}" for k in tail[:-1]]].to_numpy()
    gains = tail_ratios - table[[f"ratio0_{k}" for k in tail[:-1]]].to_numpy()
    aligns = table[[f"align_{j}_{k}" for j, k in pairs]].to_numpy()
    max_error = float(table.train_error.max())
    return [
        all_of_claim(
            "training reaches loss < 1e-3 with 100% training accuracy (every seed)",
            REF,
            # a training error, where there is one, fails the claim by that error (absolute: its threshold is 0)
            [(float(table.loss.max()), CONVERGED), *([(max_error, NO_ERROR)] if max_error else [])],
            expected="loss < 1e-3, error 0",
            measured={"max loss": float(table.loss.max()), "max error": max_error},
            id="converged",
        ),
        threshold_claim(
            f"each linear-tail layer {tail[:-1]} (the last layer, a vector, has ratio 1) tends to rank one: "
            "min ‖W‖²_op/‖W‖²_F",
            REF,
            float(tail_ratios.min()),
            TAIL_RANK_ONE,
            id="tail-rank-one",
        ),
        threshold_claim(
            "... rising from init: min gain of ‖W‖²_op/‖W‖²_F", REF, float(gains.min()), TAIL_GAIN, id="tail-ratio-gain"
        ),
        threshold_claim(
            f"adjacent tail layers align: min |⟨v_(k+1), u_k⟩| over pairs {pairs}",
            REF,
            float(aligns.min()),
            TAIL_ALIGNED,
            id="tail-aligned",
        ),
        bound_claim(
            f"ratio >= the derived Theorem 2 bound (§4 step 6, constants at init) at every log, layers {tail[:-1]}: "
            "min (ratio - bound)",
            "Le & Jegelka 2022 (arXiv 2201.11968) Theorem 2; docs/theory/invariances.md §4 steps 1-6, §6b",
            min(margins),
            "theorem2-bound",
        ),
    ]


def bound_claim(statement: str, reference: str, worst: float, cid: str):
    """``min (ratio − bound) >= −BOUND_SLACK``; its margin in ratio units, the slack included (a zero threshold)."""
    return all_of_claim(
        statement,
        reference,
        [(worst + BOUND_SLACK, NON_NEGATIVE)],
        expected=">= 0",
        measured=worst,
        tolerance=f"{BOUND_SLACK:g} (GD drift of C)",
        id=cid,
    )


def conv_claim(found: dict, runs: int):
    """Theorem 2 eq. (13) with conv layers and a ResNetFree block (`conv_tail_net`), from `conv_results`."""
    return bound_claim(
        f"Theorem 2 eq. (13) for linear conv layers and a linear ResNetFree block behind a ReLU conv g ({runs} run(s)"
        f", stages {sorted(map(int, found['stages']))}: conv, conv with stride 2, FC after the conv, the block): "
        "each stage's ‖B_k‖²_op/‖B_k‖²_F stays >= ρ_k − (E_k + ρ_k f_k)/‖B_k‖²_F at every log, with the switch costs "
        "r = min(c_in, k_h k_w) (conv), min(c, S) (FC after a conv), 2 (ResNetFree) and constants at init; "
        "min (ratio − bound)",
        "Le & Jegelka 2022 (arXiv 2201.11968) Theorem 2 eqs. (13)-(14); docs/theory/invariances.md §4 steps 1-5",
        found["min_bound_margin"],
        "theorem2-bound-conv-resnet",
    )


def tanh_results(tanh: dict[str, dict], tail: list[int], pairs: list) -> dict:
    """The tanh runs' last tail ratios and alignments, and the smallest ``ratio − bound`` over their logs."""
    t_margin, t_ratio, t_align = [], [], []
    for res in tanh.values():
        h = pd.DataFrame(res["history"])
        t_margin += [float((h[f"ratio_{k}"] - h[f"bound_{k}"]).min()) for k in tail[:-1]]
        t_ratio += [float(h[f"ratio_{k}"].iloc[-1]) for k in tail[:-1]]
        t_align += [float(h[f"align_{j}_{k}"].iloc[-1]) for j, k in pairs]
    return {"tail_ratio": t_ratio, "alignment": t_align, "min_bound_margin": min(t_margin)}


def conv_results(conv: dict[str, dict]) -> dict:
    """The conv-tail runs (`conv_tail_net`): the smallest ``ratio − bound`` over logs and tail stages but the last (the
    vector w: ratio = bound = 1), the same for the paper-style bound, and per stage the last ratio beside the limits
    ρ_k (derived) and 1/(8^{N_k}Π d_j) (paper-style) that eq. (14) bounds its liminf by."""
    margins, paper, stages = [], [], {}
    for res in conv.values():
        h = pd.DataFrame(res["history"])
        keys = sorted(int(c.split("_s")[1]) for c in h.columns if c.startswith("bound_s"))
        for k in keys[:-1]:
            margins.append(float((h[f"ratio_s{k}"] - h[f"bound_s{k}"]).min()))
            paper.append(float((h[f"ratio_s{k}"] - h[f"paper_bound_s{k}"]).min()))
            stages.setdefault(str(k), []).append(
                {"last_ratio": float(h[f"ratio_s{k}"].iloc[-1]), **res["limits"][str(k)]}
            )
    return {"min_bound_margin": min(margins), "min_paper_bound_margin": min(paper), "stages": stages}


def alignment_figure(results: dict[str, dict], depth: int, tail: list[int], pairs: list):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    uid0 = next(iter(results))
    h = pd.DataFrame(results[uid0]["history"])
    for k in range(1, depth + 1):
        (line,) = axes[0].plot(h.step, h[f"ratio_{k}"], label=f"W{k}" + (" (linear)" if k in tail else " (ReLU)"))
        if f"bound_{k}" in h and k != depth:
            axes[0].plot(h.step, h[f"bound_{k}"].clip(lower=0), ":", color=line.get_color())
    axes[0].set_ylim(0, 1.02)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("‖W‖²_op / ‖W‖²_F (dotted: derived bound)")
    axes[0].set_title(f"Rank-one tail ({uid0})")
    axes[0].legend(fontsize=7)
    for j, k in pairs:
        axes[1].plot(h.step, h[f"align_{j}_{k}"], label=f"|⟨v_{k}, u_{j}⟩|")
    axes[1].set_xlabel("step")
    axes[1].set_title("Alignment of adjacent tail layers")
    axes[1].legend(fontsize=7)
    return fig


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    depth = len(cfg.widths) + 1
    tail = list(range(depth - cfg.linear_tail + 1, depth + 1))  # 1-based layers of the linear tail
    pairs = list(zip(tail[:-1], tail[1:]))
    tanh = {u: r for u, r in results.items() if r.get("g") == "tanh"}
    conv = {u: r for u, r in results.items() if r.get("g") == "conv"}
    results = {u: r for u, r in results.items() if u not in tanh and u not in conv}
    table, margins = final_table(results, depth, pairs)
    claims = alignment_claims(table, margins, tail, pairs)
    summary = {
        "min_tail_ratio": float(table[[f"ratio_{k}" for k in tail[:-1]]].to_numpy().min()),
        "min_alignment": float(table[[f"align_{j}_{k}" for j, k in pairs]].to_numpy().min()),
        "min_bound_margin": min(margins),
        "relu_layer_ratios": table[[f"ratio_{k}" for k in range(1, tail[0])]].to_numpy().round(3).tolist(),
    }
    if tanh:
        summary["tanh_g"] = tanh_results(tanh, tail, pairs)
        claims.append(
            bound_claim(
                f"Theorem 2 needs no homogeneity of g: behind tanh layers ({len(tanh)} run(s)), each tail ratio stays "
                f">= 1 - D_k/‖W_k‖²_F (constants at init) at every log, layers {tail[:-1]}",
                "Le & Jegelka 2022 (arXiv 2201.11968) Theorem 2 (g arbitrary); docs/theory/invariances.md §4 step 6",
                summary["tanh_g"]["min_bound_margin"],
                "theorem2-bound-tanh",
            )
        )
    if conv:
        summary["conv_resnet"] = conv_results(conv)
        claims.append(conv_claim(summary["conv_resnet"], len(conv)))
    notes = [
        "ReLU-layer ratios are reported, not claimed. The paper-style bound (factors 8^{N_k}, k_h·k_w) is in "
        "the table beside the derived one; for an all-FC tail both are 1 - D_k/‖W_k‖²_F.",
        "Corollary 1's risk condition R < ℓ(0)/n: first step per seed in the table (risk_condition_step).",
    ]
    return Analysis(
        claims, {"alignment": alignment_figure(results, depth, tail, pairs)}, {"final": table}, summary, notes
    )


CATALOG = (Entry("alignment", ("quick", "tiny", "paper"), "Le & Jegelka Thm. 2: the linear tail aligns, rank one", 52),)

EXPERIMENT = Experiment(
    name="alignment",
    summary="The linear tail of a ReLU net trained with the logistic loss on separable data tends to rank one and "
    "its adjacent layers align, above the derived Theorem 2 bound.",
    reference="Le & Jegelka 2022, Training Invariances and the Low-Rank Phenomenon (ICLR 2022, arXiv 2201.11968), "
    "Theorem 2 eq. (15), Corollary 1; docs/theory/invariances.md §6b",
    config=Config,
    presets=PRESETS,
    units=units,
    run_unit=run_unit,
    analyze=analyze,
)
