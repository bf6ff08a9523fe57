"""Conserved quantities of gradient flow in bias-free homogeneous networks, their exact GD drift, the
noninvariance flow Φ of Lemma 4, and a trainer callback that tracks them (docs/theory/invariances.md §3, §5;
Le & Jegelka, ICLR 2022, Lemmas 2-4 and Theorem 1).

Networks are `HomogeneousNet`s or bias-free leaky-ReLU `MLP`s (`as_homogeneous`). Rows are samples.
Every junction between a layer's output side B_k and the next layer's input side A_{k+1} (Part 5 §1:
W, B(K)/A(K), [V_2, V_3]/[V_1; V_3], A(W) after a conv) carries, with rows/columns indexed by its units,

    C_k = A_{k+1}ᵀ A_{k+1} - B_k B_kᵀ.

* vertex-wise (Lemma 2): diag(C_k) is conserved (per channel for convs) with no activation condition;
* matrix-wise (Theorem 1): C_k[S, S] is conserved for S = units that are linear or active (z > 0) on all
  examples and positions — when all units share in- and out-neighbours (not across the skip of a
  ResNetDiagonal block, whose junctions are vertex-wise only);
* cuts (Lemma 3): ‖cut_1‖² - ‖cut_2‖² for consecutive all-learnable cuts ({W}, {K}, {V_1, V_3},
  {V_2, V_3}, {V_1, d}, {V_2, d}).

Each invariant is Q = P_1 - P_2 with P_1, P_2 quadratic in the parameters, so one full-batch GD step
θ' = θ - ηG changes an in-scope entry by exactly ΔQ = η²(P_1(G) - P_2(G)) (Part 5 §3, GD).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..checks import as_matrix, same_rows
from ..errors import FeaturelabError
from ..models.conv import Conv, unfold_after_conv, unfold_in, unfold_out
from ..models.residual import Dense, Flatten, ResBlock, as_homogeneous, block_in_matrix, block_out_matrix
from ..training.objectives import data_cost

Getter = Callable[[torch.nn.Parameter], torch.Tensor]


def PARAM(p):
    """Getter: the parameter's value."""
    return p


def GRAD(p):
    """Getter: the parameter's gradient (``p.grad``)."""
    return p.grad


@dataclass
class Junction:
    """The units between stage `before` and the next parameter stage (Part 5 §3, Theorem 1).

    key: ``(stage, tag)`` of the units' pre-activations in ``HomogeneousNet.forward(..., True).pre``.
    B, A: getter -> B_k (``units x *``) and A_{k+1} (``* x units``).   leak: slope per unit (1 = linear).
    full: True when all units share in- and out-neighbours (off-diagonal entries can be conserved).
    """

    name: str
    key: tuple
    B: Callable[[Getter], torch.Tensor]
    A: Callable[[Getter], torch.Tensor]
    leak: torch.Tensor
    full: bool

    def C(self, get: Getter = PARAM) -> torch.Tensor:
        """C_k = A_{k+1}ᵀA_{k+1} - B_kB_kᵀ (``units x units``)."""
        A, B = self.A(get), self.B(get)
        return A.T @ A - B @ B.T


@dataclass
class Invariant:
    """Q = P_1 - P_2 (Part 5 §3). kind: "vertex" (vector over units), "matrix" (units x units),
    "cut" (scalar), or "control" (a non-invariant for comparison). P_1, P_2 take a getter."""

    name: str
    kind: str
    reference: str
    P1: Callable[[Getter], torch.Tensor]
    P2: Callable[[Getter], torch.Tensor]
    junction: Junction | None = None

    def value(self, get: Getter = PARAM) -> torch.Tensor:
        """Q(θ) with the default getter; with ``get=GRAD`` the η² coefficient q(G) of a GD step."""
        return self.P1(get) - self.P2(get)

    def scope(self, active: dict) -> torch.Tensor:
        """Boolean mask of the entries conserved at the current activation pattern; `active[key]` is the
        per-unit mask "linear or z > 0 on all examples" (Theorem 1; Part 5 §8: z > 0)."""
        if self.kind != "matrix":
            like = self.P1(PARAM)
            return torch.ones(
                () if self.junction is None else self.junction.leak.shape, dtype=torch.bool, device=like.device
            )
        m = active[self.junction.key]
        return (m[:, None] & m[None, :]) | torch.eye(len(m), dtype=torch.bool, device=m.device)


