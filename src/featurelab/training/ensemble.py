"""Batched ensembles: train M same-shape models as one computation, with `train`'s semantics.

The members' parameters are stacked into ``M x ...`` leaves and one vmapped loss
(``torch.func.functional_call`` + ``torch.func.vmap``) gives every member its own cost, penalty and
gradient in a few batched kernels. Members may differ in anything that is a tensor (initial weights,
so seed and init scale; buffers such as the Leaky-ResNet steps ρ; the data, if same-shaped) and in
λ, learning rates, ``lr_min``, the mini-batch seed, and float attributes of the model that enter the
forward pass arithmetically (the Leaky-ResNet effective depth L̃). Everything else (shapes, the
phase list, optimizers, schedules, logging) must be equal; `ensemble_key` says when two runs can
share an ensemble.

Adam and SGD (with momentum, or plain with `train`'s relative trust region ``max_step``) are applied
to the stacked tensors with torch's own update formulas, so each member follows exactly the run
`train` would give it: in float64 the two agree to rounding (the batched matmuls sum in another
order), see docs/scale.md for the measured agreement. L-BFGS (a line search per member) is not
batched: `ensemble_key` returns None for such runs.

Every member gets `train`'s run record in its own folder (``history.csv``, ``model.safetensors``
and a ``checkpoint.safetensors`` in `train`'s format, optimizer state included), so a member can be
resumed one-by-one by `train(..., resume=True)`. Metrics are gathered only at logging steps (one
host-device synchronisation per log step for the whole ensemble); the step loop has none.
docs/theory/conventions.md (training conventions).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pandas as pd
import torch
from torch import nn
from torch.func import functional_call, vmap
from tqdm.auto import tqdm

from ..data.dataset import Dataset
from ..errors import FeaturelabError
from ..io import digest, write_text
from ..runtime import resolve_device
from .checkpoint import save_checkpoint, save_model
from .objectives import data_cost
from .trainer import TrainConfig, TrainResult, _batches, evaluate, trust_region

PER_MEMBER_PHASE_FIELDS = ("lr", "lr_min")
ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults, which `train` uses


# ------------------------------------------------------------------------------ grouping
def _float_attrs(model: nn.Module) -> dict[str, float]:
    """Every plain float attribute of `model` and its submodules, by dotted name."""
    out = {}
    for prefix, mod in model.named_modules():
        for k, v in vars(mod).items():
            if isinstance(v, float) and not k.startswith("_"):
                out[f"{prefix}.{k}" if prefix else k] = v
    return out


def _static_attrs(model: nn.Module) -> tuple:
    """The non-float, non-tensor plain attributes of `model` (they must be equal across an ensemble)."""
    items = []
    for prefix, mod in model.named_modules():
        for k, v in sorted(vars(mod).items()):
            if k.startswith("_") or k == "training" or isinstance(v, (float, torch.Tensor, nn.Module)):
                continue
            items.append((prefix, k, repr(v)))
    return tuple(items)


def _shapes(tensors) -> tuple:
    return tuple((k, tuple(v.shape), str(v.dtype), bool(getattr(v, "requires_grad", False))) for k, v in tensors)


def ensemble_key(model: nn.Module, data: Dataset, config: TrainConfig) -> tuple | None:
    """A hashable key; runs with equal keys can be trained as one ensemble. None: not batchable
    (an L-BFGS phase). Differences allowed inside a key: tensor values, float model attributes,
    ``lam``, ``seed`` and each phase's ``lr``/``lr_min``."""
    config = TrainConfig.model_validate(config)
    if any(p.optimizer == "lbfgs" for p in config.phases):
        return None
    phases = tuple(
        tuple(sorted((k, repr(v)) for k, v in p.model_dump().items() if k not in PER_MEMBER_PHASE_FIELDS))
        for p in config.phases
    )
    cfg = tuple(sorted((k, repr(v)) for k, v in config.model_dump().items() if k not in ("lam", "seed", "phases")))
    data_shapes = tuple(
        (k, tuple(v.shape), str(v.dtype))
        for k, v in (
            ("X_train", data.X_train),
            ("Y_train", data.Y_train),
            ("X_test", data.X_test),
            ("Y_test", data.Y_test),
        )
    )
    return (
        type(model).__qualname__,
        _shapes(model.named_parameters()),
        _shapes(model.named_buffers()),
        _static_attrs(model),
        tuple(sorted(_float_attrs(model))),
        data_shapes,
        data.n_classes,
        cfg,
        phases,
    )


