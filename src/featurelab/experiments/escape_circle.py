"""`escape-circle`: optimal escape directions of Example 1 (unit circle, alternating gradients) and the
width sweep of Figure 2 (Bantzis, Simon, Jacot 2025, arXiv 2505.21722, Example 1 and Fig. 2;
docs/theory/saddle-to-saddle.md §5).

Units: one batched projected-GD search (A1) per hidden width, and one batched rank-one search (A2)
per rank-one width. The rank-one speed curve S(φ) is computed in the analysis (closed form).
quick: widths 2..64, R = 20 restarts, K = 4000 steps (docs/theory/saddle-to-saddle.md §5's quick preset).
paper: widths 2..128, R = 50 (the reference fractions of §5 are from seed 1 at R = 50).
Claims: the data are Fig. 2 (left)'s 8 points with alternating gradients, and max S(φ) = √2-1 at φ = kπ/4
(both checks of the code: kind "identity"); best rank-one search speed √2-1;
projected GD's best speed is the rank-two 1/2 (the paper "doubts" a faster direction exists: that no run
exceeds 1/2 is reported, not claimed); success fraction (speed > √2-1 + 1e-3) non-decreasing in width up to
sampling noise (two binomial standard errors), >= 0.8 at widths >= 64 and <= 0.05 at width 2; every optimum
found (speed 1/2) has a rank-two first layer (s_2/s_1(W_1) >= 0.5). Figures: the data (Fig. 2 left), S(φ),
the projected-GD curves of every run (Fig. 2 centre, Fig. 6) and the width sweep (Fig. 2 right).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from pydantic import Field, PositiveInt

from ..catalog import Entry
from ..claims import Claim, Threshold, all_of_claim, boolean_claim, fmt, threshold_claim
from ..config import ExperimentConfig
from ..data.circle import circle_dataset
from ..figures import plt
from ..measurements.escape import (
    eig_residual,
    eq6_curve,
    find_escape_directions,
    forward,
    layer_diagnostics,
    localized_loss,
    rank_one_curve,
    theorem31_bound,
    theorem31_check,
)
from ..measurements.ranks import numerical_rank
from ..models import MLP
from ..training.health import training_health
from .base import Analysis, Experiment

RANK_ONE_SPEED = math.sqrt(2) - 1
DEAD_SPEED = 1e-9  # a best escape speed at or below this: every searched network is dead (no escape measured)
REFERENCE_FRACTIONS = {2: 0.00, 4: 0.02, 8: 0.30, 16: 0.78, 32: 0.92, 64: 0.98, 128: 1.00}  # §5, seed 1
REF = "Bantzis, Simon, Jacot 2025 (arXiv 2505.21722) Example 1, Fig. 2; docs/theory/saddle-to-saddle.md §5"
CURVE_EXACT = Threshold(
    1e-9, "<", ceiling=0.0, source="ours: Eq. (6)'s closed form read to rounding (a check of the code)"
)
RANK_ONE_TOP = Threshold(
    RANK_ONE_SPEED, "==", atol=1e-6, source="Bantzis et al. 2025 Example 1: the rank-one speed √2-1; ±1e-6 ours"
)
HALF_SPEED = Threshold(
    0.5, "==", atol=1e-3, source="Bantzis et al. 2025 Example 1: the rank-two speed 1/2; ±1e-3 ours (§5 Fig. 2)"
)
WIDE_SUCCESS = Threshold(
    0.8, ">=", ceiling=1.0, source="Bantzis et al. 2025 Fig. 2: wide nets succeed; >= 0.8 at w >= 64 ours"
)
NARROW_FAILURE = Threshold(
    0.05, "<=", ceiling=0.0, source="Bantzis et al. 2025 Fig. 2: width 2 almost never succeeds; 0.05 ours"
)
PAPER_POINTS = 8  # Example 1 and Fig. 2 (left): N = 8
CIRCLE_EXACT = Threshold(
    1e-12,
    "<=",
    ceiling=0.0,
    source="ours: Example 1's points and gradients read to float64 rounding (a check of the code)",
)


class Config(ExperimentConfig):
    n_points: int = Field(default=8, ge=2)
    depth: int = Field(default=3, ge=2)
    widths: list[PositiveInt] = Field(default=[2, 4, 8, 16, 32, 64], min_length=1)
    restarts: int = Field(default=20, ge=1)
    steps: int = Field(default=4000, ge=1)
    lr: float = Field(default=0.05, gt=0)
    rank_one_widths: list[PositiveInt] = Field(default=[4, 8, 32], min_length=1)  # its claim needs a rank-one width
    rank_one_restarts: int = Field(default=20, ge=1)
    rank_one_steps: int = Field(default=3000, ge=1)
    phi_points: int = Field(default=8 * 900 + 1, ge=9)
    success_margin: float = Field(default=1e-3, gt=0)
    rank_two_s2_s1: float = Field(default=0.5, gt=0, le=1)
    trace_points: int = Field(default=200, ge=2)
    seed: int = 1


PRESETS = {
    "quick": {},
    "tiny": {
        "widths": [2, 8],
        "restarts": 4,
        "steps": 300,
        "rank_one_widths": [4],
        "rank_one_restarts": 4,
        "rank_one_steps": 300,
    },
    "paper": {"widths": [2, 4, 8, 16, 32, 64, 128], "restarts": 50},
}


def units(cfg: Config) -> list[dict]:
    out = [{"id": f"pgd-w{w}", "search": "pgd", "width": w} for w in cfg.widths]
    out += [{"id": f"rank1-w{w}", "search": "rank_one", "width": w} for w in cfg.rank_one_widths]
    return out


def run_unit(cfg: Config, unit: dict, ctx) -> dict:
    data = circle_dataset(cfg.n_points)
    X, G = data.X_train, -data.Y_train
    rank_one = unit["search"] == "rank_one"
    res = find_escape_directions(
        X,
        G,
        cfg.depth,
        unit["width"],
        restarts=cfg.rank_one_restarts if rank_one else cfg.restarts,
        steps=cfg.rank_one_steps if rank_one else cfg.steps,
        rank_one=rank_one,
        seed=cfg.seed * 1000 + unit["width"] + (500 if rank_one else 0),
        lr=None if rank_one else cfg.lr,
    )
    speed, best = res.best()
    dead = not speed > DEAD_SPEED  # every restart ended with a network whose output no longer moves
    diag = layer_diagnostics(best, X)
    act = forward(best, X)[1]
    every = max(1, (cfg.rank_one_steps if rank_one else cfg.steps) // cfg.trace_points)
    w1 = [layer_diagnostics(res.run(i), X)["s2_s1"][0] for i in range(len(res.speeds))]
    # Thm 3.1 needs a positive speed s*; a dead search (speed <= 0) is left to the health check
    thm31 = theorem31_check(best, X, G) if float(res.speeds.max()) > 0 else None
    return {
        "speeds": res.speeds.tolist(),
        "trace_steps": list(range(0, res.trace.shape[0], every)),
        "trace": res.trace[::every].T.tolist(),
        "s2_s1_W1": w1,
        "theorem31": None if thm31 is None else theorem31_summary(thm31),
        "converged": res.converged.tolist(),
        "best_speed": speed,
        "best_L0": float(localized_loss(best, X, G)),
        "best_eig_residual": eig_residual(best, X, G),
        "best_rank_W": [numerical_rank(W, rtol=1e-6) for W in best],
        "best_rank_Zsigma": [numerical_rank(a, rtol=1e-6) for a in act],
        "best_diagnostics": {k: diag[k] for k in ("r_W", "r_Z", "lin", "s2_s1")},
        "unhealthy": f"collapsed: every net dead (best escape speed {speed:.3g})" if dead else net_health(best, data),
    }


def net_health(weights: list[torch.Tensor], data) -> str:
    """`training_health` of the escape direction `weights` as a bias-free ReLU net on the circle: non-finite or
    constant output (every unit dead). An escape search maximises a speed on the sphere, not a data loss, so
    the loss-based parts of the check do not apply; a dead search is also flagged by its speed."""
    net = MLP(data.d_in, data.d_out, [int(W.shape[0]) for W in weights[:-1]], len(weights), dtype=torch.float64)
    with torch.no_grad():
        for p, W in zip(net.weights, weights):
            p.copy_(W)
    return training_health(net, data, "mse")


def theorem31_summary(check) -> dict:
    """What a unit stores of `theorem31_check`: c, s*, B(ℓ), the largest excess, the verdict, informative layers."""
    return {
        "c": check.c,
        "s_star": check.s_star,
        "B": check.B,
        "excess": check.measured,
        "holds": check.passed,
        "informative": check.informative,
    }


def pgd_runs(results: dict[str, dict]) -> list[tuple[dict, int]]:
    """The projected-GD units' results with their widths, by width."""
    runs = ((r, int(u.split("-w")[1])) for u, r in results.items() if u.startswith("pgd-"))
    return sorted(runs, key=lambda t: t[1])


