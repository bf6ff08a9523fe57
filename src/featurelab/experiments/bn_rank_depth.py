"""`bn-rank-depth`: L2-regularized MLPs of several depths on a BN-rank-2 task (Jacot 2023,
arXiv 2305.19008, Fig. 1; docs/theory/bottleneck-rank.md §4a).

Every trained minimum is classified by its bottleneck rank k_mid (median over the middle layers of
#{s_i(W_ℓ) > 0.1}) against the task's rank 2: underestimating (fitting or not), recovering or
overestimating. Minima of one class lie on a line ‖θ‖² ≈ k·L + R⁽¹⁾ whose slope is their rank
(§2.1-§2.3), and depth favours recovery.

quick: d = 10, N = 200, width 64, L ∈ {4, 6, 9, 12}, init seeds {0, 1}, λ = 1e-2, Adam 6000 steps (cosine).
(Our reference calibration used L ∈ {6, 9, 12}; on our task instance the rank-3 → rank-2 transition sits
between L = 4 and L = 6, so L = 4 is added: without a non-recovering depth 'depth favours recovery'
cannot be tested.)
paper (ours; the paper's settings were lost): d = 20, N = 500, width 100, L ∈ {4..20}, 5 seeds,
λ ∈ {1e-3, 3e-3, 1e-2}, 30k steps.
Claims: the classes of Fig. 1 are found at each λ (a recovering line over >= 2 depths, no fitting minimum below
rank 2); each fitted class's slope is within 15% of its rank; recovering minima are more common at the
largest depth than at the smallest; Theorem 3 on the trained minima: the class's depth-fit intercept R̂⁽¹⁾
(slope fitted, not set to k) exceeds max_x 2 log|Jf(x)|_+ over its rank-k points (median(‖θ‖² − kL) >= that
max is implied for any θ by the exact bound, so it is reported, not claimed); Cor. 8 in explicit form
(`corollary8_check`): in at least (1 − p)L layers of every net s_{k+1}(α̃_ℓ(X)/√N) <= √(S/(pL))·s_1([α_{ℓ−1}(X),
β]/√N) holds for any θ (kind "identity", `cor8-bound`), and its rate O(L^{-1/2}) is measured on the trained nets
(`cor8-rate`): the exponent b of the fit log s_{k+1} = a + b log L across depths, with its 95% confidence
interval: the tail falls with depth (the interval below 0) at a rate consistent with L^{-1/2} (its lower end
<= −1/2); the exact bound ‖θ‖² >= L Σ s_i(Jf(x))^{2/L} holds at every training point (any θ: "identity").
The slope and Theorem 3 claims are statements about minima (premise "critical"), so every unit is certified.
"""

from __future__ import annotations

import statistics
from typing import Literal, Protocol

import numpy as np
import pandas as pd
import torch
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt
from scipy.stats import linregress
from scipy.stats import t as student

from ..catalog import Entry
from ..claims import Threshold, all_of_claim
from ..config import ExperimentConfig
from ..data.bn_tasks import bn_rank_two_task
from ..figures import plt
from ..measurements.bottleneck import (
    balancedness_residual,
    bottleneck_rank,
    classify_minimum,
    corollary8_check,
    middle_layers,
    representation_spectra,
    theorem3_check,
    theorem6_check,
)
from ..measurements.jacobian import ntk_trace
from ..measurements.ranks import singular_values
from ..measurements.representation_cost import estimate_representation_cost
from ..models import MLP
from ..runtime import float64_copy
from ..training import Phase, TrainConfig
from .base import Analysis, Experiment, TrainingUnit

