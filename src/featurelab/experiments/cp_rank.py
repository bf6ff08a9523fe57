"""`cp-rank`: the bipartite dataset needs N²/4 neurons (Jacot, Golikov, Hongler, Gabriel 2022, arXiv
2205.15809, Props. 13-14; docs/theory/sparsity.md §4).

With X = I_N and Y = Q = Deg + Adj of K_{N/2,N/2}, the representation cost is minimized by one ReLU
neuron per edge (W_1 = Bᵀ, W_2 = B, ‖θ‖² = N² = 2 Tr Q), and since the graph is triangle-free no net
with fewer than cp-rank(Q) = N²/4 neurons reaches it. The analysis verifies the constructions exactly
(reconstruction, norm, width, exact balance of the forces) for several N, and the same for
`onehot_identity`; the units train depth-2 nets of several widths on bipartite(N), each polished to a
certified critical point, and compare the minimal regularized loss m(w) with the lower bound
m_low = min_Y' (1/N)‖Y' - Y‖² + 2λ‖Y'‖_* (`lower_bound_loss`, valid at any width): widths >= the cp-rank must
reach it, to within half the gap of the best narrower net, and narrower ones must stay above every wider one
(Prop. 14: R > 2 Tr M_Y for n < r). The rescaled construction's best loss m* lies above m_low (Y is not a
multiple of the optimum's outputs); it is reported.
The cp-rank is computed, not assumed: `cp_rank_bounds` of M_Y = (YYᵀ)^½ bounds it below by the rank and the
clique cover of its support graph, and above by the construction's hidden layer; the two meet.
quick: N = 6, λ = 1e-2, widths [4, 6, 8, 9, 12] x 2, Adam 3000 (ours). paper: N = 8, widths up to 24, x 3.
"""

from __future__ import annotations

from typing import Literal

import pandas as pd
import torch
from pydantic import Field, PositiveFloat, PositiveInt

from ..catalog import Entry
from ..claims import Threshold, all_of_claim, boolean_claim, threshold_claim
from ..config import ExperimentConfig
from ..data.constructions import (
    adjacency_matrix,
    bipartite,
    complete_bipartite_edges,
    is_triangle_free,
    onehot_identity,
)
from ..figures import plt
from ..measurements.representations import layer_forces
from ..measurements.sparsity import cp_rank_bounds, output_gram_root
from ..models import MLP
from ..training import OptimizerConfig
from .base import Analysis, Experiment, TrainingUnit
from .width_plateau import CARATHEODORY, CERTIFY, shrink


class Config(OptimizerConfig, ExperimentConfig):
    """The graph, widths and trials; the schedule is an `OptimizerConfig` (Adam, then full-batch GD)."""

    construction_sizes: list[PositiveInt] = Field(default=[4, 6, 8], min_length=1)
    dtype: Literal["float32", "float64"] = "float32"  # the trained networks' dtype
    onehot_sizes: list[PositiveInt] = Field(default=[3, 5, 2], min_length=1)
    N: int = Field(default=6, ge=2, le=200)
    lam: float = Field(default=1e-2, gt=0)
    widths: list[PositiveInt] = Field(default=[4, 6, 8, 9, 12], min_length=1)
    trials: int = Field(default=2, ge=1, le=1000)
    adam_steps: int = Field(default=3000, ge=1)
    adam_lr: float = Field(default=1e-2, gt=0)
    gd_steps: int = Field(default=0, ge=0)
    gd_lr: float = Field(default=0.05, gt=0)
    near: float = Field(default=0.01, gt=0)
    certify: PositiveFloat | None = Field(
        default=CERTIFY, description="Clarke-residual tolerance of each unit's critical-point certificate (None: none)"
    )
    log_every: int = Field(default=500, ge=1)


PRESETS = {
    "quick": {},
    "tiny": {"widths": [4, 9], "trials": 1, "adam_steps": 300},
    "paper": {
        "N": 8,
        "widths": [4, 8, 12, 15, 16, 20, 24],
        "trials": 3,
        "adam_steps": 20000,
        "adam_lr": 3e-3,
        "gd_steps": 5000,
    },
}


def units(cfg: Config) -> list[dict]:
    return [{"id": f"N{cfg.N}-w{w}-t{t}", "width": w, "trial": t} for w in cfg.widths for t in range(cfg.trials)]


def build(cfg: Config, unit: dict) -> TrainingUnit:
    data = bipartite(cfg.N).data
    model = MLP(
        cfg.N,
        cfg.N,
        unit["width"],
        2,
        bias=0.0,
        seed=cfg.seed + 1000 * unit["trial"] + unit["width"],
        dtype=getattr(torch, cfg.dtype),
    )
    return TrainingUnit(model, data, cfg.train_config("mse", cfg.lam, top_singular_values=0), certify=cfg.certify)