def sweep_table(cfg: Config, pgd: list[tuple[dict, int]]) -> pd.DataFrame:
    """One row per width: success fraction (speed > √2-1 + margin) beside the reference, speeds, the share of
    successes at 1/2, dead runs, s_2/s_1(W_1) of the optima, convergence and the best run's diagnostics."""
    threshold = RANK_ONE_SPEED + cfg.success_margin
    rows = []
    for r, w in pgd:
        s = np.array(r["speeds"])
        ok = s > threshold
        rows.append(
            {
                "width": w,
                "restarts": len(s),
                "success_fraction": float(ok.mean()),
                "reference_fraction_seed1_R50": REFERENCE_FRACTIONS.get(w, np.nan),
                "best_speed": float(s.max()),
                "median_speed": float(np.median(s)),
                "at_half_fraction_of_successes": float(np.mean([HALF_SPEED.holds(x) for x in s[ok]]))
                if ok.any()
                else np.nan,
                "dead_fraction": float((s < 1e-3).mean()),
                "min_s2_s1_W1_at_half": min(
                    (x for sp, x in zip(s, r["s2_s1_W1"]) if HALF_SPEED.holds(sp)), default=np.nan
                ),
                "converged_fraction": float(np.mean(r["converged"])),
                "best_eig_residual": r["best_eig_residual"],
                "best_rank_W": str(r["best_rank_W"]),
                "best_rank_Zsigma": str(r["best_rank_Zsigma"]),
                **{f"best_{k}": str([round(x, 4) for x in v]) for k, v in r["best_diagnostics"].items()},
            }
        )
    return pd.DataFrame(rows)


