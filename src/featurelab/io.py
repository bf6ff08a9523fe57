"""Atomic file writes and the validating readers that go with them.

Every file featurelab writes goes to a temporary name in the same folder first (created with mode
0666 less the process umask, as `open` would) and is then renamed over the target, so an interrupted
run never leaves a file that looks complete; the temporary file of a failed write is removed, and
those of a killed writer are removed by the next one (`remove_temporaries`). An operating-system error
while writing (a full disk, no permission, a read-only file system, too many open files) is a one-line
`WriteError` naming the path, the cause and the remedy. Every reader turns an unreadable, truncated or
garbled file into a one-line `FeaturelabError` naming the file and the fix. A JSON file written with
``checksum=True`` carries the sha256 of its content (`digest`), checked on reading, so a result edited
or damaged after it was written is never used.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import os
import re
import secrets
from pathlib import Path
from typing import Any

import yaml

from .errors import FeaturelabError, WriteError

TEMPORARY = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")  # `write_bytes`'s temporary names: .NAME.XXXXXXXX.tmp


def write_error(path: str | Path, exc: OSError) -> WriteError:
    """The one-line `WriteError` for `exc`, raised while writing `path`: the cause and its remedy."""
    folder = Path(path).parent
    while not os.path.exists(folder) and folder != folder.parent:  # never raises, unlike Path.exists
        folder = folder.parent
    remedies = {
        errno.ENOSPC: "free space on its file system",
        errno.EDQUOT: "free space or raise the disk quota",
        errno.EACCES: f"give this user write permission on '{folder}' (e.g. chmod -R u+w '{folder}')",
        errno.EPERM: f"give this user write permission on '{folder}' (e.g. chmod -R u+w '{folder}')",
        errno.EROFS: f"'{folder}' lies on a read-only file system: remount it read-write",
        errno.EMFILE: "raise the limit on open files (ulimit -n)",
        errno.ENFILE: "close other programs' files or raise the system's limit on open files",
    }
    remedy = remedies.get(exc.errno or 0, f"make '{folder}' writable")
    return WriteError(str(path), exc.strerror or type(exc).__name__, remedy)


def make_folder(folder: str | Path) -> Path:
    """``mkdir -p folder``; an operating-system error is a one-line `WriteError`."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(folder, exc) from None
    return folder


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically (temp file in the same folder, fsync, rename); on an error
    nothing is left behind and the error is a one-line `WriteError`."""
    path = Path(path)
    make_folder(path.parent)
    tmp = None
    try:
        fd, tmp = _temporary(path)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:  # the folder itself refuses changes: nothing more can be cleaned
                pass
        if isinstance(exc, OSError):
            raise write_error(path, exc) from None
        raise


def _temporary(path: Path) -> tuple[int, Path]:
    """A new file ``.NAME.XXXXXXXX.tmp`` next to `path`, open for writing, mode 0666 less the umask."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def remove_temporaries(folder: str | Path) -> None:
    """Remove the temporary files that writers killed mid-write (SIGKILL, power loss) left anywhere
    under `folder`. Call it only as the folder's single writer (its lock held)."""
    for root, _, names in os.walk(folder):
        for name in names:
            if TEMPORARY.fullmatch(name):
                try:
                    os.unlink(os.path.join(root, name))
                except OSError:  # gone already, or a read-only folder: the write that follows says so
                    pass


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def jsonable(value) -> Any:
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


def digest(obj) -> str:
    """sha256 (hex) of the canonical JSON text of `obj` (sorted keys, no spaces)."""
    text = json.dumps(jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_json(path: str | Path, obj, *, checksum: bool = False) -> None:
    """Write `obj` (a dict when `checksum`) as JSON; with `checksum` a ``"sha256"`` key holds `digest` of
    the rest, which `read_json` checks."""
    obj = jsonable(obj)
    if checksum:
        obj = {**obj, "sha256": digest(obj)}
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def _text(path: Path, fix: str) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise FeaturelabError(f"'{path}' is missing; {fix}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FeaturelabError(f"'{path}' cannot be read ({type(exc).__name__}); {fix}") from None


def read_json(
    path: str | Path, *, checksum: bool = False, kind: type | None = None, fix: str = "restore or delete it"
) -> Any:
    """The JSON content of `path`; a missing, unreadable or invalid file, content not of type `kind`, or
    (with `checksum`) a missing or wrong ``"sha256"`` is a one-line error naming the file and `fix`."""
    path = Path(path)
    try:
        obj = json.loads(_text(path, fix))
    except json.JSONDecodeError as exc:
        raise FeaturelabError(f"'{path}' is not valid JSON ({exc.msg} at line {exc.lineno}); {fix}") from None
    if kind is not None and not isinstance(obj, kind):
        raise FeaturelabError(f"'{path}' holds a {type(obj).__name__}, not a {kind.__name__}; {fix}")
    if checksum:
        if not isinstance(obj, dict) or obj.pop("sha256", None) != digest(obj):
            raise FeaturelabError(
                f"'{path}' fails its sha256 checksum (changed or damaged after it was written); {fix}"
            )
    return obj


def write_yaml(path: str | Path, obj) -> None:
    write_text(path, yaml.safe_dump(jsonable(obj), sort_keys=False))


def read_yaml(path: str | Path, *, kind: type | None = None, fix: str = "restore or delete it"):
    """The YAML content of `path`, checked like `read_json`."""
    path = Path(path)
    try:
        obj = yaml.safe_load(_text(path, fix))
    except yaml.YAMLError as exc:
        reason = " ".join(str(getattr(exc, "problem", "") or "invalid YAML").split())
        raise FeaturelabError(f"'{path}' is not valid YAML ({reason}); {fix}") from None
    if kind is not None and not isinstance(obj, kind):
        raise FeaturelabError(f"'{path}' holds a {type(obj).__name__}, not a {kind.__name__}; {fix}")
    return obj


def read_csv(path: str | Path, *, fix: str = "restore or delete it"):
    """A pandas DataFrame of the CSV file `path` (an empty file gives an empty frame); a missing,
    unreadable or garbled file is a one-line error naming the file and `fix`."""
    import pandas as pd

    path = Path(path)
    text = _text(path, fix)
    if not text.strip():
        return pd.DataFrame()
    try:
        return pd.read_csv(io.StringIO(text))
    except (ValueError, pd.errors.ParserError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise FeaturelabError(f"'{path}' is not a valid CSV table ({reason}); {fix}") from None
