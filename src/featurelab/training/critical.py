"""Critical points of the regularised loss: a float64 certificate, and the second-order polish that reaches it
(docs/theory/conventions.md, "Critical points").

The loss is the one the engine trains, ``𝓛(θ) = C(θ) + R(θ)`` with ``C = data_cost(objective, f_θ(X), Y)`` and
``R = model.penalty(λ)``, on the full training set. The theorems of the Leaky-ResNet, bottleneck-rank and
sparsity papers (arXiv 2405.17573 §2-§3, 2305.19008, 2205.15809) describe critical points or minima of it, so
a unit's verdicts rest on how close to one its parameters are. That distance is

    stationarity = ‖∇𝓛(θ)‖ / ‖∇R(θ)‖          (λ > 0),

measured in float64 at the stored parameters. It is 0 exactly at a critical point (where ``∇C = −∇R``); it is
scale-free: unchanged when the loss is multiplied by a constant or the parameters are rescaled (θ = cφ); and
it compares the residual force with the smallest force that balances at a critical point, the penalty's
(``‖∇R‖ = ‖∇C‖`` there), so 1e-6 reads "the balance ∇C = −∇R holds to six digits". 1 is what a parameter
vector that ignores the penalty (∇C = 0) scores. Without a penalty (λ = 0) the ratio has no denominator;
then ``stationarity = ‖∇C‖·‖θ‖ / |C|``, again scale-free (for a positively homogeneous net ⟨θ, ∇C⟩ is of
order C, so far from a critical point it is of order 1).

`polish` minimises 𝓛 with a trust-region Newton method whose steps are truncated conjugate gradients on exact
Hessian-vector products (Steihaug-Toint; Nocedal & Wright, Numerical Optimization, Alg. 7.2) in float64,
(docs/theory/conventions.md says why, and what it reaches on featurelab's nets).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import torch
from scipy.optimize import minimize
from torch import nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode

from ..checks import non_negative, positive
from ..data.dataset import Dataset
from ..errors import FeaturelabError
from ..models.leaky_resnet import LeakyResNet
from ..results import Result
from ..runtime import float64_copy
from .objectives import data_cost

METHOD = "trust-region Newton-CG (Steihaug), float64"
# stalled: in 100 iterations neither the best stationarity fell by 10 % nor the loss by 1e-6 of itself
STALL_FACTOR, STALL_ITERATIONS, STALL_LOSS = 0.9, 100, 1e-6
ROUNDING = 1e-10  # below this relative change of the loss its float64 difference is too noisy to judge a step
LBFGS_PAIRS = 50  # curvature pairs `descend` keeps


@dataclass(frozen=True)
class Certificate(Result):
    """How close a model is to a critical point of ``C + model.penalty(λ)`` (module docstring), and what reaching
    it cost.

    stationarity: ``‖∇(C+R)‖/‖∇R‖`` (λ > 0) or ``‖∇C‖·‖θ‖/|C|`` (λ = 0), float64, at the final parameters.
    grad_norm: ``‖∇(C+R)‖``; penalty_grad_norm: ``‖∇R‖``. tolerance; certified: stationarity <= tolerance.
    loss_before, loss_after: ``C + R`` before and after the polish (equal for `stationarity`).
    iterations, hvps, seconds: the optimiser's outer iterations, Hessian-vector products and wall time.
    method: the optimiser ("none" when only measured). clarke: the Clarke residual δ (``featurelab.training.certify``:
    the smallest stationarity over the slopes at the kinks; equal to `stationarity` without kinks); kinks: how many
    activation inputs sit at a kink; gap, jacobian_rank, slopes_at_bounds, min_reduced_eigenvalue, kind ("minimum",
    "saddle" or "undecided"), rule (the certificate's failed rule, "" when certified) and previous_clarke (δ at the
    earlier point of the path that `certify` keeps, the snap's start; where its least-squares slopes leave the box,
    the upper bound at those slopes clamped to it) are filled by `certify`. condition: a Lanczos estimate of the
    Hessian's condition number ``|μ|_max/|μ|_min`` where not certified (None otherwise). detail: for Leaky ResNets
    under "mse",
    the per-layer residual ``‖W_l − L̃B_lᵀσ(A_{l−1})‖/‖W_l‖`` of the critical-point equation (0 at a critical
    point, arXiv 2405.17573 §2.4) as ``residual``, its maximum, the rescaled Hamiltonians ``ĥ_l`` as
    ``h_rescaled`` and their spread ``h_spread = max_l ĥ_l − min_l ĥ_l`` (`geodesic_diagnostics`).
    """

    stationarity: float
    grad_norm: float
    penalty_grad_norm: float
    tolerance: float
    certified: bool
    loss_before: float
    loss_after: float
    iterations: int
    hvps: int
    seconds: float
    method: str
    condition: float | None
    detail: dict
    clarke: float = math.nan
    kinks: int = 0
    gap: float = math.inf
    jacobian_rank: int = 0
    slopes_at_bounds: int = 0
    min_reduced_eigenvalue: float | None = None
    kind: str = "undecided"
    rule: str = ""
    previous_clarke: float = math.nan


class _Loss(nn.Module):
    """``(C, R)`` of `model` on fixed data: the engine's objective, as one module for `functional_call`."""

    def __init__(self, model: nn.Module, objective: str, lam: float):
        super().__init__()
        self.model, self.objective, self.lam = model, objective, lam

    def forward(self, X: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cost = data_cost(self.objective, self.model(X), Y)
        penalty = cast(Callable[[float], torch.Tensor], self.model.penalty)
        pen = penalty(self.lam) if self.lam > 0 else torch.zeros_like(cost)
        return cost, pen


class _Problem:
    """The loss as a function of the flat float64 vector θ of `model`'s trainable parameters (on the CPU)."""

    def __init__(self, model: nn.Module, data: Dataset, objective: str, lam: float):
        if not isinstance(data, Dataset):
            raise FeaturelabError(f"data must be a featurelab Dataset, got {type(data).__name__}")
        non_negative("lam", lam)
        model.cpu().to(torch.float64)
        self.loss = _Loss(model, objective, lam)
        named = [(n, p) for n, p in self.loss.named_parameters() if p.requires_grad]
        if not named:
            raise FeaturelabError(f"model {type(model).__name__} has no trainable parameters to certify")
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.theta = torch.cat([p.detach().reshape(-1) for _, p in named])
        Y = data.Y_train
        self.X = data.X_train.cpu().to(torch.float64)
        self.Y = Y.cpu() if Y.dtype in (torch.int64, torch.int32) else Y.cpu().to(torch.float64)
        self.lam, self.hvps, self.cost = lam, 0, math.nan
        self.mode: Callable[[], AbstractContextManager] = nullcontext  # e.g. smoothed or fixed-slope activations

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: t.view(s) for n, t, s in zip(self.names, theta.split(self.sizes), self.shapes)}

    def parts(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self.mode():
            return functional_call(self.loss, self.unflatten(theta), (self.X, self.Y))

    def evaluate(self, theta: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor, float]:
        """``(C + R, ∇(C + R), ∇R, C)`` at θ."""
        t = theta.detach().requires_grad_()
        cost, pen = self.parts(t)
        (g,) = torch.autograd.grad(cost + pen, t, retain_graph=pen.requires_grad)
        gr = torch.autograd.grad(pen, t)[0] if pen.requires_grad else torch.zeros_like(g)
        return float((cost + pen).detach()), g, gr, float(cost.detach())

    def hessian_at(self, theta: torch.Tensor):
        """``v ↦ ∇²(C + R)(θ) v``: one double-backward graph of ∇(C + R), reused by every product."""
        t = theta.detach().requires_grad_()
        cost, pen = self.parts(t)
        (g,) = torch.autograd.grad(cost + pen, t, create_graph=True)

        def product(v: torch.Tensor) -> torch.Tensor:
            self.hvps += 1
            return torch.autograd.grad(g, t, v, retain_graph=True)[0]

        return product

    def write(self, theta: torch.Tensor) -> None:
        with torch.no_grad():
            for (_, p), t in zip(
                [(n, p) for n, p in self.loss.named_parameters() if p.requires_grad], theta.split(self.sizes)
            ):
                p.copy_(t.view_as(p))


def _denominator(gr: torch.Tensor, theta: torch.Tensor, cost: float, lam: float) -> float:
    """The stationarity's denominator (module docstring): ‖∇R‖ for λ > 0, else |C|/‖θ‖."""
    return float(gr.norm()) if lam > 0 else abs(cost) / max(float(theta.norm()), 1e-300)


def _ratio(g: torch.Tensor, gr: torch.Tensor, theta: torch.Tensor, cost: float, lam: float) -> float:
    """The stationarity of the module docstring from the gradients (inf when the denominator vanishes)."""
    num, den = float(g.norm()), _denominator(gr, theta, cost, lam)
    if num == 0:
        return 0.0
    return num / den if den > 0 else math.inf


def _steihaug(g: torch.Tensor, hess, radius: float, tol: float, max_steps: int) -> tuple[torch.Tensor, float, bool]:
    """Truncated CG for ``min_p g·p + ½pᵀHp`` over ``‖p‖ <= radius`` (Nocedal & Wright Alg. 7.2).

    Returns the step p, its model decrease ``−(g·p + ½pᵀHp)`` and whether it reached the boundary (along
    negative curvature or a CG iterate leaving the region); stops inside once ``‖Hp + g‖ <= tol``."""
    z, Hz, r = torch.zeros_like(g), torch.zeros_like(g), g.clone()
    d, rr = -r, float(r @ r)

    def model(p, Hp):
        return -(float(g @ p) + 0.5 * float(p @ Hp))

    for _ in range(max_steps):
        if math.sqrt(rr) <= tol:
            break
        Hd = hess(d)
        dHd = float(d @ Hd)
        alpha = rr / dHd if dHd > 0 else math.inf
        if dHd <= 0 or float((z + alpha * d).norm()) >= radius:
            # the positive root τ of ‖z + τd‖ = radius
            dd, zd, zz = float(d @ d), float(z @ d), float(z @ z)
            tau = (-zd + math.sqrt(max(zd * zd + dd * (radius**2 - zz), 0.0))) / dd
            p, Hp = z + tau * d, Hz + tau * Hd
            return p, model(p, Hp), True
        z, Hz, r = z + alpha * d, Hz + alpha * Hd, r + alpha * Hd
        rr_new = float(r @ r)
        d, rr = -r + (rr_new / rr) * d, rr_new
    return z, model(z, Hz), False


def hessian_condition(hess, n: int, steps: int = 40, seed: int = 0) -> float:
    """Lanczos estimate of the condition number ``max|μ|/min|μ|`` of a symmetric ``n x n`` operator given by
    its products `hess` (v ↦ Hv): the Ritz values of `steps` Lanczos steps (full reorthogonalisation) from a
    seeded random start. The extreme Ritz values converge first, so this is a lower bound that tightens with
    `steps`; inf when a Ritz value is 0."""
    k = min(steps, n)
    gen = torch.Generator().manual_seed(seed)
    Q = torch.zeros(k, n, dtype=torch.float64)
    q = torch.randn(n, generator=gen, dtype=torch.float64)
    Q[0] = q / q.norm()
    alphas, betas = [], []
    for j in range(k):
        w = hess(Q[j])
        alphas.append(float(Q[j] @ w))
        w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)
        w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)  # twice is enough (Kahan)
        beta = float(w.norm())
        if j + 1 == k or beta <= 1e-14 * max(abs(a) for a in alphas):
            break
        betas.append(beta)
        Q[j + 1] = w / beta
    T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if betas:
        b = torch.tensor(betas, dtype=torch.float64)
        T = T + torch.diag(b, 1) + torch.diag(b, -1)
    mu = torch.linalg.eigvalsh(T).abs()
    return float(mu.max() / mu.min()) if mu.min() > 0 else math.inf


