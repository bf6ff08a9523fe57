"""The training engine: one loop that trains M >= 1 same-shape runs as one computation (`train` is the
case M = 1, `train_ensemble` the general one), with `train`'s semantics for every member.

The members' trainable parameters are stacked along a leading member axis (``M x ...``). Models that
implement `Stackable` (`MLP`, `LeakyResNet`, `HomogeneousNet`) run one forward pass on the stacked tensors (batched
matmuls: M runs cost about M times the FLOPs in one set of kernel launches); other models are vmapped
(``torch.func.functional_call`` + ``torch.func.vmap``); a single run calls the model itself. Each
member's own module keeps views into the stacks, so it always shows its current values (for
`evaluate`, callbacks, ``adapt_steps`` and saving).

Adam and SGD (with momentum, or plain with the relative trust region ``max_step``) are applied to the
stacked tensors with torch.optim's update formulas, per-member learning rates and per-member step
counts (a member restarted by the loss guard gets a fresh optimizer). L-BFGS (a line search per run)
runs one run at a time, with torch's own optimizer: an ensemble that reaches an L-BFGS phase hands each
member over, in memory, to a one-member run of the remaining phases (so the Adam phases before a float64
polish are still batched). Metrics are gathered only at log steps: the
step loop makes no host-device synchronisation unless an ``on_step`` callback or L-BFGS asks for one.
On CUDA, phases that allow it run as a captured CUDA graph (`featurelab.training.capture`).
docs/theory/conventions.md (training conventions); docs/scale.md.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar, Protocol, cast, runtime_checkable

import pandas as pd
import torch
from torch import nn
from torch.func import functional_call, vmap
from tqdm.auto import tqdm

from ..data.dataset import Dataset
from ..errors import FeaturelabError
from ..io import digest, write_text
from ..runtime import resolve_device
from . import capture
from .checkpoint import load_checkpoint, save_checkpoint, save_model
from .objectives import data_cost, error_rate
from .phases import Phase, TrainConfig, TrainResult

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults
LBFGS_LINE_SEARCH = 25  # function evaluations one L-BFGS line search may spend (torch's max_ls default)
LBFGS_TOLERANCE = 1e-15  # stop when g·d or a loss change falls below it (torch's 1e-9 stops float64 early)


# ----------------------------------------------------------------------- what a model offers
@runtime_checkable
class Trainable(Protocol):
    """What the engine needs from a model: ``forward(X)`` (``N x d_in`` -> ``N x d_out``) and its own
    regulariser ``penalty(lam)`` (a 0-d tensor; the loss is ``C + penalty``)."""

    def forward(self, X: torch.Tensor) -> torch.Tensor: ...

    def penalty(self, lam) -> torch.Tensor: ...


@runtime_checkable
class LayerSpectra(Protocol):
    """Models whose per-layer matrices' top singular values are logged (``sv{l}_{i}`` columns)."""

    def layer_matrices(self) -> list[torch.Tensor]: ...


