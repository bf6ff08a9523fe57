"""`forces`: attraction and repulsion on the hidden representations of a trained L2-regularized ReLU
net (Jacot, Golikov, Hongler, Gabriel 2022, arXiv 2205.15809, Fig. 1; docs/theory/sparsity.md §2 "Forces" and
"Visualization").

A depth-3 ReLU MLP (β = 1) is trained on digits with mean cross-entropy + λ‖θ‖² (Adam, then full-batch
GD); the forces F^att = -λ∇a_l and F^rep = -λ∇r_l are computed in float64 on both hidden layers and drawn
in the top-2 uncentered principal directions, per datapoint (coloured by class) and per neuron.
Measured: class separation in layer 2 (nearest-class-mean accuracy of Z_2) and the share of alive neurons
whose nearest cosine neighbour is >= 0.99; "neurons form rays" (the paper) is claimed as a majority, share >= 0.5
in every hidden layer (at initialization it is 0). The paper explains the rays by the stability of neurons at a
critical point, where a neuron is stable: its attraction and repulsion cancel. That balance is claimed along each
alive neuron's ray (`radial_forces`: ⟨F^att_i + F^rep_i, Z_i⟩ = 2λ(‖v_i‖² − ‖w_i‖²) = 0), the one direction
feasible whatever the Gram ranks. These claims have premise "critical": they are judged on the trained net and again on
its certified critical point (Clarke residual <= the config's `certify`, `CERTIFY` by default), where they are "not
measured" when the certificate fails (docs/sparsity.md: at the quick preset ReLU inputs sit at their kink).
quick: digits, width 64, λ = 1e-2, Adam 3000 + GD 2000 (ours). paper: MNIST, width 200, GD only (Appendix A).
The paper does not give λ; rays form more with larger λ (docs/sparsity.md: at λ = 1e-3 the net stops with
shares 0.06 and 0.44).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, PositiveFloat

from ..catalog import Entry
from ..claims import Threshold, all_of_claim, threshold_claim
from ..config import ExperimentConfig
from ..data import digits, mnist
from ..data.mnist import require_mnist
from ..figures import plt
from ..measurements.representations import layer_forces, layers, principal_view, radial_forces, radial_imbalance
from ..measurements.sparsity import class_separation, ray_share
from ..models import MLP
from ..training import OptimizerConfig
from .base import Analysis, Experiment, TrainingUnit

SEPARATED = Threshold(
    0.9,
    ">=",
    ceiling=1.0,
    source="ours: Jacot et al. 2022 Fig. 1's 'classes separate' read as nearest-class-mean accuracy >= 0.9",
)
RADIAL_BALANCE = Threshold(
    0.01,
    "<=",
    ceiling=0.0,
    source="ours: Jacot et al. 2022 §3.1's 'the attraction and repulsion cancel each other' at a stable neuron, "
    "read along each alive neuron's ray: the summed radial imbalance <= 1% of the summed radial attraction "
    "(0 at a critical point)",
)
CERTIFY = 1e-6  # stationarity the unit must reach for the claims about critical points (`training.critical`)


class Config(OptimizerConfig, ExperimentConfig):
    """The net, the data and λ; the schedule is an `OptimizerConfig` (Adam, then full-batch GD)."""

    dataset: Literal["digits", "mnist"] = "digits"
    dtype: Literal["float32", "float64"] = "float32"  # the trained networks' dtype
    n_train: int = Field(default=1000, ge=10)
    mnist_path: str | None = None
    width: int = Field(default=64, ge=1)
    depth: int = Field(default=3, ge=2)
    bias: float = Field(default=1.0, ge=0)
    lam: float = Field(default=1e-2, gt=0)
    adam_steps: int = Field(default=3000, ge=0)
    adam_lr: float = Field(default=1e-2, gt=0)
    gd_steps: int = Field(default=2000, ge=0)
    gd_lr: float = Field(default=0.05, gt=0)
    ray_cosine: float = Field(default=0.99, gt=0, le=1)
    ray_majority: float = Field(default=0.5, gt=0, le=1)
    certify: PositiveFloat | None = Field(
        default=CERTIFY, description="Clarke-residual tolerance of each unit's critical-point certificate (None: none)"
    )
    max_points: int = Field(default=500, ge=10)
    log_every: int = Field(default=500, ge=1)


PRESETS = {
    "quick": {},
    "tiny": {"adam_steps": 200, "gd_steps": 100, "n_train": 300},
    "paper": {"dataset": "mnist", "width": 200, "adam_steps": 0, "gd_steps": 20000, "gd_lr": 0.1},
}
# paper-cpu: "paper" with 10000 GD steps (paper 20000)
PRESETS["paper-cpu"] = {**PRESETS["paper"], "gd_steps": 10000}


def make_data(cfg: Config):
    if cfg.dataset == "digits":
        return digits(cfg.n_train, seed=cfg.seed)
    return mnist(cfg.mnist_path)


def make_model(cfg: Config, data) -> MLP:
    return MLP(
        data.d_in, data.d_out, cfg.width, cfg.depth, bias=cfg.bias, seed=cfg.seed + 1, dtype=getattr(torch, cfg.dtype)
    )


def units(cfg: Config) -> list[dict]:
    return [{"id": f"{cfg.dataset}-w{cfg.width}"}]


def build(cfg: Config, unit: dict) -> TrainingUnit:
    data = make_data(cfg)
    config = cfg.train_config("cross_entropy", cfg.lam, top_singular_values=0)
    return TrainingUnit(make_model(cfg, data), data, config, certify=cfg.certify)


def finish(cfg: Config, unit: dict, model, result, ctx) -> dict:
    data = make_data(cfg)
    X, y = data.X_train.double(), data.Y_train
    initial = make_model(cfg, data)
    init_pre = layers(initial, X).pre
    out = {"final": result.history.iloc[-1].to_dict(), "train_seconds": result.seconds, "layers": []}
    for f in layer_forces(model, X, y, cfg.lam)[:-1]:
        views = {}
        for view in ("datapoint", "neuron"):
            pts, att, rep, idx = principal_view(f, view, max_points=cfg.max_points)
            views[view] = {
                "points": pts.tolist(),
                "attraction": att.tolist(),
                "repulsion": rep.tolist(),
                "index": idx.tolist(),
            }
        out["layers"].append(
            {
                "layer": f.layer,
                "balance": f.balance,
                "radial_imbalance": radial_imbalance(f),
                "radial_imbalance_worst": worst_neuron(f),
                "attraction_norm": float(f.attraction.norm()),
                "repulsion_norm": float(f.repulsion.norm()),
                "ray_share": ray_share(f.Z, cfg.ray_cosine),
                "ray_share_init": ray_share(init_pre[f.layer - 1], cfg.ray_cosine),
                "alive": int((torch.relu(f.Z).norm(dim=0) > 0).sum()),
                "class_separation": class_separation(f.Z, y),
                "class_separation_init": class_separation(init_pre[f.layer - 1], y),
                "views": views,
            }
        )
    out["labels"] = y.tolist()
    return out


def worst_neuron(f) -> float:
    """The largest ``|att_i + rep_i|/|att_i|`` over the alive neurons of `radial_forces` (NaN with none)."""
    r = radial_forces(f)
    ratios = ((r.attraction + r.repulsion) / r.attraction)[r.alive].abs()
    return float(ratios.max()) if ratios.numel() else float("nan")


def balance_claim(lays: list[dict], ref: str):
    """Attraction and repulsion cancel on the alive neurons of every hidden layer, along their rays (premise
    "critical": the paper's statement about stable neurons)."""
    worst = max(lays, key=lambda lay: lay["radial_imbalance"])
    return threshold_claim(
        "attraction = repulsion at stationary neurons ('the neuron is stable, i.e. the attraction and repulsion "
        "cancel each other', §3.1 on Fig. 1): along each alive neuron's ray Z_l[:, i], the one direction feasible "
        "whatever the Gram ranks, ⟨F^att_i + F^rep_i, Z_i⟩ = 2λ(‖v_i‖² − ‖w_i‖²) vanishes; measured "
        "Σ_i|⟨F^att_i + F^rep_i, Z_i⟩| / Σ_i|⟨F^att_i, Z_i⟩| in the worst hidden layer "
        f"(layer {worst['layer']}; per layer {[round(lay['radial_imbalance'], 6) for lay in lays]}); the reading "
        "along rays and the 1% are ours",
        ref,
        worst["radial_imbalance"],
        RADIAL_BALANCE,
        id="radial-balance",
        premise="critical",
    )


def forces_claims(cfg: Config, lays: list[dict]) -> list:
    """Fig. 1's claims on the per-layer results of `finish`: classes separate in the last hidden layer, attraction
    and repulsion cancel along the neurons' rays, and the neurons of each hidden layer form rays."""
    ref = "Jacot, Golikov, Hongler, Gabriel 2022 (arXiv 2205.15809) Fig. 1; docs/theory/sparsity.md §6"
    last = lays[-1]
    sep, sep0 = last["class_separation"], last["class_separation_init"]
    claims = [
        all_of_claim(
            f"classes separate in layer {last['layer']}: nearest-class-mean accuracy of Z_{last['layer']} on "
            f"the train set is >= {SEPARATED.bound:g} and above that at initialization (init: {sep0:.3f})",
            ref,
            [(sep, SEPARATED), (sep, Threshold(sep0, ">", ceiling=1.0 if sep0 < 1 else None))],
            expected=f">= max({SEPARATED.bound:g}, {sep0:.3f})",
            measured=sep,
            id="class-separation",
        )
    ]
    claims.append(balance_claim(lays, ref))
    for lay in lays:
        claims.append(
            threshold_claim(
                f"neurons of layer {lay['layer']} align along rays ('the neurons naturally align along rays starting "
                f"from the origin', §2 on Fig. 1b, 1d): share of the alive neurons ({lay['alive']}) with another on "
                f"their ray, a nearest cosine neighbour >= {cfg.ray_cosine} (init: {lay['ray_share_init']:.3f}); "
                "'most' is our reading",
                ref,
                lay["ray_share"],
                cfg.ray_majority,
                ">=",
                ceiling=1.0,
                id=f"rays-layer{lay['layer']}",
                premise="critical",
            )
        )
    return claims


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    ((uid, res),) = results.items()
    lays = res["layers"]
    labels = np.array(res["labels"])
    fig, axes = plt.subplots(len(lays), 2, figsize=(11, 5 * len(lays)), squeeze=False)
    for row, lay in zip(axes, lays):
        for ax, view in zip(row, ("datapoint", "neuron")):
            v = lay["views"][view]
            P, A, R = (np.array(v[k]) for k in ("points", "attraction", "repulsion"))
            if view == "datapoint":
                ax.scatter(P[:, 0], P[:, 1], c=labels[v["index"]], cmap="tab10", s=8, zorder=2)
            else:
                ax.scatter(P[:, 0], P[:, 1], color="k", s=8, zorder=2)
            scale = np.abs(np.concatenate([A, R])).max() / (0.15 * np.ptp(P, axis=0).max() + 1e-300)
            for F, c, name in ((A, "tab:red", "attraction"), (R, "tab:blue", "repulsion")):
                ax.quiver(
                    P[:, 0],
                    P[:, 1],
                    F[:, 0],
                    F[:, 1],
                    color=c,
                    angles="xy",
                    scale_units="xy",
                    scale=scale,
                    width=0.002,
                    label=name,
                    zorder=1,
                )
            ax.set_title(f"layer {lay['layer']}, {view} view (uncentered PC1-PC2)")
            ax.legend(loc="best", fontsize=8)
    figures = {"forces": fig}
    table = pd.DataFrame([{k: v for k, v in lay.items() if k != "views"} for lay in lays])
    claims = forces_claims(cfg, lays)
    summary = {
        "final_loss": res["final"]["loss"],
        "final_train_error": res["final"]["train_error"],
        "final_test_error": res["final"].get("test_error"),
        "train_seconds": res["train_seconds"],
        **{
            f"layer{l['layer']}": {
                k: l[k]
                for k in ("balance", "radial_imbalance", "ray_share", "ray_share_init", "alive", "class_separation")
            }
            for l in lays
        },
    }
    notes = [
        "Balance ‖F^att + F^rep‖/‖F^att‖ is reported, not asserted: trained nets have near-singular Grams, "
        "where balance holds only along feasible directions (docs/theory/sparsity.md §2 'Balance'). "
        "`radial-balance` asserts it along each neuron's ray, a direction that is always feasible; "
        "radial_imbalance_worst (the table) is the largest single neuron's |att_i + rep_i|/|att_i|."
    ]
    return Analysis(claims, figures, {"layers": table}, summary, notes)


CATALOG = (
    Entry(
        "forces", ("quick", "tiny", "paper", "paper-cpu"), "Jacot et al. 2022 Fig. 1: attraction/repulsion, rays", 31
    ),
)

EXPERIMENT = Experiment(
    name="forces",
    summary="Attraction and repulsion between layers of an L2-regularized ReLU net: classes separate and "
    "neurons settle on rays.",
    reference="Jacot, Golikov, Hongler, Gabriel 2022, Feature Learning in L2-regularized DNNs (NeurIPS 2022, "
    "arXiv 2205.15809), Fig. 1; "
    "docs/theory/sparsity.md §2",
    config=Config,
    presets=PRESETS,
    units=units,
    check=require_mnist,
    build=build,
    finish=finish,
    analyze=analyze,
)
