"""Atomic file writes and the small readers that go with them.

Every file featurelab writes goes to a temporary name in the same folder first and is then renamed
over the target, so an interrupted run never leaves a file that looks complete.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import yaml


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def jsonable(value):
    """Recursively convert numpy/torch scalars and non-finite floats into strict JSON values."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(jsonable(obj), indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_yaml(path: str | Path, obj) -> None:
    write_text(path, yaml.safe_dump(jsonable(obj), sort_keys=False))


def read_yaml(path: str | Path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)
