"""The layer model of a network: its weight layers in forward order, the norms, and the adjacent pairs.

Order and data flow come from a ``torch.fx`` trace of the model. Modules whose own forward cannot be traced
symbolically (data-dependent control flow, ``B, N, C = x.shape``) are kept whole as leaves, so a model
traces as long as its top-level forward does (inside a module kept whole, pairs are read within the
submodules that trace and its ``nn.Sequential`` children). When even the top level fails, the order is the
forward call order seen by hooks (with data) or the registration order, and pairs are read inside the
submodules that trace and ``nn.Sequential``.

Weight layers (rows, with a `kind`): ``nn.Linear`` ("linear"); ``nn.Conv1d``/``nn.Conv2d`` as the
``out x (in·k...)`` unfolding of the kernel ("conv"); a grouped conv (groups G > 1, depthwise when
G = in) as the block-diagonal matrix diag(W_1, ..., W_G), W_g the ``out/G x (in/G·k...)`` kernel of group g,
which is the conv's operator on the channel-major unfolding (input channels of group g only reach outputs
of group g), so its spectrum is the union of the groups' spectra ("grouped conv"); attention modules split
into Q, K, V and the output projection (`attention`); ``nn.Embedding`` ("embedding"); parameters with a
leading dimension 1 (``cls_token`` 1 x 1 x E, ``pos_embed`` 1 x T x E) or named like a token or a position
embedding ("token", read as T x E); any other parameter of two or more dimensions ("parameter").

BatchNorm in eval mode is an affine map per channel, y = s ⊙ (z − μ) + β with s = γ/√(σ² + ε): when it
directly follows a conv or linear layer (that layer's only consumer) it is folded into it,
W' = diag(s) W, b' = s ⊙ (b − μ) + β, the layer's operator as the network computes it (column `folded`).
Other norms are listed in `norms` with the reason they are not folded.

A pair (a, b) is two weight layers where a's output is consumed only by a chain of per-unit maps that ends
in b: BatchNorm (folded), activations, pooling, Flatten/view/reshape, Dropout (identity in eval mode).
`homogeneous` is true when every map of the chain is positively homogeneous per unit (f(c·x) = c·f(x) for
c > 0 per unit: ReLU, leaky ReLU, PReLU, max/average pooling, Flatten, Dropout), the condition under which
rescaling a unit by c in and 1/c out leaves the function unchanged (balancedness). No pair crosses a sum
(a skip connection: the unit then feeds two paths), a concatenation, attention, or a LayerNorm/GroupNorm
(which normalises across units: rescaling one unit changes every output).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..errors import FeaturelabError
from .attention import Heads, Row, check_split, head_count, looks_like_attention, projections, split

CONVS = (nn.Conv1d, nn.Conv2d)
WEIGHTED = (nn.Linear, *CONVS)
BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d)
NORMS = (*BATCHNORMS, nn.LayerNorm, nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.LocalResponseNorm)
HOMOGENEOUS = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.PReLU,
    nn.Identity,
    nn.Flatten,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
)
ELEMENTWISE = (
    nn.GELU,
    nn.Tanh,
    nn.Sigmoid,
    nn.SiLU,
    nn.ELU,
    nn.CELU,
    nn.SELU,
    nn.Softplus,
    nn.Mish,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Hardtanh,
    nn.ReLU6,
)
HOMOGENEOUS_FUNCTIONS = {
    torch.relu,
    F.relu,
    F.leaky_relu,
    torch.flatten,
    F.dropout,
    F.max_pool1d,
    F.max_pool2d,
    F.avg_pool1d,
    F.avg_pool2d,
    F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d,
    F.adaptive_max_pool2d,
}
ELEMENTWISE_FUNCTIONS = {
    F.gelu,
    torch.tanh,
    F.tanh,
    torch.sigmoid,
    F.sigmoid,
    F.silu,
    F.elu,
    F.selu,
    torch.selu,
    F.celu,
    F.softplus,
    F.mish,
    F.hardswish,
    F.hardsigmoid,
    F.hardtanh,
    F.relu6,
}
HOMOGENEOUS_METHODS = {"relu", "relu_", "flatten", "view", "reshape"}
ELEMENTWISE_METHODS = {"tanh", "tanh_", "sigmoid", "sigmoid_"}
# the activations called as functions or methods inside a forward: representations are read after them
ACTIVATION_FUNCTIONS = {torch.relu, torch.relu_, F.relu, F.relu_, F.leaky_relu} | ELEMENTWISE_FUNCTIONS
ACTIVATION_METHODS = {"relu", "relu_"} | ELEMENTWISE_METHODS
TOKEN_NAMES = ("*token*", "*pos_embed*", "*position*", "*pos_emb*", "*register*")


@dataclass
class Layer:
    """One weight layer: `matrix` is the operator as read (float64, rows are outputs), `shape` the stored one."""

    name: str
    type: str
    kind: str
    matrix: torch.Tensor
    bias: torch.Tensor | None
    shape: tuple
    module: nn.Module | None = None
    folded: str = ""
    groups: int = 1
    scale: torch.Tensor | None = field(default=None, repr=False)  # the folded BatchNorm's per-row factor


@dataclass(frozen=True)
class Pair:
    """Weight layer `b` reads `a`'s units through per-unit maps only (`through`); `homogeneous`: all of them are
    positively homogeneous."""

    a: str
    b: str
    homogeneous: bool
    through: str


@dataclass
class LayerModel:
    layers: list[Layer]
    pairs: dict[str, Pair]  # by the first layer's name
    norms: list[dict]
    heads: list[Heads]
    order: str  # "torch.fx", "forward calls" or "registration"
    notes: list[str]
    attention_notes: list[str] = field(default_factory=list)  # attention-like modules left unsplit, and why


# ------------------------------------------------------------------------------------ tracing
def _tracer(leaves: set[nn.Module]) -> fx.Tracer:
    class Tracer(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            if m in leaves or looks_like_attention(m) or isinstance(m, NORMS):
                return True
            # torch.nn modules with submodules (nn.TransformerEncoderLayer, ...) are traced through when they can be
            return super().is_leaf_module(m, qualname) and not list(m.children())

    return Tracer()


def trace(net: nn.Module) -> tuple[dict[str, fx.Graph], str]:
    """The fx graph of every module with submodules that traces symbolically, by name ("" for `net`), each with
    the submodules that cannot be traced kept as leaves; and, when `net` itself does not trace, why."""
    leaves: set[nn.Module] = set()
    graphs, reason = {}, ""
    for name, m in reversed(list(net.named_modules())):  # children before their parents
        if not list(m.children()) or looks_like_attention(m) or isinstance(m, NORMS):
            continue
        try:
            graphs[name] = _tracer(leaves).trace(m)
        except Exception as exc:  # any failure of symbolic tracing keeps the module whole
            leaves.add(m)
            reason = f"{type(m).__name__}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    if "" in graphs:
        return graphs, ""
    return graphs, reason or ("" if list(net.children()) else "the model has no submodules")


def shallow_trace(m: nn.Module) -> fx.GraphModule | None:
    """`m`'s own forward as an fx GraphModule in which every submodule stays a module call (so its hooks still
    fire), or None when that forward cannot be traced symbolically."""

    class Shallow(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return True

    try:
        return fx.GraphModule(m, Shallow().trace(m))
    except Exception:  # any failure of symbolic tracing: the module's functional activations are not read
        return None


def activation_nodes(graph: fx.Graph) -> list[fx.Node]:
    """The activations `graph` calls as functions (``F.relu``, ``torch.tanh``, ...) or methods (``x.relu()``)."""
    return [
        n
        for n in graph.nodes
        if (n.op == "call_function" and n.target in ACTIVATION_FUNCTIONS)
        or (n.op == "call_method" and n.target in ACTIVATION_METHODS)
    ]


def _step(node: fx.Node, modules: dict[str, nn.Module], prev: fx.Node) -> str:
    """How `node` maps `prev` (its only tensor input): 'weight', 'bn', 'homogeneous', 'elementwise' or 'stop'."""
    tensor_args = [a for a in node.args if isinstance(a, fx.Node)] + [
        a for a in node.kwargs.values() if isinstance(a, fx.Node)
    ]
    if tensor_args != [prev]:
        return "stop"
    if node.op == "call_module":
        m = modules[str(node.target)]
        if isinstance(m, WEIGHTED):
            return "weight"
        if isinstance(m, BATCHNORMS):
            return "bn"
        if isinstance(m, HOMOGENEOUS):
            return "homogeneous"
        return "elementwise" if isinstance(m, ELEMENTWISE) else "stop"
    if node.op == "call_function":
        if node.target in HOMOGENEOUS_FUNCTIONS:
            return "homogeneous"
        return "elementwise" if node.target in ELEMENTWISE_FUNCTIONS else "stop"
    if node.op == "call_method":
        if node.target in HOMOGENEOUS_METHODS:
            return "homogeneous"
        return "elementwise" if node.target in ELEMENTWISE_METHODS else "stop"
    return "stop"


def _walk(start, users, classify) -> tuple[str | None, str | None, bool, list[str]]:
    """Follow the single consumer of `start`: (folded BN, paired layer, homogeneous, names passed through)."""
    bn, homogeneous, through, cur, first = None, True, [], start, True
    while True:
        nxt = users(cur)
        if nxt is None:
            return bn, None, homogeneous, through
        kind, label = classify(nxt, cur)
        if kind == "bn" and first:
            bn = label
        elif kind == "weight":
            return bn, label, homogeneous, through
        elif kind in ("homogeneous", "elementwise", "bn"):
            homogeneous = homogeneous and kind == "homogeneous"
            through.append(label)
        else:
            return bn, None, homogeneous, through
        cur, first = nxt, False


def _fx_links(
    graph: fx.Graph, modules: dict[str, nn.Module], prefix: str = ""
) -> dict[str, tuple[str | None, str | None, bool, str]]:
    """(folded BN, paired layer, homogeneous, maps between) of each weight layer `graph` calls; `modules`: the
    traced module's own submodules by name, `prefix`: its name (dotted names come out in full)."""

    def users(node):
        us = list(node.users)
        return us[0] if len(us) == 1 else None

    def classify(node, prev):
        kind = _step(node, modules, prev)
        if node.op == "call_module":
            return kind, f"{prefix}{node.target}"
        return kind, getattr(node.target, "__name__", str(node.target))

    out = {}
    for node in graph.nodes:
        if node.op == "call_module" and isinstance(modules[str(node.target)], WEIGHTED):
            bn, b, h, through = _walk(node, users, classify)
            out[f"{prefix}{node.target}"] = (bn, b, h, ", ".join(through))
    return out


