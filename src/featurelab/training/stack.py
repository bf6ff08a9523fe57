"""The members of a run as one computation: their trainable parameters stacked along a leading member
axis (``M x ...``) and their per-member loss ``(cost, penalty)``, each ``(M,)``.

Models that implement `Stackable` (`MLP`, `LeakyResNet`, `HomogeneousNet`) run one forward pass on the
stacked tensors (batched matmuls: M runs cost about M times the FLOPs in one set of kernel launches);
other models are vmapped (``torch.func.functional_call`` + ``torch.func.vmap``); a single run calls the
model itself. Each member's own module keeps views into the stacks, so it always shows its current
values (for `evaluate`, callbacks, ``adapt_steps`` and saving).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol, cast, runtime_checkable

import torch
from torch import nn
from torch.func import functional_call, vmap

from ..data.dataset import Dataset
from .objectives import data_cost
from .phases import TrainConfig


@runtime_checkable
class Trainable(Protocol):
    """What the engine needs from a model: ``forward(X)`` (``N x d_in`` -> ``N x d_out``) and its own
    regulariser ``penalty(lam)`` (a 0-d tensor; the loss is ``C + penalty``)."""

    def forward(self, X: torch.Tensor) -> torch.Tensor: ...

    def penalty(self, lam) -> torch.Tensor: ...


@runtime_checkable
class Stackable(Protocol):
    """Models whose ``forward`` and ``penalty`` accept every parameter and buffer with a leading member
    axis ``M`` (inputs ``N x d`` shared, or ``M x N x d``; outputs ``M x N x d_out``; penalties ``(M,)``,
    with λ a float or an ``(M,)`` tensor). `member_floats`: the float attributes that may differ between
    members; they are passed as ``(M,)`` tensors."""

    member_floats: ClassVar[tuple[str, ...]]


def float_attrs(model: nn.Module) -> dict[str, float]:
    """Every plain float attribute of `model` and its submodules, by dotted name."""
    out = {}
    for prefix, mod in model.named_modules():
        for k, v in vars(mod).items():
            if isinstance(v, float) and not k.startswith("_"):
                out[f"{prefix}.{k}" if prefix else k] = v
    return out


def _owner(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding the dotted attribute `name` of `root`, and the attribute's own name."""
    mod, _, attr = name.rpartition(".")
    return (root.get_submodule(mod) if mod else root), attr


def _set_path(root: nn.Module, name: str, value) -> None:
    """Set the plain attribute `name` (dotted) of `root` to `value` (a float or a tensor)."""
    owner, attr = _owner(root, name)
    owner.__dict__[attr] = value


class _Objective(nn.Module):
    """``(cost, penalty)`` of the members, for `functional_call` (stacked, or one member under `vmap`);
    the float attributes `float_names` (e.g. L̃) are set to the values passed in for the call."""

    def __init__(self, model: nn.Module, objective: str, float_names: list[str]):
        super().__init__()
        self.model, self.objective, self.float_names = model, objective, float_names

    def forward(self, X, Y, lam, floats):
        saved = {k: vars(owner)[attr] for k in self.float_names for owner, attr in [_owner(self.model, k)]}
        try:
            for k, v in zip(self.float_names, floats):
                _set_path(self.model, k, v)
            cost = data_cost(self.objective, self.model(X), Y)
            pen = cast(Trainable, self.model).penalty(lam) if lam is not None else torch.zeros_like(cost)
            return cost, pen
        finally:
            for k, v in saved.items():
                _set_path(self.model, k, v)


class Stack:
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
                owner, attr = _owner(m, k)
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


def member_norm(tensors) -> torch.Tensor:
    """(M,) float64: each member's ‖·‖ over the stacked ``M x ...`` `tensors`."""
    return torch.linalg.vector_norm(torch.cat([t.detach().flatten(1) for t in tensors], 1), dim=1).double()


def _same_data(a: Dataset, b: Dataset) -> bool:
    return a is b or all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("X_train", "Y_train", "X_test", "Y_test"))


class Losses:
    """The members' data on the device and their loss: ``losses(X, Y, idx)`` is ``(cost, penalty)``, each
    ``(M,)``, for the stacked training data `X`, `Y` (shared ``N x d``, or ``M x N x d``) at the mini-batch
    indices `idx` (``(B,)`` shared, ``(M, B)`` per member, or None for the full batch)."""

    def __init__(self, stack: Stack, datas: list[Dataset], cfgs: list[TrainConfig], device: torch.device):
        models, M = stack.models, len(stack.models)
        self.stack, self.datas, self.cfg0, self.dev, self.M = stack, datas, cfgs[0], device, M
        attrs = [float_attrs(m) for m in models]
        float_names = [k for k, v in attrs[0].items() if any(a[k] != v for a in attrs[1:])]  # e.g. L̃
        self.float_values = [
            torch.tensor([a[k] for a in attrs], dtype=torch.float64, device=device) for k in float_names
        ]
        self.native = isinstance(models[0], Stackable) and all(k in type(models[0]).member_floats for k in float_names)
        self.objective = _Objective(models[0], self.cfg0.objective, float_names)
        self.lams = torch.tensor([c.lam for c in cfgs], dtype=torch.float64, device=device)
        self.use_penalty = any(c.lam > 0 for c in cfgs)
        self.shared_data = all(_same_data(d, datas[0]) for d in datas[1:])
        self.shared_batches = self.shared_data and all(c.seed == self.cfg0.seed for c in cfgs)

    def data_on(self, dtype: torch.dtype) -> tuple[list[Dataset], torch.Tensor, torch.Tensor]:
        """(per-member datasets, X, Y) in `dtype` on the device; X, Y shared or stacked."""
        ds = [d.to(dtype=dtype, device=self.dev) for d in (self.datas[:1] if self.shared_data else self.datas)]
        X = ds[0].X_train if self.shared_data else torch.stack([d.X_train for d in ds])
        Y = ds[0].Y_train if self.shared_data else torch.stack([d.Y_train for d in ds])
        return (ds * self.M if self.shared_data else ds), X, Y

    def __call__(self, X, Y, idx) -> tuple[torch.Tensor, torch.Tensor]:
        if idx is not None and self.shared_data:  # (B,) -> B x d, or (M, B) -> M x B x d
            X, Y = X[idx], Y[idx]
        elif idx is not None:
            rows = torch.arange(self.M, device=self.dev)[:, None]
            X, Y = X[rows, idx], Y[rows, idx]
        stack = self.stack
        if self.M == 1:
            m = stack.models[0]
            cost = data_cost(self.cfg0.objective, m(X), Y)
            pen = cast(Trainable, m).penalty(self.cfg0.lam) if self.use_penalty else torch.zeros_like(cost)
            return cost[None], pen[None]
        state = {f"model.{k}": v for k, v in {**stack.leaves, **stack.buffers}.items()}
        fl = [v.to(stack.dtype) for v in self.float_values]
        lam = self.lams.to(stack.dtype) if self.use_penalty else None
        if self.native:
            return functional_call(self.objective, state, (X, Y, lam, fl))

        def one(st, X, Y, lam, fl):
            return functional_call(self.objective, st, (X, Y, lam, fl))

        data_dim = 0 if (idx is not None and idx.dim() == 2) or not self.shared_data else None
        in_dims = (0, data_dim, data_dim, 0 if lam is not None else None, [0] * len(fl))
        return vmap(one, in_dims=in_dims)(state, X, Y, lam, fl)
