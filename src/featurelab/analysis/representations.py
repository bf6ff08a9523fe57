"""Representations: which module outputs `analyze` reads, how it captures them, and their rows.

Selection (``representations=``): module names, glob patterns on the dotted names (``"blocks.*"``,
``"*.mlp.act"``, also matching functional activations) or ``nn.Module`` types. Default: the outputs of the
repeated blocks when the model has them (children of one container sharing one class that is not a torch.nn
leaf: a ViT's ``blocks.0..11``, a ResNet's ``layerK.j``, an ``nn.TransformerEncoder``'s layers): the
residual stream; otherwise every activation module (torch.nn activations, not attention), every functional
activation and every other non-container module that is not a torch.nn module (a "block"). Input and
output rows are always there.

Functional activations (``F.relu``, ``torch.tanh``, ``x.relu()`` inside a forward) are the activation nodes
of the ``torch.fx`` graph of their module's own forward (`layers.shallow_trace`); they are read by running
that forward as the graph with a tap after each chosen activation (its module's hooks still fire).

Each row is the spectrum of the centred ``(A − mean)/√N``, A flattened per sample to ``N x units``, or,
per token, a 3-D ``N x T x E`` as ``N·T x E`` (when the blocks act on (batch, tokens, width),
`acts_on_tokens`) (`spectra.singular_values`, the Gram route for wide or tall ones), and COI_γ of the
activation's input (activation rows) or of the representation itself.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import fx, nn

from ..errors import FeaturelabError
from ..measurements.cost_of_identity import cost_of_identity
from ..measurements.ranks import spectrum_ranks
from .layers import activation_nodes, shallow_trace
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


@dataclass(frozen=True)
class Functional:
    """An activation a module's forward calls as a function or method (`layers.activation_nodes`)."""

    module: str  # the module whose forward calls it ("" for the model itself)
    node: str  # its node's name in that forward's fx graph
    label: str  # e.g. "relu()"
    graph: fx.GraphModule  # that forward, shared by the module's functional activations


def functional(net: nn.Module) -> dict[str, Functional]:
    """The functional activations of the model's and every custom module's own forward, by representation name
    ``module.node`` (``relu``, ``mlp.gelu_1``; a name that a module already has gets ``()``). A forward that
    cannot be traced symbolically contributes none."""
    modules = dict(net.named_modules())
    out = {}
    for owner, m in modules.items():
        graph = None if _is_torch(m) else shallow_trace(m)
        if graph is None:
            continue
        for node in activation_nodes(graph.graph):
            name = f"{owner}.{node.name}" if owner else node.name
            label = f"{getattr(node.target, '__name__', node.target)}()"
            out[f"{name}()" if name in modules else name] = Functional(owner, node.name, label, graph)
    return out


def _default(net: nn.Module, funcs: dict[str, Functional]) -> tuple[set[str], str]:
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
    return picked | set(funcs), "activations (modules and functions) and custom modules"


def select(net: nn.Module, representations, funcs: dict[str, Functional]) -> tuple[set[str], str]:
    """The module and functional-activation names to read and a description of the rule; a one-line error for
    an entry that matches nothing (naming a few of the model's module names)."""
    if representations is None:
        return _default(net, funcs)
    if isinstance(representations, str | type):
        representations = [representations]
    named = [(n, m) for n, m in net.named_modules() if n]
    picked = set()
    for entry in representations:
        if isinstance(entry, type) and issubclass(entry, nn.Module):
            hits = {n for n, m in named if isinstance(m, entry)}
            what = f"type {entry.__name__}"
        elif isinstance(entry, str):
            hits = {n for n in [*(n for n, _ in named), *funcs] if fnmatch.fnmatchcase(n, entry)}
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


def acts_on_tokens(block: nn.Module, output: torch.Size) -> bool:
    """True when `block` acts on (batch, tokens, width): its output is 3-D and it holds a Linear, LayerNorm or
    attention of that width and no conv (a Conv1d block's N x C x L is channels, not tokens)."""
    if len(output) != 3:
        return False
    width, inner = output[-1], list(block.modules())
    if any(isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d) for m in inner):
        return False
    return any(
        (isinstance(m, nn.Linear) and m.in_features == width)
        or (isinstance(m, nn.LayerNorm) and m.normalized_shape[-1] == width)
        or (isinstance(m, nn.MultiheadAttention) and m.embed_dim == width)
        for m in inner
    )


@dataclass
class Captured:
    """What one forward pass on `n` samples gave: the output, [(name, type, coi input, output)] per call of a
    chosen module or functional activation, all module names in call order, and the first call of a block of
    the stream: its name, input and output shape."""

    n: int
    out: torch.Tensor | None = None
    reps: list = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    block: str = ""
    entry: torch.Tensor | None = None
    block_shape: torch.Size | None = None
    seen: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, kind: str, coi_input, output) -> None:
        """Record `output` (a tensor, or a tuple starting with one) when it has one row per sample; `coi_input`
        None: COI_γ reads the output itself."""
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            output = output[0]
        if isinstance(output, torch.Tensor) and output.ndim >= 1 and output.shape[0] == self.n:
            k = self.seen[name] = self.seen.get(name, 0) + 1
            coi = coi_input if isinstance(coi_input, torch.Tensor) else output
            self.reps.append((f"{name}#{k}" if k > 1 else name, kind, coi.detach(), output.detach()))