# ------------------------------------------------------------------------------- helpers
def _as_list(value, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise FeaturelabError(f"{name} has {len(value)} entries; give one per model ({n}) or a single one")
        return list(value)
    return [value] * n


def _set_path(root: nn.Module, name: str, value) -> None:
    """Set the plain attribute `name` (dotted) of `root` to `value` (a float or a 0-d tensor)."""
    mod, _, attr = name.rpartition(".")
    (root.get_submodule(mod) if mod else root).__dict__[attr] = value


def _get_path(root: nn.Module, name: str):
    mod, _, attr = name.rpartition(".")
    return (root.get_submodule(mod) if mod else root).__dict__[attr]


class _Objective(nn.Module):
    """``(cost, penalty)`` of one member, for `functional_call` under `vmap`."""

    def __init__(self, model: nn.Module, objective: str, float_names: list[str]):
        super().__init__()
        self.model: Any = model  # any nn.Module; `penalty(lam)` is needed only when lam > 0
        self.objective, self.float_names = objective, float_names

    def forward(self, X, Y, lam, floats):
        saved = {k: _get_path(self.model, k) for k in self.float_names}
        try:
            for k, v in zip(self.float_names, floats):
                _set_path(self.model, k, v)
            out = self.model(X)
            cost = data_cost(self.objective, out, Y)
            pen = self.model.penalty(lam) if lam is not None else torch.zeros((), dtype=cost.dtype)
            return cost, pen
        finally:
            for k, v in saved.items():
                _set_path(self.model, k, v)


class _Stack:
    """The members' parameters and buffers stacked along a leading member axis. Each member's own
    module keeps views into the stacks, so it always shows its current values (for `evaluate`,
    ``adapt_steps`` and saving)."""

    def __init__(self, models: list[nn.Module]):
        self.models = models
        self.build()

    def build(self) -> None:
        """(Re)stack from the members' current tensors (after a dtype change, say) and bind the views."""
        first = self.models[0]
        with torch.no_grad():
            self.params = {
                k: torch.stack([m.get_parameter(k).detach() for m in self.models]).requires_grad_(True)
                for k, p in first.named_parameters()
                if p.requires_grad
            }
            self.buffers = {
                k: torch.stack([m.get_parameter(k).detach() for m in self.models])
                for k, p in first.named_parameters()
                if not p.requires_grad
            }
            self.buffers.update(
                {k: torch.stack([m.get_buffer(k) for m in self.models]) for k, _ in first.named_buffers()}
            )
        self.bind()

    def bind(self) -> None:
        for i, m in enumerate(self.models):
            for k, t in self.params.items():
                m.get_parameter(k).data = t.detach()[i]
            for k, t in self.buffers.items():
                mod, _, attr = k.rpartition(".")
                owner = m.get_submodule(mod) if mod else m
                if attr in owner._parameters:
                    owner._parameters[attr].data = t[i]
                else:
                    owner._buffers[attr] = t[i]

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.params.values())).dtype


def _per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-member (M,) tensor in `like`'s dtype, shaped to broadcast against the stacked `like`."""
    return values.to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))


def _member_norm(tensors) -> torch.Tensor:
    """(M,) float64: each member's ‖·‖ over the stacked ``M x ...`` `tensors` (trainer.param_norm per member)."""
    return torch.sqrt(torch.stack([(t.detach() ** 2).flatten(1).sum(1) for t in tensors]).sum(0)).double()


def _same_data(a: Dataset, b: Dataset) -> bool:
    return a is b or all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("X_train", "Y_train", "X_test", "Y_test"))