@runtime_checkable
class AdaptiveSteps(Protocol):
    """Models with adaptive layer steps (Leaky ResNets, Part 1 §2.3), updated every ``Phase.adapt_every``."""

    rho_history: list

    def adapt_steps(self, X: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Deep(Protocol):
    """Models with a depth L (the inverse-norm schedule's default power is L - 2)."""

    depth: int


@runtime_checkable
class Stackable(Protocol):
    """Models whose ``forward`` and ``penalty`` accept every parameter and buffer with a leading member
    axis ``M`` (inputs ``N x d`` shared, or ``M x N x d``; outputs ``M x N x d_out``; penalties ``(M,)``,
    with λ a float or an ``(M,)`` tensor). `member_floats`: the float attributes that may differ between
    members; they are passed as ``(M,)`` tensors."""

    member_floats: ClassVar[tuple[str, ...]]


# ------------------------------------------------------------------------------------ helpers
def param_norm(model: nn.Module) -> torch.Tensor:
    """‖θ‖ over trainable parameters."""
    return torch.sqrt(torch.stack([(p.detach() ** 2).sum() for p in model.parameters() if p.requires_grad]).sum())


def trust_region(lr, max_step: float, theta_norm: torch.Tensor, grad_norm: torch.Tensor):
    """Phase.max_step: the step's lr cut to ``max_step·‖θ‖/‖g‖`` where ``lr·‖g‖`` would exceed
    ``max_step·‖θ‖``. Works per member on ``(M,)`` norms. Returns ``(lr, cut)``, `cut` a bool tensor
    (inf/NaN caps never cut)."""
    cap = max_step * theta_norm / grad_norm
    cut = cap < lr
    return torch.where(cut, cap, lr), cut


@lru_cache(maxsize=16)
def _epoch_permutation(n: int, seed: int, epoch: int, device: torch.device) -> torch.Tensor:
    """The sample order of one epoch, drawn on the CPU from (seed, epoch) and moved to `device` once."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).to(device)


def _batches(
    n: int, batch_size: int | None, seed: int, step: int, device, drop_last: bool = True
) -> torch.Tensor | None:
    """Indices of the mini-batch of global `step` (epoch permutations are seeded by (seed, epoch));
    ``drop_last=False`` keeps each epoch's last, smaller batch (as torch's DataLoader does). Slicing the
    cached device permutation makes no host-device copy per step."""
    if batch_size is None or batch_size >= n:
        return None
    per_epoch = n // batch_size if drop_last else -(-n // batch_size)
    epoch, pos = divmod(step, per_epoch)
    return _epoch_permutation(n, seed, epoch, torch.device(device))[pos * batch_size : (pos + 1) * batch_size]


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, config: TrainConfig) -> dict[str, float]:
    """One history row's metrics: loss = cost + penalty, errors, ‖θ‖, top singular values per layer."""
    out = model(data.X_train)
    cost = data_cost(config.objective, out, data.Y_train)
    pen = cast(Trainable, model).penalty(config.lam) if config.lam > 0 else torch.zeros((), dtype=cost.dtype)
    row = {
        "loss": float(cost + pen),
        "cost": float(cost),
        "penalty": float(pen),
        "train_error": float(error_rate(config.objective, out, data.Y_train)),
        "param_norm": float(param_norm(model)),
    }
    if len(data.X_test):
        out_t = model(data.X_test)
        row["test_cost"] = float(data_cost(config.objective, out_t, data.Y_test))
        row["test_error"] = float(error_rate(config.objective, out_t, data.Y_test))
    k = config.top_singular_values
    if k and isinstance(model, LayerSpectra) and math.isfinite(row["loss"]):
        for l, M in enumerate(model.layer_matrices(), start=1):
            s = torch.linalg.svdvals(M.detach().double())
            for i in range(min(k, s.numel())):
                row[f"sv{l}_{i + 1}"] = float(s[i])
    return row


def float_attrs(model: nn.Module) -> dict[str, float]:
    """Every plain float attribute of `model` and its submodules, by dotted name."""
    out = {}
    for prefix, mod in model.named_modules():
        for k, v in vars(mod).items():
            if isinstance(v, float) and not k.startswith("_"):
                out[f"{prefix}.{k}" if prefix else k] = v
    return out


def _set_path(root: nn.Module, name: str, value) -> None:
    """Set the plain attribute `name` (dotted) of `root` to `value` (a float or a tensor)."""
    mod, _, attr = name.rpartition(".")
    (root.get_submodule(mod) if mod else root).__dict__[attr] = value


def _get_path(root: nn.Module, name: str):
    mod, _, attr = name.rpartition(".")
    return (root.get_submodule(mod) if mod else root).__dict__[attr]


def _per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-member (M,) tensor in `like`'s dtype, shaped to broadcast against the stacked `like`."""
    return values.to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))


def _member_norm(tensors) -> torch.Tensor:
    """(M,) float64: each member's ‖·‖ over the stacked ``M x ...`` `tensors` (`param_norm` per member)."""
    return torch.linalg.vector_norm(torch.cat([t.detach().flatten(1) for t in tensors], 1), dim=1).double()


def _same_data(a: Dataset, b: Dataset) -> bool:
    return a is b or all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("X_train", "Y_train", "X_test", "Y_test"))


class _Objective(nn.Module):
    """``(cost, penalty)`` of the members, for `functional_call` (stacked, or one member under `vmap`)."""

    def __init__(self, model: nn.Module, objective: str, float_names: list[str]):
        super().__init__()
        self.model, self.objective, self.float_names = model, objective, float_names

    def forward(self, X, Y, lam, floats):
        saved = {k: _get_path(self.model, k) for k in self.float_names}
        try:
            for k, v in zip(self.float_names, floats):
                _set_path(self.model, k, v)
            cost = data_cost(self.objective, self.model(X), Y)
            pen = cast(Trainable, self.model).penalty(lam) if lam is not None else torch.zeros_like(cost)
            return cost, pen
        finally:
            for k, v in saved.items():
                _set_path(self.model, k, v)