def sampling_noise(a: float, b: float, n_a: int, n_b: int) -> float:
    """Two standard errors of the difference of two success fractions a, b from n_a and n_b restarts, under the
    pooled rate p: 2·sqrt(p(1-p)(1/n_a + 1/n_b)). A fraction from R = 20 restarts is an estimate: a drop within
    this is not evidence that the success probability falls."""
    p = (a * n_a + b * n_b) / (n_a + n_b)
    return 2 * math.sqrt(p * (1 - p) * (1 / n_a + 1 / n_b))


def curve_claim(phi: np.ndarray, S: np.ndarray) -> Claim:
    """Eq. (6)'s closed form: S(φ) peaks at √2-1 at φ = kπ/4. It involves no search: a check of the code."""
    i_max = int(np.argmax(S))
    k = phi[i_max] / (np.pi / 4)
    err = max(abs(S[i_max] - RANK_ONE_SPEED), abs(k - round(k)))
    return all_of_claim(
        "the rank-one speed curve S(φ) peaks at √2-1 at φ = kπ/4 (Eq. 6)",
        REF,
        [(err, CURVE_EXACT)],
        expected=f"max S = {RANK_ONE_SPEED:.8f} at φ/(π/4) integer",
        measured=f"max S = {S[i_max]:.12f} at φ/(π/4) = {k:.12f}",
        tolerance="1e-9",
        id="rank-one-curve",
        kind="identity",
    )


