"""Deep fully-connected networks with homogeneous activations (Jacot, arXiv 2306.00394 §2 "Setup"; Jacot et al.,
arXiv 2205.15809; docs/theory/bottleneck-rank.md §1, docs/theory/sparsity.md §1).

Rows are samples: ``model(X)`` maps ``N x d_in`` to ``N x d_out``.

Layer ``l = 1..L`` (L = `depth`, the number of weight matrices) computes, in docs/theory/sparsity.md §1's
notation with rows for samples,

    Z_l = [Zσ_{l-1}, β·1] @ W_lᵀ,     Zσ_l = σ(Z_l)  (hidden layers),     output Z_L,

where ``W_l`` has shape ``n_l x (n_{l-1} + 1)`` when the bias amount β > 0 (its last column is the
bias, penalized like any weight) and ``n_l x n_{l-1}`` when β = 0 (bias-free). With β = 1 this is the
usual ``W α + b`` of Part 2 §1. The activation is the leaky-ReLU family σ_a(x) = x for x > 0 and a·x
otherwise (a = 0: ReLU, a = 1: linear, a ∈ (-1, 1) in Part 2); σ'(0) = a, as torch's ReLU has
σ'(0) = 0 (Part 4 §8.4). ``activation="tanh"`` exists for the checks that need a non-homogeneous net. The
loss is C + λ‖θ‖² with λ‖θ‖² = λ Σ_l ‖W_l‖²_F (`MLP.penalty`). The training core runs stacked members through a
fused CPU kernel of these formulas where it applies (`featurelab.training._kernels`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..checks import int_at_least, non_negative, one_of
from ..errors import FeaturelabError
from .forward import Forward

ACTIVATIONS = ("leaky_relu", "tanh")
INITS = ("he", "fan_in", "absolute")


def leaky_relu(x: torch.Tensor, leak: float) -> torch.Tensor:
    """σ_a(x) = x for x > 0, a·x otherwise (σ'(0) = a; a = 0 is exactly torch.relu)."""
    if leak == 0.0:
        return torch.relu(x)
    if leak == 1.0:
        return x
    return torch.nn.functional.leaky_relu(x, leak)


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
        """X: ``N x d_in`` -> output ``N x d_out``: ``Z_l = [σ(Z_{l-1}), β·1] W_lᵀ`` for l = 1..L (module
        docstring); with ``return_layers=True`` a `Forward` with ``output`` (= ``pre[-1]``),
        ``pre = [Z_1, ..., Z_L]`` (``pre[l-1]`` is ``N x n_l``) and ``act = [Zσ_0 = X, Zσ_1, ..., Zσ_{L-1}]``
        (activations without the bias column)."""
        a, pre, act = X, [], [X]
        for l, W in enumerate(self.weights, start=1):
            z = affine(a, W, self.bias)
            pre.append(z)
            if l < self.depth:
                a = self.sigma(z, l)
                act.append(a)
        if return_layers:
            return Forward(pre[-1], pre, act)
        return pre[-1]

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

    def neurons(self, call: int) -> list[tuple[str, int]]:
        """Where the neurons of hidden layer ``call + 1`` (the activation's call-th use in a forward pass, 0-based)
        sit among the parameters: ``[(name, axis)]`` such that neuron j's weights are index j along `axis` of each
        named parameter, its incoming row of W_l (bias entry included) and its outgoing column of W_{l+1} (Jacot,
        Golikov, Hongler, Gabriel 2022, arXiv 2205.15809 §2: a neuron's input and output weights). Zeroing them
        removes the neuron from the function and from the penalty."""
        return [(f"weights.{call}", 0), (f"weights.{call + 1}", 1)]

    def sq_norm(self) -> torch.Tensor:
        """‖θ‖² = Σ_l ‖W_l‖²_F including the bias columns (per member for stacked weights)."""
        return self.penalty(1.0)

    def penalty(self, lam) -> torch.Tensor:
        """The weight decay λ‖θ‖² = λ Σ_l ‖W_l‖²_F of the regularized loss C + λ‖θ‖² (Jacot, arXiv 2306.00394 §2.1;
        docs/theory/bottleneck-rank.md §1), bias columns included; λ a float, or ``(M,)`` for stacked weights
        (result ``(M,)``)."""
        return lam * torch.stack([(W**2).sum((-2, -1)) for W in self.weights]).sum(0)

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
