"""Reformulations of the L2-regularized loss through representations, and the forces on them
(docs/theory/sparsity.md §2-§3; Jacot, Golikov, Hongler, Gabriel 2022, Prop. 1 and Section 3).

Rows are samples. For an `MLP` with weights ``W_l`` (``n_l x (n_{l-1}+1)`` with a β bias column, or
``n_l x n_{l-1}`` when β = 0) the representations are the pre-activations ``Z_l`` (``N x n_l``) and the
layer inputs with bias column ``A_{l-1} = [σ(Z_{l-1}), β1]`` (``N x (n_{l-1}+1)``, ``A_0 = [X, β1]``).
The papers write the transposes: its ``Z_ℓ`` is our ``Z_lᵀ`` and its ``Z^σ_{ℓ-1}`` our ``A_{l-1}ᵀ``, so
its ``Z_ℓ(Z^σ_{ℓ-1})⁺`` is our ``(A_{l-1}⁺ Z_l)ᵀ`` and its ``K^σ = (Z^σ)ᵀZ^σ`` our ``A Aᵀ`` (N x N).

Everything is computed in float64 from the stored parameters. Pseudo-inverses are thin SVDs truncated
at ``s_i > rtol·s_1`` (rtol = 1e-10, Part 3 §8.8) or `lstsq` with an explicit rcond; no explicit
inverse is formed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, overload

import torch
from torch import nn

from ..checks import as_matrix, non_negative, positive, renamed, same_rows
from ..errors import FeaturelabError
from ..models.convert import as_mlp
from ..models.mlp import MLP, mlp_with_weights
from ..results import Result
from ..training.objectives import data_cost
from .ranks import min_norm_lstsq

RTOL = 1e-10


# ------------------------------------------------------------------------------------ inputs
@overload
def check_inputs(model, X, Y: None = None, homogeneous: bool = False) -> tuple[torch.Tensor, None]: ...
@overload
def check_inputs(model, X, Y, homogeneous: bool = False) -> tuple[torch.Tensor, torch.Tensor]: ...
def check_inputs(model, X, Y=None, homogeneous: bool = False):
    """Validate an `MLP` and its data; return ``(X, Y)`` as float64 on the model's device (Y: int labels kept
    as int64).

    X: ``N x d_in``. Y: ``N x d_out`` floats or ``N`` integer labels (any integer dtype). `homogeneous` demands a
    positively 1-homogeneous activation (the covariance tools of Part 3 §3 and §5 need it).
    """
    if not isinstance(model, MLP):
        raise FeaturelabError(f"model must be a featurelab MLP, got {type(model).__name__}")
    if homogeneous and not model.homogeneous:
        raise FeaturelabError(
            f"activation={model.activation!r} is not allowed here: covariance pairs, merging and "
            "Carathéodory reduction need a positively homogeneous activation (leaky_relu)"
        )
    device = model.weights[0].device  # computations follow the model's device
    X = as_matrix("X", X.detach() if isinstance(X, torch.Tensor) else X).to(device)
    if X.shape[1] != model.dims[0]:
        raise FeaturelabError(f"X has {X.shape[1]} columns but the model expects d_in={model.dims[0]}")
    for l, W in enumerate(model.weights, start=1):
        if not torch.isfinite(W.detach()).all():
            raise FeaturelabError(f"the model's weight W_{l} contains NaN or inf; all entries must be finite")
    if Y is None:
        return X, None
    if isinstance(Y, torch.Tensor) and not (Y.is_floating_point() or Y.is_complex() or Y.dtype == torch.bool):
        Y = Y.detach().to(device).long().reshape(-1)
        if Y.numel() and (Y.min() < 0 or Y.max() >= model.dims[-1]):
            raise FeaturelabError(f"Y has labels outside [0, d_out={model.dims[-1]})")
    else:
        Y = as_matrix("Y", Y.detach() if isinstance(Y, torch.Tensor) else Y).to(device)
        if Y.shape[1] != model.dims[-1]:
            raise FeaturelabError(f"Y has {Y.shape[1]} columns but the model has d_out={model.dims[-1]}")
    same_rows("X", X, "Y", Y)
    return X, Y


def default_objective(Y: torch.Tensor, objective: str | None) -> str:
    """`objective`, or "cross_entropy" for integer labels and "mse" for float targets."""
    if objective is not None:
        return objective
    return "cross_entropy" if Y.dtype == torch.int64 else "mse"


# ----------------------------------------------------------------------------- representations
class Layers(NamedTuple):
    """One float64 forward pass (rows are samples).

    weights: ``[W_1..W_L]`` as stored (bias column included).
    pre:     ``[Z_1..Z_L]``, ``Z_l`` is ``N x n_l``.
    inputs:  ``[A_0..A_{L-1}]``, ``A_{l-1} = [σ(Z_{l-1}), β1]`` is ``N x (n_{l-1}+1)`` (no bias column if β = 0).
    """

    weights: list[torch.Tensor]
    pre: list[torch.Tensor]
    inputs: list[torch.Tensor]


def layers(model: MLP, X: torch.Tensor, weights: list[torch.Tensor] | None = None) -> Layers:
    """Float64 forward pass of `model` (or of the same architecture with `weights`) on X (``N x d_in``)."""
    W = [w.detach().to(dtype=torch.float64, device=X.device) for w in (model.weights if weights is None else weights)]
    a, pre, inputs = X, [], []
    for l, Wl in enumerate(W, start=1):
        A = model.with_bias(a)
        inputs.append(A)
        pre.append(A @ Wl.T)
        if l < len(W):
            a = model.sigma(pre[-1], l)
    return Layers(W, pre, inputs)


def row_basis(A: torch.Tensor, rtol: float = RTOL):
    """Thin SVD ``A = P S Qᵀ`` truncated at ``s_i > rtol·s_1``: returns ``(P_r, s_r, Q_r)``.

    A: ``N x m`` (a layer input ``A_{l-1}``). ``Q_r Q_rᵀ`` projects weight rows onto the row space of A
    (the papers' ``U_rU_rᵀ``); ``P_r diag(s_r^-2) P_rᵀ = (A Aᵀ)⁺ = (K^σ)⁺``.
    """
    P, s, Qh = torch.linalg.svd(A, full_matrices=False)
    keep = s > rtol * s[0] if s.numel() and s[0] > 0 else torch.zeros_like(s, dtype=torch.bool)
    return P[:, keep], s[keep], Qh[keep].T


def sigma_prime(model: MLP, Z: torch.Tensor, layer: int) -> torch.Tensor:
    """σ'(Z) elementwise for hidden layer `layer` (σ'(0) as torch defines it: 0 for ReLU)."""
    z = Z.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(model.sigma(z, layer).sum(), z)
    return g


# --------------------------------------------------------------------------- Prop. 1 reformulation
@dataclass(frozen=True)
class RepresentationLoss(Result):
    """L^rep of Part 3 Prop. 1 evaluated at the representations of a network.

    loss = cost + lam·Σ norms; norms[l-1] = ‖W_l^min‖² = ‖A_{l-1}⁺ Z_l‖²;
    weights: the min-norm weights ``W_l^min`` realizing the same representations (float64, stored layout);
    ranks / conds: rank and s_1/s_r of each layer input ``A_{l-1}`` (conditioning of ``K^σ_{l-1}`` is cond²).
    """

    loss: float
    cost: float
    norms: list[float]
    weights: list[torch.Tensor]
    ranks: list[int]
    conds: list[float]


def representation_loss(
    model: MLP, X, Y, lam: float, *, objective: str | None = None, form: str = "projection", rtol: float = RTOL
) -> RepresentationLoss:
    """L^rep(Z_1..Z_L) = C(Z_L) + λ Σ_l ‖Z_l (Z^σ_{l-1})⁺‖² at ``Z = Z(θ)`` (docs/theory/sparsity.md §2, Prop. 1).

    X: ``N x d_in``; Y: ``N x d_out`` floats or ``N`` int labels (rows are samples). objective: "mse",
    "cross_entropy" or "logistic" (default: cross-entropy for int labels, mse otherwise); C is the mean
    over samples (Part 0). form: "projection" (preferred, from the weights: ``‖W_l Q_r‖²`` with ``Q_r`` the
    row basis of ``A_{l-1}``) or "kernel" (``Tr[K_l (K^σ_{l-1})⁺]`` from the N x N Grams via `lstsq` with
    rcond = rtol). ``L_λ(θ) >= L^rep`` always, with equality at the min-norm weights.
    """
    X, Y = check_inputs(model, X, Y)
    lam = non_negative("lam", lam)
    if form not in ("projection", "kernel"):
        raise FeaturelabError(f"form={form!r} is not allowed; choose one of: projection, kernel")
    lay = layers(model, X)
    norms, weights, ranks, conds = [], [], [], []
    for W, Z, A in zip(lay.weights, lay.pre, lay.inputs):
        P, s, Q = row_basis(A, rtol)
        weights.append(W @ Q @ Q.T)
        ranks.append(int(s.numel()))
        conds.append(float(s[0] / s[-1]) if s.numel() else float("inf"))
        if form == "projection":
            norms.append(float(((W @ Q) ** 2).sum()))
        else:
            K, Ks = Z @ Z.T, A @ A.T
            sol = min_norm_lstsq(Ks, K, rtol)
            norms.append(float(torch.trace(sol)))
    cost = float(data_cost(default_objective(Y, objective), lay.pre[-1], Y))
    return RepresentationLoss(cost + lam * sum(norms), cost, norms, weights, ranks, conds)


def regularized_loss(model: MLP | nn.Sequential, X, Y, lam: float, *, objective: str | None = None) -> float:
    """L_λ(θ) = C(f_θ(X)) + λ‖θ‖² in float64 (Part 3 §1), the loss the trainer minimizes."""
    model = as_mlp(model)
    X, Y = check_inputs(model, X, Y)
    lam = non_negative("lam", lam)
    lay = layers(model, X)
    sq = sum(float((W**2).sum()) for W in lay.weights)
    return float(data_cost(default_objective(Y, objective), lay.pre[-1], Y)) + lam * sq


# ----------------------------------------------------------------------------------- forces
@dataclass(frozen=True)
class LayerForces(Result):
    """Forces on the representation ``Z_l`` (``N x n_l``) of layer `layer` (Part 3 §2, plotted as -λ∇).

    attraction: ``F^att = -λ∇a_l`` with ``a_l = ‖Z_l(Z^σ_{l-1})⁺‖²`` (points toward the origin).
    repulsion:  ``F^rep = -λ∇r_l`` with ``r_l = ‖Z_{l+1}(Z^σ_l)⁺‖²`` (points outward); for the output layer
                l = L, where there is no next layer, it holds the data force ``-∇C(Z_L)`` instead.
    Either way ``∂L^rep/∂Z_l = -(attraction + repulsion)``; balance = ‖F^att + F^rep‖ / ‖F^att‖.
    """

    layer: int
    Z: torch.Tensor
    attraction: torch.Tensor
    repulsion: torch.Tensor
    balance: float


def layer_forces(
    model: MLP | nn.Sequential, X, Y, lam: float, *, objective: str | None = None, rtol: float = RTOL
) -> list[LayerForces]:
    """Attraction and repulsion on every layer's representation, explicit formulas (Part 3 §2 "Forces").

    Rows are samples; in our layout (the papers' formulas transposed)
        ∇a_l = 2 (K^σ_{l-1})⁺ Z_l = 2 P S^-2 Pᵀ Z_l              (A_{l-1} = P S Qᵀ),
        ∇r_l = -2 σ'(Z_l) ⊙ ((K^σ_l)⁺ Z_{l+1} V_{l+1}),          V_{l+1} = W^min_{l+1} without bias column,
    valid where ``Z_{l+1}`` lies in the column space of ``A_l`` (true at ``Z = Z(θ)``) and ranks are locally
    constant. Returns one `LayerForces` per layer l = 1..L (hidden layers first, the output layer last).
    X: ``N x d_in``; Y: ``N x d_out`` or ``N`` labels.
    """
    model = as_mlp(model)
    X, Y = check_inputs(model, X, Y)
    lam = positive("lam", lam)
    lay = layers(model, X)
    bases = [row_basis(A, rtol) for A in lay.inputs]
    L = len(lay.weights)
    out = []
    for l in range(1, L + 1):
        Z = lay.pre[l - 1]
        P, s, _ = bases[l - 1]
        att = -lam * 2 * (P / s**2) @ (P.T @ Z)
        if l < L:
            P2, s2, Q2 = bases[l]
            V = (lay.weights[l] @ Q2 @ Q2.T)[:, : Z.shape[1]]
            rep = -lam * -2 * sigma_prime(model, Z, l) * ((P2 / s2**2) @ (P2.T @ lay.pre[l]) @ V)
        else:
            z = Z.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(data_cost(default_objective(Y, objective), z, Y), z)
            rep = -g
        norm_att = float(att.norm())
        out.append(LayerForces(l, Z, att, rep, float((att + rep).norm()) / norm_att if norm_att > 0 else float("inf")))
    return out


class RadialForces(NamedTuple):
    """The forces of one hidden layer along each neuron's own ray (`radial_forces`); ``n_l`` entries each.

    attraction: ``⟨F^att[:, i], Z[:, i]⟩ = -2λ‖w_i^min‖²`` (<= 0), w_i^min row i of ``W^min_l``.
    repulsion:  ``⟨F^rep[:, i], Z[:, i]⟩ = 2λ‖v_i^min‖²`` (>= 0), v_i^min column i of ``W^min_{l+1}``.
    alive: neurons with ``‖σ(Z[:, i])‖ > 1e-6·max_j ‖σ(Z[:, j])‖`` (as `featurelab.measurements.sparsity.ray_share`).
    """

    attraction: torch.Tensor
    repulsion: torch.Tensor
    alive: torch.Tensor


def radial_forces(F: LayerForces) -> RadialForces:
    """Attraction and repulsion on each neuron of a hidden layer, along its ray ``Z[:, i]`` (Z ``N x n_l``).

    Jacot, Golikov, Hongler, Gabriel 2022 (arXiv 2205.15809, §3.1 on Fig. 1): a neuron is stable when its
    attraction and repulsion cancel. Scaling neuron i, ``Z[:, i] → cZ[:, i]``, keeps every kink, every column
    space and (with ``v_i → v_i/c``) the next layer, for any positively homogeneous σ: the one direction always
    feasible, even where ``K^σ`` is singular and full balance holds only along feasible directions. The
    derivative of L^rep along it is ``-(attraction_i + repulsion_i)``, and at a critical point of L_λ it
    vanishes: ``attraction_i + repulsion_i = 2λ(‖v_i^min‖² - ‖w_i^min‖²) = 0``, the balance of each neuron's
    incoming and outgoing weights. Rows of F are samples; the output layer has no repulsion of this kind."""
    att = (F.attraction * F.Z).sum(0)
    rep = (F.repulsion * F.Z).sum(0)
    act = torch.relu(F.Z).norm(dim=0)
    return RadialForces(att, rep, act > 1e-6 * act.max())


def radial_imbalance(F: LayerForces) -> float:
    """``Σ_i |attraction_i + repulsion_i| / Σ_i |attraction_i|`` over the alive neurons of `radial_forces`: 0 at a
    critical point of L_λ, the neurons' radial forces weighted by their attraction ``2λ‖w_i^min‖²``; NaN with no
    alive neuron."""
    r = radial_forces(F)
    att, rep = r.attraction[r.alive], r.repulsion[r.alive]
    total = float(att.abs().sum())
    return float((att + rep).abs().sum()) / total if total > 0 else float("nan")


def principal_view(F: LayerForces, view: str = "datapoint", k: int = 2, max_points: int = 500):
    """Coordinates and arrows of Figure 1 (Part 3 §2 "Visualization"): uncentered top-k directions.

    With the uncentered SVD ``Z = P Σ Qᵀ`` (Z is ``N x n``, rows samples), the "datapoint" view gives each
    sample's coordinates ``Z[i] @ Q_k`` and arrows ``F[i] @ Q_k`` (``min(N, max_points) x k`` each); the
    "neuron" view gives each neuron's ``Z[:, j] @ P_k`` and arrows ``F[:, j] @ P_k``. Arrows are
    ``(attraction, repulsion)``. Returns ``(points, attraction, repulsion, index)``, index = rows kept.
    """
    if view not in ("datapoint", "neuron"):
        raise FeaturelabError(f"view={view!r} is not allowed; choose one of: datapoint, neuron")
    P, _, Qh = torch.linalg.svd(F.Z, full_matrices=False)
    if view == "datapoint":
        basis, Z, att, rep = Qh[:k].T, F.Z, F.attraction, F.repulsion
    else:
        basis, Z, att, rep = P[:, :k], F.Z.T, F.attraction.T, F.repulsion.T
    idx = torch.arange(Z.shape[0], device=Z.device)[:max_points]
    return Z[idx] @ basis, att[idx] @ basis, rep[idx] @ basis, idx


# ----------------------------------------------------------------------------- covariance pairs
@dataclass(frozen=True)
class CovariancePair(Result):
    """The covariance pair of hidden layer `layer` (Part 3 §3): K = Z Zᵀ and K^σ = σ(Z)σ(Z)ᵀ + β²11ᵀ (N x N)."""

    layer: int
    K: torch.Tensor
    K_sigma: torch.Tensor


def covariance_pairs(model: MLP | nn.Sequential, X) -> list[CovariancePair]:
    """(K_l, K^σ_l) of every hidden layer l = 1..L-1 on X (``N x d_in``), float64 (Part 3 §3 "Grams").

    Needs a positively homogeneous σ (Reformulation 2). ``Tr[K_l (K^σ_{l-1})⁺]`` summed over layers is
    the penalty of L^cov; `representation_loss(form="kernel")` evaluates it.
    """
    model = as_mlp(model)
    X, _ = check_inputs(model, X, homogeneous=True)
    lay = layers(model, X)
    return [
        CovariancePair(l, lay.pre[l - 1] @ lay.pre[l - 1].T, lay.inputs[l] @ lay.inputs[l].T)
        for l in range(1, len(lay.weights))
    ]


# ---------------------------------------------------------------- projected GD on representations
@renamed(eps_rel="rtol")
def tikhonov_loss(
    model: MLP, X, Zs: list[torch.Tensor], Y, lam: float, *, objective: str | None = None, rtol: float = 1e-8
) -> torch.Tensor:
    """L^rep of free representations in the Tikhonov form C(Z_L) + λ Σ Tr[Z_lᵀ (K^σ_{l-1} + εI)^-1 Z_l]
    with ε = rtol·Tr K^σ_{l-1}/N (Part 3 §2 "Stable evaluation"), differentiable in `Zs`.

    Zs: ``[Z_1..Z_L]``, ``Z_l`` is ``N x n_l`` (rows samples; the architecture's σ and β are `model`'s).
    Solves go through a Cholesky factor of ``K^σ + εI``.
    """
    a, total = X, 0.0
    for l, Z in enumerate(Zs, start=1):
        A = model.with_bias(a)
        Ks = A @ A.T
        eps = rtol * torch.trace(Ks).detach() / Ks.shape[0]
        C = torch.linalg.cholesky(Ks + eps * torch.eye(Ks.shape[0], dtype=Ks.dtype, device=Ks.device))
        total = total + (torch.linalg.solve_triangular(C, Z, upper=False) ** 2).sum()
        if l < len(Zs):
            a = model.sigma(Z, l)
    return data_cost(default_objective(Y, objective), Zs[-1], Y) + lam * total


def project_representations(model: MLP, X, Zs: list[torch.Tensor], *, rtol: float = RTOL) -> list[torch.Tensor]:
    """Π of Part 3 §2: for l = 1..L in order, ``Z_l <- A_{l-1} A_{l-1}⁺ Z_l`` (paper: Z_ℓ(Z^σ)⁺Z^σ), where
    ``A_{l-1}`` is built from the already projected ``Z_{l-1}``. Rows are samples; returns new tensors."""
    a, out = X, []
    for l, Z in enumerate(Zs, start=1):
        P, _, _ = row_basis(model.with_bias(a), rtol)
        out.append(P @ (P.T @ Z))
        if l < len(Zs):
            a = model.sigma(out[-1], l)
    return out


def projected_gd_step(
    model: MLP, X, Zs: list[torch.Tensor], Y, lam: float, lr: float, *, objective: str | None = None
) -> list[torch.Tensor]:
    """One step ``Z <- Π(Z - lr ∇L^rep)`` of projected gradient descent on representations (Part 3 §2).

    Experimental: float64, Tikhonov gradient (`tikhonov_loss`), N <= 1000 (each step solves N x N
    systems and becomes unstable as ranks drop). X: ``N x d_in``; Zs: ``[Z_1..Z_L]`` (``N x n_l``).
    Realize the result with `weights_from_representations`.
    """
    X, Y = check_inputs(model, X, Y)
    positive("lr", lr)
    if X.shape[0] > 1000:
        raise FeaturelabError(f"X has {X.shape[0]} rows; projected GD on representations is limited to N <= 1000")
    Zs = [as_matrix(f"Zs[{i}]", Z.detach()).clone().requires_grad_(True) for i, Z in enumerate(Zs)]
    for Z, n in zip(Zs, model.dims[1:]):
        same_rows("X", X, "Z", Z)
        if Z.shape[1] != n:
            raise FeaturelabError(f"a representation has {Z.shape[1]} columns but its layer has width {n}")
    grads = torch.autograd.grad(tikhonov_loss(model, X, Zs, Y, lam, objective=objective), Zs)
    with torch.no_grad():
        return project_representations(model, X, [Z - lr * g for Z, g in zip(Zs, grads)])


def weights_from_representations(
    model: MLP, X, Zs: list[torch.Tensor], *, rtol: float = RTOL
) -> tuple[list[torch.Tensor], list[float]]:
    """θ(Z) = (Z_l (Z^σ_{l-1})⁺)_l, the min-norm weights of Prop. 1, via ``lstsq`` (gelsd, rcond = rtol).

    Zs: ``[Z_1..Z_L]`` (``N x n_l``, rows samples). Returns the weights in `model`'s stored layout and, per
    layer, the row-constraint violation ``‖Z_l - A_{l-1}A_{l-1}⁺Z_l‖ / ‖Z_l‖``.
    """
    X, _ = check_inputs(model, X)
    a, weights, violations = X, [], []
    for l, Z in enumerate(Zs, start=1):
        A = model.with_bias(a)
        Wt = min_norm_lstsq(A, Z, rtol)
        weights.append(Wt.T.contiguous())
        violations.append(float((Z - A @ Wt).norm() / Z.norm().clamp_min(1e-300)))
        if l < len(Zs):
            a = model.sigma(Z, l)
    return weights, violations


def representation_descent(
    model: MLP, X, Y, lam: float, lr: float, steps: int, *, objective: str | None = None
) -> tuple[MLP, list[float]]:
    """Projected gradient descent on the representations as an optimizer (Part 3 §2, experimental).

    Starts from ``Z(θ)`` of `model`, takes `steps` calls of `projected_gd_step`, and realizes the result
    with the min-norm weights θ(Z). X: ``N x d_in``; Y: ``N x d_out`` or ``N`` labels (rows samples).
    Returns the float64 `MLP` and L^rep after each step (``len == steps + 1``, the start included).
    """

    X, Y = check_inputs(model, X, Y)
    Zs = layers(model, X).pre
    history = [representation_loss(model, X, Y, lam, objective=objective).loss]
    for _ in range(steps):
        Zs = projected_gd_step(model, X, Zs, Y, lam, lr, objective=objective)
        net = mlp_with_weights(model, weights_from_representations(model, X, Zs)[0])
        history.append(representation_loss(net, X, Y, lam, objective=objective).loss)
    net = mlp_with_weights(model, weights_from_representations(model, X, Zs)[0])
    return net, history
