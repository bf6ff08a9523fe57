"""Bottleneck structure of a trained deep network: the Theorem 3, 6 and 7 checks, neuron
balancedness and function-preserving rebalancing, and the bottleneck-rank classification
(docs/theory/bottleneck-rank.md §2.3-§2.4, §3.6-§3.10, §4a).

Networks are featurelab `MLP`s (leaky-ReLU family, optional biases; L = number of weight matrices).
Inputs are ``N x d_in`` (rows are samples) or one 1-D sample. Everything is float64.
"""

from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass

import numpy as np
import torch

from ..checks import as_matrix, int_at_least, positive, renamed
from ..errors import FeaturelabError
from ..models.convert import as_mlp
from ..models.weights import weight_list
from ..results import Check, Result
from ..runtime import float64_copy
from .jacobian import jacobian, jacobian_ranks, ntk_trace
from .ranks import singular_values
from .representation_cost import log_pdet

ROUNDING = 1e-10  # relative slack for float64 rounding in the always-true inequalities


def _check_mlp(model, homogeneous: bool = False):
    """`model` as an `MLP` (a plain Linear/activation chain is converted by `from_torch`), or a one-line error."""
    if not hasattr(model, "weight_matrices") or not hasattr(model, "with_bias"):
        model = as_mlp(model)
    if homogeneous and not model.homogeneous:
        raise FeaturelabError(f"model has activation={model.activation!r}; this needs a homogeneous (leaky-ReLU) MLP")
    return model


def _sq_norm(model) -> float:
    return float(sum((W.detach().double() ** 2).sum() for W in model.weights))


def _one_sample(model, X) -> torch.Tensor:
    x = torch.as_tensor(X)
    if x.ndim == 2 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 1:
        raise FeaturelabError(
            f"X must be one sample (a 1 x d_in row or a 1-D tensor of length d_in), got shape {tuple(x.shape)}"
        )
    return x


# ----------------------------------------------------------------------------------- Theorem 3
@dataclass(frozen=True, kw_only=True)
class Theorem3Check(Check):
    """Part 2 §2.3 Theorem 3 and the exact per-network inequality, on N samples.

    The `Check`: measured = max_two_log_pdet <= bound = R1_hat (False when no sample has rank k).
    two_log_pdet: 2 log|Jf(x_i)|_+ (top-k singular values) at every sample (N,).
    ranks: numerical Jacobian rank of every sample (N,), relative tolerance `rtol`.
    max_two_log_pdet: max of two_log_pdet over samples with Jacobian rank k (nan if none).
    margin: R1_hat − max_two_log_pdet (Theorem 3 predicts >= 0).
    exact_slack: min_i ‖θ‖² − L Σ_j s_j(Jf(x_i))^{2/L} (>= 0 for every θ and x when |a| <= 1); singular values
        <= 1e-10·s_1(Jf(x_i)) count as zero (rounding, docs/theory/bottleneck-rank.md §2.2).
    """

    two_log_pdet: list[float]
    ranks: list[int]
    max_two_log_pdet: float
    margin: float
    exact_slack: float


@renamed(tol="rtol")
def theorem3_check(model, X, R1_hat: float, k: int, *, rtol: float = 1e-3) -> Theorem3Check:
    """Theorem 3: if Rank Jf(x) = R⁽⁰⁾ = k then R⁽¹⁾ >= 2 log|Jf(x)|_+; plus the exact bound
    ‖θ‖² >= Σ_ℓ‖W_ℓ‖² >= L Σ_i s_i(Jf(x))^{2/L} (docs/theory/bottleneck-rank.md §2.3, §3.6).

    model: `MLP`; X: ``N x d_in`` (rows are samples); R1_hat: an estimate of R⁽¹⁾ (e.g. the depth fit's
    intercept); k: the rank class. Samples whose numerical Jacobian rank (relative `rtol`) is k enter the max.
    """
    model = _check_mlp(model)
    X = as_matrix("X", X)
    int_at_least("k", k, 1)
    J = jacobian(model, X)
    ranks = jacobian_ranks(model, X, rtol=rtol)
    s = torch.linalg.svdvals(J)
    if k > s.shape[1]:
        raise FeaturelabError(f"k={k} is not allowed: the Jacobian has only {s.shape[1]} singular values")
    two_lp = 2 * torch.log(s[:, :k]).sum(1)
    at_k = two_lp[ranks == k]
    mx = float(at_k.max()) if at_k.numel() else float("nan")
    L = model.depth
    # rounding leaves s ~ 1e-17·s_1 where Jf has exact zeros, and (1e-17)^{2/L} is not small at large L (0.002 at
    # L = 12, summed over the zero directions): as in `linear_representation_cost`, s <= ROUNDING·s_1 counts as 0,
    # which can only lower the bound
    kept = torch.where(s > ROUNDING * s[:, :1], s, torch.zeros_like(s))
    exact = _sq_norm(model) - L * (kept ** (2.0 / L)).sum(1)
    return Theorem3Check(
        passed=Check.holds(mx, float(R1_hat)),
        measured=mx,
        bound=float(R1_hat),
        two_log_pdet=two_lp.tolist(),
        ranks=ranks.tolist(),
        max_two_log_pdet=mx,
        margin=float(R1_hat) - mx,
        exact_slack=float(exact.min()),
    )