class _Stack:
    """The members' trainable parameters as ``M x ...`` tensors (`params`, updated in place) and the
    leaves autograd differentiates (`leaves`). One member: the leaves are the model's own parameters and
    `params` are ``1 x ...`` views of them. Several: the leaves are the stacks, each member's module
    holds views into them (and into the stacked buffers)."""

    def __init__(self, models: Sequence[nn.Module]):
        self.models = models
        self.build()

    def build(self) -> None:
        """(Re)stack from the members' current tensors (after a dtype change, say) and bind the views."""
        first = self.models[0]
        names = [k for k, p in first.named_parameters() if p.requires_grad]
        if len(self.models) == 1:
            self.leaves = {k: first.get_parameter(k) for k in names}
            self.params = {k: p.detach().unsqueeze(0) for k, p in self.leaves.items()}
            self.buffers = {}
            return
        with torch.no_grad():
            self.leaves = {
                k: torch.stack([m.get_parameter(k).detach() for m in self.models]).requires_grad_(True) for k in names
            }
            self.params = {k: t.detach() for k, t in self.leaves.items()}
            frozen = [k for k, p in first.named_parameters() if not p.requires_grad]
            self.buffers = {k: torch.stack([m.get_parameter(k).detach() for m in self.models]) for k in frozen}
            self.buffers.update(
                {k: torch.stack([m.get_buffer(k) for m in self.models]) for k, _ in first.named_buffers()}
            )
        for i, m in enumerate(self.models):
            for k, t in self.params.items():
                m.get_parameter(k).data = t[i]
            for k, t in self.buffers.items():
                mod, _, attr = k.rpartition(".")
                owner = m.get_submodule(mod) if mod else m
                if attr in owner._parameters:
                    owner._parameters[attr].data = t[i]
                else:
                    owner._buffers[attr] = t[i]

    def grads(self) -> dict[str, torch.Tensor]:
        """``M x ...`` gradients (zeros for a parameter the loss does not reach)."""
        grads = {k: p.grad if p.grad is not None else torch.zeros_like(p) for k, p in self.leaves.items()}
        return {k: g.unsqueeze(0) for k, g in grads.items()} if len(self.models) == 1 else grads

    def zero_grad(self) -> None:
        for p in self.leaves.values():
            p.grad = None

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.params.values())).dtype


def _update(phase: Phase, stack: _Stack, state: dict, lr: torch.Tensor) -> None:
    """One optimizer step on the stacked parameters with torch.optim's formulas, per-member lr, and
    per-member step counts ``state["count"]`` (0: the member's optimizer starts afresh, as after the guard;
    ``state["fresh"]`` says whether any may). Every state tensor is updated in place (a captured CUDA
    graph replays on the same memory)."""
    count = state["count"].add_(1)
    fresh = (count == 1) if state.get("fresh", True) else None
    state["fresh"] = False
    if phase.optimizer == "adam":  # torch.optim.adam._single_tensor_adam, bias corrections per member
        b1, b2 = ADAM_BETAS
        c = count.double()
        step_size, bc2_sqrt = (lr / (1 - b1**c)).to(stack.dtype), ((1 - b2**c) ** 0.5).to(stack.dtype)
    for (name, p), g in zip(stack.params.items(), stack.grads().values()):
        st = state.setdefault(name, {})
        shape = (-1, *([1] * (p.dim() - 1)))
        mask = fresh.reshape(shape) if fresh is not None else None
        if phase.optimizer == "adam":
            m_, v_ = (st.setdefault(k, torch.zeros_like(p)) for k in ("exp_avg", "exp_avg_sq"))
            if mask is not None:
                m_.masked_fill_(mask, 0.0)
                v_.masked_fill_(mask, 0.0)
            m_.lerp_(g, 1 - b1)
            v_.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v_.sqrt() / bc2_sqrt.reshape(shape)).add_(ADAM_EPS)
            p.addcdiv_(step_size.reshape(shape) * m_, denom, value=-1)
        else:  # torch.optim.sgd._single_tensor_sgd (no dampening, no nesterov)
            if phase.momentum:
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = g.clone()
                else:
                    buf = st["momentum_buffer"].mul_(phase.momentum).add_(g)
                    if mask is not None:
                        buf.copy_(torch.where(mask, g, buf))
                g = st["momentum_buffer"]
            p.add_(-_per_member(lr, p) * g)


