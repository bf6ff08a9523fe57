"""The members of a run as one computation: their trainable parameters in one ``M x P`` buffer (member i's
in row i), viewed as ``M x ...`` tensors stacked along a leading member axis, and their per-member loss
``(cost, penalty)``, each ``(M,)``, with the gradient a training step takes.

Models that implement `Stackable` (`MLP`, `LeakyResNet`, `HomogeneousNet`) run one forward pass on the
stacked tensors (batched matmuls: M runs cost about M times the FLOPs in one set of kernel launches),
through a twin of the first member's module that holds them; other models are vmapped
(``torch.func.functional_call`` + ``torch.func.vmap``); a single run calls the model itself. Each
member's own module keeps views into the stacks, so it always shows its current values (for `evaluate`,
callbacks, ``adapt_steps`` and saving).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import ClassVar, Protocol, cast, runtime_checkable

import torch
from torch import nn
from torch.func import functional_call, vmap

from ..data.dataset import Dataset
from ..errors import FeaturelabError
from . import _kernels
from .objectives import PULLBACKS, cost_pullback, data_cost
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
    members, declared by the class (no other may, `member_floats`); they are passed as ``(M,)`` tensors. A
    class whose ``penalty(λ)`` is λ‖θ‖² over all its parameters may say so with ``penalty_is_squared_norm =
    True`` (`squared_norm_penalty`)."""

    member_floats: ClassVar[tuple[str, ...]]


def squared_norm_penalty(model: nn.Module) -> bool:
    """Whether `model`'s ``penalty(λ)`` is λ‖θ‖² over its parameters (its class says so with
    ``penalty_is_squared_norm = True``) and every one of them is trained: stacked members then take the
    penalty, and its gradient 2λθ, from `Stack.flat` (`Losses.decay_apart`)."""
    return getattr(type(model), "penalty_is_squared_norm", False) and all(p.requires_grad for p in model.parameters())


def plain_floats(model: nn.Module) -> dict[str, float]:
    """Every plain float attribute of `model` and its submodules, by dotted name."""
    out = {}
    for prefix, mod in model.named_modules():
        for k, v in vars(mod).items():
            if isinstance(v, float) and not k.startswith("_"):
                out[f"{prefix}.{k}" if prefix else k] = v
    return out


def member_floats(models: Sequence[nn.Module]) -> dict[str, list[float]]:
    """The float attributes that differ between the members, with their values per member, by name. Only those
    the model class declares in ``member_floats`` may differ (the Leaky-ResNet effective depth L̃, say): any
    other plain float attribute of the model or a submodule that differs is a one-line error naming it."""
    cls = type(models[0])
    declared = tuple(getattr(cls, "member_floats", ()))
    first = plain_floats(models[0])
    for i, m in enumerate(models[1:], start=1):
        for k, v in plain_floats(m).items():
            if k not in declared and first.get(k) != v:
                raise FeaturelabError(
                    f"models[{i}].{k} = {v!r} differs from models[0].{k} = {first.get(k)!r}: only the floats "
                    f"{cls.__name__}.member_floats declares ({', '.join(declared) or 'none'}) may differ in an ensemble"
                )
    values = {k: [float(getattr(m, k)) for m in models] for k in declared}
    return {k: v for k, v in values.items() if any(x != v[0] for x in v[1:])}


