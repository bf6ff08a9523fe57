"""Critical points of a Leaky ResNet in its weights and its steps jointly (docs/leaky-resnets.md, "The
modified Hamiltonian and joint critical points"; Jacot & Kaiser, arXiv 2405.17573 §2-§3).

The steps live on the simplex ``{ρ_l > 0, Σρ = 1}``, parametrised by ``ρ = softmax([z_1..z_{L−1}, 0])``: every
ρ on the open simplex has exactly one such z, and ``∂𝓛/∂z_j = ρ_j (∂𝓛/∂ρ_j − Σ_l ρ_l ∂𝓛/∂ρ_l)``, so z is
stationary exactly when ``∂𝓛/∂ρ_l`` is equal across l (the simplex's normal). Since ``∂𝓛/∂ρ_l = −λ𝓗_l`` wherever
``W_l = L̃B_lᵀσ(A_{l−1})``, a joint critical point has a constant Hamiltonian ``𝓗_l = 𝓗(A_{l−1}, B_l)``.
The point is found by the machinery of `certify` (continuation, kink set, active-set Newton snap, Clarke
residual) run on the parameters (W, z), or, for a smoothed activation ``softplus_β``, by `minimise` alone.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from torch import nn

from ..checks import positive
from ..data.dataset import Dataset
from ..errors import FeaturelabError
from ..models.leaky_resnet import LeakyResNet
from .certify import Certified, Pieces, _continue_and_snap, _examine
from .critical import _Problem, _ratio, minimise

SMOOTH_ITERATIONS = 400  # Newton steps at most for a smoothed (softplus_β) joint critical point


class JointSteps(nn.Module):
    """`model` with its steps made trainable: ``ρ = softmax([z, 0])`` (z: ``L−1`` logits, a Parameter), the
    forward pass and penalty those of `model` at that ρ (arXiv 2405.17573 §4). `write_steps` copies ρ into
    ``model.rho``."""

    def __init__(self, model: LeakyResNet):
        super().__init__()
        if not isinstance(model, LeakyResNet):
            raise FeaturelabError(f"model must be a featurelab LeakyResNet, got {type(model).__name__}")
        if model.io != "fixed":
            raise FeaturelabError(f"model.io={model.io!r} is not allowed: joint critical points need io='fixed'")
        self.net = model
        rho = model.rho.detach().to(torch.float64)
        self.logits = nn.Parameter(torch.log(rho[:-1] / rho[-1]))

    def steps(self) -> torch.Tensor:
        """ρ, shape (L,), positive, summing to 1."""
        return torch.softmax(torch.cat([self.logits, self.logits.new_zeros(1)]), 0)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.net(X, rho=self.steps())

    def penalty(self, lam: float) -> torch.Tensor:
        return self.net.penalty(lam, rho=self.steps())

    @torch.no_grad()
    def write_steps(self) -> None:
        self.net.rho.copy_(self.steps().to(self.net.rho.dtype))


def joint_smooth_critical_point(
    model: LeakyResNet, data: Dataset, lam: float, beta: float, *, tolerance: float = 1e-12
) -> float:
    """Move `model` (float64, CPU) to a critical point in (W, ρ) of the mse loss with every ReLU replaced by
    ``softplus_β`` (`Pieces`), ρ on the simplex (module docstring), by trust-region Newton-CG. Writes W and ρ
    into `model` and returns the stationarity ``‖∇𝓛‖/‖∇R‖`` over (W, z) it reached."""
    positive("lam", lam)
    positive("beta", beta)
    joint = JointSteps(model)
    problem = _Problem(joint, data, "mse", lam)
    problem.mode = lambda: Pieces(beta=beta)
    theta, _, _ = minimise(problem, problem.theta, tolerance, SMOOTH_ITERATIONS)
    problem.write(theta)
    joint.write_steps()
    _, g, gr, cost = problem.evaluate(theta)
    return _ratio(g, gr, theta, cost, lam)


def certify_joint(
    model: LeakyResNet, data: Dataset, lam: float, *, tolerance: float = 1e-8, max_seconds: float | None = None
) -> Certified:
    """`certify` in (W, ρ) jointly for a ReLU Leaky ResNet and the mse loss: the softplus continuation, the kink
    set, the active-set Newton snap and the certificate, all on the parameters (W, z) of `JointSteps`. `model` is
    left at the snap's end, its steps in ``model.rho``; the returned `Certified`'s `slopes_mode` applies to
    `model` itself (the same activation calls). Its `previous` is the state of `model` at the snap's start."""
    positive("lam", lam)
    positive("tolerance", tolerance)
    t0 = time.perf_counter()
    joint = JointSteps(model)
    problem = _Problem(joint, data, "mse", lam)
    loss_before = problem.evaluate(problem.theta)[0]
    start, end, steps, reduced = _continue_and_snap(problem, tolerance, max_seconds)
    cert = _examine(reduced, end, tolerance, loss_before, steps + end.iterations)[0]
    cert = replace(cert, seconds=time.perf_counter() - t0, previous_clarke=start.delta)
    reduced.write(start.theta)
    joint.write_steps()
    previous = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reduced.write(end.theta)
    joint.write_steps()
    return Certified(cert, end.slopes.detach().clone(), [k.clone() for k in end.masks], previous)
