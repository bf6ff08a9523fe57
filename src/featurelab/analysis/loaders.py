"""What the command line hands to `analyze`: a weights-only module from a safetensors file, a factory's model,
inputs from digits or an ``.npz`` file. Every bad input is a one-line `FeaturelabError` naming the input and
what is allowed, raised before anything is written; nothing is unpickled."""

from __future__ import annotations

import importlib
import math
import sys
import zipfile
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn
from torch.nn.utils import skip_init

from ..errors import FeaturelabError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _natural(key: str) -> list:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split(".")]


HEADER_LIMIT = 100 * 2**20  # bytes of a safetensors header (its JSON text) read at most
COPIES = 6  # the file's tensors held at once by an analysis: read, float64 (twice the bytes), products, spectra
SVD_FLOPS = 2e11  # the most m·n·min(m, n) of a file's matrices analysed: about a minute of float64 SVDs on a CPU


def header_sizes(path: Path, what: str) -> tuple[int, dict[str, float]]:
    """The bytes of the tensors a safetensors file declares and, per tensor of >= 2 dims, the cost m·n·min(m, n)
    of its SVD (rows m = the first dim), from its header alone (8 bytes little-endian length, then JSON of
    ``name: {dtype, shape, data_offsets}``); a header that cannot be read is one line."""
    import json

    bad = f"{what} '{path}' is not a readable safetensors file"
    with open(path, "rb") as f:
        head = f.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < size <= HEADER_LIMIT:
            raise FeaturelabError(f"{bad} (its header's length, {size}, is not in 1..{HEADER_LIMIT})")
        try:
            entries = {k: v for k, v in json.loads(f.read(size)).items() if k != "__metadata__"}
            end = max((int(v["data_offsets"][1]) for v in entries.values()), default=0)
            shapes = {k: [int(d) for d in v["shape"]] for k, v in entries.items()}
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise FeaturelabError(f"{bad} (its header: {_first_line(exc)})") from None
    cost = {
        k: float(sh[0]) * math.prod(sh[1:]) * min(sh[0], math.prod(sh[1:])) for k, sh in shapes.items() if len(sh) > 1
    }
    return end, cost


def check_header(path: Path, what: str) -> None:
    """Memory (`COPIES` of the tensors) and time (`SVD_FLOPS`) of analysing the file, from its header."""
    from ..runtime import check_memory

    end, cost = header_sizes(path, what)
    check_memory(f"analysing {what} '{path}' ({COPIES} copies of its tensors)", COPIES * end)
    if sum(cost.values()) > SVD_FLOPS:
        big = max(cost, key=lambda k: cost[k])
        raise FeaturelabError(
            f"{what} '{path}': the spectra of its matrices cost {sum(cost.values()):.3g} flops (m·n·min(m, n); "
            f"the largest, '{big}', {cost[big]:.3g}), over the limit of {SVD_FLOPS:.3g}; analyse a smaller model"
        )


def _check_checksum(path: Path, tensors: dict[str, torch.Tensor], what: str) -> None:
    """The sha256 a featurelab file carries in its metadata (`featurelab.training.checkpoint.tensors_digest`),
    when present, must match its tensors."""
    from safetensors import safe_open

    from ..training.checkpoint import tensors_digest

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "sha256" in meta and meta["sha256"] != tensors_digest(tensors, meta.get("featurelab", "")):
        raise FeaturelabError(f"{what} '{path}' fails the sha256 in its metadata (changed or damaged since written)")