TRUE_RANK = 2
COR8_P = 0.25  # Cor. 8's p: at least (1 - p)L layers
COR8_RATE = -0.5  # Cor. 8: s_{k+1} = O(L^{-1/2}) in the middle layers
COR8_SHARE = Threshold(
    1 - COR8_P, ">=", ceiling=1.0, source="Jacot 2023 (arXiv 2305.19008) Cor. 8: all but pL layers; p = 1/4 is ours"
)
COR8_RATE_REACHED = Threshold(COR8_RATE, "<=", source="Jacot 2023 (arXiv 2305.19008) Cor. 8: s_(k+1) = O(L^(-1/2))")
FALLS = Threshold(0.0, "<", source="Jacot 2023 Cor. 8: the tail falls with depth (the rate's 95% interval below 0)")
RISES = Threshold(
    0.0, ">", ceiling=1.0, source="Jacot 2023 Fig. 1: recovering minima at the larger depths (a larger share)"
)
NON_NEGATIVE = Threshold(
    0.0, ">=", ceiling=1.0, source="Jacot 2023 §2.3: an inequality that holds for any θ (slack >= 0)"
)
ONE_CLASS = Threshold(1, ">=", source="ours: a slope needs one class of fitting minima over >= 2 depths")
RECOVERING_LINE = Threshold(
    1.5, ">=", source="Jacot 2023 Fig. 1: a line of recovering minima (rank 2, fitting) spans >= 2 depths (integers)"
)
NO_FITTING_UNDERESTIMATE = Threshold(
    0.5,
    "<",
    ceiling=0.0,
    source="Jacot 2023 (arXiv 2305.19008) §3: 'we have never observed fitting rank-underestimating minima' "
    "(a count of 0; < 0.5 on integers)",
)
REF = "Jacot 2023 (arXiv 2305.19008) Fig. 1; docs/theory/bottleneck-rank.md §2.3, §4a"
CLASSES = ("underestimating (not fitting)", "underestimating (fitting)", "recovering", "overestimating")
COLORS = dict(zip(CLASSES, ("tab:gray", "tab:orange", "tab:green", "tab:blue")))


