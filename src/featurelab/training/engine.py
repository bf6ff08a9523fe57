"""The training engine: one loop that trains M >= 1 same-shape runs as one computation (`train` is the
case M = 1, `train_ensemble` the general one), with `train`'s semantics for every member.

The step loop of `run` reads top to bottom; its parts are named: the members' stacked parameters and
batched loss (`featurelab.training.stack`), the optimizer updates and the trust region
(`featurelab.training.optim`), the CUDA-graph capture (`featurelab.training.capture`), and here the
schedule, the mini-batches, the loss guard, logging, checkpoints and resume (`_Run`, `_PhaseRun`) and the
hand-over to L-BFGS. Adam and SGD (with momentum, or plain with the relative trust region ``max_step``)
are applied to the stacked tensors with torch.optim's update formulas, per-member learning rates and
per-member step counts (a member restarted by the loss guard gets a fresh optimizer). L-BFGS (a line
search per run) runs one run at a time, with torch's own optimizer: an ensemble that reaches an L-BFGS
phase hands each member over, in memory, to a one-member run of the remaining phases (so the Adam
phases before a float64 polish are still batched). Metrics are gathered only at log steps: the step
loop makes no host-device synchronisation unless an ``on_step`` callback or L-BFGS asks for one. On
CUDA, phases that allow it run as a captured CUDA graph.
docs/theory/conventions.md (training conventions); docs/scale.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Protocol, cast, runtime_checkable

import pandas as pd
import torch
from torch import nn

from ..data.dataset import Dataset
from ..errors import FeaturelabError
from ..io import digest, write_text
from ..progress import progress_bar, show_progress
from ..runtime import resolve_device
from . import _kernels, capture, optim
from ._kernels.gemm import onednn_products
from .checkpoint import load_checkpoint, save_checkpoint, save_model
from .objectives import data_cost, error_rate
from .optim import trust_region
from .phases import Phase, TrainConfig, TrainResult
from .stack import Losses, Stack, Stackable, Trainable, member_norm

__all__ = ["Stackable", "Trainable", "evaluate", "param_norm", "run", "trust_region"]


# ----------------------------------------------------------------------- what a model offers
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


# ------------------------------------------------------------------------------------ helpers
def param_norm(model: nn.Module) -> torch.Tensor:
    """‖θ‖ over trainable parameters."""
    return torch.sqrt(torch.stack([(p.detach() ** 2).sum() for p in model.parameters() if p.requires_grad]).sum())


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
    out = _kernels.forward(model, data.X_train)
    cost = data_cost(config.objective, out, data.Y_train)
    pen = _kernels.penalty(model, config.lam) if config.lam > 0 else torch.zeros((), dtype=cost.dtype)
    row = {
        "loss": float(cost + pen),
        "cost": float(cost),
        "penalty": float(pen),
        "train_error": float(error_rate(config.objective, out, data.Y_train)),
        "param_norm": float(param_norm(model)),
    }
    if len(data.X_test):
        out_t = _kernels.forward(model, data.X_test)
        row["test_cost"] = float(data_cost(config.objective, out_t, data.Y_test))
        row["test_error"] = float(error_rate(config.objective, out_t, data.Y_test))
    k = config.top_singular_values
    if k and isinstance(model, LayerSpectra) and math.isfinite(row["loss"]):
        for l, M in enumerate(model.layer_matrices(), start=1):
            s = torch.linalg.svdvals(M.detach().double())
            for i in range(min(k, s.numel())):
                row[f"sv{l}_{i + 1}"] = float(s[i])
    return row


# ------------------------------------------------------------------------- the run's state
class _Run:
    """What one call of `run` carries across its phases: the members and their stacked parameters and
    loss, the per-member lr scale (halved by the guard) and trust-region counts, the history rows, the
    members' errors (a diverged loss), and where the run starts (a checkpoint's or hand-over's step)."""

    def __init__(self, models, datas, cfgs, dev: torch.device, dirs, callbacks, lr_rule):
        M = len(models)
        self.t0 = time.perf_counter()
        self.models, self.datas, self.cfgs, self.cfg0, self.M, self.dev = models, datas, cfgs, cfgs[0], M, dev
        self.dirs, self.lr_rule = dirs, lr_rule
        self.cbs = [tuple(c) for c in (callbacks if callbacks is not None else [()] * M)]
        self.rows: list[list[dict]] = [[] for _ in range(M)]
        self.lr_scale = torch.ones(M, dtype=torch.float64, device=dev)
        self.capped = torch.zeros(M, dtype=torch.int64, device=dev)  # steps cut by the trust region, per member
        self.errors: list[FeaturelabError | None] = [None] * M
        self.has_on_step = M == 1 and any(hasattr(cb, "on_step") for cb in self.cbs[0])
        self.log_capped = any(p.max_step is not None for p in self.cfg0.phases)

    def start(self, ckpts: list) -> None:
        """Move the members to the device, continue each from its checkpoint ``(tensors, info)`` or
        hand-over ``(None, info)`` where given, then stack them and put the data on the device."""
        self.ckpts = ckpts
        for m in self.models:
            m.to(self.dev)
        for i, ck in enumerate(ckpts):
            if ck is not None:
                self._restore(i, *ck)
        self.resumed_from = [ck[1].get("resumed_from", ck[1]["step"]) if ck else 0 for ck in ckpts]
        starts = {(ck[1]["step"], ck[1]["done"]) if ck else (0, False) for ck in ckpts}
        if len(starts) > 1:
            raise FeaturelabError(f"resume: the members' checkpoints are at different steps {sorted(starts)}")
        self.start_step, self.done = starts.pop()
        self.stack = Stack(self.models)
        self.losses = Losses(self.stack, self.datas, self.cfgs, self.dev)
        self.ds, self.X, self.Y = self.losses.data_on(self.stack.dtype)

    def switch_dtype(self, dtype: torch.dtype) -> None:
        """Move the members, their stack and the data on the device to `dtype` (a phase's ``dtype``)."""
        for m in self.models:
            m.to(dtype)
        self.stack.build()
        self.ds, self.X, self.Y = self.losses.data_on(self.stack.dtype)

    def _restore(self, i: int, tensors: dict | None, info: dict) -> None:
        m = self.models[i]
        if tensors is not None:  # a checkpoint, read from the run folder
            if info.get("config") != digest(self.cfgs[i].model_dump(mode="json")):
                raise FeaturelabError(
                    f"'{Path(cast(Path, self.dirs[i])) / 'checkpoint.safetensors'}' was written by a training run "
                    "with another config; delete it to train this one afresh"
                )
            if info.get("dtype") and next(m.parameters()).dtype != getattr(torch, info["dtype"]):
                m.to(getattr(torch, info["dtype"]))  # a float64 buffer (LeakyResNet's rho) keeps its dtype otherwise
            m.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        self.rows[i] = info["history"]
        self.lr_scale[i], self.capped[i] = info.get("lr_scale", 1.0), info.get("capped_steps", 0)
        if isinstance(m, AdaptiveSteps):
            m.rho_history = info.get("rho_history", [])

    # ------------------------------------------------------------------------------- schedule
    def member_rates(self, phase_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-member (lr, lr_min) of a phase, (M,) float64."""
        phases = [c.phases[phase_idx] for c in self.cfgs]
        return (
            torch.tensor([p.lr for p in phases], dtype=torch.float64, device=self.dev),
            torch.tensor([p.lr_min for p in phases], dtype=torch.float64, device=self.dev),
        )

    def schedule(self, phase: Phase, k, lr0: torch.Tensor, lr_min: torch.Tensor):
        """Per-member lr of step k of `phase`, before the guard's scaling (k an int, or a device scalar
        in a captured step)."""
        if self.lr_rule is not None:
            return torch.as_tensor(
                self.lr_rule(k, phase, self.models[0]), dtype=torch.float64, device=self.dev
            ).reshape(1)
        if phase.schedule == "constant":
            return lr0
        if phase.schedule == "cosine":
            cos = torch.cos if isinstance(k, torch.Tensor) else math.cos
            return lr_min + (lr0 - lr_min) * 0.5 * (1 + cos(math.pi * k / max(phase.steps, 1)))
        power = phase.norm_power
        if power is None:
            power = self.models[0].depth - 2 if isinstance(self.models[0], Deep) else 0
        return torch.clamp(lr0 / member_norm(self.stack.flat) ** power, min=lr_min)

    def batch_indices(self, phase: Phase, step: int) -> torch.Tensor | None:
        """Mini-batch indices of global `step`: (B,) shared by the members, (M, B), or None (full batch)."""
        n = self.X.shape[-2]
        if phase.batch_size is None or phase.batch_size >= n:
            return None
        if self.losses.shared_batches:
            return _batches(n, phase.batch_size, self.cfg0.seed, step, self.dev, phase.drop_last)
        return torch.stack(
            [
                cast(torch.Tensor, _batches(n, phase.batch_size, c.seed, step, self.dev, phase.drop_last))
                for c in self.cfgs
            ]
        )

    # ---------------------------------------------------------------------- logging, records
    def log(self, step: int, phase_idx: int, lr: torch.Tensor | None) -> None:
        """One history row per member (`evaluate`), its ``on_log`` callbacks; a non-finite loss fails it."""
        now = time.perf_counter() - self.t0
        metrics = self.evaluate_members()
        for i, m in enumerate(self.models):
            if self.errors[i] is not None:
                continue
            row = {"step": step, "phase": phase_idx, "lr": float(lr[i]) if lr is not None else float("nan")}
            row.update(metrics[i])
            if self.log_capped:
                row["capped_steps"] = int(self.capped[i])
            row["seconds"] = now
            for cb in self.cbs[i]:
                if hasattr(cb, "on_log"):
                    cb.on_log(step, m, row)
            self.rows[i].append(row)
            if not math.isfinite(row["loss"]):
                self.errors[i] = FeaturelabError(
                    f"training diverged at step {step} (loss {row['loss']}); lower the learning rate "
                    f"(phase {phase_idx}: lr={self.cfgs[i].phases[phase_idx].lr}) or set guard_window"
                )

    @torch.no_grad()
    def evaluate_members(self) -> list[dict[str, float]]:
        """`evaluate`'s metrics per member (empty for a failed one); natively stacked members from one
        stacked pass (the same numbers to rounding: the batched products sum in another order)."""
        if self.M == 1 or not self.losses.native:
            return [
                evaluate(m, d, c) if e is None else {}
                for m, d, c, e in zip(self.models, self.ds, self.cfgs, self.errors)
            ]
        objective, dtype = self.cfg0.objective, self.stack.dtype
        stacked = self.losses.stacked_objective()
        model = stacked.model
        lams = torch.tensor([c.lam for c in self.cfgs], dtype=dtype, device=self.dev)
        with stacked.floats(self.losses.fl):
            out = _kernels.forward(model, self.X)
            cost = data_cost(objective, out, self.Y)
            pen = torch.where(lams > 0, _kernels.penalty(model, lams), 0.0)
            cols = {
                "loss": cost + pen,
                "cost": cost,
                "penalty": pen,
                "train_error": error_rate(objective, out, self.Y),
                "param_norm": member_norm(self.stack.flat),
            }
            if len(self.ds[0].X_test):
                shared = self.losses.shared_data
                Xt = self.ds[0].X_test if shared else torch.stack([d.X_test for d in self.ds])
                Yt = self.ds[0].Y_test if shared else torch.stack([d.Y_test for d in self.ds])
                out_t = _kernels.forward(model, Xt)
                cols.update(test_cost=data_cost(objective, out_t, Yt), test_error=error_rate(objective, out_t, Yt))
        rows = [dict(zip(cols, values)) for values in zip(*(c.tolist() for c in cols.values()))]
        k = self.cfg0.top_singular_values
        finite = [i for i, row in enumerate(rows) if math.isfinite(row["loss"])]
        if k and isinstance(model, LayerSpectra) and finite:
            layers = zip(*(cast(LayerSpectra, self.models[i]).layer_matrices() for i in finite))
            for l, mats in enumerate(layers, start=1):
                for i, s in zip(finite, torch.linalg.svdvals(torch.stack(mats).double()).tolist()):
                    rows[i].update({f"sv{l}_{j + 1}": s[j] for j in range(min(k, len(s)))})
        return [row if e is None else {} for row, e in zip(rows, self.errors)]

    def member_state(self, i: int, step: int, finished: bool) -> dict:
        """Member i's run state at `step`, as its checkpoint records it and a hand-over passes it on."""
        m = self.models[i]
        return {
            "step": step,
            "done": finished,
            "history": self.rows[i],
            "lr_scale": float(self.lr_scale[i]),
            "capped_steps": int(self.capped[i]),
            "dtype": str(self.stack.dtype).replace("torch.", ""),
            "rho_history": m.rho_history if isinstance(m, AdaptiveSteps) else [],
            "config": digest(self.cfgs[i].model_dump(mode="json")),
            # the members' folder names: a resume regroups them (`train_ensemble(resume=True)`, bit-identical)
            "ensemble": [d.name for d in self.dirs if d is not None] if self.M > 1 else None,
        }

    def checkpoint(self, step: int, finished: bool, phase_run: _PhaseRun | None = None) -> None:
        """Each member's ``checkpoint.safetensors`` (weights, optimizer state, `member_state`)."""
        for i, (m, d) in enumerate(zip(self.models, self.dirs)):
            if d is None or self.errors[i] is not None:
                continue
            opt = phase_run.lbfgs if phase_run is not None else None
            if phase_run is not None and opt is None:
                opt = optim.torch_optimizer(phase_run.phase, self.stack, phase_run.opt_state, i)
            guard = phase_run.guard_tensors(i) if phase_run is not None else {}
            save_checkpoint(d, m, opt, self.member_state(i, step, finished), guard)

    def hand_over(self, offset: int, progress) -> list:
        """An ensemble at an L-BFGS phase: each member that has not failed goes on alone (`run` with M = 1)
        from its in-memory state through the remaining phases; a failed member keeps its error."""
        elapsed = time.perf_counter() - self.t0
        states = [
            {**self.member_state(i, offset, False), "seconds": elapsed, "resumed_from": self.resumed_from[i]}
            for i in range(self.M)
        ]
        return [
            err
            if err is not None
            else run([m], [d], [c], device=self.dev, dirs=[folder], callbacks=[cb], progress=progress, handover=[st])[0]
            for m, d, c, err, st, folder, cb in zip(
                self.models, self.datas, self.cfgs, self.errors, states, self.dirs, self.cbs
            )
        ]

    def results(self, handover: list[dict] | None) -> list[TrainResult | FeaturelabError]:
        """Per member: its error, or its `TrainResult` (history and model written to its folder)."""
        seconds = time.perf_counter() - self.t0 + (handover[0]["seconds"] if handover else 0.0)
        out: list[TrainResult | FeaturelabError] = []
        for i, m in enumerate(self.models):
            err = self.errors[i]
            if err is not None:
                out.append(err)
                continue
            history = pd.DataFrame(self.rows[i])
            if self.dirs[i] is not None:
                write_text(self.dirs[i] / "history.csv", history.to_csv(index=False))
                save_model(m, self.dirs[i] / "model.safetensors")
            out.append(TrainResult(m, history, seconds, self.resumed_from[i]))
        return out


