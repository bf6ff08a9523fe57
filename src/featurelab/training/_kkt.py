"""The KKT algebra of the snap without a dense constraint Jacobian (docs/theory/conventions.md, "Exact critical
points").

The snap of `featurelab.training.certify` needs four operations with ``J_0 = ∂a_K/∂θ`` (K x P, slope 0 at every
kink): the min-norm multipliers ``ν = argmin ‖g_0 + J_0ᵀν‖``, the restoration ``−J_0⁺a_K``, and the projector P on
null(J_0) for the tangent step's conjugate gradients and the reduced Hessian's Lanczos. Held densely, J_0 costs
8·K·P bytes (the `leaky-bottleneck` quick net, P = 26 240, reaches 1 GiB at K ≈ 5 100) and its SVD O(P·K²) flops.
Here J_0 is an operator instead:

- ``J_0ᵀμ`` is one vector-Jacobian product of θ ↦ a_K(θ) on a forward graph kept for the whole point;
- ``J_0v`` is the derivative in u of ``⟨J_0ᵀu, v⟩``, a second backward pass through the graph of ``J_0ᵀu`` (linear
  in u, so exact). On a small Leaky ResNet this took 1 ms against 37 ms for ``torch.func.jvp``, which rebuilds the
  forward pass each time.

Every solve is LSQR (Paige & Saunders 1982, ACM TOMS 8(1), Alg. LSQR) through `scipy.sparse.linalg.lsqr` on a
`LinearOperator` of J_0 with its rows scaled to unit norm (norms estimated by random probes), from 0, in float64,
with a bounded iteration count: from 0 it converges to the min-norm least-squares solution, which is what the dense
path's truncated SVD gives (``−V S⁻¹Uᵀ`` applied to the right-hand side) wherever that solution is unique or the
system consistent (`Projector` says where the scaling matters). The projector is the least-squares residual
``Pv = v − J_0ᵀ argmin_μ ‖J_0ᵀμ − v‖``. Every step is deterministic: the same input gives the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import lsq_linear
from scipy.sparse.linalg import LinearOperator, lsqr

LSQR_TOLERANCE = 1e-14  # atol = btol of every LSQR solve (relative residuals, Paige & Saunders §6)
LSQR_ITERATIONS = 5000  # at most this many LSQR steps per solve
RANK_RECOVERY = 1e-6  # J_0 has full row rank when the min-norm solve recovers a random μ from J_0ᵀμ to this
PROBES = 32  # random products that estimate J_0's row norms (the preconditioner)
BOX_ITERATIONS = 200  # at most this many trust-region reflective steps of the bounded slope solve
AT_BOUND = 1e-9  # a bounded slope this close to a bound is held there by the refinement


class Linearised:
    """θ ↦ a_K(θ) at θ with slope 0 at every kink (``mode``: a `Pieces` with zero slopes), as products.

    ``g0`` (P,) and ``gr`` (P,): the gradients of C + R and of R; ``a_K`` (K,): the kinked inputs; ``cost``: C.
    ``J(v)``: ``J_0v`` (K,) for v (P,); ``Jt(mu)``: ``J_0ᵀμ`` (P,) for μ (K,). Entries of a_K that do not depend on
    θ (a fixed input map's outputs) have zero rows."""

    def __init__(self, problem, theta: torch.Tensor, masks: list[torch.Tensor], mode) -> None:
        saved = problem.mode
        problem.mode = lambda: mode
        try:
            self._t = theta.detach().requires_grad_()
            cost, pen = problem.parts(self._t)
        finally:
            problem.mode = saved
        self.K = sum(int(m.sum()) for m in masks)
        self.P = theta.numel()
        self.g0 = torch.autograd.grad(cost + pen, self._t, retain_graph=True)[0]
        self.gr = torch.autograd.grad(pen, self._t, retain_graph=True)[0] if pen.requires_grad else 0 * self.g0
        self.cost = float(cost.detach())
        a_K = torch.cat([z[m] for z, m in zip(mode.inputs, masks)]) if self.K else theta.new_zeros(0)
        self.a_K = a_K.detach()
        self._a = a_K if a_K.requires_grad else None
        self._u = theta.new_zeros(self.K, requires_grad=True)
        self._Jtu: torch.Tensor | None = None  # J_0ᵀu as a function of u, built at the first `J`
        self.products = 0

    def Jt(self, mu: torch.Tensor) -> torch.Tensor:
        """``J_0ᵀμ`` (P,) for μ (K,)."""
        self.products += 1
        if self._a is None:
            return self._t.new_zeros(self.P)
        return torch.autograd.grad(self._a, self._t, mu, retain_graph=True)[0].detach()

    def J(self, v: torch.Tensor) -> torch.Tensor:
        """``J_0v`` (K,) for v (P,)."""
        self.products += 1
        if self._a is None:
            return self._t.new_zeros(self.K)
        if self._Jtu is None:
            self._Jtu = torch.autograd.grad(self._a, self._t, self._u, create_graph=True)[0]
        (out,) = torch.autograd.grad(self._Jtu, self._u, v, retain_graph=True, allow_unused=True)
        return out.detach() if out is not None else self._t.new_zeros(self.K)

    def dense(self) -> torch.Tensor:
        """J_0 (K x P) itself, by batched vector-Jacobian products of 256 one-hot cotangents."""
        J = self._t.new_zeros(self.K, self.P)
        if self._a is None:
            return J
        for start in range(0, self.K, 256):
            n = min(256, self.K - start)
            rows = self._t.new_zeros(n, self.K)
            rows[torch.arange(n), torch.arange(start, start + n)] = 1.0  # one-hot cotangents of a_K
            J[start : start + n] = torch.autograd.grad(
                self._a, self._t, rows, retain_graph=True, is_grads_batched=True
            )[0]
        return J


def _tensor(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64).reshape(-1))


