"""Whole-step capture on CUDA: one training step (forward, backward, schedule, trust region, optimizer
update) recorded once as a CUDA graph (`torch.cuda.graph`) and replayed every later step, so a step
costs one launch and the host never waits for the device between log steps.

Only taken on CUDA, for phases whose step is the same kernels every time: no L-BFGS (its line search
branches on the host), no ``on_step`` callbacks and no ``lr_rule``. Those phases run eagerly; the
engine says so once per reason. The step's inputs that change between replays live in static device
tensors the engine refills before each replay (the step index for the schedule, the mini-batch
indices); the optimizer state is updated in place (`optim.update`), so the graph reads and writes the
same memory every replay. Work between replays writes in place into the memory the graph reads: the
loss guard's rollback (parameters, per-member lr scale, optimizer restart counts; the graph always
carries the restart masks) and the adaptive Leaky-ResNet steps (the ρ buffer). docs/scale.md says what
of this is verified where.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import cache

import torch

WARMUP_STEPS = 3  # real steps on a side stream before capture (they allocate the optimizer state)
_ANNOUNCED: set[str] = set()


def eager_reason(device: torch.device, phase, *, on_step: bool, lr_rule: bool) -> str | None:
    """Why this phase's step cannot be captured on `device`, or None when it can (always a reason off CUDA)."""
    if device.type != "cuda":
        return "not on CUDA"
    for reason, applies in (
        ("an L-BFGS phase (host-side line search)", phase.optimizer == "lbfgs"),
        ("an on_step callback", on_step),
        ("an lr_rule", lr_rule),
    ):
        if applies:
            return reason
    return None


def announce(reason: str) -> None:
    """Say once per reason that steps run eagerly on CUDA."""
    if reason not in _ANNOUNCED:
        _ANNOUNCED.add(reason)
        warnings.warn(f"CUDA: training steps run eagerly (no graph capture) because of {reason}", stacklevel=3)


@cache
def _side_stream(device: int) -> torch.cuda.Stream:
    """The warm-up steps' stream on CUDA device `device`, one per process: cuBLAS keeps workspaces (64 MiB
    measured on an H200) for every stream that runs a product, so a new stream per step would hold more each time."""
    return torch.cuda.Stream(device=device)


def warmup(body: Callable[[], None]) -> None:
    """One real step on a side stream (before capture, as `torch.cuda.graph` asks)."""
    side = _side_stream(torch.cuda.current_device())
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)


def capture(body: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """Record `body` (one full training step reading and writing only static device tensors) as a
    CUDA graph; nothing runs until ``graph.replay()``."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


class Replayer:
    """A phase's step as CUDA graphs, one per mini-batch shape (an epoch's last batch may be smaller):
    `WARMUP_STEPS` real steps on a side stream, then one capture, then a replay per step.

    `step_body(k, idx) -> (lr, loss)` is the engine's step; here it reads the step index `k` (a float64
    device scalar, counted up by the graph) and the mini-batch indices from static tensors refilled before
    each replay (`indices`), and its per-member lr is copied to the static `lr` (read at log steps)."""

    def __init__(self, step_body: Callable, k0: int, lr0: torch.Tensor):
        self.step_body = step_body
        self.k = torch.full((), float(k0), dtype=torch.float64, device=lr0.device)
        self.lr = lr0.clone()
        self.idx: torch.Tensor | None = None
        self.graphs: dict = {}  # batch shape (None: full batch) -> [graph or None, static indices, warm-up steps]
        self.entry: list = []

    def body(self) -> None:
        lr, _ = self.step_body(self.k, self.idx)
        with torch.no_grad():
            self.lr.copy_(lr)
            self.k.add_(1)

    def indices(self, idx: torch.Tensor | None) -> torch.Tensor | None:
        """Copy this step's mini-batch indices into the static tensor of their shape; returns it."""
        key = None if idx is None else tuple(idx.shape)
        self.entry = self.graphs.setdefault(key, [None, None if idx is None else idx.clone(), 0])
        if idx is not None:
            self.entry[1].copy_(idx)
        self.idx = self.entry[1]
        return self.idx

    def step(self, before_capture: Callable[[], None]) -> bool:
        """Run one step (warm-up, capture then replay, or replay); False when the capture failed and the
        phase must go on eagerly (this step not taken). `before_capture` runs right before a capture."""
        entry = self.entry
        if entry[0] is None and entry[2] >= WARMUP_STEPS:
            before_capture()
            try:
                entry[0] = capture(self.body)
            except RuntimeError as exc:
                announce(f"a failed capture ({str(exc).splitlines()[0] if str(exc) else exc!r})")
                return False
        if entry[0] is not None:
            entry[0].replay()
        else:
            warmup(self.body)
            entry[2] += 1
        return True