def _traced_links(graphs: dict[str, fx.Graph], net: nn.Module) -> dict[str, tuple[str | None, str | None, bool, str]]:
    """`_fx_links` of every traced forward (`trace`), with full dotted names; an enclosing module's graph first,
    as it follows a layer's output past the end of the submodule that computes it."""
    out = {}
    modules = dict(net.named_modules())
    for name in sorted(graphs, key=lambda n: n.count(".") + bool(n)):
        own = dict(modules[name].named_modules())
        for a, link in _fx_links(graphs[name], own, f"{name}." if name else "").items():
            out.setdefault(a, link)
    return out


def _sequential_links(net: nn.Module) -> dict[str, tuple[str | None, str | None, bool, str]]:
    names = {m: n for n, m in net.named_modules()}
    out = {}
    for seq in net.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        children = list(seq.children())
        for i, child in enumerate(children):
            if not isinstance(child, WEIGHTED):
                continue

            def users(pos):
                return pos + 1 if pos + 1 < len(children) else None

            def classify(pos, prev):
                m = children[pos]
                kind = (
                    "weight"
                    if isinstance(m, WEIGHTED)
                    else "bn"
                    if isinstance(m, BATCHNORMS)
                    else "homogeneous"
                    if isinstance(m, HOMOGENEOUS)
                    else "elementwise"
                    if isinstance(m, ELEMENTWISE)
                    else "stop"
                )
                return kind, names[m]

            bn, b, h, through = _walk(i, users, classify)
            out[names[child]] = (bn, b, h, ", ".join(through))
    return out