@dataclass
class InvariantSet:
    """`items`: the invariants that apply; `junctions`; `skipped`: one line per layer or junction not
    covered, saying why."""

    items: list[Invariant]
    junctions: list[Junction]
    skipped: list[str] = field(default_factory=list)


def gram(M: torch.Tensor) -> torch.Tensor:
    """M Mᵀ."""
    return M @ M.T


def _sq(params) -> Callable[[Getter], torch.Tensor]:
    return lambda get: torch.stack([(get(p) ** 2).sum() for p in params]).sum()


def _out_side(i: int, s):
    """(B getter-fn, leak, full?) of stage i's output units, or a reason string."""
    if isinstance(s, Dense):
        return (lambda get: get(s.weight)), s.leak, True
    if isinstance(s, Conv):
        return (lambda get: unfold_out(get(s.weight))), s.leak, True
    if s.kind == "identity":
        return f"stage {i} (ResNetIdentity) output units: each has a fixed skip in-edge, so Lemma 2 does not apply"
    return (
        (lambda get: block_out_matrix(s, get)),
        torch.full((s.c,), s.leak_out, dtype=torch.float64, device=s.V1.device),
        s.kind == "free",
    )


def _in_side(i: int, s, channels: int | None):
    """(A getter-fn, full?) of stage i's input units; `channels` when it reads a flattened conv output."""
    unfold = (lambda M: unfold_after_conv(M, channels)) if channels else (lambda M: M)
    if isinstance(s, Dense):
        return (lambda get: unfold(get(s.weight))), True
    if isinstance(s, Conv):
        return (lambda get: unfold_in(get(s.weight))), True
    if s.kind == "identity":
        return f"stage {i} (ResNetIdentity) input units: each has a fixed skip out-edge, so Lemma 2 does not apply"
    if channels:
        skip = (lambda get: get(s.V3)) if s.kind == "free" else (lambda get: torch.diag(get(s.d)))
        return (lambda get: torch.cat([unfold(get(s.V1)), unfold(skip(get))])), s.kind == "free"
    return (lambda get: block_in_matrix(s, get)), s.kind == "free"


def _cuts(i: int, s) -> list[tuple[str, list]]:
    if isinstance(s, Dense):
        return [(f"W{i}", [s.weight])]
    if isinstance(s, Conv):
        return [(f"K{i}", [s.weight])]
    if isinstance(s, Flatten):
        return []
    if s.kind == "free":
        return [(f"{{V1,V3}}{i}", [s.V1, s.V3]), (f"{{V2,V3}}{i}", [s.V2, s.V3])]
    if s.kind == "diagonal":
        return [(f"{{V1,d}}{i}", [s.V1, s.d]), (f"{{V2,d}}{i}", [s.V2, s.d])]
    return []


