"""Result types shared by every measurement: frozen dataclasses with ``to_dict()``, and `Check`, the
outcome of checking one inequality or identity of a paper (it feeds `featurelab.claims.claim_from_check`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np
import torch


def plain(value):
    """`value` as JSON-able Python: tensors and arrays become (nested) lists or numbers."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Result):
        return value.to_dict()
    return value


@dataclass(frozen=True)
class Result:
    """Base of measurement results: immutable; ``to_dict()`` gives every field as JSON-able values."""

    def to_dict(self) -> dict:
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, kw_only=True)
class Check(Result):
    """One checked statement: ``measured <relation> bound`` within ``atol + rtol·|bound|``.

    passed: the verdict (a check may refine it, e.g. a precondition that fails makes it vacuously true).
    measured: the measured side.  bound: what it is compared with.  relation: "<=", ">=" or "==".
    rtol, atol: the slack allowed (0 for an exact inequality).
    """

    passed: bool
    measured: float
    bound: float
    relation: Literal["<=", ">=", "=="] = "<="
    rtol: float = 0.0
    atol: float = 0.0

    @property
    def slack(self) -> float:
        """How far inside the bound the measurement is (>= 0 when the inequality holds without slack);
        for "==" minus the distance."""
        if self.relation == "<=":
            return self.bound - self.measured
        if self.relation == ">=":
            return self.measured - self.bound
        return -abs(self.measured - self.bound)

    @staticmethod
    def holds(measured: float, bound: float, relation: str = "<=", rtol: float = 0.0, atol: float = 0.0) -> bool:
        """Whether ``measured <relation> bound`` within ``atol + rtol·|bound|`` (False for NaN)."""
        allowed = atol + rtol * abs(bound) if math.isfinite(bound) else 0.0
        if relation == "<=":
            return bool(measured <= bound + allowed)
        if relation == ">=":
            return bool(measured >= bound - allowed)
        return bool(abs(measured - bound) <= allowed)
