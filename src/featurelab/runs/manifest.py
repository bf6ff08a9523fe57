"""A run folder's manifest: the sha256 of every file a verdict or figure rests on, checked before it is read.

``manifest.json`` lists, for a finished run, ``config.yaml``, every unit's files (result, models,
checkpoints, histories), ``tables/*.csv``, ``claims.json`` and ``results.json`` with the sha256 of their
bytes; it is written last and atomically, with its own checksum (`featurelab.io.write_json`). A unit's
``result.json`` lists its folder's other files the same way (`unit_files`), so ``--resume`` of an
unfinished run checks a finished unit's files before it skips the unit. `verify_run` and `verify_unit`
turn a missing, changed or truncated file into one line naming it and the fix; nothing damaged is read.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import FeaturelabError
from ..io import TEMPORARY, read_json, write_json
from .lock import LOCK_NAME

MANIFEST = "manifest.json"
FIX_RUN = "restore it from a copy, or run the experiment again with a new --out"


def file_sha256(path: Path) -> str:
    """sha256 (hex) of the bytes of `path`, read in blocks of 1 MiB."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _kept(path: Path, skip: tuple[str, ...] = ()) -> bool:
    """A file a verdict rests on: not a temporary, the lock, a traceback (``error.txt``) or a name in `skip`."""
    name = path.name
    return path.is_file() and not TEMPORARY.fullmatch(name) and name not in (LOCK_NAME, "error.txt", *skip)


def unit_files(folder: Path) -> dict[str, str]:
    """{name: sha256} of the files of a unit's folder other than its ``result.json`` and ``error.txt``."""
    folder = Path(folder)
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir()) if _kept(p, ("result.json",))}


def run_files(run: Path) -> dict[str, str]:
    """{path relative to `run`: sha256} of ``config.yaml``, ``claims.json``, ``results.json``, every unit's
    files (``result.json`` included) and ``tables/*.csv``."""
    run = Path(run)
    paths = [run / n for n in ("config.yaml", "claims.json", "results.json")]
    paths += sorted((run / "units").rglob("*")) + sorted((run / "tables").glob("*.csv"))
    return {p.relative_to(run).as_posix(): file_sha256(p) for p in paths if _kept(p)}


def write_manifest(run: Path) -> None:
    """Write ``run/manifest.json`` (`run_files`, with its own checksum); call it after ``results.json``."""
    write_json(Path(run) / MANIFEST, {"files": run_files(run)}, checksum=True)


def _check(path: Path, want: str, fix: str) -> None:
    if not path.is_file():
        raise FeaturelabError(f"'{path}' is missing but listed in the run's manifest; {fix}")
    if file_sha256(path) != want:
        raise FeaturelabError(f"'{path}' differs from the sha256 in its manifest (changed or damaged); {fix}")


def verify_run(run: Path, fix: str = FIX_RUN) -> None:
    """Check every file ``run/manifest.json`` lists against its sha256 (and that ``config.yaml``,
    ``claims.json`` and ``results.json`` are listed); the first missing or changed file is one line. The
    folders of the units ``results.json`` records as failed are not checked: ``--resume`` redoes them."""
    run = Path(run)
    path = run / MANIFEST
    if not path.exists():
        raise FeaturelabError(
            f"run folder '{run}' has results.json but no {MANIFEST}: it was cut off while finishing, or damaged; {fix}"
        )
    files = read_json(path, checksum=True, kind=dict, fix=fix).get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise FeaturelabError(f"'{path}' lists no files; {fix}")
    for name in ("results.json", "config.yaml", "claims.json"):
        if name not in files:
            raise FeaturelabError(f"'{path}' does not list {name}; {fix}")
    _check(run / "results.json", files["results.json"], fix)
    failed = read_json(run / "results.json", kind=dict, fix=fix).get("failed") or {}
    redo = tuple(f"units/{u}/" for u in failed) if isinstance(failed, dict) else ()
    for name, want in files.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise FeaturelabError(f"'{path}' lists '{name}', outside the run folder; {fix}")
        if not name.startswith(redo) or not redo:
            _check(run / name, want, fix)


def verify_unit(folder: Path, files, fix: str) -> None:
    """Check a unit's files against `files` ({name: sha256}, from its ``result.json``)."""
    if files is None:
        return  # a unit written before its files were listed
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise FeaturelabError(f"'{Path(folder) / 'result.json'}' lists its files wrongly; {fix}")
    for name, want in files.items():
        if "/" in name or name in ("..", "."):
            raise FeaturelabError(f"'{Path(folder) / 'result.json'}' lists '{name}', outside its folder; {fix}")
        _check(Path(folder) / name, want, fix)