# ----------------------------------------------------------------------------------- Theorem 6
def layer_proxy(W, k: int) -> float:
    """e_ℓ(k) = Σ_{i<=k}(s_i(W)−1)² + Σ_{i>k} s_i(W)²: squared distance from W (any 2-D matrix) to the
    nearest rank-k partial isometry V_ℓV_{ℓ-1}ᵀ (docs/theory/bottleneck-rank.md §2.4, our proved per-layer proxy)."""
    s = singular_values(W)
    int_at_least("k", k, 0)
    return float(((s[:k] - 1) ** 2).sum() + (s[k:] ** 2).sum())


@dataclass(frozen=True, kw_only=True)
class Theorem6Check(Check):
    """Part 2 §2.4 Theorem 6 with the proved proxy, at one sample.

    The `Check`: measured = Σ_ℓ e_ℓ(k) + bias_sq <= bound = S = ‖θ‖² − kL − 2log|Jf(x)|_+ (always holds;
    `slack` = S − measured).
    k: Jacobian rank used.  proxies: e_ℓ(k) per layer (L,).  bias_sq: Σ_ℓ‖b_ℓ‖² (stored bias columns).
    fraction_within: share of layers with e_ℓ(k) <= S/(pL) (>= 1 − p by Markov).
    top_k: the k largest singular values of each W_ℓ (close to 1 in a bottleneck).
    next_singular: s_{k+1}(W_ℓ) per layer (O(L^{-1/2}) in a bottleneck; 0 if W_ℓ has only k).
    """

    k: int
    proxies: list[float]
    bias_sq: float
    fraction_within: float
    top_k: list[list[float]]
    next_singular: list[float]


@renamed(tol="rtol")
def theorem6_check(model, X, k: int | None = None, *, p: float = 0.25, rtol: float = 1e-3) -> Theorem6Check:
    """Σ_ℓ e_ℓ(k) + Σ_ℓ‖b_ℓ‖² <= ‖θ‖² − kL − 2log|Jf_θ(x)|_+ for k = Rank Jf(x) (docs/theory/bottleneck-rank.md
    §2.4, §3.7; Horn's product inequality and s² − 1 − 2 log s >= (s−1)²).

    model: `MLP` with |a| <= 1; X: one sample (a 1 x d_in row or a length-d_in vector); k: default the
    numerical Jacobian rank (relative `rtol`); p in (0, 1) for the share of layers within S/(pL).
    """
    model = _check_mlp(model)
    x = _one_sample(model, X)
    if not 0 < p < 1:
        raise FeaturelabError(f"p={p!r} is not allowed: it must be in (0, 1)")
    J = jacobian(model, x)
    if k is None:
        k = int(jacobian_ranks(model, x, rtol=rtol))
    int_at_least("k", k, 1)
    L = model.depth
    Ws = [W.detach() for W in weight_list(model)]
    e = [layer_proxy(W, k) for W in Ws]
    bias_sq = _sq_norm(model) - sum(float((W**2).sum()) for W in Ws)
    S = _sq_norm(model) - k * L - 2 * log_pdet(J, rank=k)
    within = float(np.mean([ei <= S / (p * L) for ei in e]))
    svals = [singular_values(W) for W in Ws]
    measured = sum(e) + bias_sq
    return Theorem6Check(
        passed=Check.holds(measured, S, rtol=ROUNDING),
        measured=measured,
        bound=S,
        rtol=ROUNDING,
        k=k,
        proxies=e,
        bias_sq=bias_sq,
        fraction_within=within,
        top_k=[s[:k].tolist() for s in svals],
        next_singular=[float(s[k]) if s.numel() > k else 0.0 for s in svals],
    )


