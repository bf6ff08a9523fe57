"""Hamiltonian diagnostics of a trained Leaky ResNet (docs/theory/leaky-resnets.md §3; Jacot & Kaiser,
arXiv 2405.17573 §2-§3, eq. 1-4, Theorem 4, Prop. 5, Prop. 10).

Rows are samples: ``A_l``, ``B_l``, ``D_l`` are ``N x w`` (the papers' transposes), so the papers'
``B σ(A)ᵀ`` is ``Bᵀσ(A)`` here and ``Tr[B Aᵀ]`` is ``Σ B ⊙ A``. Layer-l quantities use the staggered pairing
``(A_{l-1}, B_l, W_l, D_l)`` (Part 1 §3, §6.1), plotted at ``p_{l-1}``; with it the network is a
symplectic-Euler step at a critical point and the identities of §3.2-3.5 are exact. Everything runs in
float64 on the CPU from the stored parameters.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ..checks import as_matrix, non_negative, one_of, positive, same_rows
from ..errors import FeaturelabError
from ..models.leaky_resnet import LeakyResNet
from ..runtime import float64_copy
from ..training.objectives import data_cost
from .cost_of_identity import GAMMA_MODES, KernelMetric, cost_of_identity, features, kernel_metric
from .ranks import singular_values, spectrum_ranks

PAIRINGS = ("staggered", "same")


def _float64_leaky(model) -> LeakyResNet:
    if not isinstance(model, LeakyResNet):
        raise FeaturelabError(f"model must be a featurelab LeakyResNet, got {type(model).__name__}")
    return float64_copy(model)


def _check_data(model: LeakyResNet, X, Y) -> tuple[torch.Tensor, torch.Tensor]:
    X, Y = as_matrix("X", X), as_matrix("Y", Y)
    same_rows("X", X, "Y", Y)
    if X.shape[1] != model.d_in:
        raise FeaturelabError(f"X has {X.shape[1]} columns but the model's d_in is {model.d_in}")
    if Y.shape[1] != model.d_out:
        raise FeaturelabError(f"Y has {Y.shape[1]} columns but the model's d_out is {model.d_out}")
    return X, Y


def backward_variables(model: LeakyResNet, X, Y, lam: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Representations ``[A_0..A_L]`` and backward variables ``[B_0..B_L]`` (each ``N x w``, float64, on X's device).

    ``B_l = −(1/λ) ∂C/∂A_l`` (docs/theory/leaky-resnets.md §3.2, paper §2.4) is the total derivative of the data cost
    ``C = (1/N)‖Y − Ŷ‖²_F`` (the trainer's "mse") through layers l+1..L and ``V_out``, parameters fixed,
    by autograd on one float64 forward graph. X: ``N x d_in``, Y: ``N x d_out`` (rows are samples).
    """
    return _backward(_float64_leaky(model), X, Y, lam)