def _instrument(graph: fx.GraphModule, wanted: dict[str, tuple[str, str]], cap: Captured) -> None:
    """Insert after each wanted activation node (by node name: (representation name, type)) a call that records
    its input and output and returns the output; the input is cloned before the activation (an in-place one
    overwrites it)."""

    def tap(name: str, label: str, pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
        cap.add(name, label, pre, post)
        return post

    g = graph.graph
    for node in [n for n in g.nodes if n.name in wanted]:
        x = next(a for a in [*node.args, *node.kwargs.values()] if isinstance(a, fx.Node))
        with g.inserting_before(node):
            pre = g.call_function(torch.clone, (x,))
        with g.inserting_after(node):
            after = g.call_function(tap, (*wanted[node.name], pre, node))
        node.replace_all_uses_with(after, delete_user_cb=lambda user, after=after: user is not after)
    graph.recompile()


def _taps(net: nn.Module, names: set[str], funcs: dict[str, Functional], cap: Captured) -> list[nn.Module]:
    """Swap in the instrumented forward of every module with a chosen functional activation; the modules."""
    modules = dict(net.named_modules())
    wanted: dict[str, dict[str, tuple[str, str]]] = {}
    for rep, f in funcs.items():
        if rep in names:
            wanted.setdefault(f.module, {})[f.node] = (rep, f.label)
    graphs = {f.module: f.graph for f in funcs.values()}
    for owner, nodes in wanted.items():
        _instrument(graphs[owner], nodes, cap)
        modules[owner].forward = graphs[owner].forward  # an instance attribute: hooks still fire
    return [modules[owner] for owner in wanted]


def _hooks(net: nn.Module, names: set[str], stream: set[str], cap: Captured) -> list:
    """Forward hooks recording the chosen modules' outputs (activations: with their inputs, for COI_γ), every
    call, and the first stream block's input and output shape."""
    module_names = {m: n for n, m in net.named_modules()}
    pre: dict[nn.Module, torch.Tensor] = {}

    def pre_hook(m, inputs):
        if not inputs or not isinstance(inputs[0], torch.Tensor):
            return
        if module_names[m] in stream and not cap.block:
            cap.block, cap.entry = module_names[m], inputs[0].detach().clone()
        if module_names[m] in names and type(m).__module__ == ACTIVATIONS:
            pre[m] = inputs[0].detach().clone()  # an in-place activation overwrites its input

    def hook(m, inputs, output):
        name = module_names[m]
        cap.calls.append(name)
        if name == cap.block and cap.block_shape is None:
            first = output[0] if isinstance(output, tuple) and output else output
            cap.block_shape = first.shape if isinstance(first, torch.Tensor) else torch.Size()
        if name in names:
            cap.add(name, type(m).__name__, pre.pop(m, None), output)

    handles = []
    for name, m in net.named_modules():
        if m is net:
            continue
        if name in stream or (name in names and type(m).__module__ == ACTIVATIONS):
            handles.append(m.register_forward_pre_hook(pre_hook))
        handles.append(m.register_forward_hook(hook))
    return handles


def capture(
    net: nn.Module, X: torch.Tensor, names: set[str], funcs: dict[str, Functional], stream: list[str]
) -> Captured:
    """Run `net` on X once with hooks on the modules and taps on the functional activations in `names`
    (`Captured`); `stream`: the blocks whose first call's input and output shape are kept."""
    cap = Captured(len(X))
    handles = _hooks(net, names, set(stream), cap)
    swapped = _taps(net, names, funcs, cap)
    try:
        with torch.no_grad():
            out = net(X)
    finally:
        for h in handles:
            h.remove()
        for m in swapped:
            delattr(m, "forward")
    if not isinstance(out, torch.Tensor):
        keys = f" (keys {', '.join(map(str, out))})" if isinstance(out, dict) else ""
        raise FeaturelabError(
            f"the model returned a {type(out).__name__}{keys}; analyze needs one output tensor: wrap the model in an "
            "nn.Module whose forward returns the tensor to analyse"
        )
    cap.out = out
    return cap


def row(name: str, kind: str, A: torch.Tensor, coi_A: torch.Tensor, top: int, effective_rtol, rtol, gamma, per_token):
    """One representation row (module docstring) and its singular values; `per_token`: a 3-D A (N x T x E) is
    read as N·T rows of E units, one per token."""
    shape = "x".join(map(str, A.shape[1:])) or "1"
    if per_token and A.ndim == 3:
        A, coi_A = A.reshape(-1, A.shape[-1]), coi_A.reshape(A.shape[0] * A.shape[1], -1)
    N = A.shape[0]
    dead = A.abs().amax(dim=[d for d in range(A.ndim) if d != 1]) == 0 if A.ndim > 1 else A.abs().amax() == 0
    flat = A.reshape(N, -1)
    s = singular_values((flat - flat.mean(0)) / math.sqrt(N))
    coi = cost_of_identity(coi_A.reshape(N, -1), gamma=gamma) if gamma > 0 else float("nan")
    out = {"name": name, "type": kind, "shape": shape, "rows": N, "units": flat.shape[1]}
    out |= {f"sv{i + 1}": float(s[i]) if i < len(s) else np.nan for i in range(top)}
    out |= spectrum_ranks(s, effective_rtol=effective_rtol, numerical_rtol=rtol) | {
        "coi_gamma": coi,
        "dead_share": float(dead.double().mean()),
    }
    return out, s.numpy()