def paper_circle() -> tuple[np.ndarray, np.ndarray]:
    """Example 1's data as the paper writes it (Bantzis et al. 2025, arXiv 2505.21722, Example 1, Fig. 2 left),
    in numpy: ``x_j = (sin(2πj/N), cos(2πj/N))`` and ``G_j = (-1)^j`` for j = 1..N, N = 8; rows are samples
    (X ``8 x 2``, G ``8 x 1``)."""
    j = np.arange(1, PAPER_POINTS + 1)
    X = np.stack([np.sin(2 * np.pi * j / PAPER_POINTS), np.cos(2 * np.pi * j / PAPER_POINTS)], axis=1)
    return X, ((-1.0) ** j)[:, None]


def circle_claim(X: torch.Tensor, G: torch.Tensor) -> Claim:
    """The searches' data (X ``N x 2``, G ``N x 1``) are Fig. 2 (left)'s: the 8 points of `paper_circle` with
    their alternating gradients (red G = 1, blue G = -1). Measured: the largest entrywise gap to the paper's
    formula (inf when N differs). It involves no search: a check of the code."""
    Xp, Gp = paper_circle()
    if X.shape != Xp.shape or G.shape != Gp.shape:
        gap = math.inf
    else:
        gap = max(float(np.abs(X.numpy() - Xp).max()), float(np.abs(G.numpy() - Gp).max()))
    return all_of_claim(
        "the data are Example 1's, drawn in Fig. 2 (left): N = 8 points x_j = (sin(2πj/8), cos(2πj/8)) on the unit "
        "circle whose loss gradients G_j = (-1)^j alternate between neighbours: max entrywise |X - X_paper|, "
        "|G - G_paper|",
        f"{REF}; Fig. 2 left",
        [(gap, CIRCLE_EXACT)],
        measured=f"{gap:.3g} (N = {X.shape[0]})",
        id="circle-data",
        kind="identity",
    )


def search_claims(cfg: Config, results: dict[str, dict], table: pd.DataFrame) -> list[Claim]:
    """The claims on what the searches found: A2 tops out at √2-1; projected GD's best is the rank-two 1/2;
    how its success depends on the width (Fig. 2); the optima found have a rank-two first layer."""
    claims = []
    r1 = [s for u, r in results.items() if u.startswith("rank1-") for s in r["speeds"]]
    if r1:
        claims.append(
            threshold_claim(
                "rank-one search (A2) tops out at √2-1: its best speed",
                f"{REF}; A2",
                max(r1),
                RANK_ONE_TOP,
                id="rank-one-search",
            )
        )
    pgd = pgd_runs(results)
    if not pgd:
        return claims
    claims.append(
        threshold_claim(
            "the fastest escape direction projected GD finds is Example 1's rank-two solution, speed 1/2 ('there may "
            "exist an even faster escape direction than the rank-two solution we identify (though we doubt it; "
            "see subsequent numerical experiments)', footnote 2 to Example 1): best speed over all runs",
            f"{REF}; A1",
            max(max(r["speeds"]) for r, _ in pgd),
            HALF_SPEED,
            id="best-speed-half",
        )
    )
    return claims + width_claims(cfg, pgd, table)


