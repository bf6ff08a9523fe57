"""`analyze`: the feature-learning measurements of any PyTorch model in one call (rows are samples).

It finds the weight layers (``nn.Linear``; ``nn.Conv1d``/``nn.Conv2d`` with the kernel read as an
``out x (in·k...)`` matrix; other modules' own parameter matrices) and, when data is given, the
representations after each activation module and each custom block, through forward hooks, so
``nn.Sequential``, modules with skip connections and featurelab's own `MLP`/`LeakyResNet` all work.
The model is analysed on a float64 CPU copy in eval mode; the model itself is never modified.

Formulas (s_1 >= s_2 >= ... the singular values; docs/analyze.md states each with its source):
- stable rank ‖M‖²_F/‖M‖²_op, nuclear rank ‖M‖²_*/‖M‖²_F (Jacot & Kaiser, arXiv 2405.17573, Prop. 1;
  docs/theory/leaky-resnets.md §3.6), threshold effective rank #{s_i >= effective_rtol·s_1} (§3.6), entropy effective
  rank exp(−Σ p_i log p_i), p_i = s_i/Σ s_j (Roy & Vetterli, EUSIPCO 2007), numerical rank #{s_i > rtol·s_1}
  (Jacot, arXiv 2306.00394, docs/theory/bottleneck-rank.md §3.2);
- COI_γ(A) = Tr[Aᵀ(K + γI)⁻¹A], K = σ(A)σ(A)ᵀ, σ(A) = [ReLU(A), 1], γ = γ₀‖K‖_op (arXiv 2405.17573 §2.2,
  docs/theory/leaky-resnets.md §3.4), with A the activation's input (pre-activation) for activation modules
  and the output for blocks, input and output;
- per-neuron balancedness ‖w_in‖² + b² − ‖w_out‖² (arXiv 2306.00394 §2.4; invariant under gradient flow of
  positively homogeneous nets, Du, Hu & Lee, arXiv 1806.00900, Thm. 2.1);
- adjacent alignment |⟨u_1(W_l), v_1(W_{l+1})⟩| (Le & Jegelka, arXiv 2201.11968, Thm. 2, eq. (15));
- bottleneck rank k_mid = median over the middle layers of #{s_i(W_l) > 0.1} after `rebalance`
  (arXiv 2306.00394 §4a, docs/theory/bottleneck-rank.md §3.9).
"""

from __future__ import annotations

import copy
import html
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
import torch
from torch import nn

from .checks import int_at_least, non_negative
from .errors import FeaturelabError
from .figures import plt, save_figure
from .io import write_json, write_text
from .measurements.bottleneck import bottleneck_rank, rebalance
from .measurements.cost_of_identity import cost_of_identity
from .measurements.jacobian import jacobian_ranks, ntk_trace
from .measurements.ranks import spectrum_ranks
from .models.convert import from_torch, to_torch
from .models.leaky_resnet import LeakyResNet
from .models.mlp import MLP
from .runs.report import figures_html, mapping_table, page_head, tables_html

WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d)
CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
# parameter-free modules that commute with positive scaling of each unit: f(c·x) = c·f(x), c > 0, per unit
HOMOGENEOUS = (
    nn.ReLU,
    nn.LeakyReLU,
    nn.Identity,
    nn.Flatten,
    nn.Dropout,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
)


@dataclass
class _Weight:
    name: str
    kind: str
    matrix: torch.Tensor  # out x (in·k...), float64
    bias: torch.Tensor | None
    shape: tuple
    module: nn.Module | None = None