# ----------------------------------------------------------------------------------- train
def train_ensemble(
    models: Sequence[nn.Module],
    data: Dataset | list[Dataset],
    configs: TrainConfig | list[TrainConfig],
    *,
    device: str = "cpu",
    run_dirs: Sequence[str | Path | None] | None = None,
    callbacks=None,
    progress: bool | None = None,
) -> list[TrainResult | FeaturelabError]:
    """Train ``M = len(models)`` same-shape models as one batched computation; returns one entry per
    member: its `TrainResult` (as `train` would return it), or the `FeaturelabError` that `train`
    would have raised (a member whose loss diverged; the others go on).

    models: modules of equal type and parameter shapes, trained in place (rows are samples, as in `train`).
    data: one `Dataset` for all, or one per member (equal shapes).
    configs: one `TrainConfig` or one per member, equal up to ``lam``, ``seed`` and each phase's
        ``lr``/``lr_min`` (checked with `ensemble_key`).
    run_dirs: per member, a folder for `train`'s run record, or None.
    callbacks: per member, a sequence of `train`-style callbacks; only ``on_log(step, model, row)`` is
        supported (an ``on_step`` hook would need a per-step host loop, so it is an error).
    Fresh runs only (no resume): resume a member one-by-one with `train(..., resume=True)`.
    docs/theory/conventions.md; docs/scale.md.
    """
    M = len(models)
    if M == 0:
        raise FeaturelabError("models is empty; give at least one model")
    datas = _as_list(data, M, "data")
    cfgs = [TrainConfig.model_validate(c) for c in _as_list(configs, M, "configs")]
    dirs = [Path(d) if d is not None else None for d in _as_list(run_dirs, M, "run_dirs")]
    cbs = [tuple(c) for c in (callbacks if callbacks is not None else [()] * M)]
    if len(cbs) != M:
        raise FeaturelabError(f"callbacks has {len(cbs)} entries; give one sequence per model ({M})")
    if any(hasattr(cb, "on_step") for c in cbs for cb in c):
        raise FeaturelabError("callbacks with on_step cannot run in an ensemble; use train() per model")
    keys = [ensemble_key(m, d, c) for m, d, c in zip(models, datas, cfgs)]
    if keys[0] is None:
        raise FeaturelabError("configs has an lbfgs phase, which cannot be batched; use train() per model")
    if any(k != keys[0] for k in keys):
        bad = next(i for i, k in enumerate(keys) if k != keys[0])
        raise FeaturelabError(
            f"models[{bad}] cannot join the ensemble of models[0]: shapes, attributes, data "
            "shapes or training phases differ (only values, lam, seed, lr and lr_min may)"
        )
    dev = resolve_device(device)
    t0 = time.perf_counter()
    for m in models:
        m.to(dev)
    cfg0 = cfgs[0]
    stack = _Stack(list(models))
    attrs = [_float_attrs(m) for m in models]
    float_names = [k for k, v in attrs[0].items() if any(a[k] != v for a in attrs[1:])]  # e.g. L̃
    float_values = [torch.tensor([a[k] for a in attrs], dtype=torch.float64, device=dev) for k in float_names]
    objective = _Objective(models[0], cfg0.objective, float_names)
    lams = torch.tensor([c.lam for c in cfgs], dtype=torch.float64, device=dev)
    shared_data = all(_same_data(d, datas[0]) for d in datas[1:])
    errors: list[FeaturelabError | None] = [None] * M
    rows: list[list[dict]] = [[] for _ in range(M)]
    lr_scale = torch.ones(M, dtype=torch.float64, device=dev)
    capped = torch.zeros(M, dtype=torch.int64, device=dev)  # steps cut by the trust region, per member
    log_capped = any(p.max_step is not None for p in cfg0.phases)

    def data_on(dtype):
        ds = [d.to(dtype=dtype, device=dev) for d in (datas[:1] if shared_data else datas)]
        X = ds[0].X_train if shared_data else torch.stack([d.X_train for d in ds])
        Y = ds[0].Y_train if shared_data else torch.stack([d.Y_train for d in ds])
        return (ds * M if shared_data else ds), X, Y

    use_penalty = any(c.lam > 0 for c in cfgs)

    def losses(X, Y, idx):
        """Per-member (cost, penalty), each (M,). idx: mini-batch indices, (B,) shared or (M, B), or None."""
        if idx is not None:
            if shared_data:
                X, Y = X[idx], Y[idx]
            else:
                rows_ = torch.arange(M, device=dev)[:, None]
                X, Y = X[rows_, idx], Y[rows_, idx]
        batched = (idx is not None and idx.dim() == 2) or not shared_data
        state = {f"model.{k}": v for k, v in {**stack.params, **stack.buffers}.items()}
        fl = [v.to(stack.dtype) for v in float_values]
        lam = lams.to(stack.dtype) if use_penalty else None

        def one(st, X, Y, lam, fl):
            return functional_call(objective, st, (X, Y, lam, fl))

        in_dims = (0, 0 if batched else None, 0 if batched else None, 0 if lam is not None else None, [0] * len(fl))
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

    def checkpoint(step, finished, phase, opt_state):
        for i, m in enumerate(models):
            folder = dirs[i]
            if folder is None or errors[i] is not None:
                continue
            opt = None
            if phase is not None:
                opt = _torch_optimizer(phase, m, opt_state, i)
            info = {
                "step": step,
                "done": finished,
                "history": rows[i],
                "lr_scale": float(lr_scale[i]),
                "capped_steps": int(capped[i]),
                "dtype": str(stack.dtype).replace("torch.", ""),
                "rho_history": getattr(m, "rho_history", []),
                "config": digest(cfgs[i].model_dump(mode="json")),
            }
            save_checkpoint(folder, m, opt, info)

    def schedule(phase, k, lr0, lr_min):
        """Per-member lr of step k of `phase` (trainer._lr, vectorised), before the guard's scaling."""
        if phase.schedule == "constant":
            return lr0
        if phase.schedule == "cosine":
            return lr_min + (lr0 - lr_min) * 0.5 * (1 + math.cos(math.pi * k / max(phase.steps, 1)))
        power = phase.norm_power if phase.norm_power is not None else getattr(models[0], "depth", 2) - 2
        return torch.clamp(lr0 / _member_norm(stack.params.values()) ** power, min=lr_min)

    def member_rates(phase_idx):
        phases = [c.phases[phase_idx] for c in cfgs]
        return (
            torch.tensor([p.lr for p in phases], dtype=torch.float64, device=dev),
            torch.tensor([p.lr_min for p in phases], dtype=torch.float64, device=dev),
        )

    total = sum(p.steps for p in cfg0.phases)
    ds, X, Y = data_on(stack.dtype)
    log(0, 0, schedule(cfg0.phases[0], 0, *member_rates(0)).cpu() if cfg0.phases else None, ds)
    bar = tqdm(
        total=total,
        disable=not (sys.stderr.isatty() if progress is None else progress),
        leave=False,
        desc=f"ensemble of {M}",
    )
    offset = 0
    for phase_idx, phase in enumerate(cfg0.phases):
        if phase.dtype is not None and stack.dtype != getattr(torch, phase.dtype):
            for m in models:
                m.to(getattr(torch, phase.dtype))
            stack.build()
            ds, X, Y = data_on(stack.dtype)
        lr0, lr_min = member_rates(phase_idx)
        opt_state = {"count": torch.zeros(M, dtype=torch.int64, device=dev)}  # steps since (re)start, per member
        snapshot = None  # the guard's (loss (M,), parameters) at the start of its window
        for k in range(phase.steps):
            step = offset + k
            lr = schedule(phase, k, lr0, lr_min) * lr_scale
            idx = None
            if phase.batch_size is not None and phase.batch_size < X.shape[-2]:
                n = X.shape[-2]
                if shared_data and all(c.seed == cfg0.seed for c in cfgs):
                    idx = _batches(n, phase.batch_size, cfg0.seed, step, dev, phase.drop_last)  # one for all: (B,)
                else:  # (M, B)
                    batches = [_batches(n, phase.batch_size, c.seed, step, dev, phase.drop_last) for c in cfgs]
                    idx = torch.stack(cast(list[torch.Tensor], batches))  # batch_size < n: never None
            if phase.guard_window and snapshot is None:
                with torch.no_grad():
                    snapshot = (
                        torch.stack(losses(X, Y, idx)).sum(0),
                        {n_: p.detach().clone() for n_, p in stack.params.items()},
                    )
            for p in stack.params.values():
                p.grad = None
            sum(losses(X, Y, idx)).sum().backward()
            with torch.no_grad():
                if phase.max_step is not None:  # trainer's trust region ‖Δθ_i‖ <= max_step·‖θ_i‖, per member
                    lr, cut = trust_region(
                        lr,
                        phase.max_step,
                        _member_norm(stack.params.values()),
                        _member_norm(p.grad for p in stack.params.values()),
                    )
                    capped += cut.long()
                _update(phase, stack, opt_state, lr)
            if phase.guard_window and (k + 1) % phase.guard_window == 0:  # trainer's guard, per member
                with torch.no_grad():
                    cur = torch.stack(losses(X, Y, idx)).sum(0)
                    bad = ~(cur <= snapshot[0])  # the loss rose over the window (or is NaN)
                    for n_, p in stack.params.items():
                        mask = bad.reshape(-1, *([1] * (p.dim() - 1)))
                        p.copy_(torch.where(mask, snapshot[1][n_], p))
                        snapshot[1][n_] = p.detach().clone()
                    lr_scale = torch.where(bad, lr_scale * 0.5, lr_scale)
                    opt_state["count"] = torch.where(bad, 0, opt_state["count"])  # a fresh optimizer for them
                    snapshot = (torch.where(bad, snapshot[0], cur), snapshot[1])
            if (
                phase.adapt_every
                and hasattr(models[0], "adapt_steps")
                and (k + 1) % phase.adapt_every == 0
                and k + 1 < phase.adapt_stop * phase.steps
            ):
                for i, m in enumerate(models):
                    m.adapt_steps(ds[i].X_train)  # pyright: ignore[reportCallIssue]  (checked by hasattr)
            bar.update(1)
            if (step + 1) % cfg0.log_every == 0 or step + 1 == total:
                log(step + 1, phase_idx, lr.cpu(), ds)  # the only host-device synchronisation
                for i in range(M):
                    if errors[i] is None and not math.isfinite(rows[i][-1]["loss"]):
                        errors[i] = FeaturelabError(
                            f"training diverged at step {step + 1} (loss {rows[i][-1]['loss']}); lower the learning "
                            f"rate (phase {phase_idx}: lr={cfgs[i].phases[phase_idx].lr}) or set guard_window"
                        )
            if cfg0.checkpoint_every and (step + 1) % cfg0.checkpoint_every == 0:
                checkpoint(step + 1, False, phase, opt_state)
        offset += phase.steps
    bar.close()
    checkpoint(total, True, None, None)
    seconds = time.perf_counter() - t0
    out: list[TrainResult | FeaturelabError] = []
    for i, m in enumerate(models):
        error, folder = errors[i], dirs[i]
        if error is not None:
            out.append(error)
            continue
        history = pd.DataFrame(rows[i])
        if folder is not None:
            write_text(folder / "history.csv", history.to_csv(index=False))
            save_model(m, folder / "model.safetensors")
        out.append(TrainResult(m, history, seconds, 0))
    return out