def invariants(model) -> InvariantSet:
    """Every conserved quantity of Part 5 §3 that applies to `model` (a `HomogeneousNet` or bias-free
    leaky-ReLU `MLP`), with the layers skipped and why. Stages are numbered from 0.

    Raises a one-line `FeaturelabError` for a model the tools do not cover at all (see `as_homogeneous`).
    """
    net = as_homogeneous(model)
    items, junctions, skipped, cuts = [], [], [], []
    prev, channels = None, None
    for i, s in enumerate(net.stages):
        if isinstance(s, Flatten):
            shape = net.shapes[i]  # a Flatten reads an image (c, H, W)
            channels = shape[0] if isinstance(shape, tuple) else None
            continue
        if prev is not None:
            j, out = prev
            inn = _in_side(i, s, channels)
            if isinstance(out, str) or isinstance(inn, str):
                reasons = [x for x in (out, inn) if isinstance(x, str)]
                skipped.append(f"junction {j}→{i}: " + "; ".join(reasons))
            else:
                junctions.append(Junction(f"{j}→{i}", (j, "out"), out[0], inn[0], out[1], out[2] and inn[1]))
        if isinstance(s, ResBlock):
            junctions.append(
                Junction(
                    f"{i}.hidden",
                    (i, "hidden"),
                    lambda get, s=s: get(s.V1),
                    lambda get, s=s: get(s.V2),
                    torch.full((s.b,), s.leak_in, dtype=torch.float64, device=s.V1.device),
                    True,
                )
            )
            if s.kind == "identity":
                skipped.append(f"stage {i} (ResNetIdentity): no learnable cut (its skip path has no learnable edge)")
        prev, channels = (i, _out_side(i, s)), None
        cuts += _cuts(i, s)
    for jn in junctions:
        items.append(
            Invariant(
                f"vertex {jn.name}",
                "vertex",
                "Lemma 2 (Part 5 §3)",
                lambda get, jn=jn: (jn.A(get) ** 2).sum(0),
                lambda get, jn=jn: (jn.B(get) ** 2).sum(1),
                jn,
            )
        )
        if jn.full:
            items.append(
                Invariant(
                    f"matrix {jn.name}",
                    "matrix",
                    "Theorem 1 (Part 5 §3)",
                    lambda get, jn=jn: gram(jn.A(get).T),
                    lambda get, jn=jn: gram(jn.B(get)),
                    jn,
                )
            )
        else:
            skipped.append(
                f"junction {jn.name}: matrix form skipped (units have different skip neighbours); vertex-wise only"
            )
    for (n1, p1), (n2, p2) in zip(cuts[:-1], cuts[1:]):
        items.append(Invariant(f"cut {n1}-{n2}", "cut", "Lemma 3 (Part 5 §3)", _sq(p1), _sq(p2)))
    if not items:
        raise FeaturelabError("no Part 5 invariant applies to this model: " + "; ".join(skipped))
    return InvariantSet(items, junctions, skipped)


def identity_block_controls(model) -> list[Invariant]:
    """Negative controls (Part 5 §3, Lemma 3; §6a): ‖W_prev‖² - ‖V_1‖² across each ResNetIdentity block,
    where W_prev is the last learnable cut before it; {V_1} is not a cut, so this is NOT conserved."""
    net = as_homogeneous(model)
    out, last = [], None
    for i, s in enumerate(net.stages):
        if isinstance(s, ResBlock) and s.kind == "identity" and last is not None:
            out.append(
                Invariant(
                    f"control {last[0]}-V1[{i}]",
                    "control",
                    "Lemma 3 negative control (Part 5 §3)",
                    _sq(last[1]),
                    _sq([s.V1]),
                )
            )
        c = _cuts(i, s)
        last = c[-1] if c else last
    return out


def active_units(model, X, junctions: list[Junction]) -> tuple[dict, dict]:
    """(active, pattern): per junction key, `active[key]` (units,) = linear or z > 0 on every example and
    position; `pattern[key]` = the boolean z > 0 array (``N x units [x positions]``)."""
    net = as_homogeneous(model)
    with torch.no_grad():
        pre = net(X, return_layers=True).pre
    active, pattern = {}, {}
    for jn in junctions:
        z = pre[jn.key]
        pos = z > 0
        pattern[jn.key] = pos
        active[jn.key] = (jn.leak == 1.0) | pos.transpose(0, 1).reshape(pos.shape[1], -1).all(dim=1)
    return active, pattern


