"""Checkpoints with safetensors: tensors plus JSON metadata in one file written atomically; loading
never unpickles code.

Every file carries the sha256 of its tensors (names, dtypes, shapes, bytes) and metadata, checked on
loading: a file changed or damaged after it was written is a one-line `FeaturelabError` naming it and
the fix, never a silently different model. Tensors keep their stored dtypes (a float64 buffer of a
float32 model stays float64).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..errors import FeaturelabError
from ..io import jsonable, write_bytes

FIX = "delete it to start that training run afresh"


def tensors_digest(tensors: dict[str, torch.Tensor], meta: str = "") -> str:
    """sha256 (hex) of `tensors` (sorted by name: name, dtype, shape, raw bytes) and the text `meta`."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    h.update(meta.encode())
    return h.hexdigest()


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    """Write a dict of tensors (and optional JSON-able `metadata`) to `path` atomically, as safetensors,
    with their `tensors_digest`."""
    from safetensors.torch import save

    flat = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    text = json.dumps(jsonable(metadata)) if metadata is not None else ""
    meta = {"sha256": tensors_digest(flat, text)}
    if metadata is not None:
        meta["featurelab"] = text
    write_bytes(path, save(flat, metadata=meta))


def load_tensors(path: str | Path, device: str | torch.device = "cpu", fix: str = FIX) -> dict[str, torch.Tensor]:
    """The tensors of a file written by `save_tensors`, checked against its checksum."""
    return {k: v.to(device) for k, v in _load(Path(path), fix)[0].items()}


def _load(path: Path, fix: str) -> tuple[dict[str, torch.Tensor], dict | None]:
    try:
        tensors = load_file(str(path))
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        info = json.loads(meta["featurelab"]) if "featurelab" in meta else None
    except FileNotFoundError:
        raise FeaturelabError(f"'{path}' is missing; {fix}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise FeaturelabError(f"'{path}' is not a valid safetensors file ({reason}); {fix}") from None
    if meta.get("sha256") != tensors_digest(tensors, meta.get("featurelab", "")):
        raise FeaturelabError(f"'{path}' fails its sha256 checksum (changed or damaged since written); {fix}")
    return tensors, info


def load_metadata(path: str | Path, fix: str = FIX) -> dict | None:
    """The JSON metadata stored by `save_tensors`, or None (the file is checked as by `load_tensors`)."""
    return _load(Path(path), fix)[1]


def save_model(model: torch.nn.Module, path: str | Path) -> None:
    """Save a model's parameters and buffers (its state_dict) as safetensors."""
    save_tensors(path, model.state_dict())


def load_model(model: torch.nn.Module, path: str | Path) -> torch.nn.Module:
    """Load parameters saved by `save_model` into `model` (same architecture), in place; returns it.
    Each tensor keeps `model`'s dtype and device for it; missing or extra names are a one-line error."""
    state = load_tensors(path, fix="save the model again")
    ref = model.state_dict()
    if set(state) != set(ref):
        diff = sorted(set(state) ^ set(ref))[:3]
        raise FeaturelabError(f"'{path}' does not fit this {type(model).__name__}: tensors {diff} differ")
    model.load_state_dict({k: v.to(dtype=ref[k].dtype, device=ref[k].device) for k, v in state.items()})
    return model


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer's state_dict into tensors (for safetensors) and the JSON-able rest."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, val in st.items():
            if isinstance(val, torch.Tensor):
                tensors[f"optim.{idx}.{key}"] = val
            else:
                scalars[f"{idx}.{key}"] = val
    return tensors, {"scalars": scalars, "param_groups": sd["param_groups"]}


def save_checkpoint(
    folder: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    info: dict,
    extra: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write ``folder/checkpoint.safetensors``: model state, optimizer state, `info` and the `extra` run
    state tensors (the loss guard's window start, say), in one atomic file."""
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()} | (extra or {})
    opt_info = None
    if optimizer is not None and not isinstance(optimizer, torch.optim.LBFGS):
        t, opt_info = optimizer_tensors(optimizer)
        tensors.update(t)
    save_tensors(Path(folder) / "checkpoint.safetensors", tensors, {**info, "optimizer": opt_info})


def load_checkpoint(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict] | None:
    """Return ``(tensors, info)`` of the checkpoint in `folder`, or None when there is none; a damaged
    checkpoint (checksum, format, missing metadata) is a one-line error naming it."""
    path = Path(folder) / "checkpoint.safetensors"
    if not path.exists():
        return None
    tensors, info = _load(path, FIX)
    if not isinstance(info, dict) or not {"step", "done", "history"} <= set(info):
        raise FeaturelabError(f"'{path}' is not a featurelab training checkpoint; {FIX}")
    return tensors, info
