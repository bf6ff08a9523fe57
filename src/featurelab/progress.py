"""Progress bars for a person watching: in a terminal and in an interactive Jupyter kernel, off in logs, in
worker processes and when asked to be quiet (``progress=False``, the command line's ``--quiet``).

`show_progress` decides; `progress_bar` makes the bar: tqdm's notebook widget in a Jupyter kernel that has
ipywidgets, else tqdm's text bar on stderr (which a kernel shows in the cell's output). Every bar states the
elapsed time, the rate and the time left.

Work made of several runs (``featurelab reproduce``: experiments, each under several seeds) is followed by
`UnitsProgress`: its units done and its time left (`TimeLeft`, per part and in all), on one bar for a person,
as one line per finished run in a log, and not at all when quiet.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from time import monotonic

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


def fmt_duration(seconds: float) -> str:
    """A duration for a person: "42s", "3m 05s", "2h 07m" (to the second under an hour, else to the minute)."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    m = round(seconds / 60)
    return f"{m // 60}h {m % 60:02d}m"


class TimeLeft:
    """The time left of work counted in units and split into named parts (the experiments of a reproduction),
    from the units finished and the seconds they took on `clock` (default ``time.monotonic``):

    * a part that has run units: its seconds per unit run times its units left. The seconds are wall time from
      `start` to `add`, so workers running units side by side, the analysis and the report count as they cost;
    * a part that has run none yet: the seconds per unit over all the units run so far, times its units left;
    * in all: the sum over the parts; unknown (None) while no unit has run.

    Units found finished (a resumed run) or not run (a run that ended in an error) count as done, not timed."""

    def __init__(self, totals: dict[str, int], clock: Callable[[], float] | None = None):
        self.totals = dict(totals)
        self.done = dict.fromkeys(self.totals, 0)
        self.ran = dict.fromkeys(self.totals, 0)
        self.seconds = dict.fromkeys(self.totals, 0.0)
        self.clock = clock or monotonic
        self.started = self.clock()

    def start(self) -> None:
        """Start timing the next run."""
        self.started = self.clock()

    def add(self, part: str, units: int, ran: int) -> float:
        """Record a run of `part` that finished `units` units, `ran` of them run since `start` (the others found
        finished or not run); returns its seconds."""
        seconds = self.clock() - self.started
        if ran > 0:
            self.ran[part] += ran
            self.seconds[part] += seconds
        self.done[part] += units
        return seconds

    def per_unit(self, part: str | None = None) -> float | None:
        """Seconds per unit run in `part` (None: in all parts); None before one has run."""
        ran = self.ran[part] if part is not None else sum(self.ran.values())
        seconds = self.seconds[part] if part is not None else sum(self.seconds.values())
        return seconds / ran if ran else None

    def left(self, part: str | None = None) -> float | None:
        """Seconds left in `part` (None: in all parts); None while it cannot be told."""
        total = 0.0
        for p in [part] if part is not None else list(self.totals):
            todo = self.totals[p] - self.done[p]
            if todo <= 0:
                continue
            rate = self.per_unit(p) if self.ran[p] else self.per_unit()
            if rate is None:
                return None
            total += rate * todo
        return total

    def status(self, part: str) -> str:
        """ "forces 24/36 units, ~6m 10s left; all 60/220 units, ~1h 02m left" ("time left unknown" before a unit
        has run)."""

        def when(p: str | None) -> str:
            left = self.left(p)
            return "done" if left == 0 else "time left unknown" if left is None else f"~{fmt_duration(left)} left"

        here = f"{part} {self.done[part]}/{self.totals[part]} units, {when(part)}"
        return f"{here}; all {sum(self.done.values())}/{sum(self.totals.values())} units, {when(None)}"


BAR_FORMAT = "{desc}: {n_fmt}/{total_fmt} units |{bar}| {elapsed}{postfix}"


class UnitsProgress:
    """Progress of work counted in units and split into parts, run after run, with the time left (`TimeLeft`).
    Shown as `show_progress` decides for `progress`: one bar over all the units (the run going on as its
    description, then the elapsed time and the part's and the whole's time left); else, where `progress` is None
    (a log file), one line per finished run through `echo`; nothing where it is False.

    `say` prints a line of the caller's through `echo` without tearing the bar. The bar is redrawn every
    `TICK` seconds by a thread of its own, so that its elapsed time runs on while a long run goes on (the
    estimate changes when a run finishes)."""

    TICK = 1.0

    def __init__(self, totals: dict[str, int], progress: bool | None, echo=print, clock=None, desc: str = "units"):
        self.time = TimeLeft(totals, clock)
        self.mode = "bar" if show_progress(progress) else "quiet" if progress is False else "lines"
        self.echo = echo
        total = sum(self.time.totals.values())
        self.bar = progress_bar(total=total, show=self.mode == "bar", desc=desc, bar_format=BAR_FORMAT)
        self._stop = threading.Event()
        if self.mode == "bar":
            threading.Thread(target=self._tick, daemon=True, name="featurelab-progress").start()

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK):
            self.bar.refresh()

    def say(self, line: str) -> None:
        if self.mode != "bar":
            self.echo(line)
            return
        with text_bar.external_write_mode():
            self.echo(line)

    def begin(self, part: str, run: str) -> None:
        """Run `run` of `part` starts."""
        self.bar.set_postfix_str(self.time.status(part), refresh=False)
        self.bar.set_description_str(f"{part} {run}")
        self.time.start()

    def end(self, part: str, run: str, units: int, ran: int) -> None:
        """Run `run` of `part` finished `units` units, `ran` of them run now."""
        seconds = self.time.add(part, units, ran)
        status = self.time.status(part)
        self.bar.set_postfix_str(status, refresh=False)
        self.bar.update(units)
        if self.mode == "lines":
            self.echo(f"progress: {part} {run}: {ran} of {units} units run in {fmt_duration(seconds)}; {status}")

    def close(self) -> None:
        self._stop.set()
        self.bar.close()
