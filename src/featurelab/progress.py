"""Progress bars for a person watching: in a terminal and in an interactive Jupyter kernel, off in logs, in
worker processes and when asked to be quiet (``progress=False``, the command line's ``--quiet``).

`show_progress` decides; `progress_bar` makes the bar: tqdm's notebook widget in a Jupyter kernel that has
ipywidgets, else tqdm's text bar on stderr (which a kernel shows in the cell's output). Every bar states the
elapsed time, the rate and the time left.
"""

from __future__ import annotations

import importlib.util
import sys

from tqdm import tqdm as text_bar


def in_kernel() -> bool:
    """Whether this process is an IPython kernel serving a notebook (ipykernel loaded, a kernel attached to the
    running shell); a plain IPython terminal or a worker process is not."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def show_progress(progress: bool | None) -> bool:
    """`progress` when given (True or False); by default (None) bars are shown to a person: stderr is a
    terminal, or the process is a notebook's kernel (`in_kernel`)."""
    if progress is not None:
        return bool(progress)
    stream = sys.stderr
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty()) or in_kernel()


def _widget_bar():
    """tqdm's notebook bar class when ipywidgets is importable, else None (tqdm's notebook bar then refuses to
    start, so the text bar is used)."""
    if importlib.util.find_spec("ipywidgets") is None:
        return None
    from tqdm.notebook import tqdm as widget_bar

    return widget_bar


def progress_bar(iterable=None, *, show: bool, **kwargs):
    """A tqdm bar over `iterable` (or with ``total=``), disabled unless `show`; the widget in a notebook's kernel
    with ipywidgets, else the text bar. `kwargs` are tqdm's (``desc``, ``total``, ``unit``, ``leave``, ...).

    A notebook's output moves no cursor up, so there text bars all take the one line (position 0): a unit's
    step bar covers the bar over the units while it runs, instead of piling up one line per refresh."""
    kernel = show and in_kernel()
    cls = (_widget_bar() if kernel else None) or text_bar
    if kernel and cls is text_bar:
        kwargs["position"] = 0
    return cls(iterable, disable=not show, **kwargs)