def risk_gradient(model, X, Y, *, objective: str) -> list[torch.Tensor]:
    """∇R for R = data_cost(objective, f(X), Y) (rows = samples), one tensor per parameter."""
    net = as_homogeneous(model)
    params = list(net.parameters())
    return list(torch.autograd.grad(data_cost(objective, net(X), Y), params))


def flow_derivative(model, X, Y, fn: Callable[[Getter], torch.Tensor], *, objective: str) -> torch.Tensor:
    """d/dt fn(θ) under gradient flow θ' = -∇R, by forward-mode autodiff (torch.func.jvp), Part 5 §3;
    fn maps a parameter getter to a tensor (an invariant's value)."""
    net = as_homogeneous(model)
    params = list(net.parameters())
    index = {id(p): k for k, p in enumerate(params)}
    tangents = tuple(-g.detach() for g in risk_gradient(net, X, Y, objective=objective))
    return torch.func.jvp(lambda *ts: fn(lambda p: ts[index[id(p)]]), tuple(p.detach() for p in params), tangents)[1]


def _dense_pair(net, stage: int) -> tuple[Dense, Dense]:
    s = net.stages
    if not (0 <= stage < len(s) - 1 and isinstance(s[stage], Dense) and isinstance(s[stage + 1], Dense)):
        raise FeaturelabError(f"stage={stage!r} is not allowed: Lemma 4 needs Dense stages `stage` and `stage + 1`")
    return s[stage], s[stage + 1]


def gram_difference(model, stage: int, get: Getter = PARAM) -> torch.Tensor:
    """I = W_l W_lᵀ - W_{l+1}ᵀ W_{l+1} (``n_l x n_l``) between Dense stages `stage` and `stage + 1`
    (Lemma 4, Part 5 §3; I = -C)."""
    a, b = _dense_pair(as_homogeneous(model), stage)
    Wl, Wn = get(a.weight), get(b.weight)
    return Wl @ Wl.T - Wn.T @ Wn


def noninvariance_flow(model, X, Y, stage: int, *, objective: str) -> torch.Tensor:
    """Φ = dI/dt under gradient flow for I of `gram_difference` (Lemma 4, Part 5 §3; formula ours):

        Φ_uv = -Σ_i (∂R/∂f_i)(s_{v,i} - s_{u,i})(g_{v,i} z_{u,i} - g_{u,i} z_{v,i}),

    with s = σ'(z) (1 or the unit's leak), g_{v,i} = ∂f(x_i)/∂a_v; ∂R/∂f_i = ℓ'(y_i f_i) y_i / n for the
    margin losses. X: ``N x d``, Y: targets as the trainer takes them. Returns ``n_l x n_l`` float64.
    """
    net = as_homogeneous(model)
    a_stage, _ = _dense_pair(net, stage)
    X = as_matrix("X", X, a_stage.weight.dtype)
    same_rows("X", X, "Y", Y)
    fw = net(X, return_layers=True)
    f = fw.output
    (r,) = torch.autograd.grad(data_cost(objective, f, Y), f, retain_graph=True)
    (g,) = torch.autograd.grad(f.sum(), fw.act[(stage, "out")])
    z = fw.pre[(stage, "out")].detach()
    s = torch.where(z > 0, torch.ones_like(z), a_stage.leak.to(z.dtype).expand_as(z))
    ds = s[:, None, :] - s[:, :, None]  # N x u x v: s_v - s_u
    cross = g[:, None, :] * z[:, :, None] - g[:, :, None] * z[:, None, :]  # g_v z_u - g_u z_v
    return -torch.einsum("i,iuv->uv", r.reshape(-1), ds * cross).double()


