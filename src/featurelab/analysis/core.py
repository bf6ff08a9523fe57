"""`analyze`: the feature-learning measurements of any PyTorch model in one call (rows are samples).

The model is analysed on a float64 CPU copy in eval mode; the model itself is never modified. Its layer
model (`layers.layer_model`: weight layers in forward order, BatchNorm folded, attention split, pairs) gives
one row per weight layer; with data, forward hooks give one row per chosen representation
(`representations.select`). Integer inputs (token ids) stay integers; when the blocks act on (batch, tokens,
width) each 3-D representation is read per token (N·T rows), and integer inputs give the stream entering the
first block as the input row ("embedded").

Formulas (s_1 >= s_2 >= ... the singular values; docs/analyze.md states each with its source):
- stable rank ‖M‖²_F/‖M‖²_op, nuclear rank ‖M‖²_*/‖M‖²_F (Jacot & Kaiser, arXiv 2405.17573, Prop. 1),
  threshold effective rank #{s_i >= effective_rtol·s_1}, entropy effective rank exp(−Σ p_i log p_i),
  p_i = s_i/Σ s_j (Roy & Vetterli, EUSIPCO 2007), numerical rank #{s_i > rtol·s_1} (Jacot, arXiv 2306.00394);
- COI_γ(A) = Tr[Aᵀ(K + γI)⁻¹A], K = σ(A)σ(A)ᵀ, σ(A) = [ReLU(A), 1], γ = γ₀‖K‖_op (arXiv 2405.17573 §2.2);
- per-neuron balancedness ‖w_in‖² + b² − ‖w_out‖² (arXiv 2306.00394 §2.4; invariant under gradient flow of
  positively homogeneous nets, Du, Hu & Lee, arXiv 1806.00900, Thm. 2.1);
- adjacent alignment |⟨u_1(W_l), v_1(W_{l+1})⟩| (Le & Jegelka, arXiv 2201.11968, Thm. 2, eq. (15));
- bottleneck rank k_mid = median over the middle layers of #{s_i(W_l) > 0.1} after `rebalance`
  (arXiv 2306.00394 §4a);
- WeightWatcher's norm, spectral norm, stable rank and power-law exponent alpha of its ESD
  (`weightwatcher.columns`; Martin & Mahoney, JMLR 22, 2021).
"""

from __future__ import annotations

import copy
import time
from functools import partial
from typing import cast

import numpy as np
import pandas as pd
import scipy.linalg
import torch
from torch import nn

from ..checks import int_at_least, non_negative
from ..errors import FeaturelabError
from ..measurements.bottleneck import bottleneck_rank, rebalance
from ..measurements.jacobian import jacobian_ranks, ntk_trace
from ..measurements.ranks import spectrum_ranks
from ..models.convert import from_torch, to_torch
from ..models.leaky_resnet import LeakyResNet
from ..models.mlp import MLP
from . import weightwatcher as ww
from .attention import given_heads, head_rows
from .conv_operator import conv_inputs, operator_spectrum
from .layers import Layer, input_side, layer_model
from .loaders import WeightsChain, WeightsFile, check_values
from .report import ModelAnalysis
from .representations import Captured, acts_on_tokens, blocks, capture, functional, row, select
from .spectra import singular_values


def _check_model(model: nn.Module) -> None:
    if not isinstance(model, nn.Module):
        raise FeaturelabError(f"model must be a torch nn.Module, got {type(model).__name__}")
    named = list(model.named_parameters()) + list(model.named_buffers())
    meta = [n for n, p in named if p.is_meta]
    if meta:
        raise FeaturelabError(
            f"model has tensors on the meta device ({', '.join(meta[:3])}{', ...' if len(meta) > 3 else ''}), which "
            "hold no values: load its weights first (model.to_empty(device='cpu') then load_state_dict)"
        )
    check_values({n: p.detach() for n, p in model.named_parameters()}, "model", "parameters")