def _owner(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding the dotted attribute `name` of `root`, and the attribute's own name."""
    mod, _, attr = name.rpartition(".")
    return (root.get_submodule(mod) if mod else root), attr


def _set_path(root: nn.Module, name: str, value) -> None:
    """Set the plain attribute `name` (dotted) of `root` to `value` (a float or a tensor)."""
    owner, attr = _owner(root, name)
    owner.__dict__[attr] = value


def _twin(model: nn.Module, tensors: dict[str, torch.Tensor]) -> nn.Module:
    """A copy of `model`'s module tree holding `tensors` (by dotted name) as its parameters and buffers. Each
    module is copied shallowly (its plain attributes shared; its parameter, buffer and submodule dicts new),
    so `model` keeps its own tensors."""

    def shell(module: nn.Module) -> nn.Module:
        twin = copy.copy(module)
        twin._parameters, twin._buffers = dict(module._parameters), dict(module._buffers)
        twin._modules = {k: shell(m) if m is not None else None for k, m in module._modules.items()}
        return twin

    root = shell(model)
    for name, t in tensors.items():
        owner, attr = _owner(root, name)
        slots = owner._parameters if attr in owner._parameters else owner._buffers
        slots[attr] = cast(nn.Parameter, t)  # a stacked leaf or view, as functional_call would set it
    return root


class _Objective(nn.Module):
    """``(cost, penalty)`` of the members (of a stacked twin, or of one member under `functional_call` and
    `vmap`); the float attributes `float_names` (e.g. L̃) are set to the values passed in for the call."""

    def __init__(self, model: nn.Module, objective: str, float_names: list[str]):
        super().__init__()
        self.model, self.objective, self.float_names = model, objective, float_names

    def floats(self, floats) -> AbstractContextManager:
        """The float attributes `float_names` set to `floats` inside, restored after."""
        return self._floats(floats) if self.float_names else nullcontext()

    @contextmanager
    def _floats(self, floats):
        saved = {k: vars(owner)[attr] for k in self.float_names for owner, attr in [_owner(self.model, k)]}
        try:
            for k, v in zip(self.float_names, floats):
                _set_path(self.model, k, v)
            yield
        finally:
            for k, v in saved.items():
                _set_path(self.model, k, v)

    def forward(self, X, Y, lam, floats):
        """``(cost, penalty)``; the penalty is zeros when `lam` is None."""
        with self.floats(floats):
            cost = data_cost(self.objective, _kernels.forward(self.model, X), Y)
            pen = _kernels.penalty(self.model, lam) if lam is not None else torch.zeros_like(cost)
        return cost, pen

    def cost(self, X, Y, floats) -> torch.Tensor:
        """The cost alone."""
        with self.floats(floats):
            return data_cost(self.objective, _kernels.forward(self.model, X), Y)


class Stack:
    """The members' trainable parameters as one ``M x P`` buffer `flat` (member i's parameters, flattened in
    ``named_parameters`` order, in row i) and their gradients in `grad` of the same layout, so an optimizer
    step is a few ops on `flat` with per-member ``(M, 1)`` coefficients (`featurelab.training.optim`).
    `params` are the parameters' ``M x ...`` views of `flat` (updated in place); `leaves` the tensors
    autograd differentiates. One member: the leaves are the model's own parameters, their values moved
    into `flat`. Several: the leaves are the ``M x ...`` views, each member's module holds views into them
    (and into the stacked buffers). `backward` and `gather_grad` fill `grad`."""

    def __init__(self, models: Sequence[nn.Module]):
        self.models = models
        self.build()

    def build(self) -> None:
        """(Re)stack from the members' current tensors (after a dtype change, say) and bind the views."""
        first = self.models[0]
        names = [k for k, p in first.named_parameters() if p.requires_grad]
        if len({first.get_parameter(k).dtype for k in names}) > 1:
            raise FeaturelabError(f"{type(first).__name__}'s trainable parameters differ in dtype; give them one")
        with torch.no_grad():
            self.flat = torch.stack(
                [torch.cat([m.get_parameter(k).detach().reshape(-1) for k in names]) for m in self.models]
            )
        self.grad = torch.zeros_like(self.flat)
        self.ones = self.flat.new_ones(len(self.models))  # each member's loss seeds its own gradient
        self.shapes = {k: first.get_parameter(k).shape for k in names}
        self.params = self.split(self.flat)
        if len(self.models) == 1:
            self.leaves = {k: first.get_parameter(k) for k in names}
            for k, p in self.leaves.items():
                p.data = self.params[k][0]
            self.buffers = {}
            return
        self.leaves = {k: t.detach().requires_grad_(True) for k, t in self.params.items()}
        self._bind_members()

    def _bind_members(self) -> None:
        """Stack the members' frozen parameters and buffers; point each member's tensors at its views."""
        first = self.models[0]
        with torch.no_grad():
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

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parameters' ``M x ...`` views of an ``M x P`` tensor laid out like `flat`."""
        out, start = {}, 0
        for k, shape in self.shapes.items():
            n = shape.numel()
            out[k] = flat[:, start : start + n].view(-1, *shape)
            start += n
        return out

    def backward(self, *losses: torch.Tensor) -> torch.Tensor:
        """Backpropagate the members' ``(M,)`` `losses` (those that need a gradient; each member's own) and
        gather the gradients into `grad` (`gather_grad`); returns it."""
        seeds = [t for t in losses if t.requires_grad]
        self.zero_grad()
        torch.autograd.backward(seeds, [self.ones] * len(seeds))
        return self.gather_grad()

    def gather_grad(self) -> torch.Tensor:
        """The leaves' gradients (zeros where the loss does not reach one) copied into `grad`; returns it."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.leaves.values()]
        return torch.cat([g.reshape(len(self.models), -1) for g in grads], 1, out=self.grad)

    def zero_grad(self) -> None:
        for p in self.leaves.values():
            p.grad = None

    @property
    def dtype(self) -> torch.dtype:
        return self.flat.dtype


def member_norm(flat: torch.Tensor) -> torch.Tensor:
    """(M,) float64: each member's ‖·‖ over a ``M x P`` tensor laid out like `Stack.flat`."""
    return torch.linalg.vector_norm(flat, dim=1).double()


def _same_data(a: Dataset, b: Dataset) -> bool:
    """Equal tensors (the same ones, as members given one dataset hold, compare without a pass over them)."""
    pairs = [(getattr(a, k), getattr(b, k)) for k in ("X_train", "Y_train", "X_test", "Y_test")]
    return a is b or all(x is y or torch.equal(x, y) for x, y in pairs)


class Losses:
    """The members' data on the device and their loss: ``losses(X, Y, idx)`` is ``(cost, penalty)``, each
    ``(M,)``, for the stacked training data `X`, `Y` (shared ``N x d``, or ``M x N x d``) at the mini-batch
    indices `idx` (``(B,)`` shared, ``(M, B)`` per member, or None for the full batch); `value_and_grad`
    adds the gradient a training step takes.

    Two shortcuts for stacked members: `decay_apart`, a penalty λ‖θ‖² (`squared_norm_penalty`) taken as
    λ‖`Stack.flat`‖² with its gradient 2λθ added directly (two ops on the flat parameters instead of a pass
    per layer and its backward); `pullbacks`, a model and objective that give their pullbacks
    (`_kernels.pullback`, `objectives.cost_pullback`), chained by hand without an autograd graph."""

    def __init__(self, stack: Stack, datas: list[Dataset], cfgs: list[TrainConfig], device: torch.device):
        models, M = stack.models, len(stack.models)
        self.stack, self.datas, self.cfg0, self.dev, self.M = stack, datas, cfgs[0], device, M
        floats = member_floats(models)  # e.g. L̃
        float_names = list(floats)
        self.float_values = [torch.tensor(v, dtype=torch.float64, device=device) for v in floats.values()]
        self.native = isinstance(models[0], Stackable)
        self.float_names = float_names
        self.objective = _Objective(models[0], self.cfg0.objective, float_names)
        self.lams = torch.tensor([c.lam for c in cfgs], dtype=torch.float64, device=device)
        self.use_penalty = any(c.lam > 0 for c in cfgs)
        self.shared_data = all(_same_data(d, datas[0]) for d in datas[1:])
        self.shared_batches = self.shared_data and all(c.seed == self.cfg0.seed for c in cfgs)
        self.decay_apart = M > 1 and self.native and self.use_penalty and squared_norm_penalty(models[0])
        self.pullbacks = (
            M > 1
            and self.native
            and _kernels.has_pullback(models[0])
            and all(p.requires_grad for p in models[0].parameters())
            and self.cfg0.objective in PULLBACKS
            and (self.decay_apart or not self.use_penalty)
        )
        self.bound_to: torch.Tensor | None = None

    def _bind(self) -> None:
        """Bind to the stack's current tensors (again after `Stack.build`): the member floats and λ in its
        dtype and, for natively stacked models, a twin of the first model holding the stacked tensors."""
        stack = self.stack
        self.bound_to = stack.flat
        self.fl = [v.to(stack.dtype) for v in self.float_values]
        self.lam = self.lams.to(stack.dtype) if self.use_penalty else None
        self.decay = 2 * self.lam[:, None] if self.decay_apart and self.lam is not None else None  # ∂(λ‖θ‖²)/∂θ
        self.state = {f"model.{k}": v for k, v in {**stack.leaves, **stack.buffers}.items()}
        self.leaves = list(stack.leaves.values())
        twin = _twin(stack.models[0], {**stack.leaves, **stack.buffers}) if self.native else None
        self.stacked = _Objective(twin, self.cfg0.objective, self.float_names) if twin is not None else self.objective

    def stacked_objective(self) -> _Objective:
        """Bound to the stack's current tensors: the objective of the twin holding them (natively stacked
        members), or of the first member's module (vmapped)."""
        if self.bound_to is not self.stack.flat:
            self._bind()
        return self.stacked

    def data_on(self, dtype: torch.dtype) -> tuple[list[Dataset], torch.Tensor, torch.Tensor]:
        """(per-member datasets, X, Y) in `dtype` on the device; X, Y shared or stacked."""
        ds = [d.to(dtype=dtype, device=self.dev) for d in (self.datas[:1] if self.shared_data else self.datas)]
        X = ds[0].X_train if self.shared_data else torch.stack([d.X_train for d in ds])
        Y = ds[0].Y_train if self.shared_data else torch.stack([d.Y_train for d in ds])
        return (ds * self.M if self.shared_data else ds), X, Y

    def _rows(self, X, Y, idx) -> tuple[torch.Tensor, torch.Tensor]:
        """The mini-batch's rows: ``(B,)`` -> ``B x d``, or ``(M, B)`` -> ``M x B x d``."""
        if idx is not None and self.shared_data:
            return X[idx], Y[idx]
        if idx is not None:
            rows = torch.arange(self.M, device=self.dev)[:, None]
            return X[rows, idx], Y[rows, idx]
        return X, Y

    def __call__(self, X, Y, idx) -> tuple[torch.Tensor, torch.Tensor]:
        return self._parts(*self._rows(X, Y, idx), idx, apart=False)

    def _parts(self, X, Y, idx, apart: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cost, penalty)`` on the batch's rows; `apart`: the penalty of `decay_apart` outside autograd."""
        if self.M == 1:
            m = self.stack.models[0]
            cost = data_cost(self.cfg0.objective, _kernels.forward(m, X), Y)
            pen = _kernels.penalty(m, self.cfg0.lam) if self.use_penalty else torch.zeros_like(cost)
            return cost[None], pen[None]
        stacked = self.stacked_objective()
        state, fl, lam = self.state, self.fl, self.lam
        if apart and self.decay_apart:
            return stacked.cost(X, Y, fl), self._decay_penalty()
        if self.native:
            return stacked(X, Y, lam, fl)

        def one(st, X, Y, lam, fl):
            return functional_call(self.objective, st, (X, Y, lam, fl))

        data_dim = 0 if (idx is not None and idx.dim() == 2) or not self.shared_data else None
        in_dims = (0, data_dim, data_dim, 0 if lam is not None else None, [0] * len(fl))
        return vmap(one, in_dims=in_dims)(state, X, Y, lam, fl)

    def _decay_penalty(self) -> torch.Tensor:
        """λ‖θ‖² per member from `Stack.flat` (`decay_apart`)."""
        return cast(torch.Tensor, self.lam) * torch.linalg.vecdot(self.stack.flat, self.stack.flat)

    def value_and_grad(self, X, Y, idx, value: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``(loss, gradient)``: the members' loss ``(M,)`` (None without `value`) and, in `Stack.grad`
        (``M x P``), the gradient of each member's loss; by hand where `pullbacks`, else by autograd."""
        X, Y = self._rows(X, Y, idx)
        chained = self._chained(X, Y, value) if self.pullbacks else None
        if chained is not None:
            loss, grad = chained
        else:
            cost, pen = self._parts(X, Y, idx, apart=True)
            grad = self.stack.backward(cost, pen)
            loss = (cost + pen).detach() if value else None
        if self.decay_apart:
            with torch.no_grad():
                grad.addcmul_(self.stack.flat, cast(torch.Tensor, self.decay))
        return loss, grad

    def _chained(self, X, Y, value: bool) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """`value_and_grad`'s parts from the model's and the objective's pullbacks, chained without an
        autograd graph (the penalty's gradient not yet added); None where the model's does not apply."""
        stack, stacked = self.stack, self.stacked_objective()
        with torch.no_grad(), stacked.floats(self.fl):
            forward = _kernels.pullback(stacked.model, X, self.leaves)
            if forward is None:
                return None
            out, model_back = forward
            pulled = cost_pullback(self.cfg0.objective, out, Y, value)  # not None: `pullbacks` has its objective
            cost, cost_back = cast(tuple, pulled)
            grads = model_back(cost_back(stack.ones))
            torch.cat([g.reshape(self.M, -1) for g in grads], 1, out=stack.grad)
            loss = cost + self._decay_penalty() if value and self.decay_apart else cost
        return loss, stack.grad