def finish(cfg: Config, unit: dict, model, result, ctx) -> dict:
    return {**unit, **shrink(model, bipartite(cfg.N).data, "mse", cfg.lam), "train_seconds": result.seconds}


def computed_cp_rank(c) -> tuple[int, int | None]:
    """(lower, upper) bounds of cp-rank(M_Y) for a `Construction`: its hidden layer σ(Z_1) is the factor."""
    X, Y = c.data.X_train, c.data.Y_train
    with torch.no_grad():
        hidden = c.model(X, return_layers=True).act[1]
    b = cp_rank_bounds(output_gram_root(Y), factor=hidden, rtol=1e-9)
    return b.lower, b.upper


def best_rescaled_loss(Y: torch.Tensor, lam: float, R: float) -> float:
    """min_c (1/N)‖cY - Y‖² + λcR = λR - (λR)²N/(4‖Y‖²) (c = 1 - λRN/(2‖Y‖²)): the best mean-squared-error loss
    of the construction rescaled, as the representation cost of depth 2 without bias is 1-homogeneous."""
    y2 = float((Y**2).sum())
    return lam * R - (lam * R) ** 2 * Y.shape[0] / (4 * y2)


def lower_bound_loss(Y: torch.Tensor, lam: float) -> float:
    """min over Y' of (1/N)‖Y' - Y‖² + 2λ‖Y'‖_*: a lower bound on C + λ‖θ‖² for every depth-2 bias-free ReLU net
    on X = I_N (``N x d_out`` targets Y), at any width, since ‖θ‖² >= ‖W_2‖² + ‖σ(W_1)‖² >= 2‖W_2σ(W_1)‖_*. The
    minimiser soft-thresholds the singular values of Y at λN (the prox of the nuclear norm), so the bound is
    (1/N)Σ min(s_i, λN)² + 2λΣ(s_i - λN)_+. Equality needs ‖θ‖² = 2 Tr M_{Y'}, a width >= the cp-rank (Prop. 14)."""
    s = torch.linalg.svdvals(Y.to(torch.float64))
    t = lam * Y.shape[0]
    shrunk = (s - t).clamp_min(0)
    return float(((s - shrunk) ** 2).sum() / Y.shape[0] + 2 * lam * shrunk.sum())


EXACT = Threshold(1e-12, "<=", ceiling=0.0, source="ours: the constructions are exact in float64, up to rounding")
BALANCED = Threshold(
    1e-10, "<=", ceiling=0.0, source="Jacot et al. 2022 §2 'Balance': F^att + F^rep = 0 at a critical point"
)
ABOVE_LOWER_BOUND = Threshold(-1e-12, ">=", source="ours: ‖θ‖² >= 2‖f(I)‖_* for any θ, up to rounding")


def check_constructions(cfg: Config) -> tuple[list, pd.DataFrame]:
    """Exact checks of `bipartite(N)` and `onehot_identity` (float64): claims and a table."""
    table = construction_table(cfg)
    return construction_claims(cfg, table), table


