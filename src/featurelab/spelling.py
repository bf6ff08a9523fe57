"""How an error of a run names the option that fixes it: the Python API's keyword (``resume=True``), or,
inside the `featurelab` command (`command_line`), the command's flag (``--resume``)."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PYTHON = {
    "resume": "resume=True",
    "overwrite": "overwrite=True",
    "new_out": "out=<a new folder>",
    "again": "the same call with resume=True",
}
COMMAND = {
    "resume": "--resume",
    "overwrite": "--force",
    "new_out": "--out DIR",
    "again": "the same command plus --resume",
}
_WORDS: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("featurelab_spelling", default=PYTHON)


def option(name: str) -> str:
    """How to ask for option `name` ("resume", "overwrite", "new_out", "again") where the error is read."""
    return _WORDS.get()[name]


def out_folder(path: str | Path) -> str:
    """The run folder argument as the reader typed it: ``out='runs/x'`` or ``--out 'runs/x'``."""
    return f"--out '{path}'" if _WORDS.get() is COMMAND else f"out='{path}'"


@contextmanager
def command_line() -> Iterator[None]:
    """Within this block (the `featurelab` command), errors name the command's flags."""
    token = _WORDS.set(COMMAND)
    try:
        yield
    finally:
        _WORDS.reset(token)
