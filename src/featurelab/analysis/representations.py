"""Representations: which module outputs `analyze` reads, how it captures them, and their rows.

Selection (``representations=``): module names, glob patterns on the dotted names (``"blocks.*"``,
``"*.mlp.act"``) or ``nn.Module`` types. Default: the outputs of the repeated blocks when the model has
them (children of one container sharing one class that is not a torch.nn leaf: a ViT's ``blocks.0..11``,
a ResNet's ``layerK.j``, an ``nn.TransformerEncoder``'s layers): the residual stream; otherwise every
activation module (torch.nn activations, not attention) and every other non-container module that is not
a torch.nn module (a "block"). Input and output rows are always there.

Each row is the spectrum of the centred ``(A − mean)/√N``, A flattened per sample to ``N x units``
(`spectra.singular_values`, the Gram route for wide or tall ones), and COI_γ of the activation's input
(activation rows) or of the representation itself.
"""

from __future__ import annotations

import fnmatch
import math

import numpy as np
import torch
from torch import nn

from ..errors import FeaturelabError
from ..measurements.cost_of_identity import cost_of_identity
from ..measurements.ranks import spectrum_ranks
from .spectra import singular_values

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
ACTIVATIONS = "torch.nn.modules.activation"


def _is_torch(m: nn.Module) -> bool:
    return type(m).__module__.startswith("torch.")


def blocks(net: nn.Module) -> list[str]:
    """Names of the repeated blocks: children of a container holding >= 2 children of one class that is not a
    torch.nn leaf (a custom block, or a composite such as ``nn.TransformerEncoderLayer``)."""
    out = []
    for name, m in net.named_modules():
        if not isinstance(m, CONTAINERS):
            continue
        kids = list(m.named_children())
        kinds = [type(c) for _, c in kids]
        for child_name, c in kids:
            if (not _is_torch(c) or list(c.children())) and kinds.count(type(c)) >= 2:
                out.append(f"{name}.{child_name}" if name else child_name)
    return out


def _default(net: nn.Module) -> tuple[set[str], str]:
    stream = blocks(net)
    if stream:
        return set(stream), "block outputs (the residual stream)"
    picked = {
        n
        for n, m in net.named_modules()
        if n
        and not isinstance(m, CONTAINERS + (nn.MultiheadAttention,))
        and (type(m).__module__ == ACTIVATIONS or not _is_torch(m))
    }
    return picked, "activations and custom modules"


def select(net: nn.Module, representations) -> tuple[set[str], str]:
    """The module names to read and a description of the rule; a one-line error for an entry that matches
    nothing (naming a few of the model's module names)."""
    if representations is None:
        return _default(net)
    if isinstance(representations, str | type):
        representations = [representations]
    named = [(n, m) for n, m in net.named_modules() if n]
    picked = set()
    for entry in representations:
        if isinstance(entry, type) and issubclass(entry, nn.Module):
            hits = {n for n, m in named if isinstance(m, entry)}
            what = f"type {entry.__name__}"
        elif isinstance(entry, str):
            hits = {n for n, _ in named if fnmatch.fnmatchcase(n, entry)}
            what = repr(entry)
        else:
            raise FeaturelabError(
                f"representations entry {entry!r} is not allowed: give module names, glob patterns or nn.Module types"
            )
        if not hits:
            shown = ", ".join(n for n, _ in named[:8]) + (", ..." if len(named) > 8 else "")
            raise FeaturelabError(f"representations: {what} matches no module of the model (names: {shown})")
        picked |= hits
    return picked, "selected"


def capture(net: nn.Module, X: torch.Tensor, names: set[str]) -> tuple[torch.Tensor, list, list[str]]:
    """Run `net` on X with hooks: the output, [(name, type, coi input, output)] for every call of a module in
    `names` whose output is a tensor (or a tuple starting with one) with one row per sample, and the names of
    all modules in call order."""
    reps, calls, handles, pre = [], [], [], {}
    module_names = {m: n for n, m in net.named_modules()}
    seen: dict[str, int] = {}

    def pre_hook(m, inputs):
        if inputs and isinstance(inputs[0], torch.Tensor):
            pre[m] = inputs[0].detach().clone()  # an in-place activation overwrites its input

    def hook(m, inputs, output):
        name = module_names[m]
        calls.append(name)
        if name not in names:
            return
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            output = output[0]
        if isinstance(output, torch.Tensor) and output.ndim >= 1 and output.shape[0] == X.shape[0]:
            k = seen[name] = seen.get(name, 0) + 1
            coi_input = pre.pop(m, output) if type(m).__module__ == ACTIVATIONS else output
            reps.append((f"{name}#{k}" if k > 1 else name, type(m).__name__, coi_input.detach(), output.detach()))

    for name, m in net.named_modules():
        if m is net:
            continue
        if name in names and type(m).__module__ == ACTIVATIONS:
            handles.append(m.register_forward_pre_hook(pre_hook))
        handles.append(m.register_forward_hook(hook))
    try:
        with torch.no_grad():
            out = net(X)
    finally:
        for h in handles:
            h.remove()
    if not isinstance(out, torch.Tensor):
        keys = f" (keys {', '.join(map(str, out))})" if isinstance(out, dict) else ""
        raise FeaturelabError(
            f"the model returned a {type(out).__name__}{keys}; analyze needs one output tensor: wrap the model in an "
            "nn.Module whose forward returns the tensor to analyse"
        )
    return out, reps, calls


def row(name: str, kind: str, A: torch.Tensor, coi_A: torch.Tensor, top: int, effective_rtol, rtol, gamma):
    """One representation row (module docstring) and its singular values."""
    N = A.shape[0]
    dead = A.abs().amax(dim=[d for d in range(A.ndim) if d != 1]) == 0 if A.ndim > 1 else A.abs().amax() == 0
    flat = A.reshape(N, -1)
    s = singular_values((flat - flat.mean(0)) / math.sqrt(N))
    coi = cost_of_identity(coi_A.reshape(N, -1), gamma=gamma) if gamma > 0 else float("nan")
    out = {"name": name, "type": kind, "shape": "x".join(map(str, A.shape[1:])) or "1", "units": flat.shape[1]}
    out |= {f"sv{i + 1}": float(s[i]) if i < len(s) else np.nan for i in range(top)}
    out |= spectrum_ranks(s, effective_rtol=effective_rtol, numerical_rtol=rtol) | {
        "coi_gamma": coi,
        "dead_share": float(dead.double().mean()),
    }
    return out, s.numpy()