# ------------------------------------------------------------------------------- one phase
class _PhaseRun:
    """One phase of a `_Run`: its dtype, per-member rates, optimizer state (restored from a checkpoint
    taken inside it), the step (eager, L-BFGS, or a replayed CUDA graph), the loss guard, the adaptive
    Leaky-ResNet steps and the per-step callbacks."""

    def __init__(self, r: _Run, phase_idx: int, phase: Phase, offset: int):
        self.r, self.phase, self.phase_idx = r, phase, phase_idx
        if phase.dtype is not None and r.stack.dtype != getattr(torch, phase.dtype):
            r.switch_dtype(getattr(torch, phase.dtype))
        self.lr0, self.lr_min = r.member_rates(phase_idx)
        self.opt_state: dict = {"count": torch.zeros(r.M, dtype=torch.int64, device=r.dev)}  # steps since (re)start
        self.lbfgs = optim.lbfgs(phase, r.stack) if phase.optimizer == "lbfgs" else None
        self.k0 = r.start_step - offset
        if self.k0 > 0 and self.lbfgs is None:
            for i, ck in enumerate(r.ckpts):
                if ck is not None and ck[0] is not None and ck[1].get("optimizer") and ck[1]["step"] == r.start_step:
                    optim.restore_state(phase, r.stack, self.opt_state, i, ck[0])
        self.snapshot = None  # the guard's (loss (M,), parameters) at the start of its window
        if self.k0 > 0:
            self._restore_guard()
        reason = capture.eager_reason(r.dev, phase, on_step=r.has_on_step, lr_rule=r.lr_rule is not None)
        if r.dev.type == "cuda" and reason is not None:
            capture.announce(reason)
        self.replayer = capture.Replayer(self.step_body, self.k0, self.lr0) if reason is None else None

    def step_body(self, k, idx) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward, backward, trust region and update; returns (lr (M,), loss (M,), which only ``on_step``
        callbacks read: None without them)."""
        r, phase = self.r, self.phase
        lr = r.schedule(phase, k, self.lr0, self.lr_min) * r.lr_scale
        loss, grad = r.losses.value_and_grad(r.X, r.Y, idx, value=r.has_on_step)
        with torch.no_grad():
            if phase.max_step is not None:  # trust region ‖Δθ_i‖ <= max_step·‖θ_i‖, per member
                lr, cut = trust_region(lr, phase.max_step, member_norm(r.stack.flat), member_norm(grad))
                r.capped.add_(cut.long())
            optim.update(phase, r.stack, self.opt_state, lr, host=r.dev.type == "cpu" and self.replayer is None)
        return lr, loss

    def batch(self, step: int) -> torch.Tensor | None:
        """This step's mini-batch indices (in the replayer's static tensor when the step is captured)."""
        idx = self.r.batch_indices(self.phase, step)
        return self.replayer.indices(idx) if self.replayer is not None else idx

    def take_step(self, k: int, idx) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step: replayed (loss not read: None), L-BFGS, or eager; returns (lr (M,), loss)."""
        if self.replayer is not None:
            if self.replayer.step(lambda: self.opt_state.update(fresh=True)):  # restart masks kept in the graph
                return self.replayer.lr, None
            self.replayer = None  # a failed capture: the phase goes on eagerly
        if self.lbfgs is not None:
            r, lbfgs = self.r, self.lbfgs
            lr = r.schedule(self.phase, k, self.lr0, self.lr_min) * r.lr_scale
            for g in lbfgs.param_groups:
                g["lr"] = float(lr[0])
            return lr, lbfgs.step(lambda: optim.lbfgs_closure(r.stack, r.losses, r.X, r.Y, idx))
        return self.step_body(k, idx)

    # -------------------------------------------------------------------------- loss guard
    @torch.no_grad()
    def guard_open(self, idx) -> None:
        """At the start of a guard window: keep the loss and the parameters."""
        if self.phase.guard_window and self.snapshot is None:
            r = self.r
            self.snapshot = (torch.add(*r.losses(r.X, r.Y, idx)), {n: p.clone() for n, p in r.stack.params.items()})

    def guard_tensors(self, i: int) -> dict[str, torch.Tensor]:
        """Member i's guard window start, for its checkpoint (a resumed run compares against it)."""
        if self.snapshot is None:
            return {}
        loss, params = self.snapshot
        return {"guard.loss": loss[i : i + 1], **{f"guard.{n}": p[i] for n, p in params.items()}}

    def _restore_guard(self) -> None:
        """The guard window start from the members' checkpoints at the resumed step, when all have one."""
        r = self.r
        saved = [ck[0] for ck in r.ckpts if ck is not None and ck[0] is not None and ck[1]["step"] == r.start_step]
        if len(saved) != r.M or not all("guard.loss" in t for t in saved):
            return
        dev = r.dev
        loss = torch.cat([t["guard.loss"] for t in saved]).to(dev)
        self.snapshot = (
            loss,
            {n: torch.stack([t[f"guard.{n}"] for t in saved]).to(p) for n, p in r.stack.params.items()},
        )

    def guard_close(self, k: int, idx) -> None:
        """At the end of a guard window, per member (Part 1 §5.2): where the loss rose (or is NaN), restore
        the window's start, halve the lr and restart the optimizer; every write is in place (a graph reads it)."""
        if not (self.phase.guard_window and (k + 1) % self.phase.guard_window == 0):
            return
        r, (loss0, params0) = self.r, cast(tuple, self.snapshot)
        with torch.no_grad():
            cur = torch.add(*r.losses(r.X, r.Y, idx))
            bad = ~(cur <= loss0)
            for n, p in r.stack.params.items():
                mask = bad.reshape(-1, *([1] * (p.dim() - 1)))
                p.copy_(torch.where(mask, params0[n], p))
                params0[n] = p.clone()
            r.lr_scale.copy_(torch.where(bad, r.lr_scale * 0.5, r.lr_scale))
            self.opt_state["count"].masked_fill_(bad, 0)
            self.opt_state["fresh"] = True
            self.snapshot = (torch.where(bad, loss0, cur), params0)
        if self.lbfgs is not None and bool(bad[0]):
            self.lbfgs = optim.lbfgs(self.phase, r.stack)

    def after_step(self, step: int, k: int, lr: torch.Tensor, loss: torch.Tensor | None) -> None:
        """A single run's ``on_step`` callbacks; the adaptive Leaky-ResNet steps every ``adapt_every``."""
        r, phase = self.r, self.phase
        for cb in r.cbs[0] if r.M == 1 else ():
            if hasattr(cb, "on_step"):
                opt_view = self.lbfgs or SimpleNamespace(param_groups=[{"lr": float(lr[0])}])
                cb.on_step(step + 1, r.models[0], opt_view, cast(torch.Tensor, loss).reshape(()))
        if (
            phase.adapt_every
            and isinstance(r.models[0], AdaptiveSteps)
            and (k + 1) % phase.adapt_every == 0
            and k + 1 < phase.adapt_stop * phase.steps
        ):
            for i, m in enumerate(r.models):
                cast(AdaptiveSteps, m).adapt_steps(r.ds[i].X_train)


