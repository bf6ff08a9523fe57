"""`leaky-bottleneck`: a Leaky ResNet trained on a bottleneck teacher learns a k*-dimensional
bottleneck in its middle layers (docs/theory/leaky-resnets.md §5; Jacot & Kaiser Fig. 1 at one L̃).

quick: Part 1 §5.4 at L̃ = 8 (teacher 10→3→10, N = 256, w = 40, L = 16, λ = 0.02, Adam 15k cosine).
paper: Part 1 §5.2 (teacher 20→5→20, N = 1000, w = 200, L = 50, λ = 0.002, adaptive ρ, L̃ = 5,
Adam 20k then guarded GD 10k).
Claim (Part 1 §5.4 Q4): in the middle half of the layers, at least 75% have effective rank
#{i: s_i >= 0.1 s_1} of W_l in {k*, k*+1}.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, model_validator

from ..claims import claim
from ..config import ExperimentConfig
from ..data import bottleneck_teacher
from ..figures import plt
from ..measurements import effective_rank, singular_values
from ..models import LeakyResNet
from ..training import Phase, TrainConfig
from .base import Analysis, Experiment, TrainingUnit


class Config(ExperimentConfig):
    teacher_dims: list[int] = Field([10, 3, 10], min_length=3)
    teacher_kind: Literal["fcnn", "resnet"] = "fcnn"
    teacher_hidden: int = Field(64, ge=1)
    n_train: int = Field(256, ge=2)
    n_test: int = Field(256, ge=0)
    width: int = Field(40, ge=1)
    depth: int = Field(16, ge=1)
    effective_depth: float = Field(8.0, gt=0)
    steps: Literal["equidistant", "irregular", "adaptive"] = "equidistant"
    lam: float = Field(0.02, gt=0)
    adam_steps: int = Field(15000, ge=0)
    adam_lr: float = Field(3e-3, gt=0)
    adam_lr_min: float = Field(3e-6, ge=0)
    adam_schedule: Literal["constant", "cosine"] = "cosine"
    gd_steps: int = Field(0, ge=0)
    gd_lr: float = Field(1e-2, gt=0)
    log_every: int = Field(250, ge=1)
    checkpoint_every: int = Field(2500, ge=0)
    dtype: Literal["float32", "float64"] = "float32"

    @model_validator(mode="after")
    def _valid_steps(self):
        """ρ_l·L̃ < 1 for the chosen scheme (Part 1 §2): checked here, before any training."""
        check_depth(self.depth, self.effective_depth, self.steps)
        return self


def check_depth(depth: int, Lt: float, steps: str) -> None:
    """Raise ValueError unless `steps` with `depth` steps keeps ρ_l·L̃ < 1 at effective depth Lt (Part 1 §2)."""
    ok = {"equidistant": depth > Lt, "irregular": depth > (1 + 0.5 / 4) * Lt, "adaptive": depth >= Lt / 0.9}[steps]
    if not ok:
        raise ValueError(
            f"depth={depth} is too small for effective_depth={Lt:g} with {steps} steps "
            "(Part 1 §2 needs rho_l·effective_depth < 1): raise depth or lower effective_depth"
        )


PRESETS = {
    "quick": {},
    "tiny": {
        "n_train": 64,
        "n_test": 64,
        "width": 16,
        "depth": 8,
        "effective_depth": 2.0,
        "adam_steps": 300,
        "log_every": 50,
        "checkpoint_every": 100,
    },
    "paper": {
        "teacher_dims": [20, 5, 20],
        "teacher_hidden": 100,
        "n_train": 1000,
        "n_test": 1000,
        "width": 200,
        "depth": 50,
        "effective_depth": 5.0,
        "steps": "adaptive",
        "lam": 0.002,
        "adam_steps": 20000,
        "adam_lr": 1e-3,
        "adam_schedule": "constant",
        "gd_steps": 10000,
        "gd_lr": 1e-2,
        "log_every": 500,
    },
}


def bottleneck_rank(cfg: Config) -> int:
    """k*: the smallest inner dimension of the teacher."""
    return min(cfg.teacher_dims[1:-1])


def middle_half(L: int) -> list[int]:
    """1-based layers l with L/4 < l <= 3L/4 (the "mid-half" of Part 1 §5.4)."""
    return [l for l in range(1, L + 1) if L / 4 < l <= 3 * L / 4]


def mid_half_share(ranks: list[int], k: int) -> float:
    """Share of the middle-half layers whose effective rank is k* or k*+1 (Part 1 §5.4 Q4); ranks[l-1] is W_l's."""
    return float(np.mean([ranks[l - 1] in (k, k + 1) for l in middle_half(len(ranks))]))


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
    return [{"id": f"Lt{cfg.effective_depth:g}-seed{cfg.seed}"}]


