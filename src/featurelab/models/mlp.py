"""Deep fully-connected networks with homogeneous activations (docs/theory (parts 2-5)).

Rows are samples: ``model(X)`` maps ``N x d_in`` to ``N x d_out``.

Layer ``l = 1..L`` (L = `depth`, the number of weight matrices) computes, in docs/theory/sparsity.md §1's
notation with rows for samples,

    Z_l = [Zσ_{l-1}, β·1] @ W_lᵀ,     Zσ_l = σ(Z_l)  (hidden layers),     output Z_L,

where ``W_l`` has shape ``n_l x (n_{l-1} + 1)`` when the bias amount β > 0 (its last column is the
bias, penalized like any weight) and ``n_l x n_{l-1}`` when β = 0 (bias-free). With β = 1 this is the
usual ``W α + b`` of Part 2 §1. The activation is the leaky-ReLU family σ_a(x) = x for x > 0 and a·x
otherwise (a = 0: ReLU, a = 1: linear, a ∈ (-1, 1) in Part 2); σ'(0) = a, as torch's ReLU has
σ'(0) = 0 (Part 4 §8.4). ``activation="tanh"`` exists for the checks that need a non-homogeneous net.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..checks import int_at_least, non_negative, one_of
from ..errors import FeaturelabError
from .forward import Forward
from .gemm import product

ACTIVATIONS = ("leaky_relu", "tanh")
INITS = ("he", "fan_in", "absolute")


def leaky_relu(x: torch.Tensor, leak: float) -> torch.Tensor:
    """σ_a(x) = x for x > 0, a·x otherwise (σ'(0) = a; a = 0 is exactly torch.relu)."""
    if leak == 0.0:
        return torch.relu(x)
    if leak == 1.0:
        return x
    return torch.where(x > 0, x, leak * x)


def affine(a: torch.Tensor, W: torch.Tensor, beta: float) -> torch.Tensor:
    """``[a, β·1] @ Wᵀ`` in one BLAS call (addmm, or baddbmm for stacked members), without building
    ``[a, β·1]``: W's last column is the bias when β > 0.

    a: ``N x n`` or ``M x N x n``; W: ``m x (n+1)`` (``m x n`` when β = 0), or ``M x m x (n+1)`` stacked.
    """
    if beta == 0:
        return a @ W.mT
    weight, bias = W[..., :-1].mT, W[..., -1:].mT  # (M x) n x m, (M x) 1 x m
    if W.dim() == 3:
        return torch.baddbmm(bias, a.expand(W.shape[0], *a.shape[-2:]), weight, beta=beta)
    if a.dim() == 2:
        return torch.addmm(bias, a, weight, beta=beta)
    return a @ weight + beta * bias


def _activate_(z: torch.Tensor, slope: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(σ_slope(z), z or None)``: σ in place on the fresh pre-activation `z` where σ' can be read off
    σ(z) (slope >= 0: σ(z) > 0 exactly where z > 0), else out of place, keeping `z` for the backward."""
    if slope == 1.0:
        return z, None
    if slope == 0.0:
        return z.clamp_min_(0), None  # torch.relu's kernel
    if slope > 0:
        return torch.nn.functional.leaky_relu_(z, slope), None
    return torch.nn.functional.leaky_relu(z, slope), z


def _watched() -> bool:
    """Whether a torch.func transform or a torch function mode is active (the one-node path then steps
    aside). These are torch's private hooks: where one is missing, assume watched and take the plain path."""
    try:
        return bool(torch._C._are_functorch_transforms_active()) or torch._C._len_torch_function_stack() > 0
    except AttributeError:
        return True


class _DirectContext:
    """A stand-in for the context an ``autograd.Function`` gets, to call its ``forward`` and ``backward``
    directly, without an autograd graph (a training step that chains them itself). Its backward runs once
    (`once`: it may reuse what the forward kept, in place)."""

    once = True

    def __init__(self, inputs: int):
        self.needs_input_grad = (False,) * inputs

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved_tensors = tensors


def _activate_backward(g: torch.Tensor, a: torch.Tensor, z: torch.Tensor | None, slope: float, out: torch.Tensor):
    """``out = g ⊙ σ'_slope(Z)`` with σ' = 1 for Z > 0 and slope otherwise (σ'(0) = slope, as torch's ReLU
    and leaky ReLU), read off ``a = σ(Z)`` or, for a negative slope, off ``z = Z``."""
    if slope == 1.0:
        out.copy_(g)
    elif slope == 0.0:
        torch.ops.aten.threshold_backward.grad_input(g, a, 0, grad_input=out)
    elif z is None:
        torch.ops.aten.leaky_relu_backward.grad_input(g, a, slope, True, grad_input=out)
    else:
        torch.ops.aten.leaky_relu_backward.grad_input(g, z, slope, False, grad_input=out)


def _input_rows(X: torch.Tensor, beta: float) -> torch.Tensor:
    """The shared input ``N x d`` with samples as columns and the bias row, ``[Xᵀ; β·1ᵀ]`` (``(d+1) x N``, a
    transposed view); ``Xᵀ`` when β = 0."""
    return (torch.cat([X, X.new_full((X.shape[0], 1), beta)], 1) if beta > 0 else X).mT


def _affine_columns(aT: torch.Tensor, W: torch.Tensor, beta: float) -> torch.Tensor:
    """``W[i] @ [aT[i]; β·1ᵀ]`` for every member i, samples as columns: W ``M x m x (n+1)`` (``n`` when
    β = 0), aT ``M x n x N``, or the shared input with its bias row (`_input_rows`, ``(n+1) x N``: one
    ``(M·m) x N`` product for all members, `gemm.product`); ``M x m x N``."""
    M, m, n = W.shape[0], W.shape[1], aT.shape[-2]
    if aT.dim() == 2:
        return product(W.reshape(M * m, -1), aT).view(M, m, -1)
    if beta > 0:
        return torch.baddbmm(W[..., n:], W[..., :n], aT, beta=beta)
    return torch.bmm(W, aT)


def _with_bias_grad(dW: torch.Tensor, gT: torch.Tensor, beta: float) -> torch.Tensor:
    """The gradient of a stored weight: ``[dW, β·Σ_samples G]`` (the bias column) when β > 0; `gT` holds
    ``Gᵀ``, samples along its last dim."""
    if beta == 0:
        return dW
    g_sum = gT.sum(-1, keepdim=True)
    return torch.cat([dW, g_sum if beta == 1 else g_sum.mul_(beta)], -1)


class _StackedForward(torch.autograd.Function):
    """The stacked leaky-ReLU MLP (``Z_l = [Zσ_{l-1}, β·1] @ W_lᵀ`` for every member at once) as one autograd
    node with the chain rule written out: for the incoming gradient ``G = ∂C/∂Z_l`` (``N x n_l`` per member),
    ``∂C/∂W_l = [Gᵀ Zσ_{l-1}, β·Gᵀ1]`` and ``∂C/∂Zσ_{l-1} = G W_l[:, :n_{l-1}]``, then
    ``∂C/∂Z_{l-1} = ∂C/∂Zσ_{l-1} ⊙ σ'(Z_{l-1})``. Inside, samples are columns (``M x n x N``): a CPU's
    batched products and the cross-entropy over classes run faster on that layout.

    X: ``N x d_in`` (shared: the first layer is one matrix product for all members, its bias column's
    gradient included, and ∂C/∂X sums over them) or ``M x N x d_in``; Ws: ``M x n_l x (n_{l-1}+1)``
    (``n_{l-1}`` when β = 0); slopes: the slope a of σ after each hidden layer (1 inside a linear tail).
    Output ``M x N x d_out`` (a transposed view). First order only (`once_differentiable`: a double backward
    raises instead of going wrong).
    """

    @staticmethod
    def forward(ctx, X, beta: float, slopes: tuple[float, ...], *Ws):
        acts, pre, aT = [], [], (X.mT if X.dim() == 3 else _input_rows(X, beta))
        for l, W in enumerate(Ws):
            acts.append(aT)
            zT = _affine_columns(aT, W, beta)
            if l == len(Ws) - 1:
                break
            aT, kept = _activate_(zT, slopes[l])
            pre.append(kept)
        ctx.save_for_backward(X, *Ws)
        ctx.acts, ctx.pre, ctx.beta, ctx.slopes = acts, pre, beta, slopes
        return zT.mT

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        X, *Ws = ctx.saved_tensors
        M, N, beta = Ws[0].shape[0], X.shape[-2], ctx.beta
        grads: list[torch.Tensor | None] = [None] * len(Ws)
        gX, gT = None, g.mT
        for l in reversed(range(len(Ws))):
            W, aT = Ws[l], ctx.acts[l]
            m, n = W.shape[1], aT.shape[-2]
            if aT.dim() == 2:  # the shared input: one product for all members, the bias column's too
                flat = gT.reshape(M * m, N)
                grads[0] = product(flat, aT.mT).view(M, m, -1)
                if ctx.needs_input_grad[0]:
                    gX = flat.mT @ W.reshape(M * m, -1)[:, : X.shape[-1]]
                break
            grads[l] = _with_bias_grad(torch.bmm(gT, aT.mT), gT, beta)
            if l == 0:
                if ctx.needs_input_grad[0]:
                    gX = torch.bmm(gT.mT, W[..., :n])
                break
            gaT = torch.bmm(W[..., :n].mT, gT)
            _activate_backward(gaT, aT, ctx.pre[l - 1], ctx.slopes[l - 1], out=gaT)
            gT = gaT
        return (gX, None, None, *grads)


class _WeightDecay(torch.autograd.Function):
    """``λ Σ_l ‖W_l‖²_F`` (``(M,)`` for stacked ``M x ...`` weights with λ a float or ``(M,)``; 0-d for one net)
    as one autograd node: one dot product per layer forward, ``∂/∂W_l = 2λ·g·W_l`` backward, written with
    differentiable ops (a double backward, as Hessian-vector products take, differentiates them)."""

    @staticmethod
    def forward(ctx, lam, *Ws):
        ctx.save_for_backward(*Ws)
        ctx.lam = lam
        total = torch.linalg.vecdot(Ws[0].flatten(-2), Ws[0].flatten(-2))
        for W in Ws[1:]:
            total = total + torch.linalg.vecdot(W.flatten(-2), W.flatten(-2))
        return lam * total

    @staticmethod
    def backward(ctx, g):
        scale = (2 * ctx.lam * g)[..., None, None]
        return (None, *(W * scale for W in ctx.saved_tensors))


class MLP(nn.Module):
    """Deep fully-connected network of `depth` weight matrices (docs/theory/bottleneck-rank.md §1, Part 3 §1).

    ``forward`` and ``penalty`` also run on weights stacked along a leading member axis
    (``M x n_l x (n_{l-1}+1)``, as the training engine's ensembles pass them): inputs ``N x d_in`` or
    ``M x N x d_in``, outputs ``M x N x d_out``, penalties ``(M,)``.

    Args:
        d_in, d_out: input and output dimensions.
        width: an int (every hidden layer) or a list of ``depth - 1`` hidden widths.
        depth: L, the number of weight matrices (L - 1 nonlinearities), L >= 1.
        leak: a of σ_a (0 = ReLU, 1 = linear).
        bias: bias amount β >= 0; 0 is bias-free, otherwise a constant β is appended to each layer's input.
        init_scale: multiplies the init standard deviation (see `init`).
        init: "he": std = init_scale·sqrt(2 / ((1 + a²)·fan_in)) (Part 2 §3.1);
              "fan_in": std = init_scale / sqrt(fan_in) (Part 5 §6);
              "absolute": std = init_scale for every entry (Part 4 §6). Bias columns start at 0.
        linear_tail: K >= 0; the last K weight matrices act linearly (their inputs skip σ), Part 5 §4.
        activation: "leaky_relu" (default) or "tanh".
        seed: seed of the init (a private generator; the global RNG is untouched).
        dtype: torch.float32 (default) or torch.float64.
    """

    member_floats = ("init_scale",)  # floats that may differ in a stacked forward (init_scale is not read)
    penalty_is_squared_norm = True  # penalty(λ) = λ‖θ‖² over `weights`, its only parameters

    def __init__(
        self,
        d_in: int,
        d_out: int,
        width: int | list[int],
        depth: int,
        leak: float = 0.0,
        bias: float = 0.0,
        init_scale: float = 1.0,
        init: str = "he",
        linear_tail: int = 0,
        activation: str = "leaky_relu",
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        int_at_least("depth", depth, 1)
        int_at_least("d_in", d_in, 1)
        int_at_least("d_out", d_out, 1)
        non_negative("bias", bias)
        non_negative("init_scale", init_scale)
        one_of("init", init, INITS)
        one_of("activation", activation, ACTIVATIONS)
        widths = [width] * (depth - 1) if isinstance(width, int) else list(width)
        if len(widths) != depth - 1 or any(not isinstance(w, int) or w < 1 for w in widths):
            raise FeaturelabError(
                f"width={width!r} is not allowed for depth={depth}: give an int >= 1 or a list of {depth - 1} ints >= 1"
            )
        if not 0 <= linear_tail <= depth:
            raise FeaturelabError(f"linear_tail={linear_tail!r} is not allowed: it must be in [0, depth={depth}]")
        self.dims = [d_in, *widths, d_out]
        self.depth = depth
        self.leak = float(leak)
        self.bias = float(bias)
        self.init, self.init_scale = init, float(init_scale)
        self.linear_tail = linear_tail
        self.activation = activation
        gen = torch.Generator().manual_seed(seed)
        extra = 1 if self.bias > 0 else 0
        layers = []
        for fan_in, fan_out in zip(self.dims[:-1], self.dims[1:]):
            if init == "he":
                std = init_scale * math.sqrt(2.0 / ((1.0 + self.leak**2) * fan_in))
            elif init == "fan_in":
                std = init_scale / math.sqrt(fan_in)
            else:
                std = init_scale
            w = torch.zeros(fan_out, fan_in + extra, dtype=torch.float64)
            w[:, :fan_in] = torch.randn(fan_out, fan_in, generator=gen, dtype=torch.float64) * std
            layers.append(nn.Parameter(w.to(dtype)))
        self.weights = nn.ParameterList(layers)

    # ----------------------------------------------------------------------------------- forward
    @property
    def homogeneous(self) -> bool:
        """True when σ is positively 1-homogeneous (the covariance and invariance tools need it)."""
        return self.activation == "leaky_relu"

    def sigma(self, z: torch.Tensor, layer: int) -> torch.Tensor:
        """Activation applied after hidden layer `layer` (1-based); identity inside the linear tail."""
        if layer > self.depth - self.linear_tail:
            return z
        if self.activation == "tanh":
            return torch.tanh(z)
        return leaky_relu(z, self.leak)

    def with_bias(self, a: torch.Tensor) -> torch.Tensor:
        """``[a, β·1]`` (N x (n+1), or M x N x (n+1)) when β > 0, else `a` unchanged."""
        if self.bias == 0:
            return a
        return torch.cat([a, torch.full_like(a[..., :1], self.bias)], dim=-1)

    def forward(self, X: torch.Tensor, return_layers: bool = False):
        """X: ``N x d_in`` -> output ``N x d_out``; with ``return_layers=True`` a `Forward` with
        ``output`` (= ``pre[-1]``), ``pre = [Z_1, ..., Z_L]`` (``pre[l-1]`` is ``N x n_l``) and
        ``act = [Zσ_0 = X, Zσ_1, ..., Zσ_{L-1}]`` (activations without the bias column).

        Stacked weights run as one node with a hand-written backward (`_StackedForward`) when σ is the
        leaky-ReLU family in float32/float64 (its forward alone, with samples as columns, where there is no
        gradient to take); anything else takes the plain path below."""
        Ws = list(self.weights)
        if not return_layers and self._one_node(X, Ws):
            if torch.is_grad_enabled() and (X.requires_grad or any(W.requires_grad for W in Ws)):
                return _StackedForward.apply(X, self.bias, self._slopes(), *Ws)
            return _StackedForward.forward(_DirectContext(3 + len(Ws)), X, self.bias, self._slopes(), *Ws)
        a, pre, act = X, [], [X]
        for l, W in enumerate(Ws, start=1):
            z = affine(a, W, self.bias)
            pre.append(z)
            if l < self.depth:
                a = self.sigma(z, l)
                act.append(a)
        if return_layers:
            return Forward(pre[-1], pre, act)
        return pre[-1]

    def stacked_pullback(self, X: torch.Tensor, Ws: list[torch.Tensor]):
        """The one-node forward pass (`_StackedForward`) with the stacked weights `Ws` (``M x ...``, in the
        order of `weights`) and its pullback, called directly (no autograd graph; the training step chains
        them itself): ``(output, pullback)``, the output ``M x N x d_out`` and ``pullback(G)`` the gradients
        of ⟨G, output⟩ with respect to `Ws` (call it with gradients off). None where that path does not
        apply (`_one_node`)."""
        if not self._one_node(X, Ws):
            return None
        ctx = _DirectContext(3 + len(Ws))
        out = _StackedForward.forward(ctx, X, self.bias, self._slopes(), *Ws)
        return out, lambda g: list(_StackedForward.backward(ctx, g)[3:])

    def _slopes(self) -> tuple[float, ...]:
        """The slope a of σ after each hidden layer (1 inside the linear tail)."""
        return tuple(1.0 if l > self.depth - self.linear_tail else self.leak for l in range(1, self.depth))

    def _one_node(self, X: torch.Tensor, Ws: list[torch.Tensor]) -> bool:
        """Stacked ``M x ...`` weights `Ws` on the CPU (the path has not run on a GPU yet: CUDA keeps the plain
        path, which its checks cover), X ``N x d`` or ``M x N x d`` of their dtype (float32/64) and device, σ
        leaky ReLU, and no torch.func transform or torch function mode watching."""
        W0 = Ws[0]
        return (
            self.activation == "leaky_relu"
            and W0.dim() == 3
            and W0.device.type == "cpu"
            and X.dim() in (2, 3)
            and (X.dim() == 2 or X.shape[0] == W0.shape[0])
            and X.dtype in (torch.float32, torch.float64)
            and all(W.dim() == 3 and W.dtype == X.dtype and W.device == X.device for W in Ws)
            and not _watched()
        )

    # ------------------------------------------------------------------------------ parameters
    def weight_matrices(self) -> list[torch.Tensor]:
        """``[W_1, ..., W_L]`` without the bias column, each ``n_l x n_{l-1}``."""
        return [W[:, : self.dims[l]] for l, W in enumerate(self.weights)]

    def biases(self) -> list[torch.Tensor]:
        """The bias columns times β (the effective biases b_l), or zeros when β = 0."""
        if self.bias == 0:
            return [torch.zeros(W.shape[0], dtype=W.dtype, device=W.device) for W in self.weights]
        return [self.bias * W[:, -1] for W in self.weights]

    def layer_matrices(self) -> list[torch.Tensor]:
        """Matrices whose spectra the trainer logs: ``[W_1, ..., W_L]`` without the bias column (the
        bias is not part of the features' linear map; `LeakyResNet.layer_matrices` keeps it because
        Part 1's W_l acts on ``[A, 1]``)."""
        return self.weight_matrices()

    def sq_norm(self) -> torch.Tensor:
        """‖θ‖² = Σ_l ‖W_l‖²_F including the bias columns (per member for stacked weights)."""
        return self.penalty(1.0)

    def penalty(self, lam) -> torch.Tensor:
        """L2 penalty λ‖θ‖² of Parts 2-3 (the loss is C + λ‖θ‖²); λ a float, or ``(M,)`` for stacked weights.
        One autograd node (`_WeightDecay`) unless a torch.func transform or torch function mode watches."""
        Ws = list(self.weights)
        if _watched():
            return lam * torch.stack([(W**2).sum((-2, -1)) for W in Ws]).sum(0)
        return _WeightDecay.apply(lam, *Ws)

    def extra_repr(self) -> str:
        return (
            f"dims={self.dims}, leak={self.leak}, bias={self.bias}, activation={self.activation}, "
            f"linear_tail={self.linear_tail}"
        )


def mlp_with_weights(model: MLP, weights: list[torch.Tensor]) -> MLP:
    """A float64 `MLP` with `model`'s architecture (σ, β, linear tail) and the given weights (stored layout,
    ``n_l x (n_{l-1}+1)`` with bias column when β > 0), on the weights' device; hidden widths are read off
    the weights."""
    widths = [int(W.shape[0]) for W in weights[:-1]]
    new = MLP(
        model.dims[0],
        model.dims[-1],
        widths,
        model.depth,
        leak=model.leak,
        bias=model.bias,
        linear_tail=model.linear_tail,
        activation=model.activation,
        dtype=torch.float64,
    )
    new.to(weights[0].device)
    with torch.no_grad():
        for p, W in zip(new.weights, weights):
            p.copy_(W)
    return new