def width_claims(cfg: Config, pgd: list[tuple[dict, int]], table: pd.DataFrame) -> list[Claim]:
    """Fig. 2: wide nets succeed, success does not fall with the width beyond sampling noise, the optima found are
    rank two in their first layer, width-2 nets almost never succeed."""
    claims = []
    frac = dict(zip(table["width"], table["success_fraction"]))
    wide = {w: f for w, f in frac.items() if w >= 64}
    if wide:
        claims.append(
            threshold_claim(
                f"wide nets find the optimum: success fraction (speed > √2-1 + {cfg.success_margin:g}) at every "
                f"width >= 64 (min over {sorted(wide)})",
                f"{REF}; Fig. 2",
                min(wide.values()),
                WIDE_SUCCESS,
                id="wide-success",
            )
        )
    claims.append(monotone_claim(pgd, table))
    at_half = [x for r, _ in pgd for sp, x in zip(r["speeds"], r["s2_s1_W1"]) if HALF_SPEED.holds(sp)]
    if at_half:
        claims.append(
            threshold_claim(
                f"the optima found (speed within 1e-3 of 1/2, {len(at_half)} runs) have a rank-two first layer: "
                "min s_2/s_1(W_1) (Example 1: s_2/s_1 = 1)",
                f"{REF}; Example 1",
                min(at_half),
                cfg.rank_two_s2_s1,
                ">=",
                ceiling=1.0,
                id="optima-rank-two",
            )
        )
    if 2 in frac:
        claims.append(
            threshold_claim(
                "width-2 nets almost never beat the rank-one speed √2-1: their success fraction",
                f"{REF}; Fig. 2",
                frac[2],
                NARROW_FAILURE,
                id="narrow-failure",
            )
        )
    return claims


def monotone_claim(pgd: list[tuple[dict, int]], table: pd.DataFrame) -> Claim:
    """Success never drops from one width to the next by more than two binomial standard errors
    (`sampling_noise`); with one width there is no pair to compare, and the claim holds vacuously."""
    frac = dict(zip(table["width"], table["success_fraction"]))
    counts = dict(zip(table["width"], table["restarts"]))
    widths = [w for _, w in pgd]
    fr = [frac[w] for w in widths]
    statement = (
        "wider nets are more likely to find the faster rank-two direction ('wider networks are more likely to "
        "converge to the faster, rank-two escape direction', on Fig. 2): the success fraction never drops from "
        f"one width to the next by more than two binomial standard errors (widths {widths})"
    )
    expected = "f(w_i) - f(w_{i+1}) <= 2 s.e. for every pair"
    if len(widths) < 2:
        return boolean_claim(statement, f"{REF}; Fig. 2 right", expected, fr, True, id="success-monotone")
    drops = [
        (a - b, Threshold(sampling_noise(a, b, counts[v], counts[w]), "<="))
        for (a, v), (b, w) in zip(zip(fr[:-1], widths[:-1]), zip(fr[1:], widths[1:]))
    ]
    return all_of_claim(
        statement, f"{REF}; Fig. 2 right", drops, expected=expected, measured=fr, tolerance="", id="success-monotone"
    )


def theorem31_notes(cfg: Config, X, G, pgd: list[tuple[dict, int]]) -> list[str]:
    """Thm 3.1's bound at s* = 1/2 and its reading on each width's best run (vacuous at depth 3: notes)."""
    thm31 = theorem31_bound(X, G, 0.5, cfg.depth)
    c = thm31.c
    notes = [
        f"Thm 3.1 at s* = 1/2: c = {c:.4f}; B(ℓ) = {thm31.bounds} (∞ = vacuous; B < 1 needs ℓ > 81c² = "
        f"{81 * c * c:.0f})."
    ]
    t31 = [r["theorem31"] for r, _ in pgd if r["theorem31"] is not None]
    if t31:
        notes.append(
            "Thm 3.1 evaluated on the best run of each width (`theorem31_check`, s* = its own speed): c = "
            f"{fmt([t['c'] for t in t31])}, informative layers {[t['informative'] for t in t31]}, holds "
            f"{[t['holds'] for t in t31]}; at depth 3 the bound is vacuous, so this is a reading, not a claim."
        )
    return notes


