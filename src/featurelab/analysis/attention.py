"""Attention modules read as what they compute: W_Q, W_K, W_V, W_O, split per head.

Two layouts are recognised: ``nn.MultiheadAttention`` (``in_proj_weight`` 3E x E stacked as Q, K, V, with
``in_proj_bias``; or separate ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``) with ``out_proj``, and
the timm layout: a module with a ``qkv`` Linear (E -> 3E, rows Q, K, V), an integer ``num_heads`` and a
``proj`` Linear. In both, head h owns rows h·d_h .. (h+1)·d_h − 1 of each of W_Q, W_K, W_V (torch layout:
outputs are rows, q = x W_Qᵀ + b_Q) and the same columns of W_O, d_h = E/H.

Per head the attention scores are x W_Q,hᵀ W_K,h yᵀ and the value path writes x W_V,hᵀ W_O,hᵀ: the QK
circuit W_Q,hᵀ W_K,h and the OV circuit W_V,hᵀ W_O,hᵀ (both E x E of rank <= d_h; Elhage et al., "A
mathematical framework for transformer circuits", 2021, §"Attention heads as QK and OV circuits"). Their
singular values come from the d_h x d_h product of the triangular factors of thin QR decompositions
(A Bᵀ = Q_A (R_A R_Bᵀ) Q_Bᵀ), never from an E x E SVD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from ..measurements.ranks import spectrum_ranks


@dataclass(frozen=True)
class Heads:
    """One attention module: name, number of heads, and W_Q, W_K, W_V (E x E_in, rows are outputs) and W_O."""

    name: str
    num_heads: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor


def is_attention(m: nn.Module) -> bool:
    """``nn.MultiheadAttention``, or a timm-style module with a fused ``qkv`` Linear, ``num_heads`` and ``proj``."""
    if isinstance(m, nn.MultiheadAttention):
        return True
    qkv, proj = getattr(m, "qkv", None), getattr(m, "proj", None)
    return (
        isinstance(qkv, nn.Linear)
        and isinstance(proj, nn.Linear)
        and isinstance(getattr(m, "num_heads", None), int)
        and qkv.out_features == 3 * proj.in_features
    )


def split(name: str, m: nn.Module) -> tuple[list[tuple[str, str, str, torch.Tensor, torch.Tensor | None]], Heads]:
    """[(row name, type, kind, matrix, bias)] for Q, K, V and the output projection of attention module `m`
    named `name`, and its `Heads`."""
    if isinstance(m, nn.MultiheadAttention):
        if m.in_proj_weight is not None:
            q, k, v = m.in_proj_weight.detach().chunk(3)
        else:
            q, k, v = (p.detach() for p in (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight))
        biases = m.in_proj_bias.detach().chunk(3) if m.in_proj_bias is not None else (None, None, None)
        prefix, kind, out_name, heads = name, "MultiheadAttention", f"{name}.out_proj", m.num_heads
        out = m.out_proj
    else:
        qkv = cast(nn.Linear, m.qkv)
        q, k, v = qkv.weight.detach().chunk(3)
        biases = qkv.bias.detach().chunk(3) if qkv.bias is not None else (None, None, None)
        prefix, kind, out_name, heads = f"{name}.qkv", "Linear", f"{name}.proj", cast(int, m.num_heads)
        out = cast(nn.Linear, m.proj)
    rows = [(f"{prefix}.{x}", kind, f"attention {x}", W, b) for x, W, b in zip("qkv", (q, k, v), biases)]
    bo = out.bias.detach() if out.bias is not None else None
    rows.append((out_name, "Linear", "attention out", out.weight.detach(), bo))
    return rows, Heads(name, heads, q, k, v, out.weight.detach())


def _product_singular_values(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Singular values of A Bᵀ for tall A, B (E x d_h) from R_A R_Bᵀ (module docstring)."""
    return torch.linalg.svdvals(torch.linalg.qr(A).R @ torch.linalg.qr(B).R.T)


def head_rows(h: Heads, effective_rtol: float, rtol: float) -> list[dict]:
    """One row per head: sv1, stable, entropy and numerical rank of W_Q,h, W_K,h, W_V,h (d_h x E), W_O,h
    (E x d_h), the QK circuit W_Q,hᵀ W_K,h and the OV circuit W_V,hᵀ W_O,hᵀ."""
    d = h.q.shape[0] // h.num_heads
    rows = []
    for i in range(h.num_heads):
        sl = slice(i * d, (i + 1) * d)
        q, k, v, o = h.q[sl], h.k[sl], h.v[sl], h.o[:, sl]
        spectra = {
            "q": torch.linalg.svdvals(q),
            "k": torch.linalg.svdvals(k),
            "v": torch.linalg.svdvals(v),
            "o": torch.linalg.svdvals(o),
            "qk": _product_singular_values(q.T, k.T),
            "ov": _product_singular_values(v.T, o),
        }
        row: dict = {"name": h.name, "head": i, "d_head": d}
        for key, s in spectra.items():
            r = spectrum_ranks(s, effective_rtol=effective_rtol, numerical_rtol=rtol)
            row |= {
                f"{key}_sv1": float(s[0]),
                f"{key}_stable_rank": r["stable_rank"],
                f"{key}_entropy_rank": r["entropy_rank"],
                f"{key}_numerical_rank": r["numerical_rank"],
            }
        rows.append(row)
    return rows
