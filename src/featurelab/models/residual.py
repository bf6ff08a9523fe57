"""Bias-free homogeneous networks built from FC layers, conv layers and residual blocks, with scalar
output (docs/theory/invariances.md §1; Le & Jegelka, ICLR 2022).

Rows are samples: ``HomogeneousNet(...)(X)`` maps ``N x d_in`` to ``N x 1`` (a conv stack reads each row
as a channel-major ``c x H x W`` image). Every activation is unit-wise leaky ReLU with slope `leak` for
z <= 0 (0 = ReLU, 1 = identity), so the network is positively 1-homogeneous in every layer's weights.

Residual blocks (x ∈ R^a, V_1 ∈ R^{b x a}; Part 5 §1), with rows for samples:

    identity: r(x) = σ_out(σ_in(x V_1ᵀ) V_2ᵀ + x)          V_2 ∈ R^{a x b}, fixed skip,
    diagonal: r(x) = σ_out(σ_in(x V_1ᵀ) V_2ᵀ + x ∘ d)      D = diag(d) learnable,
    free:     r(x) = σ_out(σ_in(x V_1ᵀ) V_2ᵀ + x V_3ᵀ)     V_2 ∈ R^{c x b}, V_3 ∈ R^{c x a}.

Stacked members: every stage's forward (and `HomogeneousNet.forward`, `sq_norm`, `penalty`) also runs on
parameters and buffers with a leading member axis M, as the training engine's ensembles pass them
(``Dense.weight`` ``M x d_out x d_in``, ``Dense.leak`` ``M x d_out``, ``ResBlock.d`` ``M x a``, a Conv
kernel ``M x c_out x c_in x k x k``): inputs ``N x d_in`` (shared) or ``M x N x d_in``, outputs
``M x N x 1``, penalties ``(M,)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ..checks import int_at_least, non_negative, one_of
from ..errors import FeaturelabError
from .conv import Conv, leaky, register_leaks, unfold_out
from .forward import Forward
from .mlp import MLP

BLOCK_KINDS = ("identity", "diagonal", "free")
SIGMAS = {"relu": 0.0, "linear": 1.0}


def _gaussian(rows: int, cols: int, scale: float, generator, dtype) -> nn.Parameter:
    """N(0, scale²/cols) entries (Part 5 §6: std s/sqrt(fan_in))."""
    w = torch.randn(rows, cols, generator=generator, dtype=torch.float64) * (scale / math.sqrt(cols))
    return nn.Parameter(w.to(dtype))


class Dense(nn.Module):
    """Bias-free FC layer ``z = a Wᵀ`` (W: ``d_out x d_in``) followed by unit-wise σ with slope `leak`
    (a number or ``d_out`` numbers; 0 ReLU, 1 linear). ``weight=`` reuses an existing Parameter.
    Stacked members: W ``M x d_out x d_in``, leak ``M x d_out``; a ``N x d_in`` or ``M x N x d_in``
    gives ``M x N x d_out``."""

    leak: torch.Tensor  # buffer, one slope per output unit
    leak_kind: str  # leak_kind(leak), kept from construction and load_state_dict

    def __init__(
        self,
        d_in: int,
        d_out: int,
        leak: float | Sequence[float] | torch.Tensor = 0.0,
        init_scale: float = 1.0,
        generator: torch.Generator | None = None,
        dtype=torch.float64,
        weight: nn.Parameter | None = None,
    ):
        super().__init__()
        int_at_least("d_in", d_in, 1)
        int_at_least("d_out", d_out, 1)
        non_negative("init_scale", init_scale)
        self.weight = weight if weight is not None else _gaussian(d_out, d_in, init_scale, generator, dtype)
        register_leaks(self, leak, d_out)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a @ self.weight.mT

    def act(self, z: torch.Tensor) -> torch.Tensor:
        return leaky(z, self.leak, kind=self.leak_kind)

    def extra_repr(self) -> str:
        return f"weight={tuple(self.weight.shape)}"


class Flatten(nn.Module):
    """``N x c x H x W`` -> ``N x (c·H·W)``, channel-major (no parameters). With ``item_dims`` (the
    number of axes of one sample, 3 for ``c x H x W``) only the trailing ``item_dims`` axes are merged,
    so stacked members' ``M x N x c x H x W`` gives ``M x N x (c·H·W)``."""

    def forward(self, a: torch.Tensor, item_dims: int | None = None) -> torch.Tensor:
        if item_dims is None:
            return a.reshape(a.shape[0], -1)
        return a.flatten(a.dim() - item_dims)