# ---------------------------------------------------------------------------------- Corollary 8
@dataclass(frozen=True, kw_only=True)
class Corollary8Check(Check):
    """Part 2 §2.4 Cor. 8 in our explicit form, on N samples.

    The `Check`: measured = share of the L layers with ``s_{k+1}(α̃_ℓ(X)/√N) <= rhs_ℓ``, bound = 1 − p
    (relation ">="; it holds for every θ, by the proof in docs/theory/bottleneck-rank.md §2.4).
    k, p: the rank and the share parameter.  S: ``‖θ‖² − kL − max 2log|Jf(x)|_+`` over the samples of Jacobian
    rank k.  tail: ``s_{k+1}(α̃_ℓ(X)/√N)`` per layer (L,).  input_norm: ``s_1([α_{ℓ−1}(X), β1]/√N)`` per layer.
    rhs: ``√(S/(pL))·input_norm`` per layer.  constant: ``√(S/p)·max_ℓ input_norm``, so ``tail·√L <= constant``
    in the layers that pass: Cor. 8's O(L^{-1/2}) with its constant.
    """

    k: int
    p: float
    S: float
    tail: list[float]
    input_norm: list[float]
    rhs: list[float]
    constant: float


def corollary8_check(model, X, k: int, *, p: float = 0.25, rtol: float = 1e-3) -> Corollary8Check:
    """Cor. 8 with explicit constants (docs/theory/bottleneck-rank.md §2.4): in at least (1 − p)L layers,

        s_{k+1}(α̃_ℓ(X)/√N) <= √(S/(pL)) · s_1([α_{ℓ−1}(X), β1]/√N),   S = ‖θ‖² − kL − 2 log|Jf(x)|_+,

    for any θ and any sample x of Jacobian rank k (the one with the largest |Jf(x)|_+ is used: the smallest S).
    Horn's inequality splits α̃_ℓ = [α_{ℓ−1}, β1]W̃_ℓᵀ, Weyl's puts the bias column into the weight proxy
    e_ℓ(k) of `theorem6_check`, and Markov's inequality on Σ_ℓ(e_ℓ(k) + ‖b_ℓ‖²) <= S counts the layers.
    model: `MLP` (|a| <= 1); X: ``N x d_in`` (rows are samples); k: the rank class; p in (0, 1); numerical
    Jacobian ranks use the relative `rtol`.
    """
    model = _check_mlp(model)
    X = as_matrix("X", X)
    int_at_least("k", k, 1)
    if not 0 < p < 1:
        raise FeaturelabError(f"p={p!r} is not allowed: it must be in (0, 1)")
    s = torch.linalg.svdvals(jacobian(model, X))
    if k > s.shape[1]:
        raise FeaturelabError(f"k={k} is not allowed: the Jacobian has only {s.shape[1]} singular values")
    at_k = (2 * torch.log(s[:, :k]).sum(1))[jacobian_ranks(model, X, rtol=rtol) == k]
    if not at_k.numel():
        raise FeaturelabError(f"no sample of X has Jacobian rank k={k} (relative rtol={rtol:g}); Cor. 8 needs one")
    L = model.depth
    S = _sq_norm(model) - k * L - float(at_k.max())
    net = float64_copy(model).to(X.device)
    out = net(X.to(torch.float64), return_layers=True)
    N = X.shape[0]
    tail = [
        float(svals[k]) if svals.numel() > k else 0.0 for svals in (torch.linalg.svdvals(z / N**0.5) for z in out.pre)
    ]
    norms = [float(torch.linalg.matrix_norm(net.with_bias(a) / N**0.5, ord=2)) for a in out.act]
    scale = (max(S, 0.0) / (p * L)) ** 0.5
    rhs = [scale * a for a in norms]
    share = float(np.mean([t <= r * (1 + ROUNDING) + ROUNDING for t, r in zip(tail, rhs)]))
    return Corollary8Check(
        passed=Check.holds(share, 1 - p, ">="),
        measured=share,
        bound=1 - p,
        relation=">=",
        k=k,
        p=p,
        S=S,
        tail=tail,
        input_norm=norms,
        rhs=rhs,
        constant=(max(S, 0.0) / p) ** 0.5 * max(norms),
    )