# --------------------------------------------------------------------------------------- run
def run(
    models: Sequence[nn.Module],
    datas: list[Dataset],
    cfgs: list[TrainConfig],
    *,
    device: str | torch.device = "cpu",
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
    ensemble passes on at an L-BFGS phase (`_Run.hand_over`): the models hold the weights, and this run
    continues from the step, history, lr scale and trust-region count in it, as from a checkpoint. progress: a
    step-level bar with the time left (None: shown in a terminal or a notebook, `featurelab.progress.show_progress`).

    It changes no process-wide setting: `featurelab.runtime.tune_cpu` is the CPU tuning the command line applies.
    """
    dev = resolve_device(device)
    if dev.type == "cpu":
        onednn_products()  # a bad FEATURELAB_GEMM is one line here, before anything is trained or written
    r = _Run(models, datas, cfgs, dev, dirs, callbacks, lr_rule)
    ckpts = [load_checkpoint(d) if (resume and d is not None) else None for d in dirs]
    r.start([(None, info) for info in handover] if handover is not None else ckpts)
    if r.done:
        return r.results(handover)
    phases, total = r.cfg0.phases, sum(p.steps for p in r.cfg0.phases)
    if r.start_step == 0:
        r.log(0, 0, r.schedule(phases[0], 0, *r.member_rates(0)).cpu() if phases else None)
    name = type(models[0]).__name__ if r.M == 1 else f"ensemble of {r.M}"
    bar = progress_bar(
        total=total, initial=r.start_step, show=show_progress(progress), leave=False, desc=name, unit="step"
    )
    offset = 0
    for phase_idx, phase in enumerate(phases):
        if r.start_step >= offset + phase.steps or all(e is not None for e in r.errors):
            offset += phase.steps
            continue
        if phase.optimizer == "lbfgs" and r.M > 1:  # a line search per member: one by one from here
            bar.close()
            return r.hand_over(offset, progress)
        p = _PhaseRun(r, phase_idx, phase, offset)
        for k in range(p.k0, phase.steps):
            step = offset + k
            idx = p.batch(step)
            p.guard_open(idx)
            lr, loss = p.take_step(k, idx)
            p.guard_close(k, idx)
            p.after_step(step, k, lr, loss)
            bar.update(1)
            if (step + 1) % r.cfg0.log_every == 0 or step + 1 == total:
                r.log(step + 1, phase_idx, lr.cpu())  # the only host-device synchronisation
                if all(e is not None for e in r.errors):
                    break
            if r.cfg0.checkpoint_every and (step + 1) % r.cfg0.checkpoint_every == 0:
                r.checkpoint(step + 1, False, p)
        offset += phase.steps
        r.start_step = offset
    bar.close()
    r.checkpoint(total, True)
    return r.results(handover)
