"""The experiments' names, presets and one-line descriptions, readable without importing any of them.

Each experiment module states its own listing next to its ``EXPERIMENT``, as a literal block

    CATALOG = (Entry("my-experiment", ("quick", "tiny", "paper"), "Author Year Fig. N: what it checks", 61),)

and this module reads those blocks from the source files (with `ast`, importing nothing), so the command line's
``list`` and ``--help`` answer without importing torch. `featurelab.experiments` registers the same modules'
experiments and refuses, at import, a block whose names or presets differ from the module's experiments; a
module without a block (``template.py``) is not registered.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

EXPERIMENTS_DIR = Path(__file__).parent / "experiments"


class Entry(NamedTuple):
    """One experiment as `featurelab list` shows it."""

    name: str
    presets: tuple[str, ...]
    what: str  # paper and figure, then what it checks
    order: int  # where the listing shows it: one decade per paper (10s Leaky ResNets, 20s bottleneck rank, ...)


def module_entries(path: Path) -> tuple[Entry, ...]:
    """The `Entry` values of the ``CATALOG = (...)`` block of the experiment module at `path` (none without one),
    read as literals, without importing it."""
    text = path.read_text(encoding="utf-8")
    start = text.find("\nCATALOG = (")
    if start < 0:
        return ()
    end = text.index("\n)\n", start) + 2
    block = ast.parse(text[start:end]).body[0]
    assert isinstance(block, ast.Assign) and isinstance(block.value, ast.Tuple), path
    return tuple(_entry(node, path) for node in block.value.elts)


def _entry(node: ast.expr, path: Path) -> Entry:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Entry"):
        raise ValueError(f"{path.name}: CATALOG holds Entry(...) literals only")
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    return Entry(*args, **kwargs)


def experiment_modules() -> list[str]:
    """The names of the modules in ``experiments/`` that list an experiment, in file-name order."""
    return [p.stem for p in sorted(EXPERIMENTS_DIR.glob("*.py")) if module_entries(p)]


def read_catalog() -> tuple[Entry, ...]:
    """Every experiment module's entries, ordered by `Entry.order`."""
    entries = [e for p in sorted(EXPERIMENTS_DIR.glob("*.py")) for e in module_entries(p)]
    return tuple(sorted(entries, key=lambda e: e.order))


CATALOG: tuple[Entry, ...] = read_catalog()


def presets() -> list[str]:
    """Every preset name, in first-seen order."""
    return list(dict.fromkeys(p for e in CATALOG for p in e.presets))