def _as_samples(name: str, X) -> torch.Tensor:
    if isinstance(X, np.ndarray):
        if X.dtype.kind not in "biuf":
            raise FeaturelabError(f"{name} has dtype {X.dtype}; allowed: numeric arrays (bool, int, float)")
        X = torch.from_numpy(X)
    if not isinstance(X, torch.Tensor):
        raise FeaturelabError(f"{name} must be a tensor or array with one row per sample, got {type(X).__name__}")
    if X.ndim == 0:
        raise FeaturelabError(f"{name} is a 0-d tensor (a scalar); it needs one row per sample (N x ...)")
    if len(X) == 0:
        raise FeaturelabError(f"{name} has 0 rows; it needs at least one sample")
    return X.detach().cpu()


def _fit(out: torch.Tensor, Y) -> dict:
    Y = _as_samples("Y", Y)
    if len(Y) != len(out):
        raise FeaturelabError(f"Y has {len(Y)} rows but X has {len(out)}; both need one row per sample")
    if not (Y.is_floating_point() or Y.is_complex()):  # labels of any integer dtype, one per sample or token
        Y = Y.long().reshape(-1)
        scores = out.ndim >= 2 and out.shape[-1] > 1
        pred = out.argmax(-1).reshape(-1) if scores else (out.reshape(-1) > 0).long()
        if len(pred) != len(Y):
            raise FeaturelabError(
                f"Y has shape {tuple(Y.shape)} but the model's output {tuple(out.shape)} gives {len(pred)} predictions"
            )
        return {"train_error": float((pred != Y).double().mean())}
    if Y.numel() != out.numel():
        raise FeaturelabError(f"Y has shape {tuple(Y.shape)} but the model's output has {tuple(out.shape)}")
    Y = Y.double().reshape(out.shape)
    return {"relative_mse": float(((out - Y) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum().clamp_min(1e-300))}


def _spectra(layer: Layer, vector: bool, weightwatcher: bool):
    """(singular values, top left singular vector when `vector`, WeightWatcher's eigenvalues and its N when
    `weightwatcher`, else None).

    WeightWatcher reads the stored kernel (BatchNorm not folded), a Conv2d per k_h·k_w slice (`weightwatcher.esd`).
    For an ungrouped Conv2d with out <= in and out > 128 one batch of slice Gram matrices G_ij = W_ij W_ijᵀ serves
    both: the unfolded operator has M Mᵀ = D (Σ_ij G_ij) D, D the folded BatchNorm's factor, whose
    eigendecomposition gives its singular values (the Gram route of `spectra.singular_values`) and top left
    singular vector."""
    m = layer.module
    stored = isinstance(m, nn.Linear | nn.Conv1d | nn.Conv2d) and layer.kind in ("linear", "conv", "grouped conv")
    raw = cast(torch.Tensor, m.weight).detach() if stored and m is not None else layer.matrix
    conv2d = isinstance(m, nn.Conv2d) and stored
    esd = None
    if conv2d and layer.groups == 1 and 128 < raw.shape[0] <= raw.shape[1]:
        slices = raw.permute(2, 3, 0, 1).reshape(-1, raw.shape[0], raw.shape[1])
        G = slices @ slices.transpose(1, 2)
        if weightwatcher:
            evals = torch.linalg.eigvalsh(G).clamp_min(0).reshape(-1).numpy() * ww.CONV2D_SCALE
            esd = (evals, ww.sides(raw, True)[0])
        d = layer.scale if layer.scale is not None else torch.ones(raw.shape[0], dtype=raw.dtype)
        MMt = G.sum(0) * d[:, None] * d[None, :]
        s = torch.linalg.eigvalsh(MMt).flip(0).clamp_min(0).sqrt()
        return s, _top_eigenvector(MMt) if vector else None, esd
    s = singular_values(layer.matrix)
    if weightwatcher:
        esd = (ww.esd(raw, conv2d), ww.sides(raw, conv2d)[0])
    return s, _top_left(layer.matrix) if vector else None, esd


def _operator_columns(layer: Layer, inputs: dict | None, top: int) -> tuple[dict, str]:
    """The operator_* columns of a conv row (`conv_operator.operator_spectrum` at the input shape the data gave,
    BatchNorm folded, bias excluded; NaN for other rows and without data) and a note ("" when none)."""
    cols: dict = {"operator_input": "", "operator_method": ""}
    cols |= {f"operator_sv{i + 1}": np.nan for i in range(top)} | {"operator_stable_rank": np.nan}
    m = layer.module
    if not isinstance(m, nn.Conv1d | nn.Conv2d) or layer.kind not in ("conv", "grouped conv") or inputs is None:
        return cols, ""
    if layer.name not in inputs:
        return cols, f"conv {layer.name} was not called on X: no operator columns"
    op = operator_spectrum(m, inputs[layer.name], layer.scale, k=top)
    cols |= {"operator_input": "x".join(map(str, op.input)), "operator_method": op.method}
    cols |= {f"operator_sv{i + 1}": float(v) for i, v in enumerate(op.values[:top])}
    cols["operator_stable_rank"] = op.stable_rank
    if op.full or np.isfinite(op.frobenius_sq):
        return cols, ""
    return cols, (
        f"conv {layer.name}: operator on {cols['operator_input']} by Lanczos (top {len(op.values)} singular values); "
        f"its stable rank is unknown with {m.padding_mode} padding"
    )


def _top_left(M: torch.Tensor) -> torch.Tensor:
    """The top left singular vector of M (sign arbitrary), from the smaller Gram matrix's top eigenvector."""
    if M.shape[0] <= M.shape[1]:
        return _top_eigenvector(M @ M.T)
    u = M @ _top_eigenvector(M.T @ M)
    return u / torch.linalg.vector_norm(u)


def _top_eigenvector(G: torch.Tensor) -> torch.Tensor:
    """The eigenvector of the largest eigenvalue of the symmetric G (LAPACK syevr for that one pair only)."""
    n = G.shape[0]
    return torch.from_numpy(scipy.linalg.eigh(G.numpy(), subset_by_index=[n - 1, n - 1])[1][:, 0])


def _layer_rows(lm, top, effective_rtol, rtol, weightwatcher, inputs=None, notes=None):
    """The layers table, the spectra, the per-unit balance of every homogeneous pair and WeightWatcher's
    eigenvalues (`weightwatcher.esd`), by layer name. `inputs`: each conv's input shape on the data
    (`conv_operator.conv_inputs`), None without data; `notes` receives what the operator and fit columns leave
    out. Alignment reads the top singular vectors as top eigenvectors of the units x units Gram matrices
    (accurate to ε·s_1²/(s_1² − s_2²))."""
    by_name = {layer.name: layer for layer in lm.layers}
    rows, spectra, balance, esd, few, said = [], {}, {}, {}, [], []
    for layer in lm.layers:
        pair = lm.pairs.get(layer.name)
        s, u1, evals = _spectra(layer, pair is not None, weightwatcher)
        spectra[layer.name] = s.numpy()
        r = {
            "name": layer.name,
            "type": layer.type,
            "kind": layer.kind,
            "shape": "x".join(map(str, layer.shape)),
            "matrix": f"{layer.matrix.shape[0]}x{layer.matrix.shape[1]}",
            "groups": layer.groups,
            "folded": layer.folded,
        }
        r |= {f"sv{i + 1}": float(s[i]) if i < len(s) else np.nan for i in range(top)}
        r |= {
            "frobenius_sq": float((s**2).sum()),
            "bias_sq": float((layer.bias**2).sum()) if layer.bias is not None else 0.0,
        }
        r |= spectrum_ranks(s, effective_rtol=effective_rtol, numerical_rtol=rtol)
        operator, note = _operator_columns(layer, inputs, top)
        r |= operator
        said += [note, getattr(layer.module, "groups_note", "")]
        r |= _pair_columns(layer, by_name[pair.b] if pair else None, pair, u1, balance)
        if evals is not None:
            esd[layer.name] = evals[0]
            r |= ww.columns(*evals)
            if np.isnan(r["ww_alpha"]):
                few.append(f"{layer.name} ({int((evals[0] > ww.EVALS_THRESH).sum())})")
        rows.append(r)
    if notes is not None:
        notes += list(dict.fromkeys(n for n in said if n))
        if inputs is None and any(layer.kind in ("conv", "grouped conv") for layer in lm.layers):
            notes.append(
                "no inputs X: the conv operator columns (operator_*) are NaN; the operator depends on its input size"
            )
        if few:
            notes.append(
                f"too few eigenvalues (n < {ww.MIN_FIT}) for a power-law fit: ww_alpha and the other fit columns "
                f"are NaN for {', '.join(few)}"
            )
    return pd.DataFrame(rows), spectra, balance, esd


def _pair_columns(layer: Layer, nxt: Layer | None, pair, u1, balance: dict) -> dict:
    """next, via, alignment and (homogeneous pairs) balance_mean, balance_residual of a layer with its pair;
    the per-unit in − out goes into `balance`."""
    r = {"next": "", "via": "", "balance_mean": np.nan, "balance_residual": np.nan, "alignment": np.nan}
    side = input_side(layer, nxt) if nxt is not None else None
    if nxt is None or side is None or u1 is None:
        return r
    r["next"], r["via"] = nxt.name, pair.through
    r["alignment"] = float((u1 @ _top_left(side.T)).abs())
    if pair.homogeneous:
        incoming = (layer.matrix**2).sum(1) + (layer.bias**2 if layer.bias is not None else 0.0)
        outgoing = (side**2).sum(0)
        diff, total = incoming - outgoing, incoming + outgoing
        res = torch.where(total > 0, diff.abs() / total.clamp_min(1e-300), torch.zeros_like(diff))
        balance[layer.name] = diff.numpy()
        r |= {"balance_mean": float(diff.mean()), "balance_residual": float(res.max())}
    return r


def _bottleneck(net, lm, layers, atol, notes, summary):
    """k_mid of a rebalanced leaky-ReLU Linear chain (``nn.Sequential``), with count_rebalanced per layer."""
    rebalanced_spectra, mlp = {}, None
    reason = f"{type(net).__name__} is not an nn.Sequential Linear/activation chain"
    if isinstance(net, nn.Sequential):
        try:
            mlp = from_torch(net)
        except FeaturelabError as exc:
            reason = str(exc)
    if mlp is not None and not mlp.homogeneous:
        mlp, reason = None, f"activation {mlp.activation!r} is not positively homogeneous"
    elif mlp is not None and mlp.depth < 2:
        mlp, reason = None, "a single weight layer has no middle layers"
    summary["bottleneck"] = None
    if mlp is not None:
        try:
            reb = rebalance(mlp, rtol=1e-6, max_sweeps=20000)  # singular values move by O(rtol)
        except FeaturelabError as exc:
            reason = str(exc)
        else:
            bn = bottleneck_rank(reb, atol=atol)
            linear_rows = [i for i, layer in enumerate(lm.layers) if layer.kind == "linear"]
            counts = [np.nan] * len(lm.layers)
            for i, W in zip(linear_rows, reb.weight_matrices()):
                s = torch.linalg.svdvals(W.detach())
                rebalanced_spectra[lm.layers[i].name] = s.numpy()
                counts[i] = int((s > atol).sum())
            layers.insert(layers.columns.get_loc("numerical_rank") + 1, "count_rebalanced", counts)
            summary["bottleneck"] = {
                "k_mid": bn.k_mid,
                "counts": bn.counts,
                "layers": bn.layers,
                "threshold": bn.atol,
                "sq_norm": float(mlp.sq_norm().detach()),
                "sq_norm_rebalanced": float(reb.sq_norm().detach()),
            }
    if summary["bottleneck"] is None:
        notes.append(f"no bottleneck rank k_mid (read from a rebalanced leaky-ReLU Linear chain): {reason}")
    return rebalanced_spectra


def _check_output(out) -> None:
    """One line for an output `analyze` cannot read as N x d rows: a scalar, or NaN/inf entries."""
    if not isinstance(out, torch.Tensor):
        return
    if out.dim() == 0:
        raise FeaturelabError("the model's output on X is a scalar; analyze needs one output row per sample (N x d)")
    if not torch.isfinite(out).all():
        raise FeaturelabError(
            "the model's output on X contains NaN or inf; check its parameters (the weights file) and X's scale"
        )


def _inputs(X) -> torch.Tensor:
    """X as the model will see it: floats in float64, integers (token ids) as int64, never cast to float."""
    X = _as_samples("X", X)
    if X.is_floating_point():
        X = X.to(torch.float64)
        if not torch.isfinite(X).all():
            raise FeaturelabError("X contains NaN or inf; all entries must be finite")
    elif X.dtype != torch.bool and not X.is_complex():
        X = X.long()
    return X


def _forward(net: nn.Module, X: torch.Tensor, names: set[str], funcs, stream: list[str]) -> Captured:
    """One hooked forward pass (`representations.capture`); a model that fails on X is one line."""
    try:
        cap = capture(net, X, names, funcs, stream)
    except (RuntimeError, TypeError, IndexError, ValueError) as exc:
        ids = "" if X.is_floating_point() else f", dtype {str(X.dtype).removeprefix('torch.')}"
        raise FeaturelabError(
            f"the model failed on X of shape {tuple(X.shape)}{ids} ({str(exc).splitlines()[0]}); give X in the shape "
            "the model takes, rows are samples (conv nets: N x c x H x W; token ids: N x T integers; command line: "
            "--shape c,H,W)"
        ) from None
    _check_output(cap.out)
    return cap


def _input_rows(X: torch.Tensor, cap: Captured, notes: list[str]) -> list[tuple]:
    """The input row: X itself (a boolean X as 0/1), or for integer X (token ids, whose values have no spectrum)
    the embedded stream entering the first block (row "embedded")."""
    if X.is_floating_point() or X.dtype == torch.bool:
        return [("input", "input", X.double(), X.double())]
    if cap.entry is not None and cap.entry.is_floating_point():
        return [("embedded", "input", cap.entry, cap.entry)]
    notes.append("X holds integer ids and the model has no repeated blocks: no input row (ids have no spectrum)")
    return []


def _representations(net, X, representations, per_token, measure, notes: list[str], summary: dict):
    """The representation rows and spectra (input or embedded stream, each chosen module or functional
    activation call, output) and the forward pass's `Captured`. `measure`: `representations.row` with the
    options bound."""
    funcs = functional(net)
    names, rule = select(net, representations, funcs)
    stream = blocks(net)
    cap = _forward(net, X, names, funcs, stream)
    if per_token is None:  # the blocks act on (batch, tokens, width): the residual stream is read per token
        modules = dict(net.named_modules())
        per_token = bool(cap.block) and acts_on_tokens(modules[cap.block], cap.block_shape or torch.Size())
    summary["representations"] = rule + ("; 3-D ones read per token (N·T rows)" if per_token else "")
    reps = cap.reps
    if isinstance(net, LeakyResNet) and representations is None:
        with torch.no_grad():
            reps = [(f"A_{l}", "LeakyResNet", A, A) for l, A in enumerate(net.representations(X))]
    rows, spectra = [], {}
    out = cast(torch.Tensor, cap.out)
    for name, kind, coi_A, A in [*_input_rows(X, cap, notes), *reps, ("output", "output", out, out)]:
        r, s = measure(name, kind, A, coi_A, per_token=per_token)
        rows.append(r)
        spectra[name] = s
    hidden = [r for r in rows if r["type"] not in ("input", "output")]
    if hidden:
        low = min(hidden, key=lambda r: r["effective_rank"])
        summary["representation_bottleneck"] = {"name": low["name"], "effective_rank": low["effective_rank"]}
    return rows, spectra, cap


def _jacobian(net: nn.Module, X: torch.Tensor, k: int, rtol: float, layers: int) -> dict:
    """summary["jacobian"]: the input-Jacobian rank and NTK trace at the first k samples."""
    if not X.is_floating_point():
        raise FeaturelabError(
            f"jacobian={k} needs float inputs X; X holds integer ids (dtype {X.dtype}), which have no input "
            "Jacobian: pass jacobian=0"
        )
    t1 = time.perf_counter()
    sub = X[:k]
    ranks = jacobian_ranks(net, sub, rtol=rtol)
    trace = ntk_trace(net, sub)
    return {
        "samples": len(sub),
        "rank_max": int(ranks.max()),
        "rank_median": float(ranks.double().median()),
        "ntk_trace_mean": float(trace.mean()),
        "ntk_trace_per_layer": float(trace.mean()) / layers,
        "seconds": time.perf_counter() - t1,
    }


def _check_arguments(X, Y, representations, jacobian, per_token, **numbers) -> None:
    """One line for an option out of range, or for an option that needs X without X."""
    int_at_least("top", numbers.pop("top"), 1)
    int_at_least("jacobian", jacobian, 0)
    for name, v in numbers.items():
        non_negative(name, v)
    if per_token not in (None, True, False):
        raise FeaturelabError(f"per_token = {per_token!r} is not allowed: give None (automatic), True or False")
    for what, given in (
        ("Y was given", Y),
        ("representations were chosen", representations),
        ("jacobian > 0", jacobian),
    ):
        if X is None and given is not None and given is not False and given != 0:
            raise FeaturelabError(f"{what} without X; give the inputs X too")


def _weight_tables(net: nn.Module, model: nn.Module, calls, heads, options: dict, notes: list[str], summary: dict):
    """The layer model and its tables: layers (with k_mid's counts when there is one), spectra, balance,
    rebalanced spectra, attention heads."""
    lm = layer_model(net, calls, heads)
    if not lm.layers:
        raise FeaturelabError(f"model {type(model).__name__} has no weight matrix (no Linear, Conv or 2-D parameter)")
    summary["layer_order"] = lm.order
    if isinstance(net, WeightsFile):
        notes.append(
            "weights file: layers in the natural order of their names; a file stores no forward, so there are no "
            "pairs and no BatchNorm folding (a plain Linear chain is read as one)"
        )
    else:
        notes += lm.notes
    notes += lm.attention_notes
    if isinstance(net, WeightsChain):
        notes.append("weights file read as a Linear chain with a ReLU between layers (the file stores no activation)")
    top, effective_rtol, rtol = options["top"], options["effective_rtol"], options["rtol"]
    layers, spectra, balance, esd = _layer_rows(
        lm, top, effective_rtol, rtol, options["weightwatcher"], options["conv_inputs"], notes
    )
    rebalanced_spectra = _bottleneck(net, lm, layers, options["atol"], notes, summary)
    attention = pd.DataFrame([r for h in lm.heads for r in head_rows(h, effective_rtol, rtol)])
    return lm, layers, spectra, balance, rebalanced_spectra, attention, esd


def analyze(
    model: nn.Module,
    X=None,
    Y=None,
    *,
    representations=None,
    heads: dict[str, int] | None = None,
    per_token: bool | None = None,
    top: int = 5,
    effective_rtol: float = 0.1,
    rtol: float = 1e-3,
    gamma: float = 1e-3,
    atol: float = 0.1,
    jacobian: int = 0,
    weightwatcher: bool = True,
) -> ModelAnalysis:
    """Measure `model`'s weight layers and, with inputs X, its representations (module docstring).

    model: any ``nn.Module``; a featurelab `MLP` is analysed as its ``to_torch`` chain.
    X: inputs, rows are samples (``N x d_in``, ``N x c x ...`` images for conv nets, ``N x T`` integer token ids
        for sequence models: kept as int64, never cast to float); None: weights only.
    Y: optional targets (``N x d_out`` floats, or ``N`` (``N x T``) integer labels of any integer dtype).
    representations: the module outputs and functional activations to read (names, glob patterns such as
        ``"blocks.*"``, or nn.Module types); None: the repeated blocks' outputs (the residual stream) when the
        model has repeated blocks, else every activation (module or function) and custom module.
    heads: head counts by module name or glob, for attention modules that keep theirs under another name.
    per_token: read a 3-D representation (N x T x E) as N·T rows of E units; None: when the blocks act on
        (batch, tokens, width).
    top: singular values listed per row. effective_rtol: threshold of the effective rank #{s_i >= effective_rtol·s_1}.
    rtol: relative tolerance of the numerical rank (and of the Jacobian rank).
    gamma: γ₀ of COI_γ (relative, γ = γ₀‖K‖_op; 0 skips it).
    atol: absolute singular-value threshold of the bottleneck rank k_mid (on rebalanced weights).
    jacobian: number of samples (the first rows of X, float inputs) at which to compute the input-Jacobian rank
        and the NTK trace Tr Θ(x, x) (0: off); one reverse pass per output and sample for each (memory d_out·P
        per sample for the NTK).
    weightwatcher: add WeightWatcher's columns (ww_*: its ESD, norm, stable rank and power-law alpha).

    Costs otherwise: one SVD per weight matrix, one forward pass, and per representation one spectrum of
    ``rows x units`` (Gram route when both sides exceed 128) and COI_γ.
    """
    _check_model(model)
    numbers = dict(top=top, effective_rtol=effective_rtol, rtol=rtol, gamma=gamma, atol=atol)
    _check_arguments(X, Y, representations, jacobian, per_token, **numbers)
    given = given_heads(heads)
    t0 = time.perf_counter()
    source = to_torch(model) if isinstance(model, MLP) else model
    net = copy.deepcopy(source).cpu().to(torch.float64).eval()
    notes: list[str] = []
    summary: dict = {"parameters": sum(p.numel() for p in net.parameters())}
    summary["trainable_parameters"] = sum(p.numel() for p in net.parameters() if p.requires_grad)
    rep_rows, rep_spectra, calls = [], {}, None
    if X is not None:
        X = _inputs(X)
        measure = partial(row, top=top, effective_rtol=effective_rtol, rtol=rtol, gamma=gamma)
        rep_rows, rep_spectra, cap = _representations(net, X, representations, per_token, measure, notes, summary)
        calls = cap.calls
        if Y is not None:
            summary |= _fit(cast(torch.Tensor, cap.out), Y)
    options = numbers | {"weightwatcher": weightwatcher, "conv_inputs": conv_inputs(net, X) if X is not None else None}
    lm, layers, spectra, balance, rebalanced, attention, esd = _weight_tables(
        net, model, calls, given, options, notes, summary
    )
    if jacobian and X is not None:
        summary["jacobian"] = _jacobian(net, X, jacobian, rtol, len(lm.layers))
    summary["seconds"] = time.perf_counter() - t0
    summary["notes"] = notes
    tables = (layers, pd.DataFrame(rep_rows), summary, spectra, rep_spectra, balance, rebalanced)
    return ModelAnalysis(*tables, pd.DataFrame(lm.norms), attention, esd)