class Config(ExperimentConfig):
    d: int = Field(default=10, ge=2)
    dtype: Literal["float32", "float64"] = "float32"  # the trained networks' dtype
    n_train: int = Field(default=200, ge=2)
    n_test: int = Field(default=200, ge=1)
    hidden: int = Field(default=100, ge=1)
    width: int = Field(default=64, ge=3)
    depths: list[PositiveInt] = Field(default=[4, 6, 9, 12], min_length=1)
    seeds: list[int] = Field(default=[0, 1], min_length=1)
    lams: list[NonNegativeFloat] = Field(default=[1e-2], min_length=1)
    steps: int = Field(default=6000, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    lr_min: float = Field(default=3e-6, ge=0)
    sv_threshold: float = Field(default=0.1, gt=0)
    rep_rel: float = Field(default=0.02, gt=0)
    fit_threshold: float = Field(default=0.05, gt=0)
    jacobian_tol: float = Field(default=1e-3, gt=0)
    ntk_points: int = Field(default=16, ge=1)
    slope_tolerance: float = Field(default=0.15, gt=0)
    certify: PositiveFloat | None = Field(
        default=1e-6, description="Clarke-residual tolerance of each unit's critical-point certificate (None: none)"
    )
    log_every: int = Field(default=500, ge=1)
    checkpoint_every: int = Field(default=2000, ge=0)


PRESETS = {
    # quick: no certification. Most of these nets' units die under weight decay (11 488 of the 12 288 activation
    # inputs of r1-properties' id-cp L = 4 net sit at a kink), and the dense KKT solve over those kinks takes about
    # 10 minutes a unit on 2 CPU cores (docs/theory/conventions.md, "What it reaches"); `--set certify=1e-6` asks.
    "quick": {"certify": None},
    "tiny": {
        "n_train": 64,
        "n_test": 32,
        "hidden": 32,
        "width": 16,
        "depths": [4, 6, 8],
        "seeds": [0],
        "steps": 1500,
        "lr": 1e-2,
        "log_every": 500,
        "checkpoint_every": 0,
        "certify": None,  # a smoke test: its nets stop far from a critical point (stationarity ~0.1), no polish
    },
    "paper": {
        "d": 20,
        "n_train": 500,
        "n_test": 500,
        "width": 100,
        "depths": [4, 6, 8, 10, 12, 16, 20],
        "seeds": [0, 1, 2, 3, 4],
        "lams": [1e-3, 3e-3, 1e-2],
        "steps": 30000,
        "log_every": 1000,
        "checkpoint_every": 5000,
    },
}
# paper-cpu: "paper" with seeds 0, 1, 2 (paper 0-4) and 20000 steps (paper 30000)
PRESETS["paper-cpu"] = {**PRESETS["paper"], "seeds": [0, 1, 2], "steps": 20000}


def make_data(cfg: Config):
    return bn_rank_two_task(cfg.d, cfg.n_train, cfg.n_test, cfg.hidden, task_seed=cfg.seed, data_seed=cfg.seed + 1)


def units(cfg: Config) -> list[dict]:
    return [
        {"id": f"L{L}-lam{lam:g}-seed{s}", "depth": L, "lam": lam, "init_seed": s}
        for lam in cfg.lams
        for L in cfg.depths
        for s in cfg.seeds
    ]


class MLPRun(Protocol):
    """The config fields `mlp_unit` reads (this experiment's and `r1-properties`' configs have them)."""

    @property
    def d(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def steps(self) -> int: ...
    @property
    def lr(self) -> float: ...
    @property
    def lr_min(self) -> float: ...
    @property
    def log_every(self) -> int: ...
    @property
    def checkpoint_every(self) -> int: ...


def mlp_unit(
    cfg: MLPRun, data, depth: int, init_seed: int, lam: float, top_singular_values: int, certify: float | None = None
) -> TrainingUnit:
    """A ReLU `MLP` d -> d of the given depth (width cfg.width, biases, He init, seed 1000·cfg.seed + init_seed)
    trained on `data` with C + λ‖θ‖², full-batch Adam cosine-decayed from cfg.lr to cfg.lr_min
    (docs/theory/bottleneck-rank.md §4a); `certify`: the stationarity tolerance of its critical-point certificate
    (None: not certified)."""
    model = MLP(
        cfg.d,
        cfg.d,
        cfg.width,
        depth,
        bias=1.0,
        seed=1000 * cfg.seed + init_seed,
        dtype=getattr(torch, cfg.dtype),
    )
    config = TrainConfig(
        objective="mse",
        lam=lam,
        log_every=cfg.log_every,
        checkpoint_every=cfg.checkpoint_every,
        top_singular_values=top_singular_values,
        phases=[Phase(optimizer="adam", steps=cfg.steps, lr=cfg.lr, schedule="cosine", lr_min=cfg.lr_min)],
    )
    return TrainingUnit(model, data, config, certify=certify)


def build(cfg: Config, unit: dict) -> TrainingUnit:
    data = make_data(cfg)
    return mlp_unit(
        cfg, data, unit["depth"], unit["init_seed"], unit["lam"], top_singular_values=4, certify=cfg.certify
    )


def finish(cfg: Config, unit: dict, model: MLP, result, ctx) -> dict:
    data = make_data(cfg)
    X, Y = data.X_train, data.Y_train
    m64 = float64_copy(model)
    with torch.no_grad():
        rel_train = float(((m64(X) - Y) ** 2).sum(1).mean() / (Y**2).sum(1).mean())
        rel_test = float(((m64(data.X_test) - data.Y_test) ** 2).sum(1).mean() / (data.Y_test**2).sum(1).mean())
    bn = bottleneck_rank(m64, atol=cfg.sv_threshold)
    spectra = representation_spectra(m64, X)
    rep_counts = [int((spectra[l - 1] > cfg.rep_rel * spectra[l - 1][0]).sum()) for l in middle_layers(m64.depth)]
    fits = rel_train < cfg.fit_threshold
    out = {
        "depth": unit["depth"],
        "lam": unit["lam"],
        "init_seed": unit["init_seed"],
        "sq_norm": float(m64.sq_norm()),
        "rel_train_mse": rel_train,
        "rel_test_mse": rel_test,
        "fits": fits,
        "k_mid": bn.k_mid,
        "k_counts": bn.counts,
        "k_rep": statistics.median_low(rep_counts),
        "class": classify_minimum(bn.k_mid, TRUE_RANK, fits),
        "weight_spectra": [singular_values(W, 8).tolist() for W in m64.weight_matrices()],
        "median_balancedness_residual": float(torch.cat(balancedness_residual(m64)).median()),
        "ntk_trace_per_layer": float(ntk_trace(m64, X[: cfg.ntk_points]).mean() / m64.depth),
        "train_seconds": result.seconds,
    }
    if 1 <= bn.k_mid <= cfg.d:  # a bottleneck no wider than the Jacobian's rank can be (an untrained net has none)
        raw = representation_spectra(m64, X, centred=False)
        out["rep_tail"] = float(np.median([float(raw[l - 1][bn.k_mid]) for l in middle_layers(m64.depth)]))
        t3 = theorem3_check(m64, X, float("nan"), bn.k_mid, rtol=cfg.jacobian_tol)
        t6 = theorem6_check(m64, X[:1], rtol=cfg.jacobian_tol)
        out.update(
            {
                "max_two_log_pdet": t3.max_two_log_pdet,
                "points_at_rank_k": int(np.sum(np.array(t3.ranks) == bn.k_mid)),
                "jacobian_rank_max": int(max(t3.ranks)),
                "exact_slack": t3.exact_slack,
                "theorem6_slack": t6.slack,
                "theorem6_fraction_within": t6.fraction_within,
            }
        )
        if out["points_at_rank_k"]:
            c8 = corollary8_check(m64, X, bn.k_mid, p=COR8_P, rtol=cfg.jacobian_tol)
            out.update({"cor8_share": c8.measured, "cor8_constant": c8.constant, "cor8_S": c8.S})
    return out


def _fits(rows: pd.DataFrame) -> list[dict]:
    """Per (λ, class) of fitting minima with >= 2 distinct depths: the depth fit of docs/theory/bottleneck-rank.md
    §3.5."""
    out = []
    checked = rows.fits & (rows.k_mid >= 1) & ("max_two_log_pdet" in rows and rows["max_two_log_pdet"].notna())
    for (lam, k), grp in rows[checked].groupby(["lam", "k_mid"]):
        if grp.depth.nunique() < 2:
            continue
        fit = estimate_representation_cost(grp.depth, grp.sq_norm, rank=int(k))
        out.append(
            {
                "lam": lam,
                "k": int(k),
                "class": grp["class"].iloc[0],
                "n": len(grp),
                "depths": sorted(grp.depth.unique().tolist()),
                "slope": fit.R0,
                "intercept": fit.R1,
                "R1_hat": fit.R1_given_rank,
                "terms": fit.terms,
                "fit_residual": fit.residual,
                "max_two_log_pdet": float(grp.max_two_log_pdet.max()),
                "tail_sqrt_L": grp.groupby("depth").apply(lambda g: float(g.rep_tail.median()) * g.name**0.5).to_dict(),
                "rate": tail_rate(grp.depth.to_numpy(), grp.rep_tail.to_numpy()),
                "cor8_share": grp.groupby("depth").cor8_share.min().to_dict() if "cor8_share" in grp else {},
                "cor8_constant": grp.groupby("depth").cor8_constant.max().to_dict() if "cor8_constant" in grp else {},
            }
        )
    return out


def tail_rate(depths, tails) -> dict:
    """The exponent b of the least-squares fit ``log s_{k+1} = a + b log L`` over the nets of one class (one point
    per net: its median middle-layer s_{k+1}), with its standard error and 95% confidence interval (Student t,
    n − 2 degrees of freedom); b is nan with fewer than 3 nets or 2 distinct depths (Cor. 8: b <= −1/2)."""
    L, y = np.asarray(depths, dtype=float), np.asarray(tails, dtype=float)
    ok = np.isfinite(y) & (y > 0)
    L, y = L[ok], y[ok]
    if len(L) < 3 or len(np.unique(L)) < 2:
        return {"b": float("nan"), "se": float("nan"), "ci": [float("nan")] * 2, "n": int(len(L))}
    fit = linregress(np.log(L), np.log(y))
    half = float(student.ppf(0.975, len(L) - 2)) * float(fit.stderr)
    return {"b": float(fit.slope), "se": float(fit.stderr), "ci": [fit.slope - half, fit.slope + half], "n": len(L)}


def cor8_claims(f: dict) -> list:
    """Cor. 8 for one class: the bound at every net (any θ: an identity, `corollary8_check`) and its rate, the
    fitted exponent b of the middle-layer tail s_{k+1} across depths (`tail_rate`): its 95% interval lies below 0
    (the tail falls with L) and reaches −1/2 (consistent with O(L^{-1/2}); a point estimate near −1/2 would flip
    with rounding). Empirical: "not reproduced at this size" when the class spans too few nets to fit."""
    share, rate, tag = f["cor8_share"], f["rate"], f"@lam{f['lam']:g}-k{f['k']}"
    out = []
    if share:
        out.append(
            all_of_claim(
                f"Cor. 8, λ={f['lam']:g}, k={f['k']}: in at least (1 − p)L layers (p = {COR8_P:g}) of every net, "
                "s_(k+1)(α̃_ℓ(X)/√N) <= √(S/(pL))·s_1([α_(ℓ−1)(X), β]/√N), S = ‖θ‖² − kL − 2log|Jf(x)|_+ "
                "(holds for any θ: a check of the code)",
                "Jacot 2023 (arXiv 2305.19008) Cor. 8 (Theorem 6 with our explicit proxy); "
                "docs/theory/bottleneck-rank.md §2.4",
                [(min(share.values()), COR8_SHARE)],
                expected=f">= {1 - COR8_P:g} share of layers",
                measured={"min share by L": share, "constant by L": f["cor8_constant"]},
                id=f"cor8-bound{tag}",
                kind="identity",
            )
        )
    lo, hi = rate["ci"]
    c = all_of_claim(
        f"Cor. 8 rate, λ={f['lam']:g}, k={f['k']}: the middle-layer s_(k+1) of the class's nets falls with depth at a "
        "rate consistent with L^(-1/2): the 95% interval of the exponent b of log s_(k+1) = a + b log L lies below "
        "0 and reaches -1/2",
        "Jacot 2023 (arXiv 2305.19008) Cor. 8 (s_(k+1) = O(L^(-1/2)) in all but pL layers); "
        "docs/theory/bottleneck-rank.md §2.4",
        [(hi, FALLS), (lo, COR8_RATE_REACHED)],
        expected=f"CI upper < 0, CI lower <= {COR8_RATE:g}",
        measured={"b": rate["b"], "95% CI": rate["ci"], "nets": rate["n"], "median s_(k+1)·√L by L": f["tail_sqrt_L"]},
        id=f"cor8-rate{tag}",
    )
    if not np.isfinite(rate["b"]):
        c = c.not_measured(f"not reproduced at this size: {rate['n']} nets of the class, too few depths to fit")
    return out + [c]


def slope_claims(cfg: Config, fits: list[dict]) -> list:
    """Fig. 1: per class of fitting minima, the fitted slope of ‖θ‖² against L equals the rank (within
    `slope_tolerance`, relative); with no class to fit, one failing claim that says so."""
    if not fits:
        return [
            all_of_claim(
                "some class of fitting minima spans >= 2 depths, so its slope can be fitted",
                REF,
                [(0, ONE_CLASS)],
                expected=">= 1 class",
                id="slope-fit-possible",
            )
        ]
    return [
        all_of_claim(
            f"λ={f['lam']:g}, k_mid={f['k']} ({f['class']}, depths {f['depths']}): the fitted "
            "slope of ‖θ‖² against L equals the rank",
            REF,
            [(f["slope"], Threshold(f["k"], "==", rtol=cfg.slope_tolerance))],
            expected=f["k"],
            tolerance=f"{cfg.slope_tolerance:.0%} relative",
            id=f"slope-equals-rank@lam{f['lam']:g}-k{f['k']}",
            premise="critical",
        )
        for f in fits
    ]


def classes_claim(lam: float, rows: pd.DataFrame):
    """Fig. 1's classes of minima at one λ (`rows`: its nets): the fitting minima fall in the classes the figure
    shows, lines of ‖θ‖² against L by rank: a recovering line (k_mid = 2, fitting) over >= 2 depths, and no fitting
    minimum below rank 2 ("we have never observed fitting rank-underestimating minima", §3), so every other fitting
    line overestimates (k_mid > 2). Overestimating and non-fitting minima are reported, not required (the figure's
    depths and seeds are not recoverable). Integer counts, compared half a unit from their bound (`RECOVERING_LINE`,
    `NO_FITTING_UNDERESTIMATE`): the margin counts whole depths and nets."""
    fitting = rows[rows.fits]
    recovering = sorted(fitting.depth[fitting.k_mid == TRUE_RANK].unique().tolist())
    under = int((fitting.k_mid < TRUE_RANK).sum())
    lines = {int(k): sorted(g.depth.unique().tolist()) for k, g in fitting.groupby("k_mid")}
    return all_of_claim(
        f"Fig. 1's classes, λ={lam:g}: a line of recovering minima (rank {TRUE_RANK}, fitting) over >= 2 depths, and "
        f"no fitting minimum below rank {TRUE_RANK}: every fitting minimum recovers or overestimates the rank",
        REF + ' and §3 ("we have never observed fitting rank-underestimating minima")',
        [(len(recovering), RECOVERING_LINE), (under, NO_FITTING_UNDERESTIMATE)],
        expected=f"recovering over >= 2 depths; 0 fitting nets below rank {TRUE_RANK}",
        measured={
            "recovering depths": recovering,
            "fitting nets below rank 2": under,
            "fitting nets' depths by rank": lines,
            "nets not fitting": int((~rows.fits).sum()),
        },
        id=f"fig1-classes@lam{lam:g}",
    )


def theorem3_claim(f: dict):
    """Theorem 3 for one class: the depth fit's intercept R̂⁽¹⁾ is at least max_x 2 log|Jf(x)|_+."""
    return all_of_claim(
        f"Theorem 3, λ={f['lam']:g}, k={f['k']}: the depth fit's intercept R̂⁽¹⁾ (slope fitted) is >= "
        "max_x 2 log|Jf(x)|_+ over the class's nets and rank-k points",
        "Jacot 2023 (arXiv 2305.19008) Theorem 3; docs/theory/bottleneck-rank.md §2.3, §3.6",
        [(f["intercept"], Threshold(f["max_two_log_pdet"], ">="))],
        expected=">= 0 margin",
        measured={
            "R1 intercept": f["intercept"],
            "max 2log|J|+": f["max_two_log_pdet"],
            "median(‖θ‖²-kL), implied bound": f["R1_hat"],
        },
        id=f"theorem3-r1-bound@lam{f['lam']:g}-k{f['k']}",
        premise="critical",
    )


def depth_claims(cfg: Config, rows: pd.DataFrame, fits: list[dict]) -> list:
    """Every claim of the run: the slopes, recovery with depth, Theorem 3 and Cor. 8 per class, and the exact
    Jacobian bound (`rows`: one row per net)."""
    claims = slope_claims(cfg, fits)
    by_depth = rows.groupby("depth")["class"].apply(lambda c: float(np.mean(c == "recovering")))
    lo, hi = by_depth.index.min(), by_depth.index.max()
    claims.append(
        all_of_claim(
            f"recovering minima appear at the larger depths: share at L={hi} > share at L={lo}",
            REF,
            [(float(by_depth[hi] - by_depth[lo]), RISES)],  # a difference of shares in [0, 1]: already relative
            expected=f"share(L={hi}) > share(L={lo})",
            measured={f"L={lo}": by_depth[lo], f"L={hi}": by_depth[hi]},
            id="depth-favours-recovery",
        )
    )
    claims += [classes_claim(lam, grp) for lam, grp in rows.groupby("lam")]
    for f in fits:
        claims += [theorem3_claim(f), *cor8_claims(f)]
    if "exact_slack" in rows:
        claims.append(
            all_of_claim(
                "exact bound ‖θ‖² >= L Σ_i s_i(Jf(x))^{2/L} at every training point of every net (holds for any θ: "
                "a check of the code)",
                "Jacot 2023 (arXiv 2305.19008) §2.3; docs/theory/bottleneck-rank.md §2.3",
                [(float((rows.exact_slack / rows.sq_norm).min()), NON_NEGATIVE)],  # relative to each net's ‖θ‖²
                expected=">= 0 slack",
                measured=float(rows.exact_slack.min()),
                id="exact-jacobian-norm-bound",
                kind="identity",
            )
        )
    return claims


def norm_figure(cfg: Config, rows: pd.DataFrame, fits: list[dict]):
    """‖θ‖² and the relative test MSE against depth, by class, with each class's depth fit."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for cls in CLASSES:
        sub = rows[rows["class"] == cls]
        for fit_flag, marker in ((True, "o"), (False, "x")):
            s = sub[sub.fits == fit_flag]
            if len(s):
                ax.scatter(
                    s.depth, s.sq_norm, c=COLORS[cls], marker=marker, label=f"{cls}{'' if fit_flag else ', no fit'}"
                )
                ax2.scatter(s.depth, s.rel_test_mse, c=COLORS[cls], marker=marker)
    for f in fits:
        Ls = np.linspace(min(f["depths"]), max(f["depths"]), 50)
        ax.plot(
            Ls,
            f["slope"] * Ls + f["intercept"],
            color=COLORS[f["class"]],
            lw=1,
            ls="-" if len(cfg.lams) == 1 else ":",
            label=f"fit k={f['k']}, λ={f['lam']:g}: slope {f['slope']:.2f}",
        )
    ax.set_xlabel("depth L")
    ax.set_ylabel("‖θ‖² at the end of training")
    ax.set_title("parameter norm against depth, by class")
    ax.legend(fontsize=7)
    ax2.set_xlabel("depth L")
    ax2.set_ylabel("relative test MSE")
    ax2.set_yscale("log")
    ax2.set_title("test error against depth")
    return fig


def tail_figure(cfg: Config, results: dict[str, dict]):
    """The third singular value of every layer of every net, against ℓ/L."""
    fig2, ax3 = plt.subplots(figsize=(6.5, 4))
    for _uid, r in sorted(results.items()):
        S = np.array([s + [np.nan] * (8 - len(s)) for s in r["weight_spectra"]])
        ls = np.arange(1, len(S) + 1) / len(S)
        ax3.plot(ls, S[:, TRUE_RANK], color=COLORS[r["class"]], lw=1, marker=".")
    ax3.axhline(cfg.sv_threshold, color="k", ls="--", lw=0.8, label=f"threshold {cfg.sv_threshold:g}")
    ax3.set_yscale("log")
    ax3.set_xlabel("relative layer ℓ/L")
    ax3.set_ylabel(f"s_{TRUE_RANK + 1}(W_ℓ)")
    ax3.set_title("third singular value of each layer (colour = class)")
    ax3.legend()
    return fig2


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    rows = pd.DataFrame(
        [
            {"id": uid, **{k: v for k, v in r.items() if k not in ("weight_spectra", "k_counts")}}
            for uid, r in sorted(results.items())
        ]
    )
    fits = _fits(rows)
    claims = depth_claims(cfg, rows, fits)
    figures = {
        "norm_and_test_error_vs_depth": norm_figure(cfg, rows, fits),
        "third_singular_value": tail_figure(cfg, results),
    }
    summary = {
        "classes": rows.groupby(["depth", "class"]).size().rename("n").reset_index().to_dict("records"),
        "fits": fits,
        "threshold": cfg.sv_threshold,
        "share_k_rep_equals_k_mid": float(np.mean(rows.k_rep == rows.k_mid)),
    }
    notes = [
        f"Classification: k_mid = median over layers ℓ in [L/4, 3L/4] of #{{s_i(W_ℓ) > {cfg.sv_threshold:g}}}; "
        f"fits ⇔ relative train MSE < {cfg.fit_threshold:g}; cross-check k_rep from the centred middle "
        f"representations (s_i/s_1 > {cfg.rep_rel:g}). Not the Jacobian rank (docs/theory/bottleneck-rank.md §4a).",
        "Trained nets at finite λ only approximate minimal-norm interpolants: λ, fit error and balancedness "
        "are in the units table next to every estimate (docs/theory/bottleneck-rank.md §6).",
    ]
    tables = {"units": rows, **({"fits": pd.DataFrame(fits)} if fits else {})}
    return Analysis(claims, figures, tables, summary, notes)


CATALOG = (
    Entry(
        "bn-rank-depth", ("quick", "tiny", "paper", "paper-cpu"), "Jacot 2023 Fig. 1: ‖θ‖² slope = rank; Theorem 3", 21
    ),
)

EXPERIMENT = Experiment(
    name="bn-rank-depth",
    summary="L2-regularized MLPs of several depths on a BN-rank-2 task: minima classified by bottleneck rank, "
    "‖θ‖² slopes equal to ranks, depth favouring recovery of the true rank.",
    reference="Jacot 2023, Bottleneck Structure in Learned Features (NeurIPS 2023, arXiv 2305.19008), Fig. 1; "
    "docs/theory/bottleneck-rank.md §4a",
    config=Config,
    presets=PRESETS,
    units=units,
    build=build,
    finish=finish,
    analyze=analyze,
)