# ------------------------------------------------------------------------------ balancedness
def _in_out(model) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per hidden layer ℓ = 1..L-1: (‖W_ℓ[i,:]‖² with the bias column, ‖W_{ℓ+1}[:,i]‖²) per neuron i."""
    Ws = [W.detach().double() for W in model.weights]
    n = model.dims
    return [((Ws[l] ** 2).sum(1), (Ws[l + 1][:, : n[l + 1]] ** 2).sum(0)) for l in range(model.depth - 1)]


def balancedness_residual(model) -> list[torch.Tensor]:
    """|in − out| / (in + out) per hidden neuron, in = ‖W_ℓ[i,:]‖² + b_ℓ[i]², out = ‖W_{ℓ+1}[:,i]‖²
    (docs/theory/bottleneck-rank.md §2.4, §3.9); zero at every critical point of C + λ‖θ‖². Dead neurons
    (in + out = 0) count as balanced. Returns one float64 tensor per hidden layer (length n_ℓ)."""
    model = _check_mlp(model, homogeneous=True)
    return [
        torch.where(i + o > 0, (i - o).abs() / (i + o).clamp_min(1e-300), torch.zeros_like(i))
        for i, o in _in_out(model)
    ]


@renamed(tol="rtol")
def rebalance(model, *, rtol: float = 1e-12, max_sweeps: int = 100000):
    """A copy of `model` with every hidden neuron balanced (docs/theory/bottleneck-rank.md §3.9): repeatedly scale
    neuron i's incoming row (bias included) by c = (out/in)^{1/4} and its outgoing column by 1/c,
    sweeping the layers until max residual <= rtol (the residual is relative). By positive homogeneity
    of σ_a the function is unchanged; each step replaces in + out by 2√(in·out), so ‖θ‖² never increases. A neuron with
    in = 0 or out = 0 contributes nothing to f and is zeroed. Computed in float64, stored in the
    model's dtype. Needs a leaky-ReLU `MLP`.
    """
    model = _check_mlp(model, homogeneous=True)
    positive("rtol", rtol)
    int_at_least("max_sweeps", max_sweeps, 1)
    out_model = copy.deepcopy(model)
    Ws = [W.detach().double().clone() for W in model.weights]
    n = model.dims
    for _ in range(max_sweeps):
        worst = 0.0
        for l in range(model.depth - 1):
            i = (Ws[l] ** 2).sum(1)
            o = (Ws[l + 1][:, : n[l + 1]] ** 2).sum(0)
            live = (i > 0) & (o > 0)
            res = torch.where(live, (i - o).abs() / (i + o).clamp_min(1e-300), torch.zeros_like(i))
            worst = max(worst, float(res.max()))
            c = torch.where(live, (o / i.clamp_min(1e-300)) ** 0.25, torch.zeros_like(i))
            Ws[l] = Ws[l] * c[:, None]
            Ws[l + 1][:, : n[l + 1]] = Ws[l + 1][:, : n[l + 1]] / torch.where(live, c, torch.ones_like(c))[None, :]
            Ws[l + 1][:, : n[l + 1]][:, ~live] = 0.0
        if worst <= rtol:
            break
    else:
        raise FeaturelabError(
            f"rebalance did not reach rtol={rtol:g} in max_sweeps={max_sweeps} sweeps (residual {worst:.3g})"
        )
    with torch.no_grad():
        for P, W in zip(out_model.weights, Ws):
            P.copy_(W.to(P.dtype))
    return out_model


# ----------------------------------------------------------------------------------- Theorem 7
@dataclass(frozen=True, kw_only=True)
class Theorem7Check(Check):
    """Part 2 §2.4 Theorem 7 in our explicit form, at one sample.

    The `Check`: measured = (1/L) Σ_ℓ (‖α_{ℓ-1}(x)‖² + β²) <= bound =
    (TrΘ(x,x)/(kL))·exp((max(c₁,0) − 2log|Jf(x)|_+)/k).
    ratio: bound/measured (>= 1 on balanced nets).  ntk_per_layer: TrΘ(x,x)/L.  c1: ‖θ‖² − kL.  k: the rank.
    max_residual: the net's largest balancedness residual (the bound assumes it is ~0).
    """

    ratio: float
    ntk_per_layer: float
    c1: float
    k: int
    max_residual: float


@renamed(tol="rtol")
def theorem7_check(model, X, k: int | None = None, *, rtol: float = 1e-3) -> Theorem7Check:
    """Theorem 7's explicit inequality (docs/theory/bottleneck-rank.md §2.4):
    (1/L)Σ_ℓ(‖α_{ℓ-1}(x)‖² + β²) <= (TrΘ(x,x)/(kL))·exp((max(c₁,0) − 2log|Jf(x)|_+)/k), c₁ = ‖θ‖² − kL,
    for balanced θ (use `rebalance` first on Adam-trained nets) and k = Rank Jf(x) (default: numerical,
    relative `rtol`). model: leaky-ReLU `MLP`; X: one sample (a 1 x d_in row or a length-d_in vector)."""
    model = _check_mlp(model, homogeneous=True)
    x = _one_sample(model, X)
    if k is None:
        k = int(jacobian_ranks(model, x, rtol=rtol))
    int_at_least("k", k, 1)
    L = model.depth
    acts = float64_copy(model).to(x.device)(as_matrix("x", x[None]), return_layers=True).act
    sq = [float((a**2).sum()) + model.bias**2 for a in acts]
    lhs = float(np.mean(sq))
    trace = float(ntk_trace(model, x))
    c1 = _sq_norm(model) - k * L
    rhs = trace / (k * L) * float(np.exp((max(c1, 0.0) - 2 * log_pdet(jacobian(model, x), rank=k)) / k))
    worst = max(float(r.max()) for r in balancedness_residual(model)) if L > 1 else 0.0
    return Theorem7Check(
        passed=Check.holds(lhs, rhs, rtol=ROUNDING),
        measured=lhs,
        bound=rhs,
        rtol=ROUNDING,
        ratio=rhs / lhs,
        ntk_per_layer=trace / L,
        c1=c1,
        k=k,
        max_residual=worst,
    )


# ------------------------------------------------------------------------- bottleneck rank (§4a)
def middle_layers(L: int) -> list[int]:
    """1-based layers ℓ with L/4 <= ℓ <= 3L/4 (Part 2 §4a's middle range; at least one layer)."""
    mid = [l for l in range(1, L + 1) if L / 4 <= l <= 3 * L / 4]
    return mid or [max(1, (L + 1) // 2)]


@dataclass(frozen=True)
class BottleneckRank(Result):
    """k_mid = median_low over the middle layers of #{s_i(W_ℓ) > atol}, with what it used."""

    k_mid: int
    counts: list
    layers: list
    atol: float


@renamed(threshold="atol")
def bottleneck_rank(model, *, atol: float = 0.1) -> BottleneckRank:
    """Bottleneck-rank estimate of a trained `MLP` from its middle-layer weight spectra (docs/theory/bottleneck-rank.md
    §4a): k_mid = median (lower) over ℓ in [L/4, 3L/4] of #{s_i(W_ℓ) > atol}, an absolute
    threshold (0.1 is the paper's believed value). Do not use the Jacobian rank for this: small
    leftover singular directions hide in it. The count is not invariant under the function-preserving
    rescaling of a unit (c in, 1/c out): `rebalance` first unless the net was trained to a critical point
    of C + λ‖θ‖² (where every unit is balanced); `featurelab.analyze` does."""
    model = _check_mlp(model)
    positive("atol", atol)
    layers = middle_layers(model.depth)
    Ws = model.weight_matrices()
    counts = [int((singular_values(Ws[l - 1].detach()) > atol).sum()) for l in layers]
    return BottleneckRank(int(statistics.median_low(counts)), counts, layers, float(atol))


def representation_spectra(model, X, centred: bool = True) -> list[torch.Tensor]:
    """Singular values of α̃_ℓ(X)/√N for ℓ = 1..L (docs/theory/bottleneck-rank.md §3.10), centred over samples by
    default. X: ``N x d_in`` (rows are samples); float64."""
    model = _check_mlp(model)
    X = as_matrix("X", X)
    pre = float64_copy(model).to(X.device)(X, return_layers=True).pre
    return [torch.linalg.svdvals(((z - z.mean(0)) if centred else z) / np.sqrt(len(z))) for z in pre]


def classify_minimum(k_mid: int, true_rank: int, fits: bool) -> str:
    """The class of a trained minimum (Part 2 §4a): 'underestimating (fitting)', 'underestimating
    (not fitting)', 'recovering' or 'overestimating', from k_mid against the task's bottleneck rank."""
    int_at_least("k_mid", k_mid, 0)
    int_at_least("true_rank", true_rank, 1)
    if k_mid < true_rank:
        return "underestimating (fitting)" if fits else "underestimating (not fitting)"
    return "recovering" if k_mid == true_rank else "overestimating"