def _read_safetensors(path: str | Path, what: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FeaturelabError(f"{what} '{path}' does not exist or is not a file")
    check_header(path, what)
    try:
        tensors = load_file(str(path))
        _check_checksum(path, tensors, what)
    except FeaturelabError:
        raise
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise FeaturelabError(f"{what} '{path}' is not a readable safetensors file ({_first_line(exc)})") from None
    if not tensors:
        raise FeaturelabError(f"{what} '{path}' holds no tensor")
    check_values(tensors, f"{what} '{path}'")
    return tensors


def check_values(tensors: dict[str, torch.Tensor], where: str, noun: str = "tensors") -> None:
    """One line naming `where` and up to five of its `noun` when one is empty or holds NaN or inf."""
    empty = [k for k, T in tensors.items() if T.numel() == 0]
    if empty:
        raise FeaturelabError(f"{where} has empty {noun} ({', '.join(empty[:5])}); each needs entries")
    bad = [k for k, T in tensors.items() if T.is_floating_point() and not torch.isfinite(T).all()]
    if bad:
        raise FeaturelabError(f"{where} has NaN or inf in {', '.join(bad[:5])}; all entries must be finite")


def _groups(prefix: str, W: torch.Tensor, previous: int | None) -> tuple[int, str]:
    """(groups, note) of a conv kernel out x in/G x k... in a weights file, which stores no groups: depthwise
    (G = C) for a [C·m, 1, k...] kernel after a layer writing C channels; else dense, with a note naming the layer
    when the layer before writes another number of channels than the kernel reads."""
    if W.ndim < 3 or previous is None or previous == W.shape[1]:
        return 1, ""
    if W.shape[1] == 1 and W.shape[0] % previous == 0:
        return previous, ""
    return 1, (
        f"weights file: conv {prefix} reads {W.shape[1]} channels per group but the layer before it writes {previous}; "
        "groups are not stored, so it is read as a dense conv"
    )


def _module_for(prefix: str, tensors: dict[str, torch.Tensor], previous: int | None = None) -> nn.Module | None:
    """The module a ``prefix.weight`` (with ``prefix.bias``, BatchNorm statistics) stands for; `previous`: the
    channels the weight layer before it writes (`_groups`)."""
    W = tensors[f"{prefix}.weight"].to(torch.float64)
    b = tensors.get(f"{prefix}.bias")
    leaf = prefix.rpartition(".")[2].lower()
    note = ""
    if W.ndim == 1:
        cls = nn.BatchNorm1d if f"{prefix}.running_mean" in tensors else nn.LayerNorm
        m = cls(len(W), dtype=torch.float64)
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.copy_(tensors[f"{prefix}.running_mean"])
            m.running_var.copy_(tensors.get(f"{prefix}.running_var", torch.ones(len(W))))
    elif W.ndim == 2 and b is None and ("embed" in leaf or leaf in ("wte", "wpe", "embed_tokens")):
        m = nn.Embedding(W.shape[0], W.shape[1], dtype=torch.float64)
    elif W.ndim == 2:
        m = skip_init(nn.Linear, W.shape[1], W.shape[0], bias=b is not None, dtype=torch.float64)
    elif W.ndim in (3, 4):
        G, note = _groups(prefix, W, previous)
        cls = nn.Conv1d if W.ndim == 3 else nn.Conv2d
        m = skip_init(
            cls, W.shape[1] * G, W.shape[0], tuple(W.shape[2:]), groups=G, bias=b is not None, dtype=torch.float64
        )
    else:
        return None
    m.weight = nn.Parameter(W, requires_grad=False)
    if b is not None:
        m.bias = nn.Parameter(b.to(torch.float64), requires_grad=False)
    if note:
        vars(m)["groups_note"] = note  # a plain attribute, read into analyze's notes
    return m


def _chain(prefixes: list[str], mods: dict[str, nn.Module]) -> bool:
    """True when the file is a plain Linear chain: only Linear layers, each reading the previous one's outputs."""
    linears = [mods[p] for p in prefixes]
    if len(linears) < 2 or not all(type(m) is nn.Linear for m in linears):
        return False
    return all(a.out_features == b.in_features for a, b in zip(cast(list[nn.Linear], linears), linears[1:]))


class WeightsChain(nn.Sequential):
    """A Linear chain read from a weights file, with a ReLU assumed between layers (the file stores none)."""


class WeightsFile(nn.Module):
    """The tensors of a weights file that do not form a plain chain: modules without a forward."""


def weights_module(path: str | Path) -> nn.Module:
    """The tensors of a safetensors file as modules for a weights-only `analyze`, with their dotted names.

    Order: safetensors writers store the header sorted by name, so the file keeps no other order; rows follow
    the names in natural order ("2" before "10"), which is the model's order for numbered layers. Each
    ``prefix.weight`` becomes a module: 2-D an ``nn.Embedding`` when its name says so (``*embed*``, ``wte``,
    ``wpe``) and it has no bias, else an ``nn.Linear``; 3-D/4-D an ``nn.Conv1d``/``nn.Conv2d``: groups are not
    stored, so a ``[C·m, 1, k...]`` kernel after a layer writing C channels is depthwise (C groups) and any other
    kernel is dense, with a note when the layer before writes another number of channels than it reads (a
    grouped conv whose group count the file cannot tell); 1-D a BatchNorm (with ``running_mean``) or LayerNorm.
    Other tensors of >= 2 dims are parameters (a leading dimension 1 or a token name: a token).
    A plain chain (only 2-D weights, each reading the previous one's outputs) becomes an ``nn.Sequential``
    with a ReLU between layers, so the chain's k_mid, balancedness and alignment are read; `analyze` notes
    that the activation is assumed."""
    tensors = _read_safetensors(path, "weights file")
    keys = sorted(tensors, key=_natural)
    prefixes = [k.rpartition(".")[0] for k in keys if k.endswith(".weight")]
    mods: dict[str, nn.Module] = {}
    previous = None  # the channels the last weight layer of >= 2 dims writes
    for p in prefixes:
        if (m := _module_for(p, tensors, previous)) is not None:
            mods[p] = m
        previous = tensors[f"{p}.weight"].shape[0] if tensors[f"{p}.weight"].ndim >= 2 else previous
    used = {f"{p}.{s}" for p in mods for s in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    rest = [k for k in keys if k not in used and tensors[k].ndim >= 2]
    chain = not rest and _chain(list(mods), mods)
    root: nn.Module = WeightsChain() if chain else WeightsFile()
    for key in sorted(list(mods) + rest, key=_natural):
        *parents, leaf = key.split(".")
        node = root
        for part in parents:
            if not hasattr(node, part):
                node.add_module(part, nn.Sequential() if chain else nn.Module())
            node = getattr(node, part)
        if key in mods:
            node.add_module(leaf, mods[key])
            if chain and key != list(mods)[-1]:
                node.add_module(f"{leaf}_relu", nn.ReLU())
        else:
            node.register_parameter(leaf, nn.Parameter(tensors[key].to(torch.float64), requires_grad=False))
    return root


def load_factory(spec: str, weights: str | Path | None = None) -> nn.Module:
    """The model made by ``package.module:factory`` (called without arguments; the current folder is importable),
    with a safetensors state dict loaded into it when `weights` is given. An import or a call that raises, a
    result that is not an ``nn.Module``, and weights that do not fit (missing, unexpected or mis-shaped keys,
    named) are one-line errors."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.partition(":")[::2]):
        raise FeaturelabError(f"target {spec!r} is not allowed: give a .safetensors file or package.module:factory")
    module_name, _, attr = spec.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything on import
        raise FeaturelabError(
            f"factory {spec!r}: importing module {module_name!r} failed ({_first_line(exc)})"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise FeaturelabError(f"factory {spec!r}: module {module_name!r} has no callable {attr!r}")
    try:
        model = factory()
    except Exception as exc:  # the user's factory may raise anything
        raise FeaturelabError(
            f"factory {spec!r} raised {_first_line(exc)} when called without arguments; it must return an nn.Module"
        ) from None
    if not isinstance(model, nn.Module):
        raise FeaturelabError(f"factory {spec!r} returned a {type(model).__name__}, not a torch nn.Module")
    if weights is not None:
        state = _read_safetensors(weights, "weights file")
        own = model.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        sized = [
            f"{k} (file {tuple(state[k].shape)}, model {tuple(own[k].shape)})"
            for k in own
            if k in state and state[k].shape != own[k].shape
        ]
        problems = [
            f"{what} {', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''}"
            for what, keys in (("missing keys", missing), ("unexpected keys", unexpected), ("size mismatch", sized))
            if keys
        ]
        if problems:
            raise FeaturelabError(f"weights '{weights}' do not fit {spec!r}: {'; '.join(problems)}")
        try:
            model.load_state_dict(state, assign=any(p.is_meta for p in model.parameters()))
        except Exception as exc:
            raise FeaturelabError(f"weights '{weights}' do not fit {spec!r}: {_first_line(exc)}") from None
    return model


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,8,8"`` as (1, 8, 8); anything but positive integers separated by commas is a one-line error."""
    parts = text.split(",")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise FeaturelabError(
            f"--shape {text!r} is not allowed: give positive integers separated by commas, e.g. 1,8,8"
        )
    return tuple(int(p) for p in parts)


def parse_heads(text: str) -> dict[str, int]:
    """``"blocks.*.attn=4,enc.attn=2"`` as {"blocks.*.attn": 4, "enc.attn": 2}: module names or globs and their
    head counts; anything else is a one-line error."""
    out = {}
    for part in text.split(","):
        name, eq, count = part.strip().rpartition("=")
        if not (eq and name and count.strip().isdigit() and int(count) > 0):
            raise FeaturelabError(
                f"--heads {text!r} is not allowed: give module=count pairs separated by commas, e.g. blocks.*.attn=4"
            )
        out[name.strip()] = int(count)
    return out


def _numeric(data: str, key: str, A: np.ndarray) -> torch.Tensor:
    if A.dtype.kind not in "biuf":
        raise FeaturelabError(
            f"data file '{data}': array {key} has dtype {A.dtype} ; allowed: numeric arrays (bool, int, float)"
        )
    if A.ndim == 0 or len(A) == 0:
        raise FeaturelabError(f"data file '{data}': array {key} has shape {A.shape}; it needs at least one row")
    return torch.from_numpy(np.ascontiguousarray(A))


def load_inputs(data: str, n: int | None = 1000, shape: tuple[int, ...] | None = None):
    """(X, Y) of ``digits`` (the first `n` training digits, X ``n x 64``, labels Y) or of an ``.npz`` file with
    numeric arrays ``X`` (rows are samples; integer token ids ``N x T`` stay integers) and optionally ``Y``; rows
    reshaped to `shape` (e.g. (1, 8, 8))."""
    if data == "digits":
        from ..data.digits import digits

        ds = digits(n)
        X, Y = ds.X_train, ds.Y_train
    else:
        path = Path(data)
        if path.suffix != ".npz" or not path.is_file():
            raise FeaturelabError(f"data '{data}' is not allowed: give digits or an existing .npz file")
        try:
            with np.load(path, allow_pickle=False) as arrays:
                if "X" not in arrays:
                    raise FeaturelabError(f"data file '{data}' has no array X (it has: {', '.join(arrays.files)})")
                X = _numeric(data, "X", arrays["X"])
                Y = _numeric(data, "Y", arrays["Y"]) if "Y" in arrays else None
        except FeaturelabError:
            raise
        except ValueError as exc:  # numpy refuses object arrays without pickle
            raise FeaturelabError(
                f"data file '{data}' holds an array numpy cannot read without pickle ({_first_line(exc)}); "
                "allowed: numeric arrays"
            ) from None
        except (OSError, zipfile.BadZipFile, EOFError, KeyError) as exc:
            raise FeaturelabError(f"data file '{data}' is not a readable .npz file ({_first_line(exc)})") from None
    if shape is not None:
        if int(np.prod(shape)) != X[0].numel():
            raise FeaturelabError(
                f"--shape {','.join(map(str, shape))} does not hold the {X[0].numel()} entries of one sample"
            )
        X = X.reshape(len(X), *shape)
    return X, Y


def check_out(out: str | Path, force: bool = False) -> Path:
    """The output folder of an analysis, checked before anything is computed: not a file, and not holding a previous
    analysis (``report.html`` or ``summary.json``) unless `force`."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise FeaturelabError(f"--out '{path}' is a file; give a folder for the analysis")
    previous = [name for name in ("report.html", "summary.json") if (path / name).exists()]
    if previous and not force:
        raise FeaturelabError(
            f"--out '{path}' holds a previous analysis ({previous[0]}); add --force to overwrite it, or give another "
            "--out"
        )
    return path


__all__ = ["weights_module", "load_factory", "load_inputs", "parse_shape", "parse_heads", "check_out"]
