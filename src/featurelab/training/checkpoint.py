"""Checkpoints with safetensors: tensors plus JSON metadata in one file written atomically; loading
never unpickles code."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..io import jsonable, write_bytes


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    """Write a dict of tensors (and optional JSON-able `metadata`) to `path` atomically, as safetensors."""
    from safetensors.torch import save

    flat = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = {"featurelab": json.dumps(jsonable(metadata))} if metadata is not None else None
    write_bytes(path, save(flat, metadata=meta))


def load_tensors(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    return load_file(str(path), device=str(device))


def load_metadata(path: str | Path) -> dict | None:
    """The JSON metadata stored by `save_tensors`, or None."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    return json.loads(meta["featurelab"]) if "featurelab" in meta else None


def save_model(model: torch.nn.Module, path: str | Path) -> None:
    """Save a model's parameters and buffers (its state_dict) as safetensors."""
    save_tensors(path, model.state_dict())


def load_model(model: torch.nn.Module, path: str | Path) -> torch.nn.Module:
    """Load parameters saved by `save_model` into `model` (same architecture), in place; returns it."""
    state = load_tensors(path)
    ref = model.state_dict()
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
    folder: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, info: dict
) -> None:
    """Write ``folder/checkpoint.safetensors``: model state, optimizer state and `info`, in one atomic file."""
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    opt_info = None
    if optimizer is not None and not isinstance(optimizer, torch.optim.LBFGS):
        t, opt_info = optimizer_tensors(optimizer)
        tensors.update(t)
    save_tensors(Path(folder) / "checkpoint.safetensors", tensors, {**info, "optimizer": opt_info})


def load_checkpoint(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict] | None:
    """Return ``(tensors, info)`` of the checkpoint in `folder`, or None when there is none."""
    path = Path(folder) / "checkpoint.safetensors"
    if not path.exists():
        return None
    return load_tensors(path), load_metadata(path)