def _slope(sigma: str | float) -> float:
    """The slope a of σ_a named by `sigma`: "relu" (0), "linear" (1), or a number."""
    return float(SIGMAS.get(sigma, sigma) if isinstance(sigma, str) else sigma)


class ResBlock(nn.Module):
    """ResNetIdentity / ResNetDiagonal / ResNetFree block (Part 5 §1), bias-free.

    Args:
        kind: "identity", "diagonal" or "free".
        a: input width; b: hidden width; c: output width (must equal a unless kind="free").
        sigma_in, sigma_out: "relu" or "linear" (or a slope number) inside and after the block.
        init_scale: s; V_i ~ N(0, s²/fan_in); the diagonal d starts at s·1 [ours].
    ``forward(x)`` returns ``(z_hidden, z_out)`` pre-activations; ``act_in``/``act_out`` apply σ.
    Stacked members: V_i ``M x rows x cols``, d ``M x a``; x ``N x a`` or ``M x N x a`` gives
    ``M x N x b`` and ``M x N x c``.
    """

    def __init__(
        self,
        kind: str,
        a: int,
        b: int,
        c: int | None = None,
        sigma_in: str | float = "relu",
        sigma_out: str | float = "linear",
        init_scale: float = 1.0,
        generator: torch.Generator | None = None,
        dtype=torch.float64,
    ):
        super().__init__()
        one_of("kind", kind, BLOCK_KINDS)
        c = a if c is None else c
        for name, v in (("a", a), ("b", b), ("c", c)):
            int_at_least(name, v, 1)
        if kind != "free" and c != a:
            raise FeaturelabError(f"c={c} is not allowed for a {kind} block: its skip needs c = a = {a}")
        self.kind, self.a, self.b, self.c = kind, a, b, c
        self.leak_in = _slope(sigma_in)
        self.leak_out = _slope(sigma_out)
        self.V1 = _gaussian(b, a, init_scale, generator, dtype)
        self.V2 = _gaussian(c, b, init_scale, generator, dtype)
        if kind == "free":
            self.V3 = _gaussian(c, a, init_scale, generator, dtype)
        if kind == "diagonal":
            self.d = nn.Parameter(torch.full((a,), float(init_scale), dtype=dtype))

    def skip(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "identity":
            return x
        if self.kind == "diagonal":
            return x * self.d.unsqueeze(-2)  # (1 x a), or M x 1 x a for stacked members
        return x @ self.V3.mT

    def act_in(self, z: torch.Tensor) -> torch.Tensor:
        return torch.where(z > 0, z, self.leak_in * z)

    def act_out(self, z: torch.Tensor) -> torch.Tensor:
        return torch.where(z > 0, z, self.leak_out * z)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x @ self.V1.mT
        return h, self.act_in(h) @ self.V2.mT + self.skip(x)

    def extra_repr(self) -> str:
        return f"kind={self.kind}, a={self.a}, b={self.b}, c={self.c}, leak_in={self.leak_in}, leak_out={self.leak_out}"


def block_out_matrix(block: ResBlock, get=lambda p: p) -> torch.Tensor:
    """The block's output-side matrix B: [V_2, V_3] (free), [V_2, D] (diagonal), V_2 (identity); `get`
    maps each Parameter to the tensor to use (the parameter itself, or its gradient). ``c x (b + a)``
    (``c x b`` identity), or ``M x ...`` for stacked members."""
    if block.kind == "free":
        return torch.cat([get(block.V2), get(block.V3)], dim=-1)
    if block.kind == "diagonal":
        return torch.cat([get(block.V2), torch.diag_embed(get(block.d))], dim=-1)
    return get(block.V2)


def block_in_matrix(block: ResBlock, get=lambda p: p) -> torch.Tensor:
    """The block's input-side matrix A: [V_1; V_3] (free), [V_1; D] (diagonal), V_1 (identity).
    ``(b + c) x a`` (``b x a`` identity), or ``M x ...`` for stacked members."""
    if block.kind == "free":
        return torch.cat([get(block.V1), get(block.V3)], dim=-2)
    if block.kind == "diagonal":
        return torch.cat([get(block.V1), torch.diag_embed(get(block.d))], dim=-2)
    return get(block.V1)


class HomogeneousNet(nn.Module):
    """A sequence of `Dense`, `Conv`, `Flatten` and `ResBlock` stages with scalar, linear output
    (Part 5 §1). `input_shape` is ``(c, H, W)`` when the first stage is a Conv (rows of X are then
    channel-major images), else None. The last stage must be a Dense with one linear output unit.

    Implements the training engine's `Stackable` protocol: ``forward`` and ``penalty`` also run on every
    parameter and buffer stacked along a leading member axis M (inputs ``N x d_in`` or ``M x N x d_in``,
    outputs ``M x N x 1``, penalties ``(M,)``), so an ensemble is one batched forward pass, Conv stages
    included (grouped convolutions). `weight_matrices` and `layer_matrices` read one member's tensors.
    """

    member_floats: tuple[str, ...] = ()  # float attributes (the ResBlock slopes) must be equal across a stacked forward

    def __init__(self, stages: Sequence[nn.Module], input_shape: tuple[int, int, int] | None = None):
        super().__init__()
        self.stages = nn.ModuleList(stages)
        if (
            not stages
            or not isinstance(stages[-1], Dense)
            or stages[-1].weight.shape[0] != 1
            or float(stages[-1].leak[0]) != 1.0
        ):
            raise FeaturelabError("stages must end with Dense(n, 1, leak=1.0): Part 5 networks have one linear output")
        shape: int | tuple[int, ...]
        if input_shape is not None:
            shape = tuple(input_shape)
        elif isinstance(stages[0], Dense):
            shape = stages[0].weight.shape[1]
        elif isinstance(stages[0], ResBlock):
            shape = stages[0].a
        else:
            raise FeaturelabError("input_shape=None is not allowed when the first stage is a Conv: give (c, H, W)")
        self.input_shape = shape if isinstance(shape, tuple) else None
        self.d_in = math.prod(shape) if isinstance(shape, tuple) else int(shape)
        self.shapes = [shape]  # shape entering each stage, then the output shape
        for i, s in enumerate(stages):
            if isinstance(s, Conv):
                shape = s.out_shape(shape if isinstance(shape, tuple) else (shape,))
            elif isinstance(s, Flatten):
                if not isinstance(shape, tuple):
                    raise FeaturelabError(f"stage {i} (Flatten) needs an image input, got width {shape}")
                shape = math.prod(shape)
            elif isinstance(s, (Dense, ResBlock)):
                n_in = s.weight.shape[1] if isinstance(s, Dense) else s.a
                if isinstance(shape, tuple) or shape != n_in:
                    raise FeaturelabError(f"stage {i} ({type(s).__name__}) reads width {n_in} but gets {shape}")
                shape = s.weight.shape[0] if isinstance(s, Dense) else s.c
            else:
                raise FeaturelabError(f"stage {i} is a {type(s).__name__}; allowed: Dense, Conv, Flatten, ResBlock")
            self.shapes.append(shape)

    def forward(self, X: torch.Tensor, return_layers: bool = False):
        """X: ``N x d_in`` -> ``N x 1``; with ``return_layers=True`` a `Forward` of every unit layer.
        Stacked members: X ``N x d_in`` or ``M x N x d_in`` -> ``M x N x 1``."""
        a = X.reshape(*X.shape[:-1], *self.input_shape) if self.input_shape else X
        pre: dict[tuple[int, str], torch.Tensor] = {}
        act: dict[tuple[int, str], torch.Tensor] = {}
        for i, s in enumerate(self.stages):
            if isinstance(s, Flatten):
                shape = self.shapes[i]
                a = s(a, len(shape) if isinstance(shape, tuple) else 1)
                continue
            if isinstance(s, ResBlock):
                h, z = s(a)
                pre[(i, "hidden")], act[(i, "hidden")] = h, s.act_in(h)
                a = s.act_out(z)
            else:
                assert isinstance(s, (Dense, Conv))  # the constructor admits nothing else
                z = s(a)
                a = s.act(z)
            pre[(i, "out")], act[(i, "out")] = z, a
        if return_layers:
            return Forward(pre[(len(self.stages) - 1, "out")], pre, act)
        return a

    def weight_matrices(self) -> list[torch.Tensor]:
        """Each parameter stage's output-side matrix B (Part 5 §1): W, B(K), or [V_2, V_3]/[V_2, D]/V_2."""
        out = []
        for s in self.stages:
            if isinstance(s, Dense):
                out.append(s.weight)
            elif isinstance(s, Conv):
                out.append(unfold_out(s.weight))
            elif isinstance(s, ResBlock):
                out.append(block_out_matrix(s))
        return out

    def layer_matrices(self) -> list[torch.Tensor]:
        """Matrices whose spectra the trainer logs (the B unfoldings)."""
        return self.weight_matrices()

    def sq_norm(self) -> torch.Tensor:
        """‖θ‖², a 0-d tensor, or ``(M,)`` (one per member) for stacked members."""
        last = self.stages[-1]
        assert isinstance(last, Dense)  # the constructor checks it
        if last.weight.dim() == 2:  # one model (stacked members: M x 1 x n)
            return torch.stack([(p**2).sum() for p in self.parameters()]).sum()
        return torch.stack([(p**2).flatten(1).sum(1) for p in self.parameters()]).sum(0)

    def penalty(self, lam) -> torch.Tensor:
        """λ‖θ‖² (Part 5 trains with λ = 0); λ a float, or ``(M,)`` for stacked members (result ``(M,)``)."""
        return lam * self.sq_norm()


def as_homogeneous(model: nn.Module) -> HomogeneousNet:
    """`model` as a `HomogeneousNet` sharing its Parameters (gradients land on the same tensors).

    Accepts a HomogeneousNet (returned as is) or a bias-free leaky-ReLU `MLP` with one output (its
    linear tail becomes slope-1 units). Anything else raises a one-line error saying why Part 5's
    tools (paths, invariants, alignment) do not cover it.
    """
    if isinstance(model, HomogeneousNet):
        return model
    if isinstance(model, MLP):
        reasons = []
        if model.bias != 0:
            reasons.append(f"every layer has a bias column (bias={model.bias}); Part 5 networks are bias-free")
        if model.activation != "leaky_relu":
            reasons.append(f"activation={model.activation!r} is not positively 1-homogeneous")
        if model.dims[-1] != 1:
            reasons.append(f"d_out={model.dims[-1]}; Part 5 networks have one output")
        if reasons:
            raise FeaturelabError(f"MLP not covered by Part 5 tools: {'; '.join(reasons)}")
        stages = []
        for l, W in enumerate(model.weights, start=1):
            leak = 1.0 if l == model.depth or l > model.depth - model.linear_tail else model.leak
            stages.append(Dense(W.shape[1], W.shape[0], leak, weight=W))
        return HomogeneousNet(stages)
    raise FeaturelabError(
        f"model of type {type(model).__name__} is not covered by Part 5 tools: give a "
        "HomogeneousNet or a bias-free leaky-ReLU MLP with one output"
    )
