"""Claims: a paper's statement checked numerically, with what was expected, measured and allowed."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from .results import Check


@dataclass
class Claim:
    """One checked statement of a paper.

    id: a stable name (``"f4-bottleneck-rank"``): tests and users find a claim by it, never by its wording.
    statement: what is claimed, in words.   reference: where (paper, section or figure, arXiv id).
    expected: the value or range claimed.    measured: what this run measured.
    tolerance: the slack allowed ("" when the check is an inequality).
    passed: the verdict: True, False, or None when the claim was not measured (a unit it rests on failed
        or is unhealthy); `reason` then says why.
    units: the ids of the units the claim rests on; None (the default) means every unit of the run.
    """

    statement: str
    reference: str
    expected: str
    measured: str
    tolerance: str
    passed: bool | None
    id: str = ""
    reason: str = ""
    units: tuple[str, ...] | None = None

    @property
    def verdict(self) -> str:
        return verdict(self.passed)

    def not_measured(self, reason: str) -> Claim:
        """This claim with no verdict, because of `reason`."""
        return replace(self, passed=None, reason=reason)

    def rests_on(self, units) -> Claim:
        """This claim, resting only on the units with these ids (an unhealthy other unit leaves it measured)."""
        return replace(self, units=tuple(units))

    def to_dict(self) -> dict:
        return asdict(self)


def verdict(passed: bool | None) -> str:
    """ "PASS", "FAIL" or "NOT MEASURED" for a claim's `passed`."""
    return "NOT MEASURED" if passed is None else ("PASS" if passed else "FAIL")


def fmt(value, digits: int = 4) -> str:
    """Compact text for a measured number, list or dict."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v, digits) for v in value) + "]"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {fmt(v, digits)}" for k, v in value.items())
    return str(value)


def claim(statement: str, reference: str, expected, measured, passed: bool, tolerance="", *, id: str = "") -> Claim:
    """Build a `Claim`, formatting `expected`, `measured` and `tolerance` for the report; `id` names it stably."""
    return Claim(
        statement,
        reference,
        expected if isinstance(expected, str) else fmt(expected),
        fmt(measured),
        tolerance if isinstance(tolerance, str) else fmt(tolerance),
        bool(passed),
        id,
    )


def claim_from_check(statement: str, reference: str, check: Check, *, id: str = "") -> Claim:
    """The `Claim` that `check` (a measurement's `Check`) decides: expected ``<relation> bound``, the
    measured side, its tolerance and verdict."""
    tolerance = ", ".join(f"{name}={fmt(v)}" for name, v in (("rtol", check.rtol), ("atol", check.atol)) if v)
    return claim(
        statement,
        reference,
        f"{check.relation} {fmt(float(check.bound))}",
        float(check.measured),
        check.passed,
        tolerance,
        id=id,
    )