# ---------------------------------------------------------------------------------- the layers
def _fold(
    m: nn.Linear | nn.Conv1d | nn.Conv2d, bn: nn.BatchNorm1d | nn.BatchNorm2d
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(W', b', s) of `m` followed by eval-mode BatchNorm `bn` (module docstring), None without running stats."""
    if bn.running_mean is None or bn.running_var is None:
        return None
    s = bn.running_var.rsqrt() if bn.eps == 0 else (bn.running_var + bn.eps).rsqrt()
    if bn.weight is not None:
        s = s * bn.weight.detach()
    W = m.weight.detach() * s.reshape(-1, *[1] * (m.weight.ndim - 1))
    b = m.bias.detach() if m.bias is not None else torch.zeros_like(s)
    b = (b - bn.running_mean) * s + (bn.bias.detach() if bn.bias is not None else 0.0)
    return W, b, s


def _operator(W: torch.Tensor, groups: int) -> torch.Tensor:
    """A conv kernel (out x in/G x k...) as its out x (in·k...) unfolding, block-diagonal over the G groups (the
    conv's operator on an input is another matrix: `conv_operator`)."""
    flat = W.reshape(W.shape[0], -1)
    return flat if groups == 1 else torch.block_diag(*flat.chunk(groups))


def _is_token(name: str, P: torch.Tensor) -> bool:
    leaf = name.rpartition(".")[2].lower()
    return (P.ndim == 3 and P.shape[0] == 1) or any(fnmatch.fnmatch(leaf, p) for p in TOKEN_NAMES)


def _module_layers(name: str, m: nn.Module, fold: nn.Module | None, fold_name: str) -> list[Layer]:
    if isinstance(m, WEIGHTED):
        W = m.weight.detach()
        b = m.bias.detach() if m.bias is not None else None
        folded, scale = "", None
        if isinstance(fold, BATCHNORMS) and (triple := _fold(m, fold)) is not None:
            (W, b, scale), folded = triple, fold_name
        if isinstance(m, nn.Linear):
            return [Layer(name, type(m).__name__, "linear", W, b, tuple(m.weight.shape), m, folded, 1, scale)]
        G = m.groups
        kind = "grouped conv" if G > 1 else "conv"
        return [Layer(name, type(m).__name__, kind, _operator(W, G), b, tuple(W.shape), m, folded, G, scale)]
    if isinstance(m, nn.Embedding):
        W = m.weight.detach()
        return [Layer(f"{name}.weight", "Embedding", "embedding", W, None, tuple(W.shape), m)]
    out = []
    for pname, p in m.named_parameters(recurse=False):
        full, P = f"{name}.{pname}" if name else pname, p.detach()
        if P.ndim < 2:
            continue
        if _is_token(full, P):
            out.append(Layer(full, "token", "token", P.reshape(-1, P.shape[-1]), None, tuple(P.shape), m))
        elif P.ndim == 3:  # a stack of matrices
            out += [
                Layer(f"{full}[{i}]", type(m).__name__, "parameter", P[i], None, tuple(P[i].shape), m)
                for i in range(len(P))
            ]
        else:
            out.append(Layer(full, type(m).__name__, "parameter", P.reshape(P.shape[0], -1), None, tuple(P.shape), m))
    return out


def _attention(
    modules: dict[str, nn.Module], given: dict[str, int]
) -> tuple[dict[str, tuple[list[Row], Heads, tuple[str, ...]]], list[str]]:
    """The attention modules split per head ({name: (rows, heads, names of the modules they consume)}) and a
    note for each that looks like attention but cannot be split, naming the ``heads=`` entry that splits it.
    A `given` head count that does not split its module, or a pattern that matches no attention module, is a
    one-line error."""
    out, notes, used = {}, [], set()
    for name, m in modules.items():
        forced = [p for p in given if fnmatch.fnmatchcase(name, p)]
        p = projections(name, m, modules, bool(forced))
        if p is None:
            continue
        H, source = head_count(name, m, modules, given)
        problem = check_split(name, p, H, source) if H else f"{name} looks like attention but has no head count"
        if problem and forced:
            raise FeaturelabError(problem)
        if problem:
            notes.append(f"{problem}: pass heads={{{name!r}: H}}")
            continue
        used.update(forced[:1])
        rows, heads = split(name, p, H)
        out[name] = (rows, heads, p.consumed)
    unused = [p for p in given if p not in used]
    if unused:
        raise FeaturelabError(
            f"heads: {unused[0]!r} matches no attention module (one with Q, K, V projections: a fused Linear "
            "of 3E outputs read by an output projection of E inputs, or q/k/v Linears)"
        )
    return out, notes


def layer_model(net: nn.Module, calls: list[str] | None = None, heads: dict[str, int] | None = None) -> LayerModel:
    """The weight layers of `net` in forward order, its norms, attention heads and pairs (module docstring).
    `calls`: module names in forward call order (from hooks), used when fx cannot trace the model. `heads`: head
    counts by module name or glob, for attention modules that keep theirs under another name (`attention`)."""
    modules = dict(net.named_modules())
    graphs, reason = trace(net)
    graph, notes = graphs.get(""), []
    # inside a module kept whole, its submodules' traces and nn.Sequential still fix the data flow
    links = _traced_links(graphs, net)
    links |= {a: v for a, v in _sequential_links(net).items() if a not in links}
    if graph is not None:
        order = "torch.fx"
        position: dict[str, int] = {}
        for i, node in enumerate(graph.nodes):
            if node.op in ("call_module", "get_attr"):
                position.setdefault(str(node.target), i)
    else:
        order = "forward calls" if calls else "registration"
        position = {n: i for i, n in reversed(list(enumerate(calls or [])))}
        notes.append(
            f"torch.fx cannot trace {type(net).__name__} ({reason}); layer order from {order}, pairs only inside "
            "the submodules it traces and nn.Sequential"
        )
    folded_by = {bn: a for a, (bn, *_rest) in links.items() if bn is not None}

    def key(name: str) -> float:
        parts = name.split(".")
        for i in range(len(parts), -1, -1):
            if ".".join(parts[:i]) in position:
                return position[".".join(parts[:i])]
        return float("inf")

    attention, attention_notes = _attention(modules, heads or {})
    consumed = {c for _, _, names in attention.values() for c in names}
    layers, split_heads = [], []
    for rank, (name, m) in enumerate(modules.items()):
        if name in attention:
            rows, h, _ = attention[name]
            split_heads.append(h)
            for j, (rname, typ, kind, W, b) in enumerate(rows):
                layers.append(((key(name), rank, j), Layer(rname, typ, kind, W, b, tuple(W.shape), m)))
        if name in consumed:
            continue
        bn_name = links.get(name, (None,))[0]
        for j, layer in enumerate(_module_layers(name, m, modules[bn_name] if bn_name else None, bn_name or "")):
            layers.append(((key(layer.name), rank, j), layer))
    ordered = [layer for _, layer in sorted(layers, key=lambda t: t[0])]
    names = {layer.name for layer in ordered}
    pairs = {
        a: Pair(a, b, h, through)
        for a, (_, b, h, through) in links.items()
        if b is not None and a in names and b in names
    }
    norms = []
    for name, m in modules.items():
        if not isinstance(m, NORMS):
            continue
        if name in folded_by and any(layer.folded == name for layer in ordered):
            status = f"folded into {folded_by[name]}"
        elif isinstance(m, BATCHNORMS):
            status = "not folded: its input is not the sole output of a conv/linear layer; no pair crosses it"
        else:
            status = "normalises across units: no pair crosses it"
        norms.append({"name": name, "type": type(m).__name__, "status": status})
    return LayerModel(ordered, pairs, norms, split_heads, order, notes, attention_notes)


def input_side(a: Layer, b: Layer) -> torch.Tensor | None:
    """b's operator as a matrix whose columns are a's output units (a Linear after a channel-major Flatten reads
    C·positions inputs: each unit owns `positions` columns; a conv's k taps become rows), or None when the
    shapes do not chain."""
    units, W = a.matrix.shape[0], b.matrix
    if W.shape[1] % units or (isinstance(b.module, CONVS) and b.module.in_channels != units):
        return None
    return W.reshape(W.shape[0], units, -1).permute(0, 2, 1).reshape(-1, units)