def _backward(m: LeakyResNet, X, Y, lam: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    X, Y = _check_data(m, X, Y)
    positive("lam", lam)
    m.to(X.device)
    with torch.enable_grad():
        A0 = (X @ m.U_in.T).detach().requires_grad_()
        reps = m.representations(X, A0=A0)
        C = data_cost("mse", reps[-1] @ m.V_out.T, Y)
        grads = torch.autograd.grad(C, reps)
    return [a.detach() for a in reps], [-g / lam for g in grads]


def hamiltonian_gradients(
    A: torch.Tensor, B: torch.Tensor, effective_depth: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(∂_A𝓗, ∂_B𝓗)`` of eq. 1, ``𝓗 = (L̃/2)‖Bᵀσ(A)‖² − L̃ Σ B⊙A`` (Jacot & Kaiser, arXiv 2405.17573 §2.4), at
    (A, B), each ``N x w`` (rows are samples). In closed form, with ``W = L̃Bᵀσ(A)``: ``∂_B𝓗 = σ(A)Wᵀ − L̃A`` (the
    velocity ∂_pA) and ``∂_A𝓗 = σ'(A) ⊙ (BW)[:, :w] − L̃B`` (= −∂_pB). Taken by autograd, so σ' is whatever the
    active torch function mode makes it (softplus_β under `Pieces(beta=β)`, the slopes s* under
    `Certified.slopes_mode()`, relu'(0) = 0 otherwise)."""
    Lt = float(effective_depth)
    with torch.enable_grad():
        A_, B_ = A.detach().requires_grad_(), B.detach().requires_grad_()
        H = Lt / 2 * ((B_.T @ features(A_)) ** 2).sum() - Lt * (B_ * A_).sum()
        dA, dB = torch.autograd.grad(H, (A_, B_))
    return dA, dB


def symplectic_terms(reps: list[torch.Tensor], Bs: list[torch.Tensor], rho: torch.Tensor) -> torch.Tensor:
    """``g_l = ⟨B_{l−1} − B_l, A_l − A_{l−1}⟩/ρ_l²``, l = 1..L, shape (L,) (docs/leaky-resnets.md, "The modified
    Hamiltonian"). reps ``[A_0..A_L]``, Bs ``[B_0..B_L]`` (each ``N x w``), rho (L,).

    The forward and backward recursions are ``A_l − A_{l−1} = ρ_l ∂_B𝓗ᵖʳᵉ`` and ``B_{l−1} − B_l = ρ_l ∂_A𝓗ᵖʳᵉ``
    (the pre-Hamiltonian of layer l at ``(A_{l−1}, B_l, W_l)``), and wherever ``W_l = L̃B_lᵀσ(A_{l−1})`` these
    partials are those of 𝓗 itself, so g_l is ``⟨∂_A𝓗, ∂_B𝓗⟩(A_{l−1}, B_l)`` (`hamiltonian_gradients`) with the
    activation's derivative that the backward pass used (the slopes s* at a certified kink)."""
    return torch.stack(
        [((Bs[l - 1] - Bs[l]) * (reps[l] - reps[l - 1])).sum() / rho[l - 1] ** 2 for l in range(1, len(reps))]
    ).to(torch.float64)


def layer_energies(
    A: torch.Tensor,
    B: torch.Tensor,
    D: torch.Tensor,
    effective_depth: float,
    gamma0: float = 1e-3,
    gamma_mode: str = "relative",
    *,
    metric: KernelMetric | None = None,
) -> dict[str, float]:
    """The Hamiltonians, energies and Theorem-4 bounds of one layer (docs/theory/leaky-resnets.md §3.3-3.5).

    A: ``A_{l-1}``, B: ``B_l``, D: ``D_l = (A_l − A_{l-1})/ρ_l`` (each ``N x w``, rows are samples).
    With ``L̃`` = effective_depth, ``K = σ(A)σ(A)ᵀ``, γ from (gamma0, gamma_mode) and ``c = ‖B‖``:
    hamiltonian ``𝓗 = (L̃/2)‖Bᵀσ(A)‖² − L̃ Σ B⊙A`` (eq. 1), h_rescaled ``ĥ = −2𝓗/L̃``;
    coi_gamma ``COI_γ(A)``; kappa ``κ = ‖D‖²_(K+γI)/L̃²``; kinetic ``T = L̃κ/2``; potential
    ``U = −(L̃/2)COI_γ``; stable_hamiltonian ``T + U``, h_gamma_rescaled ``ĥ_γ = COI_γ − κ``;
    thm4 ``(1/2L̃)‖D + γL̃B‖²_(K+γI) − (L̃/2)COI_γ − (γL̃/2)c²`` (equals 𝓗 when ``W = L̃Bᵀσ(A)``);
    slack_a/b/c: bound minus left side of §3.5 (a)-(c) (≥ 0 when the bound holds). metric: the
    ``kernel_metric(A, True, gamma0, gamma_mode)`` when the caller has it already.
    """
    Lt = float(effective_depth)
    metric = kernel_metric(A, True, gamma0, gamma_mode) if metric is None else metric
    w = A.shape[1]
    Z = metric.whiten(torch.cat([A, D, B], dim=1))
    ZA, ZD, ZB = Z[:, :w], Z[:, w : 2 * w], Z[:, 2 * w :]
    g = metric.gamma
    coi = float((ZA**2).sum())
    d2 = float((ZD**2).sum())
    c = float(torch.linalg.norm(B))
    BS = B.T @ metric.S
    H = Lt / 2 * float((BS**2).sum()) - Lt * float((B * A).sum())
    h = -2 * H / Lt
    kappa = d2 / Lt**2
    h_gamma = coi - kappa
    thm4 = float(((ZD + g * Lt * ZB) ** 2).sum()) / (2 * Lt) - Lt / 2 * coi - g * Lt / 2 * c**2
    d = math.sqrt(d2)
    return {
        "B_norm": c,
        "BS_norm": float(torch.linalg.norm(BS)),
        "hamiltonian": H,
        "h_rescaled": h,
        "kinetic": Lt * kappa / 2,
        "kappa": kappa,
        "potential": -Lt / 2 * coi,
        "coi_gamma": coi,
        "stable_hamiltonian": Lt * kappa / 2 - Lt / 2 * coi,
        "h_gamma_rescaled": h_gamma,
        "thm4": thm4,
        "thm4_gap": abs(thm4 - H),
        "D_norm_K": d,
        "slack_a": 2 / Lt * d * math.sqrt(g) * c + g * c**2 - abs(h - h_gamma),
        "slack_b": 2 * Lt * math.sqrt(g) * c - abs(d - Lt * math.sqrt(max(0.0, coi - h))),
        "slack_c": coi + g * c**2 - h,
        "gamma": g,
        "jitter": metric.jitter,
        "condition": metric.condition,
    }


def balancedness_residual(W: torch.Tensor, positions: torch.Tensor, effective_depth: float) -> float:
    """``max_l |E_l − Ê_l| / max_l E_l`` of the discrete balancedness law (docs/theory/leaky-resnets.md §3.6).

    At a critical point ``∂_p‖W_p‖² = 2L̃‖b_p‖²`` (full norm, bias included): twice the rate of Jacot & Kaiser's
    Prop. 10, whose proof drops the chain-rule term of the reparametrisation; derived in docs/leaky-resnets.md,
    "Balancedness (Prop. 10)". W: ``L x w x (w+1)`` (bias = last column), positions: ``p_0..p_L``.
    ``E_l = ‖W_l‖²`` at the midpoints ``m_l = (p_{l-1}+p_l)/2``,
    ``Ê_l = E_1 + 2L̃ Σ_{j=2..l} (β_{j-1}+β_j)/2 (m_j − m_{j-1})``, ``β_l = ‖b_l‖²`` (trapezoid rule).
    """
    W = W.detach().to(torch.float64)
    E = (W**2).sum(dim=(1, 2))
    beta = (W[:, :, -1] ** 2).sum(dim=1)
    p = positions.to(torch.float64)
    m = (p[:-1] + p[1:]) / 2
    increments = 2 * effective_depth * (beta[:-1] + beta[1:]) / 2 * (m[1:] - m[:-1])
    E_hat = E[0] + torch.cat([torch.zeros(1, dtype=E.dtype, device=E.device), torch.cumsum(increments, 0)])
    return float((E - E_hat).abs().max() / E.max())


def lagrangian_weights(
    A: torch.Tensor, D: torch.Tensor, effective_depth: float, *, metric: KernelMetric | None = None
) -> torch.Tensor:
    """The weights of the Lagrangian reformulation, ``W = (L̃A + ∂_pA) σ(A)⁺`` (Jacot & Kaiser §2.2; columns
    convention there): the minimum-norm W with ``∂_pA = Wσ(A) − L̃A``, ``w x (w+1)``.

    A: the representation, D: its velocity ∂_pA (a layer's ``D_l = (A_l − A_{l-1})/ρ_l``), each ``N x w`` (rows
    are samples). In rows, ``Wᵀ = σ(A)⁺(L̃A + D)``: the least-squares solution of ``σ(A) Wᵀ = L̃A + D``
    (`KernelMetric.pinv`: the thin SVD of σ(A) when N > w+1, else ``lstsq`` with gelsd; explicit rcond). For a
    layer of the network it is ``W_l`` projected onto the row space of σ(A_{l-1}); every critical point has
    ``W_l = L̃B_lᵀσ(A_{l-1})`` there already, so the two agree. metric: any `kernel_metric` of A (its γ plays no
    part) when the caller has one already.
    """
    A, D = as_matrix("A", A), as_matrix("D", D)
    metric = kernel_metric(A, True, 0.0) if metric is None else metric
    return metric.pinv(effective_depth * A + D).T


def _modified(H: float, g: float, rho: float, effective_depth: float, shift: int) -> dict[str, float]:
    """The columns g, hamiltonian_modified ``𝓗̃_l = 𝓗_l + (1/2 − shift)ρ_l g_l`` and h_modified ``−2𝓗̃_l/L̃``: with
    the staggered pairing (shift 0) ``𝓗(A_{l−1}, B_l) + (ρ_l/2)g_l``, with "same" (shift 1)
    ``𝓗(A_l, B_l) − (ρ_l/2)g_l``; both are the symplectic-Euler modified Hamiltonian to O(ρ²)."""
    Hm = H + (0.5 - shift) * rho * g
    return {"g": g, "hamiltonian_modified": Hm, "h_modified": -2 * Hm / effective_depth}


def geodesic_diagnostics(
    model: LeakyResNet, X, Y, lam: float, gamma0: float = 1e-3, gamma_mode: str = "relative", pairing: str = "staggered"
) -> pd.DataFrame:
    """Every Part 1 §3 diagnostic of a trained `LeakyResNet` on its training set, one row per layer l = 1..L.

    X: ``N x d_in``, Y: ``N x d_out`` (rows are samples); lam: the λ it was trained with (> 0); gamma0: γ_0 of
    §3.4 (relative to ‖K_{l-1}‖_op by default, ``gamma_mode="absolute"`` for a fixed γ; 0 uses
    pseudo-inverses). pairing "staggered" (default) uses ``(A_{l-1}, B_l, W_l, D_l)`` plotted at
    ``p_{l-1}``; "same" uses ``A_l`` and ``p_l`` instead of ``A_{l-1}`` (identities then only approximate).

    Columns: layer, p, rho, the `layer_energies` keys, pre_hamiltonian
    ``Tr[Bᵀ(σ(A)W_lᵀ − L̃A)] − ‖W_l‖²/(2L̃)`` (= −(1/λ)∂𝓛/∂ρ_l, §3.3), residual
    ``r_l = ‖W_l − L̃Bᵀσ(A)‖/‖W_l‖`` (§3.2), lagrangian_residual ``‖W_l − (L̃A_{l-1} + D_l)σ(A_{l-1})⁺‖/‖W_l‖``
    (`lagrangian_weights`: the share of W_l the training data never see; 0 at a critical point), negativity
    ``‖min(A,0)‖/‖A‖`` of the paired A (Prop. 5), sv1..sv10 of W_l and effective_rank ``#{s_i ≥ 0.1 s_1}`` (§3.6);
    g ``= ⟨∂_A𝓗, ∂_B𝓗⟩(A_{l−1}, B_l)`` (`symplectic_terms`), hamiltonian_modified ``𝓗̃_l`` and h_modified
    ``−2𝓗̃_l/L̃`` (`_modified`): constant across layers to O(ρ²) at a critical point in W, where ĥ is constant to
    O(ρ) only (docs/leaky-resnets.md, "The modified Hamiltonian"). Run it under ``Certified.slopes_mode()`` at a
    certified ReLU critical point so that B (and g) use the slopes s* at the kinks.
    ``.attrs["summary"]``: median/min/max of h_rescaled and h_gamma_rescaled, h_spread and h_modified_spread
    (max − min over layers), h_correction_max ``max_l ρ_l|g_l|/L̃`` (the O(ρ) term, in ĥ's units), min_coi
    (``min_l COI_γ(A_l)``, l = 0..L), path_length_F and path_length_gamma (§3.6), balancedness (rate 2L̃‖b‖²),
    max/median residual, max lagrangian_residual, max B_norm and BS_norm (Fig. 3), max thm4_gap, the minimum
    slacks of (a)-(c) and the eq. 4 slacks (d) at the median ĥ.
    """
    m = _float64_leaky(model)
    non_negative("gamma0", gamma0)
    one_of("gamma_mode", gamma_mode, GAMMA_MODES)
    one_of("pairing", pairing, PAIRINGS)
    reps, Bs = _backward(m, X, Y, lam)
    Lt, rho, p = m.effective_depth, m.rho, m.positions
    W = m.W.detach()
    shift = 0 if pairing == "staggered" else 1
    g = symplectic_terms(reps, Bs, rho)
    rows = []
    for l in range(1, m.depth + 1):
        A, B, Wl = reps[l - 1 + shift], Bs[l], W[l - 1]
        D = (reps[l] - reps[l - 1]) / rho[l - 1]
        row = {"layer": l, "p": float(p[l - 1 + shift]), "rho": float(rho[l - 1])}
        metric = kernel_metric(A, True, gamma0, gamma_mode)  # one factorisation of σ(A) per layer
        row.update(layer_energies(A, B, D, Lt, gamma0, gamma_mode, metric=metric))
        row.update(_modified(row["hamiltonian"], float(g[l - 1]), float(rho[l - 1]), Lt, shift))
        S = metric.S
        row["pre_hamiltonian"] = float((B * (S @ Wl.T - Lt * A)).sum()) - float((Wl**2).sum()) / (2 * Lt)
        row["residual"] = float(torch.linalg.norm(Wl - Lt * B.T @ S) / torch.linalg.norm(Wl))
        W_lag = lagrangian_weights(reps[l - 1], D, Lt, metric=metric if shift == 0 else None)
        row["lagrangian_residual"] = float(torch.linalg.norm(Wl - W_lag) / torch.linalg.norm(Wl))
        row["negativity"] = float(torch.linalg.norm(A.clamp(max=0)) / torch.linalg.norm(A).clamp_min(1e-300))
        s = singular_values(Wl)
        row.update({f"sv{i + 1}": float(s[i]) for i in range(min(10, s.numel()))})
        row["effective_rank"] = spectrum_ranks(s, effective_rtol=0.1)["effective_rank"]
        rows.append(row)
    df = pd.DataFrame(rows)

    df.attrs["summary"] = _summary(df, reps, W, p, Lt, gamma0, gamma_mode, shift)
    return df


def _summary(df: pd.DataFrame, reps, W, p, Lt: float, gamma0: float, gamma_mode: str, shift: int) -> dict:
    """`geodesic_diagnostics`' ``.attrs["summary"]`` from its table, the representations ``[A_0..A_L]``, the
    weights ``L x w x (w+1)`` and the positions ``p_0..p_L``."""
    coi_last = cost_of_identity(reps[-1 if shift == 0 else 0], True, gamma0, gamma_mode)
    min_coi = min(float(df["coi_gamma"].min()), coi_last)
    path_F = sum(float(torch.linalg.norm(reps[l] - reps[l - 1])) for l in range(1, len(reps)))
    path_gamma = float((df["rho"] * df["D_norm_K"]).sum())
    h_med = float(df["h_rescaled"].median())
    sqrt_gc = float((np.sqrt(df["gamma"]) * df["B_norm"]).max())
    gc2 = float((df["gamma"] * df["B_norm"] ** 2).max())
    return {
        "h_median": h_med,
        "h_min": float(df["h_rescaled"].min()),
        "h_max": float(df["h_rescaled"].max()),
        "h_spread": float(df["h_rescaled"].max() - df["h_rescaled"].min()),
        "h_modified_spread": float(df["h_modified"].max() - df["h_modified"].min()),
        "h_correction_max": float((df["rho"] * df["g"]).abs().max()) / Lt,
        "h_gamma_median": float(df["h_gamma_rescaled"].median()),
        "h_gamma_min": float(df["h_gamma_rescaled"].min()),
        "h_gamma_max": float(df["h_gamma_rescaled"].max()),
        "min_coi": min_coi,
        "path_length_F": path_F,
        "path_length_gamma": path_gamma,
        "balancedness": balancedness_residual(W, p, Lt),
        "residual_max": float(df["residual"].max()),
        "residual_median": float(df["residual"].median()),
        "lagrangian_residual_max": float(df["lagrangian_residual"].max()),
        "B_norm_max": float(df["B_norm"].max()),
        "BS_norm_max": float(df["BS_norm"].max()),
        "thm4_gap_max": float(df["thm4_gap"].max()),
        "slack_a_min": float(df["slack_a"].min()),
        "slack_b_min": float(df["slack_b"].min()),
        "slack_c_min": float(df["slack_c"].min()),
        "slack_d_lower": (h_med - min_coi) + (path_gamma / Lt + sqrt_gc) ** 2,
        "slack_d_upper": gc2 - (h_med - min_coi),
    }
