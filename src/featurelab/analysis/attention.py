"""Attention modules read as what they compute: W_Q, W_K, W_V, W_O, split per head.

Layouts recognised (each projection an ``nn.Linear``, torch layout: outputs are rows, q = x W_Qᵀ + b_Q):
- ``nn.MultiheadAttention``: ``in_proj_weight`` 3E x E stacked as Q, K, V (with ``in_proj_bias``), or separate
  ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``, and ``out_proj``;
- one fused Linear E -> 3E with rows Q, K, V (timm's ``qkv``, nanoGPT's ``c_attn``, ``qkv_proj``, ``Wqkv``);
- three Linears (``q_proj``/``k_proj``/``v_proj`` as in Hugging Face models, ``query``/``key``/``value``,
  ``wq``/``wk``/``wv``, ``q``/``k``/``v``), K and V possibly with fewer heads (grouped-query attention);
- the output projection: a child ``proj``, ``c_proj``, ``out_proj``, ``o_proj``, ``dense``, ``wo``, ``o`` or
  ``out``, or a sibling ``output.dense`` (BERT's layout); without one, the O and OV columns are NaN.
The head count H comes from the ``heads=`` argument (module names or globs), else from the first integer
attribute ``num_heads``, ``n_head``, ``n_heads``, ``num_attention_heads``, ``heads`` or ``nhead`` of the
module, its ``config``, or an enclosing module or its ``config``. Head h owns rows h·d_h .. (h+1)·d_h − 1 of
W_Q (d_h = rows/H) and the same columns of W_O; with H_kv < H key/value heads it reads K and V head
⌊h·H_kv/H⌋ (rows of W_K, W_V in blocks of d_h), as grouped-query attention computes (Ainslie et al.,
arXiv 2305.13245, §2.2).

Per head the attention scores are x W_Q,hᵀ W_K,h yᵀ and the value path writes x W_V,hᵀ W_O,hᵀ: the QK
circuit W_Q,hᵀ W_K,h and the OV circuit W_V,hᵀ W_O,hᵀ (both E x E of rank <= d_h; Elhage et al., "A
mathematical framework for transformer circuits", 2021, §"Attention heads as QK and OV circuits"). Their
singular values come from the d_h x d_h product of the triangular factors of thin QR decompositions
(A Bᵀ = Q_A (R_A R_Bᵀ) Q_Bᵀ), never from an E x E SVD.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import FeaturelabError
from ..measurements.ranks import spectrum_ranks

HEAD_COUNTS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "heads", "nhead")
FUSED = ("qkv", "c_attn", "qkv_proj", "Wqkv")
SEPARATE = (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"), ("wq", "wk", "wv"), ("q", "k", "v"))
OUTPUTS = ("proj", "c_proj", "out_proj", "o_proj", "dense", "wo", "o", "out")
Row = tuple[str, str, str, torch.Tensor, "torch.Tensor | None"]


@dataclass(frozen=True)
class Heads:
    """One attention module: name, number of heads H and of key/value heads, W_Q (H·d_h x E), W_K and W_V
    (kv_heads·d_h x E) and W_O (E x H·d_h, or None without an output projection)."""

    name: str
    num_heads: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor | None
    kv_heads: int = 0  # 0: as many as num_heads


@dataclass(frozen=True)
class Projections:
    """Where an attention module keeps its weights: the rows Q, K, V (name, type, matrix, bias), the output
    projection (name and Linear, or None) and the module names whose own weights these are."""

    qkv: tuple[tuple[str, str, torch.Tensor, torch.Tensor | None], ...]
    out_name: str  # "" without an output projection
    out: nn.Linear | None
    consumed: tuple[str, ...]


def _dotted(name: str, attr: str) -> str:
    return f"{name}.{attr}" if name else attr


def _linear(m: nn.Module | None, attr: str) -> nn.Linear | None:
    child = getattr(m, attr, None) if m is not None else None
    return child if isinstance(child, nn.Linear) else None


def _output(name: str, m: nn.Module, modules: dict[str, nn.Module], width: int) -> tuple[str, nn.Linear | None]:
    """The output projection reading `width` inputs: a child named in OUTPUTS, else a sibling ``output.dense``."""
    for attr in OUTPUTS:
        o = _linear(m, attr)
        if o is not None and o.in_features == width:
            return _dotted(name, attr), o
    sibling = _dotted(name.rpartition(".")[0], "output.dense")
    o = modules.get(sibling)
    return (sibling, o) if isinstance(o, nn.Linear) and o.in_features == width else ("", None)


def _chunks(W: torch.Tensor, b: torch.Tensor | None):
    """The thirds Q, K, V of a fused weight and of its bias."""
    return W.detach().chunk(3), b.detach().chunk(3) if b is not None else (None, None, None)


def _fused(name: str, m: nn.Module, modules: dict[str, nn.Module], attrs) -> Projections | None:
    for attr in attrs:
        f = _linear(m, attr)
        if f is None or f.out_features % 3:
            continue
        (q, k, v), biases = _chunks(f.weight, f.bias)
        out_name, out = _output(name, m, modules, f.out_features // 3)
        rows = tuple((_dotted(name, f"{attr}.{x}"), "Linear", W, b) for x, W, b in zip("qkv", (q, k, v), biases))
        return Projections(rows, out_name, out, (_dotted(name, attr), *([out_name] if out else [])))
    return None


def _separate(name: str, m: nn.Module, modules: dict[str, nn.Module]) -> Projections | None:
    for attrs in SEPARATE:
        lins = [_linear(m, a) for a in attrs]
        if any(p is None for p in lins) or len({p.in_features for p in lins if p is not None}) != 1:
            continue
        rows = tuple(
            (_dotted(name, a), "Linear", p.weight.detach(), p.bias.detach() if p.bias is not None else None)
            for a, p in zip(attrs, lins)
            if p is not None
        )
        out_name, out = _output(name, m, modules, rows[0][2].shape[0])
        return Projections(rows, out_name, out, (*(_dotted(name, a) for a in attrs), *([out_name] if out else [])))
    return None


def _multihead(name: str, m: nn.MultiheadAttention) -> Projections:
    if m.in_proj_weight is not None:
        (q, k, v), biases = _chunks(m.in_proj_weight, m.in_proj_bias)
    else:
        q, k, v = (p.detach() for p in (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight))
        biases = m.in_proj_bias.detach().chunk(3) if m.in_proj_bias is not None else (None, None, None)
    rows = tuple((_dotted(name, x), "MultiheadAttention", W, b) for x, W, b in zip("qkv", (q, k, v), biases))
    return Projections(rows, _dotted(name, "out_proj"), m.out_proj, (name, _dotted(name, "out_proj")))


def projections(name: str, m: nn.Module, modules: dict[str, nn.Module], given: bool = False) -> Projections | None:
    """`m`'s attention weights in one of the layouts of the module docstring, or None. `given` (a head count
    was passed for `m`): any Linear child E -> 3E whose outputs a sibling Linear of E inputs reads is read as a
    fused Q, K, V."""
    if isinstance(m, nn.MultiheadAttention):
        return _multihead(name, m)
    found = _fused(name, m, modules, FUSED) or _separate(name, m, modules)
    if found is not None or not given:
        return found
    children = [a for a, c in m.named_children() if isinstance(c, nn.Linear)]
    for attr in children:
        p = _fused(name, m, modules, [attr])
        if p is not None and p.out is not None:
            return p
    return None


def looks_like_attention(m: nn.Module) -> bool:
    """``nn.MultiheadAttention`` or a module with the Linear projections of one of the layouts above."""
    return projections("", m, {}) is not None


def _enclosing(name: str, modules: dict[str, nn.Module]) -> list[nn.Module]:
    """The modules that contain `name`, nearest first, the root last."""
    parts = name.split(".") if name else []
    return [modules[".".join(parts[:i])] for i in range(len(parts) - 1, -1, -1) if ".".join(parts[:i]) in modules]


def head_count(name: str, m: nn.Module, modules: dict[str, nn.Module], given: dict[str, int]) -> tuple[int, str]:
    """(H, where it came from) for attention module `name`: the first `given` pattern matching it, else an
    integer HEAD_COUNTS attribute of the module, its config, or an enclosing module or its config; (0, "") when
    none holds one."""
    for pattern, H in given.items():
        if fnmatch.fnmatchcase(name, pattern):
            return H, f"heads[{pattern!r}]"
    if isinstance(m, nn.MultiheadAttention):
        return m.num_heads, "num_heads"
    for holder in [m, *_enclosing(name, modules)]:
        for obj, prefix in ((holder, ""), (getattr(holder, "config", None), "config.")):
            for attr in HEAD_COUNTS:
                H = getattr(obj, attr, None)
                if isinstance(H, int) and not isinstance(H, bool) and H > 0:
                    return H, prefix + attr
    return 0, ""


def check_split(name: str, p: Projections, H: int, source: str) -> str:
    """'' when H heads split `p` (H divides Q's rows into d_h, K and V hold whole heads whose number divides H,
    W_O reads Q's rows); else the reason, naming `source`."""
    rows, kv = p.qkv[0][2].shape[0], p.qkv[1][2].shape[0]
    d = rows // H
    if rows % H or kv % d or p.qkv[2][2].shape[0] != kv or H % (kv // d):
        return (
            f"{name}: {source} = {H} heads do not split its projections (Q {rows} rows, K and V "
            f"{kv}, {p.qkv[2][2].shape[0]} rows; H must divide Q's rows and K, V must hold whole heads)"
        )
    return ""


def split(name: str, p: Projections, H: int) -> tuple[list[Row], Heads]:
    """[(row name, type, kind, matrix, bias)] for Q, K, V and the output projection, and the `Heads`."""
    rows: list[Row] = [(n, typ, f"attention {x}", W, b) for x, (n, typ, W, b) in zip("qkv", p.qkv)]
    o = p.out.weight.detach() if p.out is not None else None
    if p.out is not None and o is not None:
        rows.append((p.out_name, "Linear", "attention out", o, p.out.bias.detach() if p.out.bias is not None else None))
    q, k, v = (W for _, _, W, _ in p.qkv)
    kv_heads = k.shape[0] // (q.shape[0] // H)
    return rows, Heads(name, H, q, k, v, o, kv_heads)


def given_heads(heads) -> dict[str, int]:
    """The ``heads=`` argument checked: a mapping of module names or globs to positive integers."""
    if heads is None:
        return {}
    if not isinstance(heads, dict):
        raise FeaturelabError(
            f"heads must be a dict of module name (or glob) to head count, got {type(heads).__name__}"
        )
    for key, H in heads.items():
        if not isinstance(key, str) or not isinstance(H, int) or isinstance(H, bool) or H < 1:
            raise FeaturelabError(f"heads[{key!r}] = {H!r} is not allowed: give module name (or glob) -> integer >= 1")
    return dict(heads)


def _product_singular_values(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Singular values of A Bᵀ for tall A, B (E x d_h) from R_A R_Bᵀ (module docstring)."""
    return torch.linalg.svdvals(torch.linalg.qr(A).R @ torch.linalg.qr(B).R.T)


def head_rows(h: Heads, effective_rtol: float, rtol: float) -> list[dict]:
    """One row per head: sv1, stable, entropy and numerical rank of W_Q,h, W_K,h, W_V,h (d_h x E), W_O,h
    (E x d_h), the QK circuit W_Q,hᵀ W_K,h and the OV circuit W_V,hᵀ W_O,hᵀ (O and OV NaN without W_O)."""
    d = h.q.shape[0] // h.num_heads
    group = h.num_heads // (h.kv_heads or h.num_heads)  # query heads per key/value head
    nan = {"sv1": float("nan"), "stable_rank": float("nan"), "entropy_rank": float("nan"), "numerical_rank": 0}
    rows = []
    for i in range(h.num_heads):
        sl, kv = slice(i * d, (i + 1) * d), slice((i // group) * d, (i // group + 1) * d)
        q, k, v = h.q[sl], h.k[kv], h.v[kv]
        spectra = {
            "q": torch.linalg.svdvals(q),
            "k": torch.linalg.svdvals(k),
            "v": torch.linalg.svdvals(v),
            "o": torch.linalg.svdvals(h.o[:, sl]) if h.o is not None else None,
            "qk": _product_singular_values(q.T, k.T),
            "ov": _product_singular_values(v.T, h.o[:, sl]) if h.o is not None else None,
        }
        row: dict = {"name": h.name, "head": i, "d_head": d}
        for key, s in spectra.items():
            r = (
                spectrum_ranks(s, effective_rtol=effective_rtol, numerical_rtol=rtol) | {"sv1": float(s[0])}
                if s is not None
                else nan
            )
            row |= {f"{key}_{c}": r[c] for c in ("sv1", "stable_rank", "entropy_rank", "numerical_rank")}
        rows.append(row)
    return rows