def circle_figure(X: torch.Tensor, G: torch.Tensor):
    """Fig. 2 (left): the points on the unit circle, red where G = 1 and blue where G = -1."""
    fig, ax = plt.subplots(figsize=(4, 4))
    t = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.sin(t), np.cos(t), color="0.8", lw=1)
    g = G[:, 0].numpy()
    for value, color in ((1.0, "tab:red"), (-1.0, "tab:blue")):
        pts = X.numpy()[g == value]
        ax.scatter(pts[:, 0], pts[:, 1], color=color, s=40, zorder=2, label=f"G = {value:+g}")
    ax.set_aspect("equal")
    ax.set_title("Fig. 2 left: Example 1's data")
    ax.legend(fontsize=8, loc="center")
    return fig


def curve_figure(phi: np.ndarray, S: np.ndarray, best_r1: float | None):
    """S(φ) against φ/(π/4), with √2-1, 1/2 and the best rank-one search."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(phi / (np.pi / 4), S, lw=1.2, label="S(φ), rank-one speed")
    ax.axhline(RANK_ONE_SPEED, color="C1", ls="--", lw=1, label="√2 - 1")
    ax.axhline(0.5, color="C2", ls=":", lw=1, label="optimal speed 1/2 (rank two)")
    if best_r1 is not None:
        ax.plot([], [], " ", label=f"A2 search best: {best_r1:.8f}")
    ax.set_xlabel("φ / (π/4)")
    ax.set_ylabel("speed")
    ax.set_title("Example 1: speed of rank-one directions")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def sweep_figure(cfg: Config, pgd: list[tuple[dict, int]], table: pd.DataFrame):
    """Fig. 2 right: success fraction against width beside the reference; each restart's final speed."""
    widths = [w for _, w in pgd]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    a1.plot(widths, table["success_fraction"], "o-", label=f"this run (R = {cfg.restarts}, seed {cfg.seed})")
    ref_w = [w for w in widths if w in REFERENCE_FRACTIONS]
    a1.plot(ref_w, [REFERENCE_FRACTIONS[w] for w in ref_w], "s--", color="0.5", label="reference (seed 1, R = 50)")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("hidden width w")
    a1.set_ylabel(f"fraction with speed > √2-1 + {cfg.success_margin:g}")
    a1.set_ylim(-0.05, 1.05)
    a1.legend(fontsize=8)
    a1.set_title("Fig. 2: success of projected GD vs width")
    rng = np.random.default_rng(0)
    for i, (r, _w) in enumerate(pgd):
        s = np.array(r["speeds"])
        a2.scatter(i + rng.uniform(-0.2, 0.2, len(s)), s, s=10, alpha=0.7)
    a2.axhline(RANK_ONE_SPEED, color="C1", ls="--", lw=1, label="√2 - 1")
    a2.axhline(0.5, color="C2", ls=":", lw=1, label="1/2")
    a2.set_xticks(range(len(widths)), [str(w) for w in widths])
    a2.set_xlabel("hidden width w")
    a2.set_ylabel("final speed of each restart")
    a2.legend(fontsize=8)
    a2.set_title("final speeds")
    return fig