def _update(phase, stack: _Stack, state: dict, lr: torch.Tensor) -> None:
    """One optimizer step on the stacked parameters with torch.optim's formulas, per-member lr, and
    per-member step counts ``state["count"]`` (0: the member's optimizer starts afresh, as after the guard)."""
    count = state["count"] + 1
    fresh = count == 1
    for name, p in stack.params.items():
        g = p.grad
        assert g is not None  # set by the backward pass of this step
        st = state.setdefault(name, {})
        if phase.optimizer == "adam":  # torch.optim.adam._single_tensor_adam
            b1, b2 = ADAM_BETAS
            mask = fresh.reshape(-1, *([1] * (p.dim() - 1)))
            m_, v_ = (
                torch.where(mask, 0.0, st[k]) if k in st else torch.zeros_like(p) for k in ("exp_avg", "exp_avg_sq")
            )
            st["exp_avg"], st["exp_avg_sq"] = m_.lerp_(g, 1 - b1), v_.mul_(b2).addcmul_(g, g, value=1 - b2)
            c = count.double()
            step_size = _per_member(lr / (1 - b1**c), p)
            bc2_sqrt = _per_member((1 - b2**c) ** 0.5, p)
            denom = (st["exp_avg_sq"].sqrt() / bc2_sqrt).add_(ADAM_EPS)
            p.add_(-step_size * st["exp_avg"] / denom)
        else:  # torch.optim.sgd._single_tensor_sgd (no dampening, no nesterov)
            if phase.momentum:
                mask = fresh.reshape(-1, *([1] * (p.dim() - 1)))
                buf = st.get("momentum_buffer")
                st["momentum_buffer"] = g.clone() if buf is None else torch.where(mask, g, buf * phase.momentum + g)
                g = st["momentum_buffer"]
            p.add_(-_per_member(lr, p) * g)
    state["count"] = count


def _torch_optimizer(phase, model: nn.Module, state: dict, i: int):
    """Member i's optimizer state as the torch optimizer `train` would hold (for its checkpoint)."""
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