def build(cfg: Config, unit: dict) -> TrainingUnit:
    data = make_data(cfg)
    return TrainingUnit(make_model(cfg, data), data, train_config(cfg))


def finish(cfg: Config, unit: dict, model: LeakyResNet, result, ctx) -> dict:
    final = result.history.iloc[-1].to_dict()
    W = [w.detach().double().cpu() for w in model.layer_matrices()]
    return {
        "final": final,
        "rho": model.rho.tolist(),
        "positions": model.positions.tolist(),
        "top_singular_values": [singular_values(w, 10).tolist() for w in W],
        "effective_ranks": [effective_rank(w, rtol=0.1) for w in W],
        "train_seconds": result.seconds,
        "resumed_from_step": result.resumed_from,
    }


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    ((uid, res),) = results.items()
    k = bottleneck_rank(cfg)
    ranks = res["effective_ranks"]
    mid = middle_half(cfg.depth)
    share = mid_half_share(ranks, k)
    claims = [
        claim(
            f"in the middle half of the layers, >= 75% have effective rank #{{s_i >= 0.1 s_1}} of W_l "
            f"in {{k*, k*+1}} = {{{k}, {k + 1}}}",
            "docs/theory/leaky-resnets.md §5.4 Q4; Jacot & Kaiser Fig. 1",
            ">= 0.75",
            share,
            share >= 0.75,
        )
    ]

    p = np.array(res["positions"][:-1])
    S = np.array([s + [np.nan] * (10 - len(s)) for s in res["top_singular_values"]])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i in range(S.shape[1]):
        ax.plot(p, S[:, i], marker=".", lw=1, color=plt.cm.viridis(i / 9))
    ax.axvspan(p[mid[0] - 1], p[mid[-1] - 1], color="0.9", zorder=0, label="middle half")
    ax.set_yscale("log")
    ax.set_xlabel("layer position p (W_l plotted at p_{l-1})")
    ax.set_ylabel("top-10 singular values of W_l")
    ax.set_title(f"Bottleneck: k* = {k}, L̃ = {cfg.effective_depth:g}, L = {cfg.depth}")
    ax.legend(loc="upper right")
    figures = {"bottleneck_spectra": fig}

    hist = pd.read_csv(ctx.dir / "units" / uid / "history.csv")
    fig2, ax2 = plt.subplots(figsize=(6.5, 4))
    for col in ("loss", "cost", "penalty", "test_cost"):
        if col in hist:
            ax2.plot(hist["step"], hist[col], label=col)
    ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_title("training curves")
    ax2.legend()
    figures["training_curves"] = fig2

    table = pd.DataFrame(
        {
            "layer": range(1, cfg.depth + 1),
            "p": p,
            "rho": res["rho"],
            "effective_rank": ranks,
            **{f"s{i + 1}": S[:, i] for i in range(min(5, S.shape[1]))},
        }
    )
    final = res["final"]
    summary = {
        "k_star": k,
        "mid_half_share_in_k_or_k_plus_1": share,
        "effective_ranks": ranks,
        "final_loss": final["loss"],
        "final_cost": final["cost"],
        "final_test_cost": final.get("test_cost"),
        "train_seconds": res["train_seconds"],
    }
    return Analysis(claims, figures, {"layers": table}, summary)


EXPERIMENT = Experiment(
    name="leaky-bottleneck",
    summary="A Leaky ResNet trained with L2 regularization on a bottleneck teacher learns a k*-dimensional "
    "bottleneck in its middle layers.",
    reference="Jacot & Kaiser, Hamiltonian Mechanics of Feature Learning (arXiv 2405.17573), Fig. 1; "
    "docs/theory/leaky-resnets.md §5",
    config=Config,
    presets=PRESETS,
    units=units,
    build=build,
    finish=finish,
    analyze=analyze,
)