@dataclass
class Solve:
    """One LSQR solve: the solution (torch), its iterations, whether it stopped on its tolerance (not the cap) and
    LSQR's estimate of the operator's condition number."""

    x: torch.Tensor
    iterations: int
    converged: bool
    condition: float


def least_squares(op: LinearOperator, rhs: torch.Tensor) -> Solve:
    """The min-norm ``argmin_x ‖op·x − rhs‖`` by LSQR from 0 (`LSQR_TOLERANCE`, at most `LSQR_ITERATIONS` steps)."""
    if not op.shape[1] or not bool(rhs.any()):
        return Solve(rhs.new_zeros(op.shape[1]), 0, True, 1.0)
    out = lsqr(op, rhs.numpy(), atol=LSQR_TOLERANCE, btol=LSQR_TOLERANCE, conlim=1e300, iter_lim=LSQR_ITERATIONS)
    x, stop, iterations, acond = out[0], out[1], out[2], out[6]
    return Solve(_tensor(x).clone(), int(iterations), stop in (0, 1, 2, 4, 5), float(acond))


def row_norms(lin: Linearised, probes: int = PROBES) -> torch.Tensor:
    """The norms of J_0's rows (K,), estimated as ``√(mean_i (J_0z_i)²)`` over `probes` seeded standard normal z_i
    (E[(J_0z)_k²] = ‖row k‖²; 32 probes: about 13 % relative error, enough for a preconditioner); 1 for zero rows."""
    gen = torch.Generator().manual_seed(0)
    total = lin.g0.new_zeros(lin.K)
    for _ in range(probes):
        total += lin.J(torch.randn(lin.P, generator=gen, dtype=torch.float64)) ** 2
    norms = (total / probes).sqrt()
    return torch.where(norms > 0, norms, 1.0)