class InvariantTracker:
    """Trainer callback recording the drift of every invariant of `model` (Part 5 §3, GD; §5).

    Attach with ``train(..., callbacks=[tracker])`` for full-batch plain GD (``Phase(optimizer="sgd")``,
    no momentum, λ = 0): after each step it checks ΔQ = η²q(G) entrywise on the entries in scope at the
    step's starting point, accumulates Σ_s η²q(G_s), intersects the stably active sets A(0, t), and
    counts parameter sign flips and (unit, example) activation flips. X: ``N x d`` training inputs.

    Results: `summary()` (one row per invariant), `sign_summary()`; with the trainer, each history row
    gets ``drift:<name>`` (rel_drift so far), ``sign_flips``, ``activation_flips`` and ``active:<junction>``.
    rel_drift = ‖Q(t) - Q(0)‖_F / max_{i, s∈{0,t}} ‖P_i(s)‖_F on the stably in-scope entries.
    """

    def __init__(self, model, X, extra: Sequence[Invariant] = ()):
        self.net = as_homogeneous(model)
        found = invariants(self.net)
        self.items = found.items + list(extra)
        self.junctions, self.skipped = found.junctions, found.skipped
        self.params = list(self.net.parameters())
        self.X = as_matrix("X", X, self.params[0].dtype)
        with torch.no_grad():
            self.q0 = [inv.value().detach().clone() for inv in self.items]
            self.p0 = [(inv.P1(PARAM).detach().clone(), inv.P2(PARAM).detach().clone()) for inv in self.items]
        self.prev = [q.clone() for q in self.q0]
        self.cum = [torch.zeros_like(q) for q in self.q0]
        zero = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        self.step_residual = [zero.clone() for _ in self.items]  # device scalars: no host read per step
        self.active, self.pattern = active_units(self.net, self.X, self.junctions)
        self.scopes = [inv.scope(self.active) for inv in self.items]
        self.stable = [m.clone() for m in self.scopes]
        self.stable_units = {k: v.clone() for k, v in self.active.items()}
        self.signs = [p.detach() >= 0 for p in self.params]
        self.last_flip = [torch.zeros(p.shape, dtype=torch.long, device=p.device) for p in self.params]
        self.sign_flips, self.activation_flips = zero.clone().long(), zero.clone().long()
        self.directions: list[tuple[int, torch.Tensor]] = [(0, self._direction())]
        self.step = 0

    def _direction(self) -> torch.Tensor:
        w = torch.cat([p.detach().reshape(-1) for p in self.params]).double()
        return w / w.norm()

    def on_step(self, step, model, optimizer, loss) -> None:
        """Everything stays on the device (masked maxima, counts as tensors): no host read per step."""
        lr = float(optimizer.param_groups[0]["lr"])
        with torch.no_grad():
            for k, inv in enumerate(self.items):
                q_new = inv.value()
                eta2q = lr**2 * inv.value(GRAD)
                scope = self.scopes[k]  # an empty scope gives 0, which leaves the running maximum as it was
                res = torch.where(scope, (q_new - self.prev[k] - eta2q).abs(), 0.0).amax()
                scale = 1.0 + torch.where(scope, q_new.abs(), 0.0).amax()
                self.step_residual[k] = torch.maximum(self.step_residual[k], (res / scale).double())
                self.cum[k] += eta2q
                self.prev[k] = q_new
            self.active, pattern = active_units(self.net, self.X, self.junctions)
            for key, pat in pattern.items():
                self.activation_flips += (pat != self.pattern[key]).sum()
                self.stable_units[key] &= self.active[key]
            self.pattern = pattern
            self.scopes = [inv.scope(self.active) for inv in self.items]
            self.stable = [s & m for s, m in zip(self.stable, self.scopes)]
            for k, p in enumerate(self.params):
                sg = p.detach() >= 0
                flipped = sg != self.signs[k]
                self.sign_flips += flipped.sum()
                self.last_flip[k].masked_fill_(flipped, step)
                self.signs[k] = sg
        self.step = step

    def rel_drift(self, k: int) -> float:
        """rel_drift of invariant k on its stably in-scope entries (Part 5 §3, Measure)."""
        m = self.stable[k]
        inv = self.items[k]
        with torch.no_grad():
            p1, p2 = inv.P1(PARAM), inv.P2(PARAM)
            denom = max(float(t[m].norm()) for t in (p1, p2, *self.p0[k]))
            return float((self.prev[k] - self.q0[k])[m].norm()) / max(denom, 1e-300)

    def cumulative_residual(self, k: int) -> float:
        """‖Q(t) - Q(0) - Σ_s η²q(G_s)‖_F / (1 + max|Q|) on the stably in-scope entries."""
        m = self.stable[k]
        r = (self.prev[k] - self.q0[k] - self.cum[k])[m]
        return float(r.norm()) / (1.0 + float(self.prev[k][m].abs().max())) if r.numel() else 0.0

    def on_log(self, step, model, row: dict) -> None:
        for k, inv in enumerate(self.items):
            row[f"drift:{inv.name}"] = self.rel_drift(k)
        for key, m in self.stable_units.items():
            row[f"active:{key[0]}.{key[1]}"] = int(m.sum())
        row["sign_flips"], row["activation_flips"] = int(self.sign_flips), int(self.activation_flips)
        self.sign_flips.zero_()
        self.activation_flips.zero_()
        if self.directions[-1][0] == step:
            self.directions.pop()
        self.directions.append((step, self._direction()))

    def summary(self) -> pd.DataFrame:
        """One row per invariant: kind, reference, rel_drift, step_residual (max over steps, relative to
        1 + |Q|), cumulative_residual, in_scope (entries stably in scope) and size, at the last step."""
        rows = []
        for k, inv in enumerate(self.items):
            rows.append(
                {
                    "invariant": inv.name,
                    "kind": inv.kind,
                    "reference": inv.reference,
                    "rel_drift": self.rel_drift(k),
                    "step_residual": float(self.step_residual[k]),
                    "cumulative_residual": self.cumulative_residual(k),
                    "in_scope": int(self.stable[k].sum()),
                    "size": self.stable[k].numel(),
                }
            )
        return pd.DataFrame(rows)

    def sign_summary(self) -> dict:
        """Part 5 §5 monitoring: `parameters` (per tensor: entries, step of the last sign flip, entries that
        ever flipped) and `direction` (per log: cos(w̄(t), w̄(T)), share of entries with the final sign,
        ‖w̄(t) - w̄(t')‖ to the previous log), and
        `sqrtP_min_abs` = √P·min_e |w̄_e(T)|."""
        params = pd.DataFrame(
            [
                {
                    "parameter": k,
                    "entries": p.numel(),
                    "last_flip_step": int(self.last_flip[k].max()),
                    "flipped_entries": int((self.last_flip[k] > 0).sum()),
                }
                for k, p in enumerate(self.params)
            ]
        )
        final = self._direction()
        steps = [s for s, _ in self.directions]
        dirs = [d for _, d in self.directions]
        direction = pd.DataFrame(
            {
                "step": steps,
                "cos_to_final": [float(d @ final) for d in dirs],
                "sign_match_final": [float(((d >= 0) == (final >= 0)).double().mean()) for d in dirs],
                "step_change": [0.0] + [float((b - a).norm()) for a, b in zip(dirs[:-1], dirs[1:])],
            }
        )
        return {
            "parameters": params,
            "direction": direction,
            "sqrtP_min_abs": float(np.sqrt(final.numel()) * final.abs().min()),
        }


def drift_slope(etas, drifts) -> float:
    """Least-squares slope of log(drift) against log(η) (Part 5 §3: 1 for O(η) drift at fixed τ = ηT)."""
    x, y = np.log(np.asarray(etas, float)), np.log(np.asarray(drifts, float))
    if len(x) < 2 or not np.all(np.isfinite(y)):
        return float("nan")
    return float(np.polyfit(x, y, 1)[0])
