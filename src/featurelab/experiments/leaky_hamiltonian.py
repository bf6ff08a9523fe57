"""`leaky-hamiltonian`: the Hamiltonian, the cost of identity and the energies of trained Leaky ResNets
across effective depths L̃ (Jacot & Kaiser 2024, arXiv 2405.17573, Figs. 1 and 3; docs/theory/leaky-resnets.md §3,
§5.3-5.4).

One unit per L̃: train (leaky-bottleneck's model, data and phases, optionally a float64 L-BFGS polish,
§5.2), then `geodesic_diagnostics` on the training set.
quick: docs/theory/leaky-resnets.md §5.4 (teacher 10→3→10, N = 256, w = 40, L = 16 equidistant, λ = 0.02),
leaky-bottleneck's quick schedule (Adam 20k cosine from 6e-3),
L̃ ∈ {2, 5, 8}; claims Q1-Q7 (Q4 as F4's gap test) and the paper's stronger F1, F4 and F5 (Theorem 4 (b)), which
may fail at this size (the residual r is reported next to ĥ).
Both presets: the two statements of Fig. 1 (b)-(d)'s caption at L̃ >= 5, ĥ_γ ≈ ĥ except in the first layers
(`fig1-hgamma-tracks-h`) and κ → 0, COI_γ → k* inside the bottleneck (`fig1-bottleneck-kappa-coi`).
paper: docs/theory/leaky-resnets.md §5.2-5.3 (teacher 20→5→20, N = 1000, w = 200, L = 50 adaptive, λ = 0.04 as
leaky-bottleneck's paper preset, Adam 20k + guarded GD 10k + 500 L-BFGS steps **[ours]**), L̃ ∈ {1, 2, 3, 4, 5, 6, 7.5,
10}; claims F1-F5 and Fig. 3.
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field, PositiveFloat, model_validator
from scipy.stats import spearmanr

from ..catalog import Entry
from ..claims import Threshold, all_of_claim, fmt
from ..figures import plt
from ..measurements import singular_values
from ..measurements.hamiltonian import geodesic_diagnostics
from . import leaky_bottleneck as lb
from .base import Analysis, Experiment, TrainingUnit

REF = "Jacot & Kaiser 2024 (arXiv 2405.17573) Figs. 1, 3, read as checks Q1-Q7; docs/theory/leaky-resnets.md §5.4"
FIG1 = "Jacot & Kaiser 2024 (arXiv 2405.17573) Fig. 1; docs/theory/leaky-resnets.md §5.3"
LARGE = 5.0  # "L̃ >= 5" of Q5 and Q7 (docs/theory/leaky-resnets.md §5.4)


class Config(lb.Config):
    effective_depth: float | None = Field(default=None, description="set per unit from effective_depths")
    effective_depths: list[PositiveFloat] = Field(default=[2.0, 5.0, 8.0], min_length=3)
    profile_depths: list[PositiveFloat] = Field(default=[2.0, 5.0, 8.0], min_length=1, max_length=3)
    gamma0: float = Field(default=1e-3, ge=0)
    gamma_mode: Literal["relative", "absolute"] = "relative"
    claims: Literal["quick", "paper"] = "quick"

    @model_validator(mode="after")
    def _valid_steps(self):
        """Every L̃ of the sweep keeps ρ_l·L̃ < 1 (docs/theory/leaky-resnets.md §2), checked before any training."""
        for Lt in self.effective_depths:
            lb.check_depth(self.depth, Lt, self.steps)
        return self


PRESETS = {
    "quick": dict(lb.PRESETS["quick"]),  # the L̃ = 8 unit is leaky-bottleneck's quick run
    "tiny": {**lb.PRESETS["tiny"], "effective_depths": [1.0, 2.0, 3.0], "profile_depths": [1.0, 2.0, 3.0]},
    "paper": {
        **{k: v for k, v in lb.PRESETS["paper"].items() if k != "lams"},  # one λ: 0.04, our calibration
        "effective_depth": None,
        "effective_depths": [1, 2, 3, 4, 5, 6, 7.5, 10],
        "profile_depths": [5, 2, 7.5],
        "lbfgs_steps": 500,
        "claims": "paper",
        "checkpoint_every": 2500,
    },
}
# paper-cpu: "paper" with N = 250 training points (paper 1000) and Adam 8000 + GD 3000 steps (paper 20000 + 10000)
PRESETS["paper-cpu"] = {**PRESETS["paper"], "n_train": 250, "adam_steps": 8000, "gd_steps": 3000}


def unit_config(cfg: Config, Lt: float) -> Config:
    return cfg.model_copy(update={"effective_depth": float(Lt)})


def units(cfg: Config) -> list[dict]:
    return [{"id": f"Lt{Lt:g}", "effective_depth": float(Lt)} for Lt in cfg.effective_depths]


def build(cfg: Config, unit: dict) -> TrainingUnit:
    ucfg = unit_config(cfg, unit["effective_depth"])
    data = lb.make_data(ucfg)
    # leaky-bottleneck's phases, its float64 L-BFGS included (docs/theory/leaky-resnets.md §5.2: ρ fixed, a fixed-ρ
    # critical point); every claim here is about critical points, so every unit is certified
    return TrainingUnit(lb.make_model(ucfg, data), data, lb.train_config(ucfg), certify=cfg.certify)


def finish(cfg: Config, unit: dict, model, result, ctx) -> dict:
    data = lb.make_data(unit_config(cfg, unit["effective_depth"]))
    t0 = time.perf_counter()
    df = geodesic_diagnostics(model, data.X_train, data.Y_train, cfg.lam, cfg.gamma0, cfg.gamma_mode)
    return {
        "effective_depth": unit["effective_depth"],
        "layers": df.to_dict(orient="list"),
        "positions": model.positions.tolist(),
        "mean_free_singular_values": [
            singular_values(w, 10).tolist() for w in lb.mean_free_layer_weights(model, data.X_train)
        ],
        "summary": df.attrs["summary"],
        "final": result.history.iloc[-1].to_dict(),
        "train_seconds": result.seconds,
        "diagnostics_seconds": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------------------- analysis
def spread(x) -> float:
    return float(np.max(x) - np.min(x))


def f4_layers(k: int, df: pd.DataFrame, res: dict) -> tuple[list[str], list[float]]:
    """`lb.bottleneck_kind` and `lb.f4_gap` of W_l in each bottleneck layer of one trained net (F4)."""
    S, free = df.filter(regex=r"^sv\d+$").to_numpy(), res["mean_free_singular_values"]
    mid = lb.bottleneck_layers(res["positions"])
    return [lb.bottleneck_kind(S[l - 1], free[l - 1], k) for l in mid], [
        lb.f4_gap(S[l - 1], free[l - 1], k) for l in mid
    ]


def per_depth_table(cfg: Config, layers: dict[float, pd.DataFrame], res: dict[float, dict]) -> pd.DataFrame:
    """One row per L̃: the headline numbers the claims and Fig. 1(a)/Fig. 3 use."""
    k = lb.bottleneck_rank(cfg)
    rows = []
    for Lt, df in layers.items():
        s = res[Lt]["summary"]
        mid = df[df["layer"].isin(lb.middle_half(len(df)))]
        kinds, gaps = f4_layers(k, df, res[Lt])
        sv = df.filter(regex=r"^sv\d+$").to_numpy()
        rows.append(
            {
                "effective_depth": Lt,
                "h_median": s["h_median"],
                "h_min": s["h_min"],
                "h_max": s["h_max"],
                "h_gamma_median": s["h_gamma_median"],
                "h_gamma_min": s["h_gamma_min"],
                "h_gamma_max": s["h_gamma_max"],
                "min_coi": s["min_coi"],
                "residual_median": s["residual_median"],
                "residual_max": s["residual_max"],
                "thm4_gap_max": s["thm4_gap_max"],
                "balancedness": s["balancedness"],
                "slack_b_min": s["slack_b_min"],
                "slack_c_min": s["slack_c_min"],
                "slack_d_lower": s["slack_d_lower"],
                "slack_d_upper": s["slack_d_upper"],
                "mid_half_share": lb.mid_half_share(df["effective_rank"].tolist(), k),
                "f4_kinds": kinds,
                "f4_layers_with_gap": sum(kind in ("k*", "k*+1 (bias)") for kind in kinds),
                "f4_gap_min": min(gaps, default=float("nan")),
                "f4_gap_max": max(gaps, default=float("nan")),
                "speed_log_ratio_max": float(np.max(np.abs(np.log(speed_ratio(df, Lt))))),
                "slack_b_share_max": float(
                    (1 - df["slack_b"] / (2 * Lt * np.sqrt(df["gamma"]) * df["B_norm"]).clip(lower=1e-300)).max()
                ),
                "gap_first": lb.spectral_gap(sv[0], k),
                "gap_last": lb.spectral_gap(sv[-1], k),
                "kappa_first": float(df["kappa"].iloc[0]),
                "kappa_last": float(df["kappa"].iloc[-1]),
                "kappa_mid_median": float(mid["kappa"].median()),
                "coi_mid_median": float(mid["coi_gamma"].median()),
                "negativity_mid_max": float(mid["negativity"].max()),
                "h_gamma_spread": spread(df["h_gamma_rescaled"]),
                "h_spread": spread(df["h_rescaled"]),
                "h_modified_spread": s.get("h_modified_spread", float("nan")),
                "h_correction_max": s.get("h_correction_max", float("nan")),
                "coi_spread": spread(df["coi_gamma"]),
                "kappa_spread": spread(df["kappa"]),
                "h_gap_mid_median": float((mid["h_gamma_rescaled"] - mid["h_rescaled"]).abs().median()),
                **dict(zip(("h_gap_first_max", "h_gap_rest_max"), h_gap_split(df))),
                "rank_first": int(df["effective_rank"].iloc[0]),
                "rank_last": int(df["effective_rank"].iloc[-1]),
                "B_norm_max": s["B_norm_max"],
                "BS_norm_max": s["BS_norm_max"],
                "path_length_F": s["path_length_F"],
                "path_length_gamma": s["path_length_gamma"],
                "final_cost": res[Lt]["final"]["cost"],
                "final_test_cost": res[Lt]["final"].get("test_cost"),
                "train_seconds": res[Lt]["train_seconds"],
                "diagnostics_seconds": res[Lt]["diagnostics_seconds"],
            }
        )
    return pd.DataFrame(rows).sort_values("effective_depth").reset_index(drop=True)


def h_gap_split(df: pd.DataFrame) -> tuple[float, float]:
    """The largest ``|ĥ_γ − ĥ|`` over the first layers (W_l placed at ``p_{l-1} < 1/4``, the quarter before the
    bottleneck of `lb.bottleneck_layers`) and over the rest (``p_{l-1} >= 1/4``) of one net's `geodesic_diagnostics`
    table; NaN for an empty side (Jacot & Kaiser 2024, arXiv 2405.17573, Fig. 1 (b)-(d))."""
    gap = (df["h_gamma_rescaled"] - df["h_rescaled"]).abs()
    first = df["p"] < FIRST_LAYERS_END
    head, rest = gap[first], gap[~first]
    return (float(head.max()) if len(head) else float("nan"), float(rest.max()) if len(rest) else float("nan"))


def rise_margin(x) -> float:
    """The margin of "x strictly increases": its smallest step relative to its largest |x| (< 0 where it falls)."""
    x = np.asarray(x, dtype=float)
    return float(np.min(np.diff(x)) / max(float(np.max(np.abs(x))), 1e-300))


def speed_ratio(df: pd.DataFrame, effective_depth: float) -> np.ndarray:
    """The two sides of Theorem 4 (b) per layer, ``‖D_l‖_(K+γI) / (L̃√(COI_γ − ĥ_l))``: 1 at a critical point as
    γ → 0 (the theorem's slack 2L̃√γ‖B_l‖ vanishes); inf where ĥ_l >= COI_γ. df: one net's `geodesic_diagnostics`
    (L rows); L̃ = effective_depth (the steps ρ_l sum to 1, not to L̃). Returns shape (L,)."""
    right = effective_depth * np.sqrt(np.clip(df["coi_gamma"] - df["h_rescaled"], 0.0, None))
    with np.errstate(divide="ignore"):
        return np.where(right > 0, df["D_norm_K"] / np.where(right > 0, right, 1.0), np.inf)


SPEED_FACTOR = 1.5  # [ours] F5's two sides agree within this factor at every layer
FIRST_LAYERS_END = 0.25  # "the first layers": W_l placed at p_{l-1} < 1/4, before the bottleneck of F4

# Thresholds of Q1-Q7 (docs/theory/leaky-resnets.md §5.4, our quick-preset checks of Jacot & Kaiser 2024, arXiv
# 2405.17573, Figs. 1 and 3) and F1-F5, Fig. 3 (§5.3, the paper's observations). "==" windows about k* are given
# as offsets from k* (`Threshold.at(k + offset)`).
RISES = Threshold(0.0, ">", source="Jacot & Kaiser 2024 Fig. 1: strictly monotone in L̃ (smallest step > 0)")
SPEARMAN_TREND = Threshold(
    0.8, ">=", ceiling=1.0, source="ours: a monotone trend in L̃ read as |Spearman| >= 0.8 (§5.3 F1, F2)"
)
COI_NEAR_K = Threshold(
    0.5, "==", atol=1.0, source="ours: min COI_γ in [k*-0.5, k*+1.5] at the largest L̃ (§5.4 Q2, §5.3 F2)"
)
COI_ABOVE_K = Threshold(-0.5, ">=", source="ours: min COI_γ >= k*-0.5 at every L̃ (§5.3 F2)")
H_NEAR_K = Threshold(-0.5, "==", atol=0.5, source="Jacot & Kaiser 2024 Fig. 1(a): ĥ in [k*-1, k*] at the largest L̃")
H_BELOW_K = Threshold(0.0, "<=", source="Jacot & Kaiser 2024 Theorem 4 eq. 4: ĥ approaches k* from below")
KAPPA_AT_ENDS = Threshold(10.0, ">=", source="ours: κ at the ends >= 10x its mid-half median (§5.4 Q5, §5.3 F5)")
COI_MID_NEAR_K = Threshold(0.0, "==", atol=1.0, source="ours: mid-half COI_γ within 1 of k* (§5.3 F5)")
H_FLAT = Threshold(
    0.25, "<=", ceiling=0.0, source="ours: ĥ's spread over layers <= 0.25x COI_γ's and κ's (§5.4 Q7, §5.3 F3)"
)
H_GAP_MID = Threshold(0.5, "<=", ceiling=0.0, source="ours: mid-half median |ĥ_γ − ĥ| <= 0.5 (§5.3 F3)")
H_GAP_REST = Threshold(
    0.5,
    "<=",
    ceiling=0.0,
    source="ours: ĥ_γ within 0.5 of ĥ (half a rank unit) at every layer with p >= 1/4 (Fig. 1 (b)-(d))",
)
GAP_AT_INPUT = Threshold(
    1.0,
    ">",
    source="Jacot & Kaiser 2024 Fig. 1 (b)-(d): ĥ_γ departs from ĥ 'in the first layers' (their largest gap "
    "over the rest's > 1)",
)
KAPPA_MID_SMALL = Threshold(
    0.5,
    "<=",
    ceiling=0.0,
    source="ours: κ → 0 in the bottleneck read as mid-half median κ <= 0.5 rank units (Fig. 1 (b)-(d))",
)
BOUNDED = Threshold(
    10.0, "<=", ceiling=1.0, source="ours: 'of the same order' over L̃ read as max/min <= 10 (§5.3 Fig. 3)"
)
SPEED = Threshold(
    float(np.log(SPEED_FACTOR)),
    "<=",
    ceiling=0.0,
    source="ours: Theorem 4 (b)'s two sides within a factor 1.5 (§3.5 (b))",
)


def _over(frame: pd.DataFrame, value) -> float:
    """`value` (a number read off the L̃ >= 5 rows `frame`), NaN when there are none (the claim then fails)."""
    return float(value) if len(frame) else float("nan")


def quick_claims(cfg: Config, t: pd.DataFrame) -> list:
    """Q1-Q7 of docs/theory/leaky-resnets.md §5.4, F4 at the largest L̃, F1, F5 and Fig. 1 (b)-(d)'s caption
    (`fig1_profile_claims`); each from its thresholds above. Premise "critical" where the statement rests on the
    critical-point equations: the Hamiltonians ĥ, ĥ_γ (conserved only there, §3.2: Q1, Q3, Q7, F1), Prop. 5's
    non-negativity (Q6) and Theorem 4 (F5); the observations of Fig. 1 on trained nets (COI, spectra, κ: Q2, Q4,
    Q5, F4) have none."""
    k = lb.bottleneck_rank(cfg)
    Lts = t["effective_depth"].tolist()
    return [
        *hamiltonian_rise_claims(k, t),
        lb.f4_claim(k, t["f4_kinds"].iloc[-1], t["f4_gap_min"].iloc[-1], f" at L̃ = {Lts[-1]:g}"),
        *quick_shape_claims(t),
        f1_claim(k, t),
        f5_speed_claim(t[t["effective_depth"] >= LARGE]),
        *fig1_profile_claims(k, t),
    ]


def fig1_profile_claims(k: int, t: pd.DataFrame) -> list:
    """The two statements of Fig. 1 (b)-(d)'s caption at L̃ >= 5 (both presets): ĥ_γ ≈ ĥ except in the first
    layers, and κ → 0, COI_γ → k* inside the bottleneck."""
    big = t[t["effective_depth"] >= LARGE]
    return [hgamma_tracks_h_claim(big), bottleneck_energies_claim(k, big)]


def hamiltonian_rise_claims(k: int, t: pd.DataFrame) -> list:
    """Q1-Q3: ĥ and ĥ_γ rise with L̃, min COI_γ falls to near k*, ĥ_γ stays below it."""
    Lts, last_coi = t["effective_depth"].tolist(), float(t["min_coi"].iloc[-1])
    r = fmt(dict(zip(Lts, t["residual_median"])), 2)
    return [
        all_of_claim(
            f"Q1: median ĥ_γ and median ĥ increase with L̃ (median r by L̃: {r}; ĥ is no k* estimate here)",
            REF,
            [(rise_margin(t["h_gamma_median"]), RISES), (rise_margin(t["h_median"]), RISES)],
            expected="both strictly increasing",
            measured={"h_gamma": t["h_gamma_median"].tolist(), "h": t["h_median"].tolist()},
            id="q1-hamiltonians-increase",
            premise="critical",
        ),
        all_of_claim(
            f"Q2: min_l COI_γ decreases with L̃ and is in [k*-0.5, k*+1.5] at L̃ = {Lts[-1]:g}",
            REF,
            [(rise_margin(-t["min_coi"]), RISES), (last_coi, COI_NEAR_K.at(k + COI_NEAR_K.bound))],
            expected=f"decreasing; last in [{k - 0.5}, {k + 1.5}]",
            measured=t["min_coi"].tolist(),
            id="q2-coi-decreases",
        ),
        all_of_claim(
            "Q3: median ĥ_γ < min_l COI_γ at each L̃",
            REF,
            [(h, Threshold(c, "<")) for h, c in zip(t["h_gamma_median"], t["min_coi"])],
            expected="ĥ_γ < COI_γ",
            measured=(t["min_coi"] - t["h_gamma_median"]).tolist(),
            tolerance="difference > 0",
            id="q3-hgamma-below-coi",
            premise="critical",
        ),
    ]


def quick_shape_claims(t: pd.DataFrame) -> list:
    """Q4-Q7: no F4 gap at the smallest L̃, κ large at the input, the negativity falling, ĥ_γ flat over layers."""
    big = t[t["effective_depth"] >= LARGE]
    kappa_ratio = (big["kappa_first"] / big["kappa_mid_median"]).to_numpy()
    flat = (big["h_gamma_spread"] / big["coi_spread"]).to_numpy()
    small_gaps = t["f4_gap_max"].iloc[0]
    return [
        all_of_claim(
            f"Q4: at L̃ = {t['effective_depth'].iloc[0]:g} no bottleneck layer has F4's gap (no bottleneck at small L̃)",
            REF,
            [(small_gaps, Threshold(lb.GAP, "<"))],
            expected=f"0 layers (largest F4 gap < {lb.GAP:g})",
            measured={
                "layers with the gap": int(t["f4_layers_with_gap"].iloc[0]),
                "of": len(t["f4_kinds"].iloc[0]),
                "largest F4 gap": small_gaps,
            },
            id="q4-no-gap-small-depth",
        ),
        all_of_claim(
            f"Q5: at L̃ >= 5 the first-layer κ is >= {KAPPA_AT_ENDS.bound:g}x the mid-half median κ",
            REF,
            [(_over(big, kappa_ratio.min(initial=np.inf)), KAPPA_AT_ENDS)],
            expected=f">= {KAPPA_AT_ENDS.bound:g}",
            measured=kappa_ratio.tolist(),
            id="q5-kappa-large-at-input",
        ),
        all_of_claim(
            "Q6: the mid-half negativity max_l ‖min(A,0)‖/‖A‖ decreases with L̃",
            REF + "; Prop. 5",
            [(rise_margin(-t["negativity_mid_max"]), RISES)],
            expected="strictly decreasing",
            measured=t["negativity_mid_max"].tolist(),
            id="q6-negativity-decreases",
            premise="critical",
        ),
        all_of_claim(
            f"Q7: at L̃ >= 5 the spread over layers of ĥ_γ is <= {H_FLAT.bound:g}x that of COI_γ",
            REF,
            [(_over(big, flat.max(initial=-np.inf)), H_FLAT)],
            expected=f"<= {H_FLAT.bound:g}",
            measured=flat.tolist(),
            id="q7-hgamma-flat",
            premise="critical",
        ),
    ]


def f1_claim(k: int, t: pd.DataFrame):
    """F1: median ĥ and ĥ_γ rise towards k* from below as L̃ grows: increasing in L̃ (Spearman >= 0.8), never
    above k*, and within one rank unit below k* at the largest L̃ (Jacot & Kaiser Fig. 1(a), Theorem 4 eq. 4).
    ĥ is conserved along the depth only at a critical point (§3.2): premise "critical". The margin is the
    smallest of the conditions' margins (Spearman against 0.8, the maximum against k*, the last values' share of
    the [k*-1, k*] window left)."""
    rho_h = spearmanr(t["effective_depth"], t["h_median"]).statistic
    rho_hg = spearmanr(t["effective_depth"], t["h_gamma_median"]).statistic
    last = t.iloc[-1]
    r = last["residual_median"]
    top = float(t[["h_median", "h_gamma_median"]].max().max())
    near = H_NEAR_K.at(k + H_NEAR_K.bound)
    return all_of_claim(
        f"F1: median ĥ and ĥ_γ rise towards k* = {k} from below as L̃ grows (Spearman with L̃ >= 0.8, never above "
        f"k*, in [k*-1, k*] at the largest L̃; median r there {r:.3g})",
        FIG1,
        [
            (rho_h, SPEARMAN_TREND),
            (rho_hg, SPEARMAN_TREND),
            (top, H_BELOW_K.at(k + H_BELOW_K.bound)),
            (last["h_median"], near),
            (last["h_gamma_median"], near),
        ],
        expected=f"rising to k* = {k}, all <= {k}",
        measured={
            "spearman_h": rho_h,
            "spearman_h_gamma": rho_hg,
            "max": top,
            "h_last": last["h_median"],
            "h_gamma_last": last["h_gamma_median"],
        },
        tolerance="none above k*",
        id="f1-hamiltonian-from-below",
        premise="critical",
    )


def f5_speed_claim(big: pd.DataFrame):
    """F5 as Theorem 4 (b) in its tight form: the two sides ``‖D_l‖_(K+γI)`` and ``L̃√(COI_γ − ĥ_l)`` agree
    (`speed_ratio`) within `SPEED_FACTOR` at every layer, for L̃ >= 5. The theorem's additive bound
    2L̃√γ‖B_l‖ is reported (the largest |left − right| over it), not tested: at γ = 1e-3‖K‖ it is 10-100x the
    sides' difference, so it cannot fail. Margin on the worst layer's |ln ratio| against ln `SPEED_FACTOR`."""
    return all_of_claim(
        "F5 (Theorem 4 (b), tight form): at L̃ >= 5 the speed ‖∂_pA‖_(K+γI) equals L̃ times the square root of the "
        f"extra COI (COI_γ − ĥ) within a factor {SPEED_FACTOR:g} at every layer",
        'Jacot & Kaiser 2024 (arXiv 2405.17573) Theorem 4 (b) ("‖∂_pA_p‖_(K_p+γI) = L̃√(COI_γ − ĥ) up to '
        '2L̃√γ‖B_p‖") and Fig. 1; docs/theory/leaky-resnets.md §3.5 (b)',
        [(_over(big, big["speed_log_ratio_max"].max()), SPEED)],
        expected=f"max_l |ln ratio| <= ln {SPEED_FACTOR:g}",
        measured={
            "max |ln ratio| by L̃": dict(zip(big["effective_depth"], big["speed_log_ratio_max"])),
            "theorem's bound used (max |left − right|/(2L̃√γ‖B‖))": _over(big, big["slack_b_share_max"].max()),
        },
        tolerance="[ours] factor 1.5",
        id="f5-thm4b-speed",
        premise="critical",
    )


def paper_claims(cfg: Config, t: pd.DataFrame) -> list:
    """F1-F5 and Fig. 3 of docs/theory/leaky-resnets.md §5.3 at the paper's sizes; premise "critical" on the
    Hamiltonian and Theorem-4 statements (F1, F2's slack (d), F3, F5's speed), none on the observations of
    Figs. 1 and 3."""
    k = lb.bottleneck_rank(cfg)
    big = t[t["effective_depth"] >= LARGE]
    return [
        f1_claim(k, t),
        f2_claim(k, t),
        f3_claim(big),
        lb.f4_claim(k, sum(big["f4_kinds"], []), big["f4_gap_min"].min(), " at L̃ >= 5"),
        all_of_claim(
            f"F4: at L̃ >= 5 no gap near p = 0, 1: s_k*/s_k*+1 of the first and last W_l below {lb.GAP:g}",
            FIG1,
            [(_over(big, big[["gap_first", "gap_last"]].to_numpy().max(initial=-np.inf)), Threshold(lb.GAP, "<"))],
            expected=f"< {lb.GAP:g}",
            measured={"first": big["gap_first"].tolist(), "last": big["gap_last"].tolist()},
            id="f4-no-gap-at-ends",
        ),
        f5_kinetic_claim(k, big),
        f5_speed_claim(big),
        fig3_claim(t),
        *fig1_profile_claims(k, t),
    ]


def f2_claim(k: int, t: pd.DataFrame):
    """F2: min COI_γ falls towards k* from above and stays >= median ĥ up to the slack of §3.5 (c)."""
    rho_c = spearmanr(t["effective_depth"], t["min_coi"]).statistic
    last = t.iloc[-1]
    return all_of_claim(
        "F2: min_l COI_γ falls towards k* from above (Spearman <= -0.8, all >= k*-0.5, last in [k*-0.5, k*+1.5]) "
        "and stays >= median ĥ up to the slack of §3.5(c)",
        FIG1,
        [
            (rho_c, Threshold(-SPEARMAN_TREND.bound, "<=", ceiling=-1.0)),
            (float(t["min_coi"].min()), COI_ABOVE_K.at(k + COI_ABOVE_K.bound)),
            (float(last["min_coi"]), COI_NEAR_K.at(k + COI_NEAR_K.bound)),
            (float(t["slack_d_upper"].min()), Threshold(0.0, ">=")),
        ],
        expected=f"falling to k* = {k}",
        measured={"spearman": rho_c, "last": last["min_coi"], "min slack (d) upper": float(t["slack_d_upper"].min())},
        tolerance="[ours] [-0.5, +1.5]",
        id="f2-coi-from-above",
        premise="critical",
    )


def f3_claim(big: pd.DataFrame):
    """F3: at L̃ >= 5 ĥ is flat over the layers next to COI_γ and κ, and ĥ_γ ≈ ĥ in the mid-half. Beside it, the
    spread of the modified ĥ̃ (conserved to O(ρ²) at fixed ρ, docs/leaky-resnets.md) and the O(ρ) term
    ``max_l ρ_l|g_l|/L̃`` that separates the two, which bounds how flat ĥ itself can be at fixed ρ."""
    flat_coi = (big["h_spread"] / big["coi_spread"]).to_numpy()
    flat_kappa = (big["h_spread"] / big["kappa_spread"]).to_numpy()
    return all_of_claim(
        f"F3: at L̃ >= 5, ĥ varies <= {H_FLAT.bound:g}x as much over layers as COI_γ and κ; mid-half |ĥ_γ - ĥ| "
        f"median <= {H_GAP_MID.bound:g}",
        FIG1,
        [
            (_over(big, np.maximum(flat_coi, flat_kappa).max(initial=-np.inf)), H_FLAT),
            (_over(big, big["h_gap_mid_median"].max()), H_GAP_MID),
        ],
        expected=f"<= {H_FLAT.bound:g}; <= {H_GAP_MID.bound:g}",
        measured={
            "ratio_coi": flat_coi.tolist(),
            "ratio_kappa": flat_kappa.tolist(),
            "gap": big["h_gap_mid_median"].tolist(),
            "h_spread": big["h_spread"].tolist(),
            "h_modified_spread": big["h_modified_spread"].tolist(),
            "h_correction_max": big["h_correction_max"].tolist(),
        },
        tolerance="[ours]",
        id="f3-hamiltonian-flat",
        premise="critical",
    )


def f5_kinetic_claim(k: int, big: pd.DataFrame):
    """F5: at L̃ >= 5 κ is large at both ends and the mid-half COI_γ is near k*."""
    kin = np.concatenate([big["kappa_first"] / big["kappa_mid_median"], big["kappa_last"] / big["kappa_mid_median"]])
    near = COI_MID_NEAR_K.at(k + COI_MID_NEAR_K.bound)
    return all_of_claim(
        f"F5: at L̃ >= 5, κ at both ends >= {KAPPA_AT_ENDS.bound:g}x its mid-half median, and mid-half median COI_γ "
        f"within {COI_MID_NEAR_K.atol:g} of k*",
        FIG1,
        [(_over(big, kin.min(initial=np.inf)), KAPPA_AT_ENDS), *((float(c), near) for c in big["coi_mid_median"])],
        expected=f">= {KAPPA_AT_ENDS.bound:g}; |COI_γ - k*| <= {COI_MID_NEAR_K.atol:g}",
        measured={
            "first": (big["kappa_first"] / big["kappa_mid_median"]).tolist(),
            "last": (big["kappa_last"] / big["kappa_mid_median"]).tolist(),
            "coi": big["coi_mid_median"].tolist(),
        },
        tolerance="[ours] 1 rank unit",
        id="f5-kinetic-at-ends",
    )


def hgamma_tracks_h_claim(big: pd.DataFrame):
    """Fig. 1 (b)-(d): "the stable Hamiltonian approximates [ĥ] well - except in the first layers, where the kinetic
    energy (and COI) blows up". At every L̃ >= 5: ``|ĥ_γ − ĥ| <= 0.5`` at every layer with ``p_{l-1} >= 1/4``
    (`h_gap_split`), and the first layers' largest gap exceeds the rest's (the departure sits there, as Theorem 4
    (a)'s bound ``(2/L̃)‖∂_pA‖√γ‖B‖ + γ‖B‖²`` grows with the speed). ĥ is a Hamiltonian of critical points (§3.2):
    premise "critical". Margin: the smallest of the two conditions' margins over the L̃ (a ratio's is ``ratio − 1``)."""
    ratio = (big["h_gap_first_max"] / big["h_gap_rest_max"]).to_numpy()
    return all_of_claim(
        f"Fig. 1 (b)-(d): at L̃ >= 5, ĥ_γ ≈ ĥ except in the first layers: |ĥ_γ − ĥ| <= {H_GAP_REST.bound:g} at every "
        f"layer with p >= {FIRST_LAYERS_END:g}, and the largest |ĥ_γ − ĥ| of the layers with p < {FIRST_LAYERS_END:g} "
        "exceeds that of the rest",
        FIG1 + ' ("the stable Hamiltonian approximates it well - except in the first layers")',
        [
            *((float(v), H_GAP_REST) for v in big["h_gap_rest_max"]),
            *((float(r), GAP_AT_INPUT) for r in ratio),
        ],
        expected=f"<= {H_GAP_REST.bound:g} past p = {FIRST_LAYERS_END:g}; first-layer max / rest max > 1",
        measured={
            "max gap p >= 1/4 by L̃": dict(zip(big["effective_depth"], big["h_gap_rest_max"])),
            "max gap p < 1/4 by L̃": dict(zip(big["effective_depth"], big["h_gap_first_max"])),
        },
        tolerance="[ours] half a rank unit",
        id="fig1-hgamma-tracks-h",
        premise="critical",
    )


def bottleneck_energies_claim(k: int, big: pd.DataFrame):
    """Fig. 1 (b)-(d): "inside the bottleneck, the kinetic energy approaches zero and the COI approaches k*". At
    every L̃ >= 5: the mid-half median κ (rank units) is <= 0.5, so that there ĥ_γ = COI_γ − κ and COI_γ name the same
    rank, and the mid-half median COI_γ lies within 1 of k* (`COI_MID_NEAR_K`, F5's window). An observation on
    trained nets (κ and COI_γ need no critical point): no premise. Margin: the smallest of the conditions' margins."""
    near = COI_MID_NEAR_K.at(k + COI_MID_NEAR_K.bound)
    return all_of_claim(
        f"Fig. 1 (b)-(d): at L̃ >= 5, inside the bottleneck κ → 0 and COI_γ → k* = {k}: mid-half median κ <= "
        f"{KAPPA_MID_SMALL.bound:g} and mid-half median COI_γ within {COI_MID_NEAR_K.atol:g} of k*",
        FIG1 + ' ("Inside the bottleneck, the kinetic energy approaches zero and the COI approaches k*")',
        [
            *((float(v), KAPPA_MID_SMALL) for v in big["kappa_mid_median"]),
            *((float(c), near) for c in big["coi_mid_median"]),
        ],
        expected=f"κ <= {KAPPA_MID_SMALL.bound:g}; |COI_γ − {k}| <= {COI_MID_NEAR_K.atol:g}",
        measured={
            "kappa by L̃": dict(zip(big["effective_depth"], big["kappa_mid_median"])),
            "coi by L̃": dict(zip(big["effective_depth"], big["coi_mid_median"])),
        },
        tolerance="[ours] half a rank unit (κ), 1 rank unit (COI_γ)",
        id="fig1-bottleneck-kappa-coi",
    )


def fig3_claim(t: pd.DataFrame):
    """Fig. 3: the norms and path lengths stay of the same order over L̃ (max/min <= `BOUNDED`)."""
    bounded = {
        c: float(t[c].max() / t[c].min()) for c in ("B_norm_max", "BS_norm_max", "path_length_F", "path_length_gamma")
    }
    return all_of_claim(
        f"Fig. 3: max‖B_l‖, max‖B_lσ(A_{{l-1}})ᵀ‖, ℓ_F and ℓ_γ stay of the same order over L̃ (max/min <= "
        f"{BOUNDED.bound:g})",
        "Jacot & Kaiser 2024 (arXiv 2405.17573) Fig. 3; docs/theory/leaky-resnets.md §5.3",
        [(v, BOUNDED) for v in bounded.values()],
        expected=f"<= {BOUNDED.bound:g}",
        measured=bounded,
        tolerance="[ours] factor 10",
        id="fig3-bounded",
    )


def figure_vs_depth(cfg: Config, t: pd.DataFrame):
    k = lb.bottleneck_rank(cfg)
    x = t["effective_depth"].to_numpy()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, col, off in (("ĥ (Hamiltonian)", "h", -0.04), ("ĥ_γ (stable Hamiltonian)", "h_gamma", 0.04)):
        med = t[f"{col}_median"].to_numpy()
        err = [med - t[f"{col}_min"].to_numpy(), t[f"{col}_max"].to_numpy() - med]
        ax.errorbar(x + off * (x.max() - x.min()), med, yerr=err, marker="o", capsize=3, label=f"median {name}")
    ax.plot(x, t["min_coi"], marker="s", label="min_l COI_γ(A_l)")
    ax.axhline(k, color="k", ls="--", lw=1, label=f"k* = {k}")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("effective depth L̃")
    ax.set_ylabel("rank units")
    ax.set_title("Rescaled Hamiltonians (min-max bars over layers) and cost of identity")
    ax.legend(fontsize=8)
    return fig


def figure_profiles(cfg: Config, layers: dict[float, pd.DataFrame]):
    k = lb.bottleneck_rank(cfg)
    chosen = [Lt for Lt in cfg.profile_depths if Lt in layers] or list(layers)[:3]
    fig, axes = plt.subplots(2, len(chosen), figsize=(4.3 * len(chosen), 7), squeeze=False, sharex=True)
    for j, Lt in enumerate(chosen):
        df = layers[Lt]
        top, bottom = axes[0, j], axes[1, j]
        svs = [c for c in df.columns if c.startswith("sv")]
        for i, c in enumerate(svs):
            top.plot(df["p"], df[c], marker=".", lw=1, color=plt.cm.viridis(i / max(len(svs) - 1, 1)))
        top.set_yscale("log")
        top.set_title(f"L̃ = {Lt:g}: top singular values of W_p")
        for col, label in (
            ("h_rescaled", "ĥ"),
            ("h_gamma_rescaled", "ĥ_γ"),
            ("coi_gamma", "COI_γ(A_{l-1})"),
            ("kappa", "κ"),
        ):
            bottom.plot(df["p"], df[col], marker=".", lw=1, label=label)
        bottom.axhline(k, color="k", ls="--", lw=1)
        bottom.set_yscale("symlog", linthresh=1.0)
        bottom.set_xlabel("p (layer l at p_{l-1})")
        bottom.set_title(f"energies in rank units (median r = {df['residual'].median():.2g})")
        if j == 0:
            bottom.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figure_bounded(t: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for col, label in (
        ("B_norm_max", "max_l ‖B_l‖"),
        ("BS_norm_max", "max_l ‖B_l σ(A_{l-1})ᵀ‖"),
        ("path_length_F", "ℓ_F"),
        ("path_length_gamma", "ℓ_γ"),
        ("residual_median", "median r"),
    ):
        ax.plot(t["effective_depth"], t[col], marker="o", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("effective depth L̃")
    ax.set_title("Bounded quantities (Fig. 3) and the convergence residual")
    ax.legend(fontsize=8)
    return fig


def analyze(cfg: Config, results: dict[str, dict], ctx) -> Analysis:
    res = {r["effective_depth"]: r for r in results.values()}
    layers = {Lt: pd.DataFrame(res[Lt]["layers"]) for Lt in sorted(res)}
    t = per_depth_table(cfg, layers, res)
    claims = quick_claims(cfg, t) if cfg.claims == "quick" else paper_claims(cfg, t)
    all_layers = pd.concat([df.assign(effective_depth=Lt) for Lt, df in layers.items()], ignore_index=True)
    figures = {
        "hamiltonian_vs_depth": figure_vs_depth(cfg, t),
        "profiles": figure_profiles(cfg, layers),
        "bounded_quantities": figure_bounded(t),
    }
    notes = [
        "Convergence residual r (median over layers) by L̃: "
        + ", ".join(f"{a:g}: {b:.3g}" for a, b in zip(t["effective_depth"], t["residual_median"]))
        + ". The exact Hamiltonian ĥ is a k* estimate only when r is small (docs/theory/leaky-resnets.md §3.2, §5.4).",
        lb.lambda_note(cfg),
        "Largest |𝓗ᵀ⁴ - 𝓗| over layers by L̃: "
        + ", ".join(f"{a:g}: {b:.3g}" for a, b in zip(t["effective_depth"], t["thm4_gap_max"])),
    ]
    summary = {
        "k_star": lb.bottleneck_rank(cfg),
        "per_depth": t.drop(columns=["train_seconds", "diagnostics_seconds"]).to_dict(orient="records"),
        "diagnostics_seconds": t["diagnostics_seconds"].tolist(),
    }
    return Analysis(claims, figures, {"per_depth": t, "layers": all_layers}, summary, notes)


CATALOG = (
    Entry(
        "leaky-hamiltonian",
        ("quick", "tiny", "paper", "paper-cpu"),
        "Jacot & Kaiser Figs. 1, 3: Hamiltonian, cost of identity",
        12,
    ),
)

EXPERIMENT = Experiment(
    name="leaky-hamiltonian",
    summary="Across effective depths, the rescaled Hamiltonian of a trained Leaky ResNet rises towards the "
    "bottleneck rank k* while the cost of identity falls to it; energies and spectra along the depth.",
    reference="Jacot & Kaiser 2024, Hamiltonian Mechanics of Feature Learning (arXiv 2405.17573), Figs. 1 and 3; "
    "docs/theory/leaky-resnets.md §3, §5",
    config=Config,
    presets=PRESETS,
    units=units,
    build=build,
    finish=finish,
    analyze=analyze,
)