def construction_table(cfg: Config) -> pd.DataFrame:
    """One row per construction (bipartite(N) for each N, then onehot_identity): width, cp-rank bounds, norm,
    reconstruction error, balance, whether its graph is triangle-free."""
    rows = []
    for N in cfg.construction_sizes:
        c = bipartite(N)
        X, Y = c.data.X_train, c.data.Y_train
        with torch.no_grad():
            rec = float((c.model(X) - Y).abs().max())
        lo, hi = computed_cp_rank(c)
        rows.append(
            {
                "construction": f"bipartite({N})",
                "width": c.model.dims[1],
                "cp_rank_lower": lo,
                "cp_rank_upper": hi,
                "n2_over_4": N * N // 4,
                "sq_norm": float(c.model.sq_norm().detach()),
                "expected_sq_norm": c.sq_norm,
                "reconstruction": rec,
                "balance": layer_forces(c.model, X, Y, cfg.lam)[0].balance,
                "triangle_free": is_triangle_free(adjacency_matrix(complete_bipartite_edges(N // 2, N // 2), N)),
            }
        )
    c = onehot_identity(cfg.onehot_sizes)
    with torch.no_grad():
        rec = float((c.model(c.data.X_train) - c.data.Y_train).abs().max())
    lo, hi = computed_cp_rank(c)
    rows.append(
        {
            "construction": f"onehot_identity({cfg.onehot_sizes})",
            "width": c.model.dims[1],
            "cp_rank_lower": lo,
            "cp_rank_upper": hi,
            "n2_over_4": None,
            "sq_norm": float(c.model.sq_norm().detach()),
            "expected_sq_norm": c.sq_norm,
            "reconstruction": rec,
            "balance": layer_forces(c.model, c.data.X_train, c.data.Y_train, cfg.lam)[0].balance,
            "triangle_free": None,
        }
    )
    return pd.DataFrame(rows)


def construction_claims(cfg: Config, table: pd.DataFrame) -> list:
    """The constructions have the computed cp-rank as their width, reproduce Y exactly, with the optimal norm,
    and are balanced (checks of the code: identities)."""
    ref = "Jacot et al. 2022 (arXiv 2205.15809) Props. 13-14; docs/theory/sparsity.md §4, §7 check 3"
    bip = table.iloc[:-1]
    return [
        boolean_claim(
            f"the cp-rank of M_Y = (YYᵀ)^½, computed (lower bound: rank and clique cover of its support graph; "
            f"upper bound: the construction's hidden layer), is N²/4 for bipartite(N), N in "
            f"{cfg.construction_sizes}, and C = {len(cfg.onehot_sizes)} for onehot_identity; the constructions "
            "have exactly that many neurons",
            ref,
            f"lower = upper = width = {[N * N // 4 for N in cfg.construction_sizes] + [len(cfg.onehot_sizes)]}",
            {r["construction"]: f"[{r['cp_rank_lower']}, {r['cp_rank_upper']}]" for r in table.to_dict("records")},
            bool(
                (table["cp_rank_lower"] == table["cp_rank_upper"]).all()
                and (table["cp_rank_lower"] == table["width"]).all()
                and (bip["cp_rank_lower"] == bip["n2_over_4"]).all()
                and table["cp_rank_lower"].iloc[-1] == len(cfg.onehot_sizes)
                and bip["triangle_free"].all()
            ),
            id="cp-rank-computed",
            kind="identity",
        ),
        threshold_claim(
            "the constructions reproduce Y exactly: max|f(X) - Y|",
            ref,
            float(table["reconstruction"].max()),
            EXACT,
            id="construction-exact",
            kind="identity",
        ),
        threshold_claim(
            "the constructions have the optimal norm ‖θ‖² = 2 Tr M_Y (N² for bipartite, 2Σ√N_c for one-hot): "
            "max |‖θ‖² - 2 Tr M_Y| / 2 Tr M_Y",
            ref,
            float(((table["sq_norm"] - table["expected_sq_norm"]).abs() / table["expected_sq_norm"]).max()),
            EXACT,
            id="construction-norm",
            kind="identity",
        ),
        threshold_claim(
            "the constructions are exactly balanced on the hidden layer: ‖F^att + F^rep‖ / ‖F^att‖",
            "Jacot et al. 2022 (arXiv 2205.15809) §2 'Balance'; docs/theory/sparsity.md §2, §7 check 3",
            float(table["balance"].max()),
            BALANCED,
            id="construction-balance",
            kind="identity",
        ),
    ]


def reach_tolerance(near: float, narrow_losses, target: float) -> float:
    """The relative distance to the optimum `target` within which a width "reaches" it: `near`, or half the
    relative gap of the best narrower net, ½(min_{w<r} m(w)/target - 1), when that is smaller. A wide net passes
    only if it is nearer the optimum than any narrower one by a factor 2, so the tolerance can never let a width
    below the cp-rank count as reaching it (at the quick preset m(8)/m_low - 1 = 3.5e-3, below 1 %)."""
    if len(narrow_losses) == 0:
        return near
    return min(near, 0.5 * (float(min(narrow_losses)) / target - 1))


def run_claims(cfg: Config, rows: pd.DataFrame, best: pd.DataFrame, r: int, bound: float, target: float) -> list:
    """The trained nets (`rows`; `best`: the minimising trial per width) against the lower bound m_low = `bound`:
    never below it, reached at widths >= the cp-rank `r`, not reached below it (Prop. 14); the Carathéodory
    reduction keeps their outputs."""
    ref = "Jacot et al. 2022 (arXiv 2205.15809) Prop. 14; docs/theory/sparsity.md §4, measured reproduction"
    wide, narrow = best[best["width"] >= r], best[best["width"] < r]
    near = reach_tolerance(cfg.near, narrow["loss"], bound)
    claims = [
        threshold_claim(
            f"no net goes below the lower bound m_low = min_Y' (1/N)‖Y' - Y‖² + 2λ‖Y'‖_* = {bound:.6g} "
            "(‖θ‖² >= 2‖f(I)‖_* for any parameters): (min_w m(w) - m_low)/m_low over all trained nets, "
            "up to rounding",
            ref,
            (float(rows["loss"].min()) - bound) / bound,
            ABOVE_LOWER_BOUND,
            id="loss-lower-bound",
            kind="identity",
        )
    ]
    if len(wide):
        claims.append(
            threshold_claim(
                f"trained nets of width >= cp-rank = {r} reach the optimum, the lower bound m_low = {bound:.6g} "
                f"(the rescaled construction gives m* = {target:.6g}, above it): max |m(w)/m_low - 1| over widths "
                f">= {r}, within a tolerance below half the narrow nets' gap, min(near, ½(min_{{w<r}} m(w)/m_low "
                f"- 1)) = {near:.3g}",
                ref,
                float((wide["loss"] / bound - 1).abs().max()),
                near,
                "<=",
                id="wide-reach-optimum",
                premise="critical",
            ).rests_on(wide["id"])  # m(w) is a min over trials: the minimisers, not the trials beside them
        )
    if len(narrow) and len(wide):
        low, high = float(narrow["loss"].min()), float(wide["loss"].max())
        claims.append(
            all_of_claim(
                f"nets narrower than the cp-rank ({narrow['width'].tolist()} < {r}) do not reach the optimum: "
                "every m(w), w < cp-rank, stays above every m(w'), w' >= cp-rank (Prop. 14: R > 2 Tr M_Y)",
                ref,
                [(low, Threshold(high, ">"))],
                expected="min_{w<r} m(w) - max_{w'>=r} m(w') > 0",
                measured={**dict(zip(narrow["width"].astype(str), narrow["loss"] / bound)), "difference": low - high},
                tolerance="",
                id="narrow-above-optimum",
                premise="critical",
            ).rests_on(best["id"])
        )
    claims.append(
        threshold_claim(
            "Carathéodory reduction keeps the trained nets' training outputs: max|Δf|/max|f| (float64)",
            "Jacot et al. 2022 (arXiv 2205.15809) §5; docs/theory/sparsity.md §5b",
            float(rows["reduced_output_error"].max()),
            CARATHEODORY,
            id="caratheodory-outputs",
            kind="identity",
        )
    )
    return claims


def cp_figure(cfg: Config, best: pd.DataFrame, r: int, bound: float, target: float):
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(best["width"], best["loss"], marker="o", label="min over trials of C + λ‖θ‖²")
    ax.axhline(target, color="0.4", ls=":", label="rescaled construction m*")
    ax.axhline(bound, color="k", ls="--", label="lower bound m_low (nuclear-norm prox)")
    ax.axvline(r, color="0.6", ls=":", label=f"computed cp-rank {r}")
    ax.set(xlabel="hidden width", ylabel="regularized loss", title=f"bipartite({cfg.N}), λ = {cfg.lam:g}")
    ax.legend()
    return fig


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    claims, table = check_constructions(cfg)
    tables = {"constructions": table}
    summary = {"constructions": table.drop(columns=["triangle_free"]).to_dict(orient="records")}
    if not results:
        return Analysis(claims, {}, tables, summary)
    rows = pd.DataFrame(results.values())
    best = rows.loc[rows.groupby("width")["loss"].idxmin()].sort_values("width")
    tables.update(runs=rows, per_width=best)
    c = bipartite(cfg.N)
    r, r_upper = computed_cp_rank(c)
    target = best_rescaled_loss(c.data.Y_train, cfg.lam, c.sq_norm)
    bound = lower_bound_loss(c.data.Y_train, cfg.lam)
    summary["cp_rank"] = {"lower": r, "upper": r_upper}
    summary["construction_best_loss"] = target
    summary["lower_bound_loss"] = bound
    summary["reach_tolerance"] = reach_tolerance(cfg.near, best[best["width"] < r]["loss"], bound)
    claims += run_claims(cfg, rows, best, r, bound, target)
    summary["m"] = dict(zip(best["width"].astype(str), best["loss"]))
    summary["reduced_width"] = dict(zip(best["width"].astype(str), [w[0] for w in best["reduced_width"]]))
    return Analysis(claims, {"cp_rank": cp_figure(cfg, best, r, bound, target)}, tables, summary)


CATALOG = (Entry("cp-rank", ("quick", "tiny", "paper"), "Jacot et al. 2022 Props. 13-14: N²/4 neurons", 33),)

EXPERIMENT = Experiment(
    name="cp-rank",
    summary="The bipartite dataset's optimal ReLU nets need N²/4 neurons (cp-rank of Deg + Adj), and the "
    "constructions are exact and balanced.",
    reference="Jacot, Golikov, Hongler, Gabriel 2022, Feature Learning in L2-regularized DNNs (NeurIPS 2022, "
    "arXiv 2205.15809), Props. 13-14; docs/theory/sparsity.md §4",
    config=Config,
    presets=PRESETS,
    units=units,
    build=build,
    finish=finish,
    analyze=analyze,
)