def _torch_optimizer(phase: Phase, model: nn.Module, state: dict, i: int):
    """Member i's optimizer state as the torch optimizer of its phase would hold it (for its checkpoint)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if phase.optimizer == "adam":
        opt = torch.optim.Adam(params, lr=phase.lr)
    else:
        opt = torch.optim.SGD(params, lr=phase.lr, momentum=phase.momentum)
    count = int(state["count"][i])
    if count == 0:
        return opt
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    for name, p in zip(names, params):
        st = state.get(name, {})
        if phase.optimizer == "adam":
            opt.state[p] = {
                "step": torch.tensor(float(count)),
                "exp_avg": st["exp_avg"][i].clone(),
                "exp_avg_sq": st["exp_avg_sq"][i].clone(),
            }
        elif "momentum_buffer" in st:
            opt.state[p] = {"momentum_buffer": st["momentum_buffer"][i].clone()}
    return opt


def _restore_state(phase: Phase, stack: _Stack, state: dict, i: int, tensors: dict) -> None:
    """Member i's optimizer state from its checkpoint's tensors (the inverse of `_torch_optimizer`)."""
    for j, (name, p) in enumerate(stack.params.items()):
        st = state.setdefault(name, {})
        keys = ("exp_avg", "exp_avg_sq") if phase.optimizer == "adam" else ("momentum_buffer",)
        for key in keys:
            saved = tensors.get(f"optim.{j}.{key}")
            if saved is not None:
                st.setdefault(key, torch.zeros_like(p))[i] = saved.to(p)
        step = tensors.get(f"optim.{j}.step")
        if step is not None or f"optim.{j}.momentum_buffer" in tensors:
            state["count"][i] = int(step) if step is not None else 1


# --------------------------------------------------------------------------------------- run
def run(
    models: Sequence[nn.Module],
    datas: list[Dataset],
    cfgs: list[TrainConfig],
    *,
    device: str = "cpu",
    dirs: list[Path | None],
    resume: bool = False,
    callbacks: list[tuple] | None = None,
    progress: bool | None = None,
    lr_rule=None,
    handover: list[dict] | None = None,
) -> list[TrainResult | FeaturelabError]:
    """Train ``M = len(models)`` runs of equal shapes and phases (checked by the callers) as one
    computation; returns per member its `TrainResult` or the `FeaturelabError` of a diverged loss.

    cfgs may differ in ``lam``, ``seed`` and each phase's ``lr``/``lr_min``; datas in values (same
    shapes); models in tensor values and float attributes. dirs: per member, a folder for its run record
    (``history.csv``, ``model.safetensors``, ``checkpoint.safetensors``) or None. resume: continue each
    member's checkpoint (all at the same step). callbacks: per member, objects with ``on_log(step, model,
    row)`` and, for a single run only, ``on_step(step, model, optimizer, loss)``. lr_rule (single run):
    ``f(step_in_phase, phase, model) -> lr`` overriding the schedule. handover: per member, the state an
    ensemble passes on at an L-BFGS phase (`_hand_over`): the models hold the weights, and this run continues
    from the step, history, lr scale and trust-region count in it, as from a checkpoint.

    On the CPU this switches on `torch.set_flush_denormal` for the process (torch has no way to read the
    setting back): weight decay drives unused float32 weights and activations below 1.2e-38, where
    denormal arithmetic is about 100x slower on x86; flushed, they become 0. A deep net trained to its
    bottleneck ran 6.8x faster (docs/scale.md).
    """
    M = len(models)
    cbs = [tuple(c) for c in (callbacks if callbacks is not None else [()] * M)]
    dev = resolve_device(device)
    if dev.type == "cpu":
        torch.set_flush_denormal(True)
    t0 = time.perf_counter()
    cfg0 = cfgs[0]
    rows: list[list[dict]] = [[] for _ in range(M)]
    lr_scale = torch.ones(M, dtype=torch.float64, device=dev)
    capped = torch.zeros(M, dtype=torch.int64, device=dev)  # steps cut by the trust region, per member
    ckpts = [load_checkpoint(d) if (resume and d is not None) else None for d in dirs]
    if handover is not None:  # (no tensors: the models hold the weights)
        ckpts = [(None, info) for info in handover]
    for m in models:
        m.to(dev)
    for i, (m, ck, d) in enumerate(zip(models, ckpts, dirs)):
        if ck is None:
            continue
        tensors, info = ck
        if tensors is not None:  # a checkpoint, read from the run folder d
            if info.get("config") != digest(cfgs[i].model_dump(mode="json")):
                raise FeaturelabError(
                    f"'{Path(cast(Path, d)) / 'checkpoint.safetensors'}' was written by a training run with "
                    "another config; delete it to train this one afresh"
                )
            if info.get("dtype") and next(m.parameters()).dtype != getattr(torch, info["dtype"]):
                m.to(getattr(torch, info["dtype"]))  # a float64 buffer (LeakyResNet's rho) keeps its dtype otherwise
            m.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        rows[i] = info["history"]
        lr_scale[i], capped[i] = info.get("lr_scale", 1.0), info.get("capped_steps", 0)
        if isinstance(m, AdaptiveSteps):
            m.rho_history = info.get("rho_history", [])
    resumed_from = [ck[1].get("resumed_from", ck[1]["step"]) if ck else 0 for ck in ckpts]
    starts = {(ck[1]["step"], ck[1]["done"]) if ck else (0, False) for ck in ckpts}
    if len(starts) > 1:
        raise FeaturelabError(f"resume: the members' checkpoints are at different steps {sorted(starts)}")
    start_step, done = starts.pop()
    stack = _Stack(models)
    attrs = [float_attrs(m) for m in models]
    float_names = [k for k, v in attrs[0].items() if any(a[k] != v for a in attrs[1:])]  # e.g. L̃
    float_values = [torch.tensor([a[k] for a in attrs], dtype=torch.float64, device=dev) for k in float_names]
    native = isinstance(models[0], Stackable) and all(k in type(models[0]).member_floats for k in float_names)
    objective = _Objective(models[0], cfg0.objective, float_names)
    lams = torch.tensor([c.lam for c in cfgs], dtype=torch.float64, device=dev)
    use_penalty = any(c.lam > 0 for c in cfgs)
    shared_data = all(_same_data(d, datas[0]) for d in datas[1:])
    shared_batches = shared_data and all(c.seed == cfg0.seed for c in cfgs)
    errors: list[FeaturelabError | None] = [None] * M
    has_on_step = M == 1 and any(hasattr(cb, "on_step") for cb in cbs[0])
    log_capped = any(p.max_step is not None for p in cfg0.phases)

    def data_on(dtype):
        ds = [d.to(dtype=dtype, device=dev) for d in (datas[:1] if shared_data else datas)]
        X = ds[0].X_train if shared_data else torch.stack([d.X_train for d in ds])
        Y = ds[0].Y_train if shared_data else torch.stack([d.Y_train for d in ds])
        return (ds * M if shared_data else ds), X, Y

    def losses(X, Y, idx):
        """Per-member (cost, penalty), each (M,). idx: mini-batch indices, (B,) shared or (M, B), or None."""
        if idx is not None and shared_data:  # (B,) -> B x d, or (M, B) -> M x B x d
            X, Y = X[idx], Y[idx]
        elif idx is not None:
            rows_ = torch.arange(M, device=dev)[:, None]
            X, Y = X[rows_, idx], Y[rows_, idx]
        if M == 1:
            m = models[0]
            cost = data_cost(cfg0.objective, m(X), Y)
            pen = cast(Trainable, m).penalty(cfg0.lam) if use_penalty else torch.zeros_like(cost)
            return cost[None], pen[None]
        per_member_data = (idx is not None and idx.dim() == 2) or not shared_data
        state = {f"model.{k}": v for k, v in {**stack.leaves, **stack.buffers}.items()}
        fl = [v.to(stack.dtype) for v in float_values]
        lam = lams.to(stack.dtype) if use_penalty else None
        if native:
            return functional_call(objective, state, (X, Y, lam, fl))

        def one(st, X, Y, lam, fl):
            return functional_call(objective, st, (X, Y, lam, fl))

        data_dim = 0 if per_member_data else None
        in_dims = (0, data_dim, data_dim, 0 if lam is not None else None, [0] * len(fl))
        return vmap(one, in_dims=in_dims)(state, X, Y, lam, fl)

    def log(step, phase_idx, lr, ds):
        now = time.perf_counter() - t0
        for i, m in enumerate(models):
            if errors[i] is not None:
                continue
            row = {"step": step, "phase": phase_idx, "lr": float(lr[i]) if lr is not None else float("nan")}
            row.update(evaluate(m, ds[i], cfgs[i]))
            if log_capped:
                row["capped_steps"] = int(capped[i])
            row["seconds"] = now
            for cb in cbs[i]:
                if hasattr(cb, "on_log"):
                    cb.on_log(step, m, row)
            rows[i].append(row)
            if not math.isfinite(row["loss"]):
                errors[i] = FeaturelabError(
                    f"training diverged at step {step} (loss {row['loss']}); lower the learning rate "
                    f"(phase {phase_idx}: lr={cfgs[i].phases[phase_idx].lr}) or set guard_window"
                )

    def member_state(i, step, finished):
        """Member i's run state at `step`, as its checkpoint records it and a hand-over passes it on."""
        m = models[i]
        return {
            "step": step,
            "done": finished,
            "history": rows[i],
            "lr_scale": float(lr_scale[i]),
            "capped_steps": int(capped[i]),
            "dtype": str(stack.dtype).replace("torch.", ""),
            "rho_history": m.rho_history if isinstance(m, AdaptiveSteps) else [],
            "config": digest(cfgs[i].model_dump(mode="json")),
        }

    def checkpoint(step, finished, phase, opt_state, lbfgs=None):
        for i, (m, d) in enumerate(zip(models, dirs)):
            if d is None or errors[i] is not None:
                continue
            opt = lbfgs
            if phase is not None and lbfgs is None:
                opt = _torch_optimizer(phase, m, opt_state, i)
            save_checkpoint(d, m, opt, member_state(i, step, finished))

    def schedule(phase, k, lr0, lr_min):
        """Per-member lr of step k of `phase`, before the guard's scaling."""
        if lr_rule is not None:
            return torch.as_tensor(lr_rule(k, phase, models[0]), dtype=torch.float64, device=dev).reshape(1)
        if phase.schedule == "constant":
            return lr0
        if phase.schedule == "cosine":
            cos = torch.cos if isinstance(k, torch.Tensor) else math.cos  # a device tensor k in a captured step
            return lr_min + (lr0 - lr_min) * 0.5 * (1 + cos(math.pi * k / max(phase.steps, 1)))
        power = phase.norm_power
        if power is None:
            power = models[0].depth - 2 if isinstance(models[0], Deep) else 0
        return torch.clamp(lr0 / _member_norm(stack.params.values()) ** power, min=lr_min)

    def member_rates(phase_idx):
        phases = [c.phases[phase_idx] for c in cfgs]
        return (
            torch.tensor([p.lr for p in phases], dtype=torch.float64, device=dev),
            torch.tensor([p.lr_min for p in phases], dtype=torch.float64, device=dev),
        )

    def batch_indices(phase, step, n):
        if phase.batch_size is None or phase.batch_size >= n:
            return None
        if shared_batches:  # one for all: (B,)
            return _batches(n, phase.batch_size, cfg0.seed, step, dev, phase.drop_last)
        # batch_size < n here, so no member's indices are None
        return torch.stack(
            [cast(torch.Tensor, _batches(n, phase.batch_size, c.seed, step, dev, phase.drop_last)) for c in cfgs]
        )

    total = sum(p.steps for p in cfg0.phases)
    ds, X, Y = data_on(stack.dtype)
    if not done:
        if start_step == 0:
            log(0, 0, schedule(cfg0.phases[0], 0, *member_rates(0)).cpu() if cfg0.phases else None, ds)
        bar = tqdm(
            total=total,
            initial=start_step,
            disable=not (sys.stderr.isatty() if progress is None else progress),
            leave=False,
            desc=type(models[0]).__name__ if M == 1 else f"ensemble of {M}",
        )
        offset = 0
        for phase_idx, phase in enumerate(cfg0.phases):
            if start_step >= offset + phase.steps or all(e is not None for e in errors):
                offset += phase.steps
                continue
            if phase.optimizer == "lbfgs" and M > 1:  # a line search per member: one by one from here
                bar.close()
                elapsed = time.perf_counter() - t0
                states = [
                    {**member_state(i, offset, False), "seconds": elapsed, "resumed_from": resumed_from[i]}
                    for i in range(M)
                ]
                return _hand_over(
                    models, datas, cfgs, errors, states, device=device, dirs=dirs, callbacks=cbs, progress=progress
                )
            if phase.dtype is not None and stack.dtype != getattr(torch, phase.dtype):
                for m in models:
                    m.to(getattr(torch, phase.dtype))
                stack.build()
                ds, X, Y = data_on(stack.dtype)
            lr0, lr_min = member_rates(phase_idx)
            opt_state: dict = {"count": torch.zeros(M, dtype=torch.int64, device=dev)}  # steps since (re)start
            lbfgs = None
            if phase.optimizer == "lbfgs":
                lbfgs = _lbfgs(phase, stack)
            k0 = start_step - offset
            if k0 > 0 and lbfgs is None:
                for i, ck in enumerate(ckpts):
                    if ck is not None and ck[0] is not None and ck[1].get("optimizer") and ck[1]["step"] == start_step:
                        _restore_state(phase, stack, opt_state, i, ck[0])
            snapshot = None  # the guard's (loss (M,), parameters) at the start of its window

            def step_(k, idx):
                """Forward, backward, trust region and update; returns (lr (M,), loss (M,))."""
                lr = schedule(phase, k, lr0, lr_min) * lr_scale
                stack.zero_grad()
                loss = torch.add(*losses(X, Y, idx))
                loss.sum().backward()
                with torch.no_grad():
                    if phase.max_step is not None:  # trust region ‖Δθ_i‖ <= max_step·‖θ_i‖, per member
                        theta, grad = _member_norm(stack.params.values()), _member_norm(stack.grads().values())
                        lr, cut = trust_region(lr, phase.max_step, theta, grad)
                        capped.add_(cut.long())
                    _update(phase, stack, opt_state, lr)
                return lr, loss

            reason = capture.eager_reason(dev, phase, on_step=has_on_step, lr_rule=lr_rule is not None)
            if dev.type == "cuda" and reason is not None:
                capture.announce(reason)
            graphs: dict = {}  # mini-batch shape (None: full batch) -> [graph or None, static indices, warm-up steps]
            static: dict[str, torch.Tensor | None] | None = None
            if reason is None:  # the step's changing inputs, refilled in place before each replay
                k_dev = torch.full((), float(k0), dtype=torch.float64, device=dev)
                static = {"k": k_dev, "lr": lr0.clone(), "idx": None}

                def body():
                    lr, _ = step_(static["k"], static["idx"])
                    with torch.no_grad():
                        static["lr"].copy_(lr)
                        static["k"].add_(1)

            for k in range(k0, phase.steps):
                step = offset + k
                idx = batch_indices(phase, step, X.shape[-2])
                entry = None
                if static is not None:  # one graph per batch shape (an epoch's last batch may be smaller)
                    key = None if idx is None else tuple(idx.shape)
                    entry = graphs.setdefault(key, [None, None if idx is None else idx.clone(), 0])
                    if idx is not None:
                        entry[1].copy_(idx)
                    static["idx"] = idx = entry[1]
                if phase.guard_window and snapshot is None:
                    with torch.no_grad():
                        snapshot = (torch.add(*losses(X, Y, idx)), {n: p.clone() for n, p in stack.params.items()})
                if entry is not None and entry[0] is None and entry[2] >= capture.WARMUP_STEPS:
                    opt_state["fresh"] = True  # record the per-member restart masks: the guard may need them later
                    try:
                        entry[0] = capture.capture(body)
                    except RuntimeError as exc:  # the phase goes on eagerly
                        capture.announce(f"a failed capture ({str(exc).splitlines()[0] if str(exc) else exc!r})")
                        static = entry = None
                if entry is not None and static is not None:
                    if entry[0] is not None:
                        entry[0].replay()
                    else:
                        capture.warmup(body)
                        entry[2] += 1
                    lr, loss = static["lr"], None
                else:
                    if lbfgs is not None:
                        lr = schedule(phase, k, lr0, lr_min) * lr_scale
                        for g in lbfgs.param_groups:
                            g["lr"] = float(lr[0])
                        loss = lbfgs.step(lambda: _lbfgs_closure(stack, losses, X, Y, idx))
                    else:
                        lr, loss = step_(k, idx)
                if phase.guard_window and (k + 1) % phase.guard_window == 0:  # per member (Part 1 §5.2)
                    with torch.no_grad():
                        cur = torch.add(*losses(X, Y, idx))
                        bad = ~(cur <= snapshot[0])  # the loss rose over the window (or is NaN)
                        for n, p in stack.params.items():
                            mask = bad.reshape(-1, *([1] * (p.dim() - 1)))
                            p.copy_(torch.where(mask, snapshot[1][n], p))
                            snapshot[1][n] = p.clone()
                        lr_scale.copy_(torch.where(bad, lr_scale * 0.5, lr_scale))  # in place: a graph reads it
                        opt_state["count"].masked_fill_(bad, 0)  # a fresh optimizer for them
                        opt_state["fresh"] = True
                        snapshot = (torch.where(bad, snapshot[0], cur), snapshot[1])
                    if lbfgs is not None and bool(bad[0]):
                        lbfgs = _lbfgs(phase, stack)
                for cb in cbs[0] if M == 1 else ():
                    if hasattr(cb, "on_step"):
                        opt_view = lbfgs or SimpleNamespace(param_groups=[{"lr": float(lr[0])}])
                        cb.on_step(step + 1, models[0], opt_view, loss.reshape(()))
                if (
                    phase.adapt_every
                    and isinstance(models[0], AdaptiveSteps)
                    and (k + 1) % phase.adapt_every == 0
                    and k + 1 < phase.adapt_stop * phase.steps
                ):
                    for i, m in enumerate(models):
                        cast(AdaptiveSteps, m).adapt_steps(ds[i].X_train)
                bar.update(1)
                if (step + 1) % cfg0.log_every == 0 or step + 1 == total:
                    log(step + 1, phase_idx, lr.cpu(), ds)  # the only host-device synchronisation
                    if all(e is not None for e in errors):
                        break
                if cfg0.checkpoint_every and (step + 1) % cfg0.checkpoint_every == 0:
                    checkpoint(step + 1, False, phase, opt_state, lbfgs)
            offset += phase.steps
            start_step = offset
        bar.close()
        checkpoint(total, True, None, None)
    seconds = time.perf_counter() - t0 + (handover[0]["seconds"] if handover else 0.0)
    out: list[TrainResult | FeaturelabError] = []
    for i, m in enumerate(models):
        err = errors[i]
        if err is not None:
            out.append(err)
            continue
        history = pd.DataFrame(rows[i])
        if dirs[i] is not None:
            write_text(dirs[i] / "history.csv", history.to_csv(index=False))
            save_model(m, dirs[i] / "model.safetensors")
        out.append(TrainResult(m, history, seconds, resumed_from[i]))
    return out