class Projector:
    """The operations of the snap that the dense path takes from J_0's SVD, on `Linearised` products:
    ``project(v)`` (v's component in null(J_0), P,), ``restoration()`` (``−J_0⁺a_K``, P,), the multipliers
    ``solve_multipliers()`` (``ν``, K, and the residual ``r = g_0 + J_0ᵀν``) and ``rank``.

    The solves run on the rows scaled to unit norm, ``D⁻¹J_0`` with D = `row_norms` (Jacobi preconditioning: on the
    demo net's 466 kinks it takes J_0's condition from 163 to 40). That changes nothing where the solution is unique
    (ν and the restoration at full rank; r and the projector always); where J_0 is rank-deficient ν is the one of
    least ‖Dν‖ and the restoration the least-norm minimiser of ‖D⁻¹(J_0d + a_K)‖. ``condition`` is the largest
    condition estimate LSQR reported (on the Krylov spaces it met); ``iterations`` counts LSQR steps over all solves
    and ``unconverged`` the solves that stopped at the iteration cap."""

    def __init__(self, lin: Linearised) -> None:
        self.lin = lin
        self.scale = row_norms(lin) if lin.K else lin.g0.new_zeros(0)
        self.op = LinearOperator(  # J_0ᵀD⁻¹ (P x K)
            (lin.P, lin.K),
            matvec=lambda x: lin.Jt(_tensor(x) / self.scale).numpy(),
            rmatvec=lambda y: (lin.J(_tensor(y)) / self.scale).numpy(),
            dtype=np.float64,
        )
        self.iterations, self.condition, self.unconverged = 0, 1.0, 0
        self._rank: int | None = None

    def _solve(self, op: LinearOperator, rhs: torch.Tensor) -> torch.Tensor:
        found = least_squares(op, rhs)
        self.iterations += found.iterations
        self.condition = max(self.condition, found.condition)
        self.unconverged += 0 if found.converged else 1
        return found.x

    @property
    def rank(self) -> int:
        """K when J_0 has full row rank, else -1 (deficient; a factorisation would be needed to count it): full when
        a seeded random y (K,) is recovered from ``J_0ᵀD⁻¹y`` by the min-norm solve to `RANK_RECOVERY` (a component of
        y in null(J_0ᵀD⁻¹) is lost by it). Computed once."""
        if self._rank is None:
            K = self.lin.K
            full = K <= self.lin.P
            if full and K:
                y = torch.randn(K, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
                back = self._solve(self.op, self.lin.Jt(y / self.scale))
                full = float((back - y).norm()) <= RANK_RECOVERY * float(y.norm())
            self._rank = K if full else -1
        return self._rank

    def project(self, v: torch.Tensor) -> torch.Tensor:
        """``Pv = v − J_0ᵀμ`` with μ a minimiser of ``‖J_0ᵀμ − v‖``: v's component in null(J_0) (P,)."""
        if not self.lin.K:
            return v
        return v - self.lin.Jt(self._solve(self.op, v) / self.scale)

    def preimage(self, b: torch.Tensor) -> torch.Tensor:
        """``J_0⁺b`` (P,): the min-norm step that moves the linearised a_K by b (K,)."""
        if not self.lin.K:
            return self.lin.g0.new_zeros(self.lin.P)
        return self._solve(self.op.adjoint(), b / self.scale)

    def restoration(self) -> torch.Tensor:
        """``−J_0⁺a_K`` (P,): the min-norm step that brings the linearised a_K to 0."""
        return -self.preimage(self.lin.a_K)

    def solve_multipliers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ν, r)``: ``ν = argmin ‖g_0 + J_0ᵀν‖`` (K,) and ``r = g_0 + J_0ᵀν`` (P,)."""
        if not self.lin.K:
            return self.lin.g0.new_zeros(0), self.lin.g0
        nu = -self._solve(self.op, self.lin.g0) / self.scale
        return nu, self.lin.g0 + self.lin.Jt(nu)

    def box_slopes(self, c: torch.Tensor, low: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """``argmin ‖g_0 + J_0ᵀ(c ⊙ s)‖`` over ``s ∈ [low, 1]^K`` (K,) for output cotangents c (K,), the bounded
        problem the dense path hands to BVLS, on products: scipy's trust-region reflective `lsq_linear` (LSMR inner
        solves; it picks its own interior start, so `start`, part of the common signature, is not used), then its
        end refined by LSQR on the coordinates off their bounds with those within `AT_BOUND` of a bound held there
        (an interior method only approaches an active bound); the refined point is kept when it stays in the box
        and lowers the residual."""
        lin, ones = self.lin, torch.ones_like(low)
        op = _sloped(lin, c, torch.ones(lin.K, dtype=torch.bool))
        found = lsq_linear(
            op, -lin.g0.numpy(), bounds=(low.numpy(), ones.numpy()), method="trf", tol=1e-15, max_iter=BOX_ITERATIONS
        )
        s = _tensor(found.x).clamp(low, ones)
        s = torch.where(s - low <= AT_BOUND, low, torch.where(ones - s <= AT_BOUND, ones, s))
        free = (s > low) & (s < ones)
        residual = lin.g0 + lin.Jt(c * s)
        if not bool(free.any()):
            return s
        step = least_squares(_sloped(lin, c, free), -residual).x
        refined = s.clone()
        refined[free] += step
        inside = bool(((refined >= low) & (refined <= ones)).all())
        if inside and float((lin.g0 + lin.Jt(c * refined)).norm()) < float(residual.norm()):
            return refined
        return s


def _sloped(lin: Linearised, c: torch.Tensor, free: torch.Tensor) -> LinearOperator:
    """``x ↦ J_0ᵀ(c ⊙ x)`` on the coordinates `free` (P x |free|), the others 0."""
    index = free.nonzero().squeeze(1)

    def matvec(x: np.ndarray) -> np.ndarray:
        full = c.new_zeros(lin.K)
        full[index] = _tensor(x)
        return lin.Jt(c * full).numpy()

    def rmatvec(y: np.ndarray) -> np.ndarray:
        return (c * lin.J(_tensor(y)))[index].numpy()

    return LinearOperator((lin.P, int(index.numel())), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)


def dense_bytes(K: int, P: int) -> float:
    """The bytes of a dense float64 J_0 (K x P)."""
    return 8.0 * K * P