class _ReluInputs(TorchFunctionMode):
    """Records the inputs of every ``torch.relu`` call of a forward pass."""

    def __init__(self):
        super().__init__()
        self.inputs: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.relu:
            self.inputs.append(args[0].detach())
        return func(*args, **(kwargs or {}))


KINK_RTOL = 1e-8  # a ReLU input with |a| <= KINK_RTOL·max|a| (in its layer) is at the kink


def _kink_masks(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [a.abs() <= KINK_RTOL * float(a.abs().max()) if a.numel() else a.bool() for a in inputs]


def relu_kinks(model: nn.Module, X: torch.Tensor) -> int:
    """How many ReLU inputs of `model` on X (``N x d_in``) sit at the kink: ``|a| <= 1e-8·max|a|`` per layer.

    A minimum where some do is a minimum of a non-smooth function: ∇(C + R) jumps across it and need not
    vanish there (docs/theory/conventions.md, "Critical points"). Counts ``torch.relu`` calls (Leaky ResNets,
    ReLU MLPs); 0 for other activations."""
    mode = _ReluInputs()
    with torch.no_grad(), mode:
        model(X)
    return sum(int(m.sum()) for m in _kink_masks(mode.inputs))


class _KinkSlopes(TorchFunctionMode):
    """``torch.relu(a) → a·m`` with ``m = 1[a > 0]`` off the kinks and the given slopes on them (in call order)."""

    def __init__(self, masks: list[torch.Tensor], slopes: torch.Tensor):
        super().__init__()
        self.masks, self.slopes, self.calls, self.used = masks, slopes, 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not torch.relu:
            return func(*args, **(kwargs or {}))
        a, kink = args[0], self.masks[self.calls]
        n = int(kink.sum())
        free = torch.zeros_like(a).masked_scatter(kink, self.slopes[self.used : self.used + n])
        self.calls, self.used = self.calls + 1, self.used + n
        return a * torch.where(kink, free, (a.detach() > 0).to(a.dtype))


def clarke_stationarity(problem: _Problem, theta: torch.Tensor, max_evaluations: int = 150) -> tuple[float, int]:
    """``(min_s ‖∇𝓛_s‖ / ‖∇R‖, number of kinks)``: the stationarity with each kink's ReLU slope s chosen in
    [0, 1] (`relu_kinks`; any slope there is a one-sided limit or a convex combination of the two, Clarke's
    generalised gradient), minimised by L-BFGS-B over the slopes (an upper bound on the minimum; the
    ratio's denominator as in `stationarity`). Equals the stationarity when no input is at a kink."""
    mode = _ReluInputs()
    with torch.no_grad(), mode:
        problem.parts(theta)
    masks = _kink_masks(mode.inputs)
    kinks = sum(int(m.sum()) for m in masks)
    _, g, gr, c = problem.evaluate(theta)
    plain = _ratio(g, gr, theta, c, problem.lam)
    if kinks == 0 or plain == 0:
        return plain, kinks
    scale = _denominator(gr, theta, c, problem.lam) ** -2

    def objective(s_np: np.ndarray) -> tuple[float, np.ndarray]:
        s = torch.from_numpy(s_np).requires_grad_()
        t = theta.detach().requires_grad_()
        with _KinkSlopes(masks, s):
            cost, pen = problem.parts(t)
        (gs,) = torch.autograd.grad(cost + pen, t, create_graph=True)
        q = (gs @ gs) * scale
        (dq,) = torch.autograd.grad(q, s)
        return float(q.detach()), dq.numpy()

    found = minimize(
        objective,
        np.full(kinks, 0.5),
        jac=True,
        method="L-BFGS-B",
        bounds=[(0.0, 1.0)] * kinks,
        options={"maxfun": max_evaluations, "ftol": 1e-30, "gtol": 1e-30},
    )
    return min(plain, math.sqrt(max(float(found.fun), 0.0))), kinks


def _leaky_detail(problem: _Problem, g: torch.Tensor, gr: torch.Tensor) -> dict:
    """Per-layer residual of the critical-point equation and ĥ_l of a Leaky ResNet (arXiv 2405.17573 §2.4,
    §3.3; docs/theory/leaky-resnets.md §3.2-3.3), read off exact derivatives.

    residual_l: ``‖∇_{W_l}(C + R)‖ / ‖∇_{W_l}R‖``, which is ``‖W_l − L̃B_lᵀσ(A_{l−1})‖/‖W_l‖`` since
    ``∇_{W_l}C = −λρ_l B_lᵀσ(A_{l−1})`` and ``∇_{W_l}R = (λρ_l/L̃)W_l`` (``B_l = −(1/λ)∂C/∂A_l``).
    h_rescaled: ``(2/(λL̃)) ∂(C + R)/∂ρ_l`` = ``−(2/L̃)`` × the pre-Hamiltonian of §3.3, which equals
    ``ĥ_l = −2𝓗_l/L̃`` wherever ``W_l = L̃B_lᵀσ(A_{l−1})`` (so at a critical point)."""
    model = problem.loss.model
    assert isinstance(model, LeakyResNet)
    i = problem.names.index("model.W")
    off = sum(problem.sizes[:i])
    shape = (model.depth, -1)
    gW = g[off : off + problem.sizes[i]].reshape(shape).norm(dim=1)
    rW = gr[off : off + problem.sizes[i]].reshape(shape).norm(dim=1)
    residual = (gW / rW).tolist()
    rho = model.rho.detach().clone().requires_grad_()
    with torch.enable_grad():
        loss = data_cost(problem.loss.objective, model(problem.X, rho=rho), problem.Y) + model.penalty(problem.lam, rho)
        (d_rho,) = torch.autograd.grad(loss, rho)
    h = (2 / (problem.lam * model.effective_depth) * d_rho).tolist()
    return {
        "residual": residual,
        "residual_max": max(residual),
        "h_rescaled": h,
        "h_spread": max(h) - min(h),
    }


def _certificate(
    problem: _Problem, theta, tolerance, loss_before, iterations, seconds, method, hess=None
) -> Certificate:
    loss, g, gr, cost = problem.evaluate(theta)
    s = _ratio(g, gr, theta, cost, problem.lam)
    certified = s <= tolerance
    problem.write(theta)
    model = problem.loss.model
    clarke, kinks = clarke_stationarity(problem, theta) if not certified else (s, relu_kinks(model, problem.X))
    detail: dict = {"relu_kinks": kinks, "clarke_stationarity": clarke}
    if isinstance(model, LeakyResNet) and problem.lam > 0:
        detail.update(_leaky_detail(problem, g, gr))
    condition = None
    if not certified:
        condition = hessian_condition(hess or problem.hessian_at(theta), theta.numel())
    return Certificate(
        stationarity=s,
        grad_norm=float(g.norm()),
        penalty_grad_norm=float(gr.norm()),
        tolerance=tolerance,
        certified=certified,
        loss_before=loss_before,
        loss_after=loss,
        iterations=iterations,
        hvps=problem.hvps,
        seconds=seconds,
        method=method,
        condition=condition,
        detail=detail,
        clarke=clarke,
        kinks=kinks,
    )


def stationarity(model: nn.Module, data: Dataset, objective: str, lam: float, tolerance: float = 1e-6) -> Certificate:
    """The `Certificate` of `model` as it is (a float64 copy is measured; `model` is untouched): stationarity
    of ``C + model.penalty(lam)`` on ``data``'s training set (``N x d_in`` rows), no optimisation."""
    positive("tolerance", tolerance)
    t0 = time.perf_counter()
    copy = float64_copy(model)
    for p, q in zip(copy.parameters(), model.parameters()):
        p.requires_grad_(q.requires_grad)
    problem = _Problem(copy, data, objective, lam)
    loss = problem.evaluate(problem.theta)[0]
    cert = _certificate(problem, problem.theta, tolerance, loss, 0, 0.0, "none")
    return replace(cert, seconds=time.perf_counter() - t0)


def polish(
    model: nn.Module,
    data: Dataset,
    objective: str,
    lam: float,
    *,
    tolerance: float = 1e-6,
    max_iterations: int = 3000,
    max_seconds: float | None = None,
) -> Certificate:
    """Minimise ``C + model.penalty(lam)`` on ``data``'s training set (``N x d_in`` rows) from `model`'s
    parameters until the stationarity is <= `tolerance`; `model` is converted to float64 on the CPU and left
    at the final parameters. Returns its `Certificate` (module docstring).

    Trust-region Newton-CG (Nocedal & Wright Alg. 4.1 with 7.2): each step solves the quadratic model on exact
    Hessian-vector products (double backward) by truncated CG to the forcing tolerance
    ``min(0.5, √stationarity)·‖∇𝓛‖`` (superlinear convergence near a non-degenerate minimum), accepted when
    the loss falls by more than 1e-4 of the model's prediction. Stops after `max_iterations` steps, after
    `max_seconds` if given (by default none: a wall-clock stop would make the polished net, and the verdicts
    resting on it, depend on the machine's speed), when the trust region has shrunk below float64
    resolution of θ, or when it has stalled (in 100
    iterations neither the best stationarity fell by 10 % nor the loss by 1e-6 of itself: near a minimiser at
    ReLU kinks, `relu_kinks`)."""
    positive("tolerance", tolerance)
    if max_seconds is not None:
        positive("max_seconds", max_seconds)
    if not isinstance(max_iterations, int) or max_iterations < 0:
        raise FeaturelabError(f"max_iterations={max_iterations!r} is not allowed: it must be an integer >= 0")
    t0 = time.perf_counter()
    problem = _Problem(model, data, objective, lam)
    loss_before = problem.evaluate(problem.theta)[0]
    theta, iterations, hess = minimise(problem, problem.theta, tolerance, max_iterations, max_seconds)
    seconds = time.perf_counter() - t0
    return _certificate(problem, theta, tolerance, loss_before, iterations, seconds, METHOD, hess)


def minimise(
    problem: _Problem, theta: torch.Tensor, tolerance: float, max_iterations: int, max_seconds: float | None = None
):
    """`polish`'s trust-region Newton-CG on `problem` (whatever activations its `mode` gives) from θ: stops at
    stationarity <= `tolerance`, after `max_iterations` steps or `max_seconds`, when the trust region is below
    float64 resolution, or on a stall. Returns ``(θ, iterations, the last Hessian product or None)``."""
    t0 = time.perf_counter()
    loss, g, gr, cost = problem.evaluate(theta)
    radius = 1e-3 * max(float(theta.norm()), 1.0)
    hess, iterations, best, window, loss_ref = None, 0, math.inf, 0, loss
    while iterations < max_iterations and (max_seconds is None or time.perf_counter() - t0 < max_seconds):
        s = _ratio(g, gr, theta, cost, problem.lam)
        if s < STALL_FACTOR * best:
            best, window, loss_ref = s, 0, loss
        elif window == STALL_ITERATIONS:  # a window without progress in stationarity: did the loss move?
            if loss_ref - loss < STALL_LOSS * abs(loss):
                break
            window, loss_ref = 0, loss
        if s <= tolerance or radius < 1e-15 * float(theta.norm()):
            break
        window += 1
        iterations += 1
        hess = problem.hessian_at(theta)
        step, predicted, on_boundary = _steihaug(
            g, hess, radius, min(0.5, math.sqrt(s)) * float(g.norm()), min(theta.numel(), 2000)
        )
        new = problem.evaluate(theta + step)
        actual = loss - new[0]
        if predicted < ROUNDING * abs(loss):  # the loss difference is rounding noise: integrate the gradient
            actual = -0.5 * float((g + new[1]) @ step)  # exact for a quadratic, O(‖p‖³) otherwise
        ratio = actual / predicted if predicted > 0 else -1.0
        if ratio < 0.25:
            radius = 0.25 * float(step.norm())
        elif ratio > 0.75 and on_boundary:
            radius *= 2
        if ratio > 1e-4:
            theta = theta + step
            loss, g, gr, cost = new
            hess = None
    return theta, iterations, hess


def descend(
    problem: _Problem, theta: torch.Tensor, tolerance: float, max_iterations: int, max_seconds: float | None = None
) -> tuple[torch.Tensor, int]:
    """Limited-memory BFGS on `problem` (whatever activations its `mode` gives) from θ, in float64: scipy's L-BFGS-B
    without bounds (Byrd, Lu, Nocedal & Zhu 1995, SIAM J. Sci. Comput. 16(5); `LBFGS_PAIRS` curvature pairs),
    stopping at the first iterate whose stationarity is <= `tolerance`, after `max_iterations` iterations or
    `max_seconds`, or when its line search can no longer lower the loss in float64 (scipy's own tolerances are
    off). On a smoothed ReLU net whose Hessian spreads over many orders it keeps descending where the trust-region
    Newton-CG of `minimise` stalls, and `minimise` then finishes from its point. Returns ``(θ, iterations)``."""
    t0 = time.perf_counter()
    last: list[tuple[np.ndarray, float]] = []  # the last point evaluated and its stationarity

    def loss_and_gradient(x: np.ndarray) -> tuple[float, np.ndarray]:
        t = torch.from_numpy(x.copy())
        loss, g, gr, cost = problem.evaluate(t)
        last[:] = [(x.copy(), _ratio(g, gr, t, cost, problem.lam))]
        return loss, g.numpy()

    def stop(intermediate_result) -> None:
        if last and np.array_equal(intermediate_result.x, last[0][0]) and last[0][1] <= tolerance:
            raise StopIteration
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
            raise StopIteration

    loss, g, gr, cost = problem.evaluate(theta)
    if max_iterations <= 0 or _ratio(g, gr, theta, cost, problem.lam) <= tolerance:
        return theta, 0
    found = minimize(
        loss_and_gradient,
        theta.detach().numpy().copy(),
        jac=True,
        method="L-BFGS-B",
        callback=stop,
        options={"maxiter": max_iterations, "maxfun": 4 * max_iterations, "maxcor": LBFGS_PAIRS, "ftol": 0, "gtol": 0},
    )
    return torch.from_numpy(found.x.copy()), int(found.nit)