def _hand_over(models, datas, cfgs, errors, states, *, device, dirs, callbacks, progress) -> list:
    """An ensemble at an L-BFGS phase: each member that has not failed goes on alone (`run` with M = 1)
    from its in-memory state `states[i]` through the remaining phases; a failed member keeps its error."""
    return [
        err
        if err is not None
        else run([m], [d], [c], device=device, dirs=[folder], callbacks=[cb], progress=progress, handover=[st])[0]
        for m, d, c, err, st, folder, cb in zip(models, datas, cfgs, errors, states, dirs, callbacks)
    ]


def _lbfgs_closure(stack: _Stack, losses, X, Y, idx) -> torch.Tensor:
    stack.zero_grad()
    loss = sum(losses(X, Y, idx)).sum()
    loss.backward()
    return loss


def _lbfgs(phase: Phase, stack: _Stack) -> torch.optim.LBFGS:
    """One L-BFGS iteration per training step, with a strong-Wolfe line search of up to 25 evaluations.

    ``max_eval`` must be given: torch's default, ``max_iter * 5 // 4``, is 1 here, which leaves the line search
    no evaluation beyond its first trial, so a step whose unit trial fails Armijo is never taken and L-BFGS
    stalls for good."""
    return torch.optim.LBFGS(
        list(stack.leaves.values()),
        lr=phase.lr,
        max_iter=1,
        max_eval=LBFGS_LINE_SEARCH + 1,
        tolerance_grad=0.0,
        tolerance_change=LBFGS_TOLERANCE,
        history_size=50,
        line_search_fn="strong_wolfe",
    )
