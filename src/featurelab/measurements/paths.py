"""Path enumeration and the tree network of Lemma 1 (docs/theory/invariances.md §2; Le & Jegelka, ICLR 2022).

For a bias-free homogeneous network (a `HomogeneousNet`, or an `MLP` accepted by `as_homogeneous`) with
input x ∈ R^d and one output neuron o, every maximal input→o path p gives

    h_p(x) = x_{i(p)} · Π_{e ∈ p} w_e          (fixed edges, e.g. identity skips, contribute 1),

and Lemma 1 writes f = T ∘ h with a tree network T whose weights are ±1, set only by sgn(w): the nodes
of T are the path suffixes ending at o, the edge child→parent carries sgn(w_{uv}) (sgn(0) := +1), each
node applies its first neuron's activation, and leaf p feeds a linear node with weight
s_p = Π_{e∈p} sgn(w_e). Rows are samples: ``path_enumeration(model, X)`` is ``N x m``.

These tools build the network's neuron graph explicitly, so they are for small networks: more than
`max_paths` paths is refused with the count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import as_matrix, int_at_least
from ..errors import FeaturelabError
from ..models.conv import Conv
from ..models.residual import Dense, Flatten, ResBlock, as_homogeneous

MAX_PATHS = 1000


@dataclass
class Graph:
    """The neuron DAG: `leak[v]` (inputs have None), `inputs` (neuron ids of x_1..x_d in order), `output`,
    and `in_edges[v]` = list of (u, k) with k the index of the edge weight in the flat parameter vector
    ``cat([p.reshape(-1) for p in params], [1])`` (k = len - 1: a fixed edge of weight 1)."""

    leak: list
    inputs: list[int]
    output: int
    in_edges: list[list[tuple[int, int]]]
    params: list[torch.nn.Parameter]


def neuron_graph(model) -> Graph:
    """The neuron graph of `model` (a HomogeneousNet or a bias-free MLP), Part 5 §1."""
    net = as_homogeneous(model)
    params = [p for p in net.parameters()]
    offsets, total = {}, 0
    for p in params:
        offsets[id(p)] = total
        total += p.numel()
    fixed = total
    leak: list = []
    in_edges: list[list] = []

    def new(n, lk):
        start = len(leak)
        for j in range(n):
            leak.append(float(lk[j]) if lk is not None else None)
            in_edges.append([])
        return torch.arange(start, start + n)

    shape = net.input_shape
    cur = new(net.d_in, None)
    inputs = cur.tolist()
    if shape:
        cur = cur.reshape(shape)
    for s in net.stages:
        if isinstance(s, Flatten):
            cur = cur.reshape(-1)
        elif isinstance(s, Dense):
            out = new(s.weight.shape[0], s.leak)
            o = offsets[id(s.weight)]
            for j, v in enumerate(out.tolist()):
                in_edges[v] = [(int(u), o + j * len(cur) + i) for i, u in enumerate(cur.tolist())]
            cur = out
        elif isinstance(s, Conv):
            c_out, c_in, kh, kw = s.weight.shape
            _, H, W = cur.shape
            oc, oh, ow = s.out_shape(tuple(cur.shape))
            out = new(oc * oh * ow, s.leak.repeat_interleave(oh * ow)).reshape(oc, oh, ow)
            o = offsets[id(s.weight)]
            for co in range(oc):
                for y in range(oh):
                    for x in range(ow):
                        edges = []
                        for ci in range(c_in):
                            for p in range(kh):
                                for q in range(kw):
                                    iy, ix = y * s.stride - s.padding + p, x * s.stride - s.padding + q
                                    if 0 <= iy < H and 0 <= ix < W:
                                        edges.append((int(cur[ci, iy, ix]), o + ((co * c_in + ci) * kh + p) * kw + q))
                        in_edges[int(out[co, y, x])] = edges
            cur = out
        else:
            assert isinstance(s, ResBlock)  # HomogeneousNet admits nothing else
            hid = new(s.b, [s.leak_in] * s.b)
            o1, o2 = offsets[id(s.V1)], offsets[id(s.V2)]
            for j, v in enumerate(hid.tolist()):
                in_edges[v] = [(int(u), o1 + j * s.a + i) for i, u in enumerate(cur.tolist())]
            out = new(s.c, [s.leak_out] * s.c)
            for j, v in enumerate(out.tolist()):
                edges = [(int(u), o2 + j * s.b + i) for i, u in enumerate(hid.tolist())]
                if s.kind == "identity":
                    edges.append((int(cur[j]), fixed))
                elif s.kind == "diagonal":
                    edges.append((int(cur[j]), offsets[id(s.d)] + j))
                else:
                    o3 = offsets[id(s.V3)]
                    edges += [(int(u), o3 + j * s.a + i) for i, u in enumerate(cur.tolist())]
                in_edges[v] = edges
            cur = out
    return Graph(leak, inputs, int(cur[0]), in_edges, params)


def flat_weights(graph: Graph) -> torch.Tensor:
    """``cat([p.reshape(-1) for p in params], [1])``: every edge weight by its index (last: fixed edges)."""
    ps = [p.reshape(-1) for p in graph.params]
    return torch.cat(ps + [torch.ones(1, dtype=ps[0].dtype, device=ps[0].device)])


def count_paths(graph: Graph) -> int:
    """m, the number of maximal input→o paths (dynamic programming over the DAG)."""
    count = [0] * len(graph.leak)
    for v in graph.inputs:
        count[v] = 1
    for v in range(len(graph.leak)):  # neuron ids are topologically ordered
        if graph.in_edges[v]:
            count[v] = sum(count[u] for u, _ in graph.in_edges[v])
    return count[graph.output]


@dataclass
class Paths:
    """Every maximal input→o path: `input[p]` (index of x_{i(p)}), `edges[p]` (weight indices along p from
    the input to o), the graph, and the DFS order that `TreeNetwork` uses."""

    graph: Graph
    input: torch.Tensor
    edges: list[list[int]]

    def __len__(self) -> int:
        return len(self.edges)

    def weight_products(self) -> torch.Tensor:
        """Π_{e∈p} w_e for each path (length m; differentiable in the parameters)."""
        w = flat_weights(self.graph)
        L = max(len(e) for e in self.edges)
        fixed = w.numel() - 1
        idx = torch.tensor([e + [fixed] * (L - len(e)) for e in self.edges], device=w.device)
        return w[idx].prod(dim=1)

    def incidence(self, param: torch.nn.Parameter) -> torch.Tensor:
        """``m x param.numel()`` counts of each entry of `param` on each path (Part 5 §3, fact 2)."""
        start = 0
        for p in self.graph.params:
            if p is param:
                break
            start += p.numel()
        else:
            raise FeaturelabError("param is not a parameter of this network")
        out = torch.zeros(len(self.edges), param.numel(), dtype=torch.float64, device=param.device)
        for i, e in enumerate(self.edges):
            for k in e:
                if start <= k < start + param.numel():
                    out[i, k - start] += 1
        return out


def enumerate_paths(model, max_paths: int = MAX_PATHS) -> Paths:
    """All maximal input→o paths of `model` (Part 5 §2); refuses when there are more than `max_paths`."""
    int_at_least("max_paths", max_paths, 1)
    graph = neuron_graph(model)
    m = count_paths(graph)
    if m > max_paths:
        raise FeaturelabError(
            f"the network has {m} input→output paths, more than max_paths={max_paths}; "
            "path enumeration is for small networks (raise max_paths to force it)"
        )
    position = {v: i for i, v in enumerate(graph.inputs)}
    inputs, edges = [], []

    def walk(v, suffix):
        if v in position:
            inputs.append(position[v])
            edges.append(suffix)
            return
        for u, k in graph.in_edges[v]:
            walk(u, [k] + suffix)

    walk(graph.output, [])
    return Paths(graph, torch.tensor(inputs), edges)


def path_enumeration(model, X, max_paths: int = MAX_PATHS, paths: Paths | None = None) -> torch.Tensor:
    """h(X): ``N x m`` with h_p(x) = x_{i(p)} Π_{e∈p} w_e (Part 5 §2), rows = samples, columns in the
    order of `enumerate_paths` (and of `tree_network`). Differentiable in the parameters."""
    paths = paths or enumerate_paths(model, max_paths)
    X = as_matrix("X", X, paths.graph.params[0].dtype)
    if X.shape[1] != len(paths.graph.inputs):
        raise FeaturelabError(f"X has {X.shape[1]} columns but the network reads {len(paths.graph.inputs)}")
    return X[:, paths.input] * paths.weight_products()


class TreeNetwork:
    """T of Lemma 1 (Part 5 §2): ``T(Z)`` maps ``N x m`` path inputs to ``N`` outputs with ±1 weights
    fixed at construction from sgn(w). `signs[p]` = s_p = Π_{e∈p} sgn(w_e)."""

    def __init__(self, paths: Paths):
        g = paths.graph
        sgn = torch.where(flat_weights(g).detach() >= 0, 1.0, -1.0).to(torch.float64)
        self.signs = torch.stack([sgn[e].prod() for e in paths.edges])
        # nodes in post-order: (leak, [(child, sign)]) with child >= 0 a node, child < 0 the leaf -1-p
        self.nodes: list[tuple[float, list[tuple[int, float]]]] = []
        position = {v: i for i, v in enumerate(g.inputs)}
        counter = iter(range(len(paths)))

        def build(v) -> int:
            children = []
            for u, k in g.in_edges[v]:
                child = -1 - next(counter) if u in position else build(u)
                children.append((child, float(sgn[k])))
            self.nodes.append((g.leak[v], children))
            return len(self.nodes) - 1

        build(g.output)

    def __call__(self, Z: torch.Tensor) -> torch.Tensor:
        """Z: ``N x m`` (rows = samples) -> T(Z): ``N``."""
        leaves = Z * self.signs.to(Z.dtype)
        values = []
        for leak, children in self.nodes:
            z = torch.stack([s * (leaves[:, -1 - c] if c < 0 else values[c]) for c, s in children]).sum(0)
            values.append(torch.where(z > 0, z, leak * z))
        return values[-1]


def tree_network(model, max_paths: int = MAX_PATHS) -> TreeNetwork:
    """The ±1 tree network T with f = T ∘ h (Lemma 1, Part 5 §2), paths in `enumerate_paths` order."""
    return TreeNetwork(enumerate_paths(model, max_paths))