def pgd_figure(cfg: Config, pgd: list[tuple[dict, int]]):
    """Fig. 2 centre / Fig. 6: every projected-GD run's speed over its steps, one panel per width."""
    threshold = RANK_ONE_SPEED + cfg.success_margin
    cols = min(len(pgd), 4)
    nrow = math.ceil(len(pgd) / cols)
    fig, axs = plt.subplots(nrow, cols, figsize=(3.6 * cols, 2.9 * nrow), squeeze=False, sharey=True)
    for ax, (r, w) in zip(axs.flat, pgd):
        for sp, tr in zip(r["speeds"], r["trace"]):
            ax.plot(r["trace_steps"], tr, lw=0.8, color="tab:blue" if sp > threshold else "tab:red", alpha=0.7)
        ax.axhline(RANK_ONE_SPEED, color="0.3", ls="--", lw=0.8)
        ax.axhline(0.5, color="0.3", ls=":", lw=0.8)
        ax.set_title(f"width {w}", fontsize=9)
        ax.set_xlabel("PGD step", fontsize=8)
    for ax in axs.flat[len(pgd) :]:
        ax.axis("off")
    axs[0][0].set_ylabel("speed -L0(θ) on ‖θ‖² = 3")
    fig.suptitle(f"Fig. 2 centre / Fig. 6: projected-GD runs (blue: speed > √2-1 + {cfg.success_margin:g}, red: not)")
    fig.tight_layout()
    return fig


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    data = circle_dataset(cfg.n_points)
    X, G = data.X_train, -data.Y_train
    phi = np.linspace(0, 2 * np.pi, cfg.phi_points)
    S = rank_one_curve(phi, cfg.n_points)
    pgd = pgd_runs(results)
    table = sweep_table(cfg, pgd)
    claims = [curve_claim(phi, S), circle_claim(X, G), *search_claims(cfg, results, table)]
    notes = []
    if cfg.n_points == 8:
        gap = float(np.abs(S - eq6_curve(phi)).max())
        notes.append(f"S(φ) and the paper's Eq. (6) agree to {gap:.2e} over {cfg.phi_points} angles.")
    notes += theorem31_notes(cfg, X, G, pgd)
    notes.append(
        "Optima sit on ReLU kinks, so the eigen-equation residual of the best runs is not small (§5, §8.4); "
        "the values of L0 are what is checked."
    )
    r1 = [s for u, r in results.items() if u.startswith("rank1-") for s in r["speeds"]]
    best_r1 = max(r1) if r1 else None
    best = max((max(r["speeds"]) for r, _ in pgd), default=None)
    if best is not None:
        notes.append(
            f"No projected-GD run exceeded 1/2 + 1e-6: {best <= 0.5 + 1e-6} (best {best:.10f}); the paper doubts a "
            "faster direction exists but does not exclude one, so this is reported, not claimed."
        )
    figures = {"circle_data": circle_figure(X, G), "rank_one_speed_curve": curve_figure(phi, S, best_r1)}
    if pgd:
        figures["width_sweep"] = sweep_figure(cfg, pgd, table)
        figures["pgd_curves"] = pgd_figure(cfg, pgd)
    summary = {
        "max_rank_one_curve": float(S.max()),
        "best_rank_one_search": best_r1,
        "best_speed": best,
        "theorem31_c": theorem31_bound(X, G, 0.5, cfg.depth).c,
        "success_fraction": {
            int(w): float(f) for w, f in zip(table.get("width", []), table.get("success_fraction", []))
        },
    }
    return Analysis(claims, figures, {"width_sweep": table}, summary, notes)


CATALOG = (
    Entry("escape-circle", ("quick", "tiny", "paper"), "Bantzis et al. Example 1: escape speeds √2-1 and 1/2", 41),
)

EXPERIMENT = Experiment(
    name="escape-circle",
    summary="Example 1: on 8 points of the unit circle with alternating gradients, rank-one escape directions "
    "reach speed √2-1 but the optimal escape direction (speed 1/2) has a rank-two first layer; "
    "projected GD finds it more often as the width grows.",
    reference="Bantzis, Simon, Jacot 2025, Saddle-to-Saddle Dynamics in Deep ReLU Networks (arXiv 2505.21722), "
    "Example 1 and Fig. 2; "
    "docs/theory/saddle-to-saddle.md §5",
    config=Config,
    presets=PRESETS,
    units=units,
    run_unit=run_unit,
    analyze=analyze,
)
