"""Converters between plain PyTorch chains and featurelab's `MLP` (rows are samples throughout).

`from_torch` reads an ``nn.Sequential`` of ``nn.Linear`` layers separated by one activation kind
(ReLU, LeakyReLU(a), Tanh) as an `MLP` with the same outputs; `to_torch` writes an `MLP` back as such
a chain. `as_mlp` is the entry coercion of the tools that need an `MLP`.

Biases: the `MLP` stores the bias of layer l as the last column of ``W_l``, scaled by one bias amount β
(``z = [a, β·1] @ W_lᵀ``, docs/theory/sparsity.md §1). A chain with biases becomes an MLP with β = 1 and
bias column ``b_l``; a bias-free chain an MLP with β = 0; a chain where only some layers have a bias
gets zero bias columns in the others (equal outputs; those zeros then train like any weight).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import FeaturelabError
from .mlp import MLP

PASSTHROUGH = (nn.Identity, nn.Dropout)  # no-ops in eval mode


def _leaves(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The leaf modules of a (possibly nested) Sequential in call order, with their dotted names."""
    out = []
    for name, child in module.named_children():
        if isinstance(child, nn.Sequential):
            out += [(f"{name}.{n}", m) for n, m in _leaves(child)]
        else:
            out.append((name, child))
    return out


def _activation(name: str, m: nn.Module) -> tuple[str, float]:
    if isinstance(m, nn.ReLU):
        return "leaky_relu", 0.0
    if isinstance(m, nn.LeakyReLU):
        return "leaky_relu", float(m.negative_slope)
    if isinstance(m, nn.Tanh):
        return "tanh", 0.0
    raise FeaturelabError(
        f"layer {name!r} ({type(m).__name__}) is not allowed in from_torch: the chain may hold only Linear, "
        "ReLU, LeakyReLU, Tanh, Identity, Dropout and a leading Flatten"
    )


def from_torch(module: nn.Module) -> MLP:
    """An `MLP` computing the same function as `module`, an ``nn.Sequential`` chain
    ``Linear, σ, Linear, σ, ..., Linear`` (nested Sequentials are flattened).

    σ is one kind throughout: ReLU (leak 0), LeakyReLU(a) (leak a) or Tanh. Hidden layers without σ must
    form a suffix (they become the MLP's `linear_tail`); with no σ at all the MLP is linear (leak 1).
    Identity and Dropout are skipped (eval-mode semantics), as is a Flatten before the first Linear (the
    MLP then takes flat ``N x d_in`` inputs). The MLP has the dtype of the first Linear's weight and
    copies of its parameters. A featurelab `MLP` is returned unchanged. Anything else is a one-line error.
    """
    if isinstance(module, MLP):
        return module
    if not isinstance(module, nn.Sequential):
        raise FeaturelabError(
            f"module of type {type(module).__name__} is not allowed in from_torch: give an nn.Sequential of "
            "Linear layers and activations"
        )
    linears, acts = [], []  # acts[i]: the activation after linears[i] (None: none)
    for name, m in _leaves(module):
        if isinstance(m, PASSTHROUGH) or (isinstance(m, nn.Flatten) and not linears and m.start_dim == 1):
            continue
        if isinstance(m, nn.Linear):
            if linears and linears[-1][1].out_features != m.in_features:
                raise FeaturelabError(
                    f"layer {name!r} reads {m.in_features} features but the previous Linear gives "
                    f"{linears[-1][1].out_features}"
                )
            linears.append((name, m))
            acts.append(None)
            continue
        if not linears:
            raise FeaturelabError(f"layer {name!r} ({type(m).__name__}) comes before the first Linear in from_torch")
        if acts[-1] is not None:
            raise FeaturelabError(f"layer {name!r} is a second activation after Linear {linears[-1][0]!r}")
        acts[-1] = (name, _activation(name, m))
    if not linears:
        raise FeaturelabError("module has no Linear layer: from_torch needs Linear, σ, ..., Linear")
    if acts[-1] is not None:
        raise FeaturelabError(
            f"layer {acts[-1][0]!r} is an activation after the last Linear; an MLP's output is linear (drop it)"
        )
    hidden = acts[:-1]
    kinds = {a[1] for a in hidden if a is not None}
    if len(kinds) > 1:
        raise FeaturelabError(f"from_torch needs one activation kind in the chain, got {sorted(kinds)}")
    missing = [i for i, a in enumerate(hidden) if a is None]
    L = len(linears)
    if kinds and missing and missing != list(range(L - 1 - len(missing), L - 1)):
        raise FeaturelabError(
            f"Linear {linears[missing[0]][0]!r} has no activation after it, but later layers do: only the last "
            "layers of a chain may act linearly (an MLP's linear_tail)"
        )
    activation, leak = kinds.pop() if kinds else ("leaky_relu", 1.0)
    linear_tail = len(missing) + 1 if (missing and leak != 1.0) else 0
    first = linears[0][1].weight
    has_bias = any(m.bias is not None for _, m in linears)
    dims = [linears[0][1].in_features] + [m.out_features for _, m in linears]
    model = MLP(
        dims[0],
        dims[-1],
        dims[1:-1],
        L,
        leak=leak,
        bias=1.0 if has_bias else 0.0,
        linear_tail=linear_tail,
        activation=activation,
        dtype=first.dtype,
    ).to(first.device)
    with torch.no_grad():
        for P, (_, m) in zip(model.weights, linears):
            W = m.weight.detach()
            if has_bias:
                b = m.bias.detach() if m.bias is not None else torch.zeros_like(W[:, 0])
                W = torch.cat([W, b[:, None]], dim=1)
            P.copy_(W)
    return model


def to_torch(model: MLP) -> nn.Sequential:
    """`model` as ``nn.Sequential(Linear, σ, ..., Linear)`` with the same outputs, dtype and device
    (copied parameters; Linear biases are β times the stored bias columns, absent when β = 0). σ is
    ReLU (leak 0), LeakyReLU(a), or Tanh; a linear σ (leak 1, or inside the linear tail) is omitted."""
    if not isinstance(model, MLP):
        raise FeaturelabError(f"model must be a featurelab MLP for to_torch, got {type(model).__name__}")
    layers: list[nn.Module] = []
    dtype, device = model.weights[0].dtype, model.weights[0].device
    for l, (W, b) in enumerate(zip(model.weight_matrices(), model.biases()), start=1):
        lin = nn.Linear(W.shape[1], W.shape[0], bias=model.bias > 0, dtype=dtype, device=device)
        with torch.no_grad():
            lin.weight.copy_(W)
            if model.bias > 0:
                lin.bias.copy_(b)
        layers.append(lin)
        if l == model.depth or l > model.depth - model.linear_tail:
            continue
        if model.activation == "tanh":
            layers.append(nn.Tanh())
        elif model.leak == 0.0:
            layers.append(nn.ReLU())
        elif model.leak != 1.0:
            layers.append(nn.LeakyReLU(model.leak))
    return nn.Sequential(*layers)


def as_mlp(model) -> MLP:
    """`model` if it is an `MLP`, else `from_torch(model)` for an ``nn.Sequential`` chain; anything else is a
    one-line error naming both. The entry coercion of the tools that need an `MLP`."""
    if isinstance(model, MLP):
        return model
    if isinstance(model, nn.Sequential):
        return from_torch(model)
    raise FeaturelabError(
        f"model must be a featurelab MLP or an nn.Sequential Linear/activation chain (see featurelab.from_torch), "
        f"got {type(model).__name__}"
    )