@dataclass(frozen=True)
class ModelAnalysis:
    """What `analyze` measured.

    layers: one row per weight layer (execution order when data was given): name, type, shape (as
        stored), matrix (rows x cols read), sv1..svK, frobenius_sq, bias_sq, stable_rank, nuclear_rank,
        effective_rank, entropy_rank, numerical_rank, count_rebalanced (#{s_i > threshold} after
        rebalancing, leaky-ReLU chains only), balance_mean / balance_residual (this layer's units:
        mean of in − out and max |in − out|/(in + out)), alignment (with the next layer).
    representations: one row per hooked representation (input, each activation or block call, output):
        name, type, shape (per sample), units, sv1..svK (of the centred A/√N), the five ranks, coi_gamma,
        dead_share.
    summary: scalars: bottleneck estimate, representation bottleneck, fit, Jacobian/NTK, seconds, notes.
    spectra, representation_spectra, balance: full singular values and per-neuron in − out, by name.
    """

    layers: pd.DataFrame
    representations: pd.DataFrame
    summary: dict
    spectra: dict = field(repr=False)
    representation_spectra: dict = field(repr=False)
    balance: dict = field(repr=False)
    rebalanced_spectra: dict = field(repr=False)

    def __str__(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.summary.items() if k != "notes"]
        lines += [f"note: {n}" for n in self.summary.get("notes", [])]
        return "\n".join(lines)

    def plot(self):
        """The bottleneck picture: (a) every singular value of each weight layer along depth (after
        rebalancing when available, with the 0.1 threshold of k_mid); (b) the representation ranks along depth
        (when data was given). Returns the matplotlib Figure."""
        panels = 2 if len(self.representations) else 1
        fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
        ax = axes[0, 0]
        spectra = self.rebalanced_spectra or self.spectra
        names = list(spectra)
        count = max(len(s) for s in spectra.values())
        for i in range(count):  # s_i along depth, dark = large singular values
            ys = [s[i] if len(s) > i else np.nan for s in spectra.values()]
            ax.plot(range(len(names)), ys, marker="o", ms=2, lw=0.8, color=plt.cm.viridis(i / max(count - 1, 1)))
        if self.rebalanced_spectra:
            ax.axhline(self.summary["bottleneck"]["threshold"], color="k", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
        ax.set_title("weight spectra along depth" + (" (rebalanced)" if self.rebalanced_spectra else ""))
        if panels == 2:
            ax = axes[0, 1]
            reps = self.representations
            for col in ("effective_rank", "entropy_rank", "stable_rank", "numerical_rank", "coi_gamma"):
                ax.plot(range(len(reps)), reps[col], marker="o", ms=3, label=col)
            ax.set_xticks(range(len(reps)), reps["name"], rotation=60, fontsize=7)
            ax.set_yscale("log")
            ax.set_title("representation ranks along depth (centred)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        return fig

    def report(self, folder: str | Path, title: str = "model analysis") -> Path:
        """Write ``folder/report.html`` (self-contained: figures inline) with ``tables/layers.csv``,
        ``tables/representations.csv``, ``figures/analysis.png|svg`` and ``summary.json``; returns the
        report's path."""
        folder = Path(folder)
        write_text(folder / "tables" / "layers.csv", self.layers.to_csv(index=False))
        if len(self.representations):
            write_text(folder / "tables" / "representations.csv", self.representations.to_csv(index=False))
        save_figure(self.plot(), folder / "figures", "analysis")
        write_json(folder / "summary.json", self.summary)
        flat = {k: v for k, v in self.summary.items() if k != "notes"}
        parts = [
            page_head(title),
            f"<h1>{html.escape(title)}</h1>",
            "<p>Columns, formulas and sources: docs/analyze.md of featurelab.</p>",
            "<h2>Summary</h2>",
            mapping_table(flat),
        ]
        if self.summary.get("notes"):
            notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.summary["notes"])
            parts.append(f"<h2>Notes</h2><ul>{notes}</ul>")
        parts += figures_html(folder) + tables_html(folder) + ["</body></html>"]
        path = folder / "report.html"
        write_text(path, "\n".join(parts))
        return path


# ---------------------------------------------------------------------------------- weights
def _weights(net: nn.Module) -> list[_Weight]:
    """Weight layers in registration order: Linear/Conv (kernel as out x (in·k...)), then any other module's
    own parameters with >= 2 dims (a 3-D parameter of a non-conv module is a stack of matrices)."""
    out = []
    for name, m in net.named_modules():
        if isinstance(m, WEIGHTED):
            W = m.weight.detach()
            bias = m.bias.detach() if m.bias is not None else None
            out.append(_Weight(name, type(m).__name__, W.reshape(W.shape[0], -1), bias, tuple(W.shape), m))
            continue
        if isinstance(m, CONTAINERS):
            continue
        for pname, p in m.named_parameters(recurse=False):
            full = f"{name}.{pname}" if name else pname
            P = p.detach()
            if P.ndim == 3 and "Conv" not in type(m).__name__:
                kind = type(m).__name__
                out += [_Weight(f"{full}[{i}]", kind, P[i], None, tuple(P[i].shape), m) for i in range(len(P))]
            elif P.ndim >= 2:
                out.append(_Weight(full, type(m).__name__, P.reshape(P.shape[0], -1), None, tuple(P.shape), m))
    return out


def _pairs(net: nn.Module) -> list[tuple[nn.Module, nn.Module, bool]]:
    """(a, b, homogeneous) for Linear/Conv modules a, b that follow each other inside one nn.Sequential with
    only parameter-free leaf modules between; homogeneous when all of those are in HOMOGENEOUS."""
    out = []
    for seq in net.modules():
        if not isinstance(seq, nn.Sequential):
            continue
        prev, homogeneous = None, True
        for child in seq.children():
            if isinstance(child, WEIGHTED):
                if prev is not None:
                    out.append((prev, child, homogeneous))
                prev, homogeneous = child, True
            elif list(child.children()) or list(child.parameters()):
                prev = None
            else:
                homogeneous = homogeneous and isinstance(child, HOMOGENEOUS)
    return out


def _input_side(a: _Weight, b: _Weight) -> torch.Tensor | None:
    """b's weights as a matrix whose columns are a's output units (a Linear after a channel-major Flatten
    reads C·positions inputs: each unit owns `positions` columns), or None when the shapes do not chain."""
    units, W = a.shape[0], cast(torch.Tensor, b.module.weight).detach()
    if W.shape[1] % units or (isinstance(b.module, nn.Conv1d | nn.Conv2d) and W.shape[1] != units):
        return None
    return W.reshape(W.shape[0], units, -1).permute(0, 2, 1).reshape(-1, units)


# ------------------------------------------------------------------------- representations
def _is_representation(m: nn.Module) -> bool:
    """Activation modules (torch.nn.modules.activation) and custom non-container modules (blocks)."""
    if isinstance(m, CONTAINERS + WEIGHTED):
        return False
    return type(m).__module__ == "torch.nn.modules.activation" or not type(m).__module__.startswith("torch.")


def _forward(net: nn.Module, X: torch.Tensor) -> tuple[torch.Tensor, list, list[str]]:
    """Run `net` on X with hooks: returns the output, [(name, type, coi input, output)] for every call of
    a representation module, and the names of the modules in call order."""
    reps, calls, handles, pre = [], [], [], {}
    names = {m: n for n, m in net.named_modules()}

    def pre_hook(m, inputs):
        if inputs and isinstance(inputs[0], torch.Tensor):
            pre[m] = inputs[0].detach().clone()

    def hook(m, inputs, output):
        name = names[m]
        calls.append(name)
        if _is_representation(m) and isinstance(output, torch.Tensor) and output.shape[:1] == X.shape[:1]:
            k = sum(r[0].split("#")[0] == name for r in reps)
            activation = type(m).__module__ == "torch.nn.modules.activation"
            coi_input = pre.pop(m, output).detach() if activation else output.detach()
            reps.append((f"{name}#{k + 1}" if k else name, type(m).__name__, coi_input, output.detach()))

    for m in net.modules():
        if m is not net:
            if type(m).__module__ == "torch.nn.modules.activation":  # its input may be overwritten in place
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


def _rep_row(
    name: str, kind: str, A: torch.Tensor, coi_A: torch.Tensor, top: int, effective_rtol: float, rtol: float, gamma
):
    N = A.shape[0]
    dead = A.abs().amax(dim=[d for d in range(A.ndim) if d != 1]) == 0 if A.ndim > 1 else A.abs().amax() == 0
    flat = A.reshape(N, -1)
    s = torch.linalg.svdvals((flat - flat.mean(0)) / math.sqrt(N))
    coi = cost_of_identity(coi_A.reshape(N, -1), gamma=gamma) if gamma > 0 else float("nan")
    row = {"name": name, "type": kind, "shape": "x".join(map(str, A.shape[1:])) or "1", "units": flat.shape[1]}
    row |= {f"sv{i + 1}": float(s[i]) if i < len(s) else np.nan for i in range(top)}
    row |= spectrum_ranks(s, effective_rtol=effective_rtol, numerical_rtol=rtol) | {
        "coi_gamma": coi,
        "dead_share": float(dead.double().mean()),
    }
    return row, s.numpy()


def _as_samples(name: str, X) -> torch.Tensor:
    if isinstance(X, np.ndarray):
        X = torch.from_numpy(X)
    if not isinstance(X, torch.Tensor) or X.ndim < 1:
        raise FeaturelabError(f"{name} must be a tensor or array with one row per sample, got {type(X).__name__}")
    return X.detach().cpu()


def _fit(out: torch.Tensor, Y) -> dict:
    Y = _as_samples("Y", Y)
    if len(Y) != len(out):
        raise FeaturelabError(f"Y has {len(Y)} rows but X has {len(out)}; both need one row per sample")
    if not (Y.is_floating_point() or Y.is_complex()):  # labels of any integer dtype
        Y = Y.long().reshape(-1)
        pred = out.argmax(1) if out.ndim == 2 and out.shape[1] > 1 else (out.reshape(-1) > 0).long()
        return {"train_error": float((pred != Y).double().mean())}
    if Y.numel() != out.numel():
        raise FeaturelabError(f"Y has shape {tuple(Y.shape)} but the model's output has {tuple(out.shape)}")
    Y = Y.double().reshape(out.shape)
    return {"relative_mse": float(((out - Y) ** 2).sum() / ((Y - Y.mean(0)) ** 2).sum().clamp_min(1e-300))}


# ---------------------------------------------------------------------------------- analyze
def analyze(
    model: nn.Module,
    X=None,
    Y=None,
    *,
    top: int = 5,
    effective_rtol: float = 0.1,
    rtol: float = 1e-3,
    gamma: float = 1e-3,
    atol: float = 0.1,
    jacobian: int = 0,
) -> ModelAnalysis:
    """Measure `model`'s weight layers and, with inputs X, its representations (module docstring).

    model: any ``nn.Module``; a featurelab `MLP` is analysed as its ``to_torch`` chain.
    X: inputs, rows are samples (``N x d_in``, or ``N x c x ...`` images for conv nets); None: weights only.
    Y: optional targets (``N x d_out`` floats, or ``N`` integer labels of any integer dtype) for the fit.
    top: singular values listed per row. effective_rtol: threshold of the effective rank #{s_i >= effective_rtol·s_1}.
    rtol: relative tolerance of the numerical rank (and of the Jacobian rank).
    gamma: γ₀ of COI_γ (relative, γ = γ₀‖K‖_op; 0 skips it).
    atol: absolute singular-value threshold of the bottleneck rank k_mid (on rebalanced weights).
    jacobian: number of samples (the first rows of X) at which to compute the input-Jacobian rank and the NTK
        trace Tr Θ(x, x) (0: off). Cost: one reverse pass per output and sample for the Jacobian, and one per
        output and sample over the trainable parameters for the NTK (memory d_out·P per sample).

    Costs otherwise: one SVD per weight matrix, one forward pass, and two SVDs of ``N x units`` per
    representation (its spectrum and COI_γ).
    """
    if not isinstance(model, nn.Module):
        raise FeaturelabError(f"model must be a torch nn.Module, got {type(model).__name__}")
    int_at_least("top", top, 1)
    int_at_least("jacobian", jacobian, 0)
    for name, v in (("effective_rtol", effective_rtol), ("rtol", rtol), ("gamma", gamma), ("atol", atol)):
        non_negative(name, v)
    t0 = time.perf_counter()
    source = to_torch(model) if isinstance(model, MLP) else model
    net = copy.deepcopy(source).cpu().to(torch.float64).eval()
    notes: list[str] = []
    summary: dict = {"parameters": sum(p.numel() for p in net.parameters())}
    summary["trainable_parameters"] = sum(p.numel() for p in net.parameters() if p.requires_grad)
    weights = _weights(net)
    if not weights:
        raise FeaturelabError(f"model {type(model).__name__} has no weight matrix (no Linear, Conv or 2-D parameter)")

    rep_rows, rep_spectra = [], {}
    if X is not None:
        X = _as_samples("X", X).to(torch.float64)
        if not torch.isfinite(X).all():
            raise FeaturelabError("X contains NaN or inf; all entries must be finite")
        try:
            out, reps, calls = _forward(net, X)
        except (RuntimeError, TypeError, IndexError) as exc:
            raise FeaturelabError(
                f"the model failed on X of shape {tuple(X.shape)} ({str(exc).splitlines()[0]}); give X in the shape "
                "the model takes, rows are samples (conv nets: N x c x H x W; command line: --shape c,H,W)"
            ) from None
        if isinstance(net, LeakyResNet):
            with torch.no_grad():
                reps = [(f"A_{l}", "LeakyResNet", A, A) for l, A in enumerate(net.representations(X))]
        first = {n: i for i, n in reversed(list(enumerate(calls)))}
        module_names = {m: n for n, m in net.named_modules()}
        weights.sort(key=lambda w: first.get(module_names.get(w.module, ""), math.inf))
        all_reps = [("input", "input", X, X)] + reps + [("output", "output", out, out)]
        for name, kind, coi_A, A in all_reps:
            row, s = _rep_row(name, kind, A, coi_A, top, effective_rtol, rtol, gamma)
            rep_rows.append(row)
            rep_spectra[name] = s
        hidden = rep_rows[1:-1]
        if hidden:
            low = min(hidden, key=lambda r: r["effective_rank"])
            summary["representation_bottleneck"] = {"name": low["name"], "effective_rank": low["effective_rank"]}
        if Y is not None:
            summary |= _fit(out, Y)
    elif Y is not None:
        raise FeaturelabError("Y was given without X; give the inputs X too")

    # weight layers
    rows, spectra, balance = [], {}, {}
    by_module: dict[nn.Module, _Weight] = {w.module: w for w in weights if isinstance(w.module, WEIGHTED)}
    pairs: dict[nn.Module | None, tuple[nn.Module, bool]] = {a: (b, h) for a, b, h in _pairs(net)}
    svd = {w.name: torch.linalg.svd(w.matrix, full_matrices=False) for w in weights}  # one SVD per matrix
    for w in weights:
        s = svd[w.name].S
        spectra[w.name] = s.numpy()
        row = {
            "name": w.name,
            "type": w.kind,
            "shape": "x".join(map(str, w.shape)),
            "matrix": f"{w.matrix.shape[0]}x{w.matrix.shape[1]}",
        }
        row |= {f"sv{i + 1}": float(s[i]) if i < len(s) else np.nan for i in range(top)}
        row |= {
            "frobenius_sq": float((s**2).sum()),
            "bias_sq": float((w.bias**2).sum()) if w.bias is not None else 0.0,
        }
        row |= spectrum_ranks(s, effective_rtol=effective_rtol, numerical_rtol=rtol)
        row |= {"balance_mean": np.nan, "balance_residual": np.nan, "alignment": np.nan}
        nxt = by_module[pairs[w.module][0]] if w.module in pairs else None
        side = _input_side(w, nxt) if nxt else None
        if side is not None:
            same = side.shape == nxt.matrix.shape  # a Linear after a Linear: its own matrix
            v = svd[nxt.name].Vh[0] if same else torch.linalg.svd(side, full_matrices=False).Vh[0]
            row["alignment"] = float((svd[w.name].U[:, 0] @ v).abs())
            if pairs[w.module][1]:
                incoming = (w.matrix**2).sum(1) + (w.bias**2 if w.bias is not None else 0.0)
                diff = incoming - (side**2).sum(0)
                total = incoming + (side**2).sum(0)
                res = torch.where(total > 0, diff.abs() / total.clamp_min(1e-300), torch.zeros_like(diff))
                balance[w.name] = diff.numpy()
                row |= {"balance_mean": float(diff.mean()), "balance_residual": float(res.max())}
        rows.append(row)
    layers = pd.DataFrame(rows)

    # bottleneck rank after rebalancing (leaky-ReLU chains)
    rebalanced_spectra, mlp = {}, None
    reason = f"{type(model).__name__} is not an nn.Sequential Linear/activation chain"
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
            linear_rows = [i for i, w in enumerate(weights) if isinstance(w.module, nn.Linear)]
            counts = [np.nan] * len(weights)
            for i, W in zip(linear_rows, reb.weight_matrices()):
                s = torch.linalg.svdvals(W.detach())
                rebalanced_spectra[weights[i].name] = s.numpy()
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

    if jacobian:
        if X is None:
            raise FeaturelabError("jacobian > 0 needs inputs X")
        t1 = time.perf_counter()
        sub = X[:jacobian]
        ranks = jacobian_ranks(net, sub, rtol=rtol)
        trace = ntk_trace(net, sub)
        summary["jacobian"] = {
            "samples": len(sub),
            "rank_max": int(ranks.max()),
            "rank_median": float(ranks.double().median()),
            "ntk_trace_mean": float(trace.mean()),
            "ntk_trace_per_layer": float(trace.mean()) / len(weights),
            "seconds": time.perf_counter() - t1,
        }
    summary["seconds"] = time.perf_counter() - t0
    summary["notes"] = notes
    return ModelAnalysis(layers, pd.DataFrame(rep_rows), summary, spectra, rep_spectra, balance, rebalanced_spectra)


# ------------------------------------------------------------------------ command-line loaders
def _natural(key: str) -> list:
    return [int(p) if p.isdigit() else p for p in key.replace("[", ".").split(".")]


def weights_module(path: str | Path) -> nn.Module:
    """The tensors of a safetensors file as modules for a weights-only `analyze`: each ``prefix.weight`` of
    2/3/4 dims becomes an ``nn.Linear``/``nn.Conv1d``/``nn.Conv2d`` (with ``prefix.bias`` when present), any
    other tensor of >= 2 dims a plain parameter; keys in natural order ("2" before "10"). Never unpickles."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FeaturelabError(f"weights file '{path}' does not exist")
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise FeaturelabError(f"weights file '{path}' is not a readable safetensors file ({exc})") from None
    root = nn.Module()
    for key in sorted(tensors, key=_natural):
        T = tensors[key].detach().to(torch.float64)
        prefix, _, leaf = key.rpartition(".")
        if leaf == "bias" and f"{prefix}.weight" in tensors and tensors[f"{prefix}.weight"].ndim in (2, 3, 4):
            continue
        if leaf == "weight" and T.ndim in (2, 3, 4):
            cls = {2: nn.Linear, 3: nn.Conv1d, 4: nn.Conv2d}[T.ndim]
            bias = tensors.get(f"{prefix}.bias")
            m = cls.__new__(cls)
            nn.Module.__init__(m)
            m.weight = nn.Parameter(T, requires_grad=False)
            m.bias = nn.Parameter(bias.to(torch.float64), requires_grad=False) if bias is not None else None
            root.add_module(prefix.replace(".", "/") or "weight", m)
        elif T.ndim >= 2:
            root.register_parameter(key.replace(".", "/"), nn.Parameter(T, requires_grad=False))
    return root


def load_factory(spec: str, weights: str | Path | None = None) -> nn.Module:
    """The model made by ``package.module:factory`` (called without arguments; the current folder is
    importable), with a safetensors state dict loaded into it when `weights` is given."""
    import importlib
    import sys

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise FeaturelabError(f"target {spec!r} is not allowed: give a .safetensors file or package.module:factory")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FeaturelabError(f"factory {spec!r}: cannot import module {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise FeaturelabError(f"factory {spec!r}: module {module_name!r} has no callable {attr!r}")
    model = factory()
    if not isinstance(model, nn.Module):
        raise FeaturelabError(f"factory {spec!r} returned a {type(model).__name__}, not a torch nn.Module")
    if weights is not None:
        from safetensors.torch import load_file

        if not Path(weights).is_file():
            raise FeaturelabError(f"weights file '{weights}' does not exist")
        try:
            model.load_state_dict(load_file(str(weights)))
        except RuntimeError as exc:
            raise FeaturelabError(f"weights '{weights}' do not fit {spec!r}: {str(exc).splitlines()[0]}") from None
    return model


def load_inputs(data: str, n: int | None = 1000, shape: tuple[int, ...] | None = None):
    """(X, Y) of ``digits`` (the first `n` training digits, X ``n x 64``, labels Y) or of an ``.npz`` file
    with arrays ``X`` (rows are samples) and optionally ``Y``; rows reshaped to `shape` (e.g. (1, 8, 8))."""
    if data == "digits":
        from .data.digits import digits

        ds = digits(n)
        X, Y = ds.X_train, ds.Y_train
    else:
        path = Path(data)
        if path.suffix != ".npz" or not path.is_file():
            raise FeaturelabError(f"data '{data}' is not allowed: give digits or an existing .npz file")
        with np.load(path, allow_pickle=False) as arrays:
            if "X" not in arrays:
                raise FeaturelabError(f"data file '{data}' has no array X (it has: {', '.join(arrays.files)})")
            X = torch.from_numpy(arrays["X"])
            Y = torch.from_numpy(arrays["Y"]) if "Y" in arrays else None
    if shape is not None:
        if int(np.prod(shape)) != X[0].numel():
            raise FeaturelabError(f"shape={shape} does not hold the {X[0].numel()} entries of one sample")
        X = X.reshape(len(X), *shape)
    return X, Y


# ---------------------------------------------------------------------------------- tracking
class AnalysisTracker:
    """`analyze` recorded over training: the bottleneck as it forms.

    For featurelab's trainer pass it as a callback (``train(..., callbacks=[tracker])``): ``on_log`` analyses
    at every history row and adds ``k_mid`` and ``min_rep_rank`` to it. In your own loop call
    ``tracker.step(model)`` once per step; it analyses at steps 0, every, 2·every, ...

    X, Y: the data to analyse on (None: weights only). every: steps between analyses in `step`.
    options: keyword arguments of `analyze`.
    """

    def __init__(self, X=None, Y=None, every: int = 100, **options):
        self.X, self.Y, self.options = X, Y, options
        self.every = int_at_least("every", every, 1)
        self.steps: list[int] = []
        self.results: list[ModelAnalysis] = []
        self._calls = 0

    def record(self, step: int, model: nn.Module) -> ModelAnalysis:
        """Analyse `model` now and store the result under `step`."""
        res = analyze(model, self.X, self.Y, **self.options)
        self.steps.append(int(step))
        self.results.append(res)
        return res

    def step(self, model: nn.Module) -> ModelAnalysis | None:
        """Count one training step; analyse when the count is a multiple of `every` (from 0)."""
        k, self._calls = self._calls, self._calls + 1
        return self.record(k, model) if k % self.every == 0 else None

    def on_log(self, step: int, model: nn.Module, row: dict) -> None:
        """featurelab trainer callback: analyse and add the headline numbers to the history row."""
        res = self.record(step, model)
        row["k_mid"] = res.summary["bottleneck"]["k_mid"] if res.summary["bottleneck"] else np.nan
        if "representation_bottleneck" in res.summary:
            row["min_rep_rank"] = res.summary["representation_bottleneck"]["effective_rank"]

    def balance_drift(self) -> pd.DataFrame:
        """Per recorded step: max over units of |q_i(t) − q_i(t_0)| / ‖θ(t_0)‖², q_i = ‖w_in,i‖² + b_i² − ‖w_out,i‖²
        (every paired unit, biases and any number of outputs included), ‖θ‖² the weights' plus biases' squared
        norm at the first record. q_i is invariant under gradient flow of an unregularized loss of a positively
        homogeneous net (docs/analyze.md, Balancedness), so under gradient descent with step η the drift over a
        fixed time is O(η) (each step changes q_i by η²(‖g_in,i‖² − ‖g_out,i‖²)); with λ‖θ‖² it decays as e^{−4λt}."""
        if not self.results:
            raise FeaturelabError("the tracker has recorded nothing yet: call step() or train with it first")
        first = self.results[0]
        scale = float(first.layers["frobenius_sq"].sum() + first.layers["bias_sq"].sum())
        rows = []
        for s, r in zip(self.steps, self.results):
            drift = max((float(np.abs(r.balance[k] - v).max()) for k, v in first.balance.items()), default=np.nan)
            rows.append({"step": s, "drift": drift / scale})
        return pd.DataFrame(rows)

    def _stacked(self, attr: str) -> pd.DataFrame:
        frames = [getattr(r, attr).assign(step=s) for s, r in zip(self.steps, self.results)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    @property
    def layers(self) -> pd.DataFrame:
        """Every recorded `layers` table, with a `step` column."""
        return self._stacked("layers")

    @property
    def representations(self) -> pd.DataFrame:
        """Every recorded `representations` table, with a `step` column."""
        return self._stacked("representations")

    def plot(self, column: str = "effective_rank"):
        """`column` of each weight layer (left) and each hidden representation (right) against the step:
        the bottleneck forming along training. Returns the matplotlib Figure."""
        if not self.results:
            raise FeaturelabError("the tracker has recorded nothing yet: call step() or train with it first")
        frames = [("weight layers", self.layers)]
        reps = self.representations
        if len(reps):
            frames.append(("representations", reps[~reps["type"].isin(["input", "output"])]))
        fig, axes = plt.subplots(1, len(frames), figsize=(6 * len(frames), 4), squeeze=False)
        for ax, (title, df) in zip(axes[0], frames):
            names = list(dict.fromkeys(df["name"]))
            for i, name in enumerate(names):
                part = df[df["name"] == name]
                ax.plot(part["step"], part[column], color=plt.cm.viridis(i / max(len(names) - 1, 1)), label=name)
            ax.set_xlabel("step")
            ax.set_ylabel(column)
            ax.set_title(f"{title}: {column} (dark = early layers)")
            if len(names) <= 12:
                ax.legend(fontsize=6)
        fig.tight_layout()
        return fig


__all__ = ["analyze", "ModelAnalysis", "AnalysisTracker"]
