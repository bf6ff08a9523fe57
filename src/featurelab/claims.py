"""Claims: a paper's statement checked numerically, with what was expected, measured and allowed."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from .errors import FeaturelabError
from .results import Check


@dataclass
class Claim:
    """One checked statement of a paper.

    id: a stable name (``"f4-bottleneck-rank"``): tests and users find a claim by it, never by its wording.
    statement: what is claimed, in words.   reference: where (paper, section or figure, arXiv id).
    expected: the value or range claimed.    measured: what this run measured.
    tolerance: the slack allowed ("" when the check is an inequality).
    passed: the verdict: True, False, or None when the claim was not measured (a unit it rests on failed
        or is unhealthy, or is not at the critical point the claim presumes); `reason` then says why.
    units: the ids of the units the claim rests on; None (the default) means every unit of the run.
    kind: "empirical" (its verdict depends on what training found: a reproduced result) or "identity"
        (it holds for any parameters: a check of the code, reported apart and never counted as reproduced).
    margin: the signed distance of the measurement to its threshold, relative to the threshold (`margin`):
        > 0 inside, < 0 outside; None where the claim has no numeric threshold.
    headroom: the margin the claim would have if its measured quantity sat at its ceiling, the best value it
        can take (an R² or a cosine at 1: `Threshold.ceiling`); the most `margin` can be, so that "+0.9% of
        +1%" reads as nearly all the room there is. None where the quantity has no ceiling.
    premise: "" or "critical": a statement the paper makes at critical points (or minima) of the
        regularised loss. Tier "as the paper did" measures it on the trained nets like any other claim, with
        `stationarity` beside it; tier "certified" measures it (and every other empirical claim) on the units'
        certified critical points.
    stationarity: tier "as the paper did": the largest stationarity ``‖∇(C+R)‖/‖∇R‖`` of the trained nets the
        claim rests on (None where the run certifies nothing).
    certified_passed, certified_measured, certified_margin, certified_reason: tier "certified", the same claim
        measured on the certified nets (`featurelab.training.certify.certify`): it passes only when every
        unit it rests on is certified and its margin is at least `ERROR_BAR_ROOM` times `error_bar`; None
        ("not measured") with
        `certified_reason` otherwise (the failed rule of an uncertified unit, an unhealthy unit, an undefined
        quantity). Empty where the run certifies nothing; identity claims have only the first tier.
    error_bar: the certified margin's uncertainty ``|margin(certified) − margin(previous)|·δ/(δ_prev − δ)``:
        its measured sensitivity to the Clarke residual times the residual (`error_bar`).
    clarke: the largest Clarke residual δ of the certified units the claim rests on.
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
    kind: str = "empirical"
    margin: float | None = None
    headroom: float | None = None
    premise: str = ""
    stationarity: float | None = None
    certified_passed: bool | None = None
    certified_measured: str = ""
    certified_margin: float | None = None
    certified_reason: str = ""
    error_bar: float | None = None
    clarke: float | None = None

    @property
    def verdict(self) -> str:
        return verdict(self.passed)

    @property
    def certified_verdict(self) -> str:
        """Tier "certified"'s verdict ("" where the claim has no such tier: an identity, or nothing certified)."""
        return tier_verdict(self.to_dict())

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


def digits(measured: float, bound: float, allowed: float = 0.0) -> int:
    """The significant digits that print `measured` and `bound` so that a reader sees where they differ, down
    to the tolerance `allowed` (``atol + rtol·|bound|``) and no finer: the last digit shown sits at the
    larger of `allowed` and ``|measured − bound|`` (then values that differ by more than the tolerance print
    differently, and values within it agree to its resolution). At least 4, at most 15 (float64)."""
    values = [abs(float(v)) for v in (measured, bound, allowed)]
    if not all(math.isfinite(v) for v in values):
        return 4
    step = max(values[2], abs(float(measured) - float(bound)))
    scale = max(values[0], values[1])
    if step <= 0 or scale <= 0:
        return 4
    return min(15, max(4, math.floor(math.log10(scale)) - math.floor(math.log10(step)) + 1))


def tally(claims: list[dict]) -> dict:
    """The counts of a run's claims (dicts, as in ``claims.json``): ``claims_passed``, ``claims_failed``,
    ``claims_not_measured`` and ``claims_total`` count the empirical claims only (the reproduced results);
    ``identity_passed`` and ``identity_total`` the identity claims (checks of the code), counted apart."""
    empirical = [c for c in claims if c.get("kind", "empirical") != "identity"]
    identity = [c for c in claims if c.get("kind", "empirical") == "identity"]
    certified = [c for c in empirical if has_tier(c)]
    return {
        "claims_passed": sum(c["passed"] is True for c in empirical),
        "claims_failed": sum(c["passed"] is False for c in empirical),
        "claims_not_measured": sum(c["passed"] is None for c in empirical),
        "claims_total": len(empirical),
        "identity_passed": sum(c["passed"] is True for c in identity),
        "identity_total": len(identity),
        "certified_claims_passed": sum(c.get("certified_passed") is True for c in certified),
        "certified_claims_failed": sum(c.get("certified_passed") is False for c in certified),
        "certified_claims_not_measured": sum(c.get("certified_passed") is None for c in certified),
        "certified_claims_total": len(certified),
    }


TIERS = {
    "paper": "as the paper did: measured on the trained nets (the run's seeds and dtype), stationarity beside it",
    "certified": "certified: measured on the certified critical points; passes only when every unit it rests on "
    "is certified and its margin is at least 10 times its error bar (the margin's sensitivity to the Clarke "
    "residual δ, times δ)",
}


def has_tier(claim: dict) -> bool:
    """Whether the claim dict (as in ``claims.json``) carries tier "certified": an empirical claim of a run that
    certifies its units (measured, or not measured with a reason)."""
    return claim.get("kind", "empirical") != "identity" and bool(
        claim.get("certified_measured") or claim.get("certified_reason") or claim.get("certified_passed") is not None
    )


def tier_verdict(claim: dict) -> str:
    """Tier "certified"'s verdict of the claim dict: "PASS", "FAIL", "NOT MEASURED", or "" without that tier."""
    return verdict(claim.get("certified_passed")) if has_tier(claim) else ""


def error_bar(certified: float, previous: float, ratio: float) -> float:
    """The error bar of a certified margin: ``|certified − previous|·ratio``, with ``ratio = δ/(δ_prev − δ)``
    (`certified` and `previous` the margins at the certified point, Clarke residual δ, and at an earlier point
    of the path, δ_prev > δ). To first order the margin moves by ``κ·δ`` between the certified point and the
    exact critical point, and ``κ ≈ |certified − previous|/(δ_prev − δ)`` is its measured sensitivity."""
    return abs(certified - previous) * ratio


ERROR_BAR_ROOM = 10.0  # a certified margin passes when it is at least this many error bars: κ·δ <= margin/10


def certified_tier(paper: Claim, certified: Claim | None, previous: Claim | None, ratio: float | None) -> Claim:
    """`paper` with tier "certified" filled in from the same claim measured on the certified nets (`certified`)
    and on the earlier point of their path (`previous`); `ratio` is the largest ``δ/(δ_prev − δ)`` of the
    units it rests on (None: no error bar can be measured, δ_prev <= δ). Passes when `certified` passes and its
    margin is at least `ERROR_BAR_ROOM` times its `error_bar` (a claim without a margin: when `certified`
    passes): the residual's tolerance for the claim is ``δ <= margin/(10κ)``, set by the claim's own measured
    sensitivity κ and its distance to its threshold rather than by one constant. Identity claims are returned as
    they are (one tier)."""
    if paper.kind == "identity":
        return paper
    if certified is None:
        return replace(paper, certified_reason="the analysis of the certified nets does not make this claim")
    tier = replace(paper, certified_measured=certified.measured, certified_margin=certified.margin)
    if certified.passed is None:
        return replace(tier, certified_reason=certified.reason or "not measured on the certified nets")
    if certified.margin is None:
        return replace(tier, certified_passed=certified.passed)
    if previous is None or previous.margin is None or ratio is None:
        return replace(tier, certified_reason="no error bar: the path's earlier point gives no margin to compare")
    bar = error_bar(certified.margin, previous.margin, ratio)
    tier = replace(tier, error_bar=bar)
    if certified.passed and certified.margin < ERROR_BAR_ROOM * bar:
        why = f"margin {fmt_margin(certified.margin)} within {ERROR_BAR_ROOM:g} error bars ({fmt_margin(bar)} each)"
        return replace(tier, certified_passed=False, certified_reason=why)
    return replace(tier, certified_passed=certified.passed)


def fmt_margin(value, headroom=None) -> str:
    """A claim's margin as text: a signed percentage of its threshold ("+12%", "-3.1%"), with the claim's
    `headroom` where it has one ("+0.9% of +1%": the margin of the most it could be); "" when it has none."""
    if value is None or isinstance(value, str):
        return "" if value is None else value
    room = "" if headroom is None or isinstance(headroom, str) else f" of {100 * headroom:+.3g}%"
    return f"{100 * value:+.3g}%{room}"


def fmt_error_bar(value) -> str:
    """A certified margin's error bar as text: "±0.1%" (the same units as `fmt_margin`); "" when it has none."""
    return "" if value is None else f"±{100 * abs(value):.3g}%"


KINDS = ("empirical", "identity")
PREMISES = ("", "critical")


def margin(measured: float, bound: float, relation: str = ">=", rtol: float = 0.0, atol: float = 0.0) -> float:
    """The signed distance of `measured` to the threshold of ``measured <relation> bound``, relative to the
    threshold: ``(measured - bound)/|bound|`` for ">=", ``(bound - measured)/|bound|`` for "<=", and for "=="
    ``(allowed - |measured - bound|)/allowed`` with ``allowed = atol + rtol·|bound|`` (the share of the
    tolerance left). Positive: the claim holds with that much room; negative: it fails by that much. A zero
    bound (or a zero tolerance) is measured in absolute terms. NaN for a NaN measurement."""
    if relation == "==":
        allowed = atol + rtol * abs(bound)
        gap = allowed - abs(measured - bound)
        return gap / allowed if allowed > 0 else gap
    if relation not in ("<=", ">="):
        raise ValueError(f"relation must be one of '<=', '>=', '==', got {relation!r}")
    gap = measured - bound if relation == ">=" else bound - measured
    return gap / abs(bound) if bound != 0 and math.isfinite(bound) else gap


def claim(
    statement: str,
    reference: str,
    expected,
    measured,
    passed: bool,
    tolerance="",
    *,
    id: str = "",
    margin: float | None = None,
    headroom: float | None = None,
    kind: str = "empirical",
    premise: str = "",
) -> Claim:
    """Build a `Claim`, formatting `expected`, `measured` and `tolerance` for the report; `id` names it stably;
    `margin` (see `featurelab.claims.margin`), `headroom`, `kind` and `premise` as in `Claim`."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if premise not in PREMISES:
        raise ValueError(f"premise must be one of {PREMISES}, got {premise!r}")
    m = None if margin is None or not math.isfinite(float(margin)) else float(margin)
    room = None if headroom is None or not math.isfinite(float(headroom)) else float(headroom)
    return Claim(
        statement,
        reference,
        expected if isinstance(expected, str) else fmt(expected),
        fmt(measured),
        tolerance if isinstance(tolerance, str) else fmt(tolerance),
        bool(passed),
        id,
        margin=m,
        headroom=room,
        kind=kind,
        premise=premise,
    )


RELATIONS = ("<=", ">=", "==", "<", ">")


@dataclass(frozen=True)
class Threshold:
    """The threshold of a claim, ``measured <relation> bound`` ("==": within ``atol + rtol·|bound|``; "<=" and
    ">=" include their bound, "<" and ">" do not), with where its number comes from: `source` names the paper's
    number (authors, year, section or figure, arXiv id) or says it is ours and why. One comparison, `margin`,
    gives both the verdict (``margin >= 0``; ``> 0`` for a strict relation) and the claim's margin. Experiments
    name their thresholds as module-level constants; ``tests/test_thresholds.py`` pins them against the numbers
    the docs state.

    `ceiling`: the best value the measured quantity can take by construction, where it has one (1 for an R², a
    |cosine| or a fraction claimed >= t; −1 for a correlation claimed <= −t; 0 for a nonnegative quantity
    claimed <= t); None for none. It never changes the verdict: it gives the claim its `headroom`, the margin
    a measurement at the ceiling would have. It must lie on the passing side of the bound (else the claim
    could never pass), and an equality ("==") has none: its best margin is always its whole tolerance."""

    bound: float
    relation: str = ">="
    rtol: float = 0.0
    atol: float = 0.0
    source: str = ""
    ceiling: float | None = None

    def __post_init__(self):
        if self.relation not in RELATIONS:
            raise ValueError(f"relation must be one of {RELATIONS}, got {self.relation!r}")
        if self.ceiling is not None:
            _check_ceiling(self.ceiling, self.bound, self.relation)

    def at(self, bound: float) -> Threshold:
        """The same comparison and tolerance about another `bound` (a bound that depends on the data, such as
        a slope that should equal the rank)."""
        return replace(self, bound=float(bound))

    def margin(self, measured: float) -> float:
        """`margin` of `measured` to this threshold (a strict relation's as its non-strict one's); NaN for NaN."""
        relation = {"<": "<=", ">": ">="}.get(self.relation, self.relation)
        return margin(float(measured), self.bound, relation, self.rtol, self.atol)

    @property
    def headroom(self) -> float | None:
        """The margin of a measurement at `ceiling` (None without one): the most `margin` can be, e.g.
        (1 − 0.95)/0.95 for an R² >= 0.95 (ceiling 1), (−0.8 − (−1))/0.8 = 0.25 for a correlation <= −0.8
        (ceiling −1), 1 for a nonnegative quantity <= t > 0 (ceiling 0)."""
        return None if self.ceiling is None else self.margin(self.ceiling)

    def holds(self, measured: float) -> bool:
        """Whether `measured` meets this threshold: its margin is >= 0 (> 0 for "<" and ">"); False for NaN."""
        m = self.margin(measured)
        return bool(m > 0 if self.relation in ("<", ">") else m >= 0)

    def texts(self, measured: float) -> tuple[str, str]:
        """The report's "expected" and "measured" texts for `measured`, both printed with the `digits` that
        show their difference against this threshold's tolerance (``== 0.414214`` against ``0.414206`` at
        ``atol=1e-6``, where 4 digits would print 0.4142 twice)."""
        d = digits(measured, self.bound, self.atol + self.rtol * abs(float(self.bound)))
        return f"{self.relation} {fmt(float(self.bound), d)}", fmt(float(measured), d)

    @property
    def tolerance(self) -> str:
        """The report's "tolerance" text: the non-zero ``rtol`` and ``atol`` ("" for none)."""
        return ", ".join(f"{name}={fmt(v)}" for name, v in (("rtol", self.rtol), ("atol", self.atol)) if v)


def _check_ceiling(ceiling: float, bound: float, relation: str) -> None:
    """One line unless `ceiling` is a finite number on the passing side of ``<relation> bound``."""
    if relation == "==":
        raise FeaturelabError(
            f"ceiling={ceiling!r} is not allowed for the threshold '{relation} {bound:g}': only an inequality "
            "(<=, >=, <, >) has a ceiling"
        )
    c = float(ceiling)
    inside = {">=": c >= bound, ">": c > bound, "<=": c <= bound, "<": c < bound}[relation]
    if not (math.isfinite(c) and inside):
        raise FeaturelabError(
            f"ceiling={ceiling!r} is not allowed for the threshold '{relation} {bound:g}': give a finite ceiling "
            f"{relation} {bound:g} (the best value the quantity can take; on the other side the claim could never pass)"
        )


def threshold_claim(
    statement: str,
    reference: str,
    measured: float,
    bound: float | Threshold,
    relation: str = ">=",
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    ceiling: float | None = None,
    id: str = "",
    kind: str = "empirical",
    premise: str = "",
) -> Claim:
    """The `Claim` ``measured <relation> bound`` (within ``atol + rtol·|bound|`` for "=="; inequalities include
    their bound): verdict, margin and headroom computed here, from one comparison. `bound` is a number (with
    `relation`, `rtol`, `atol`, `ceiling`) or a `Threshold`."""
    th = bound if isinstance(bound, Threshold) else Threshold(float(bound), relation, rtol, atol, ceiling=ceiling)
    return all_of_claim(statement, reference, [(measured, th)], id=id, kind=kind, premise=premise)


def all_of_claim(
    statement: str,
    reference: str,
    comparisons,
    *,
    expected=None,
    measured=None,
    tolerance: str | None = None,
    id: str = "",
    kind: str = "empirical",
    premise: str = "",
) -> Claim:
    """The `Claim` that every ``(value, threshold)`` of `comparisons` holds (`Threshold`): its margin is the
    smallest of their margins and its verdict that every one holds (the smallest margin's sign, for thresholds
    that include their bound); NaN anywhere (or no
    comparison at all) fails, with no margin. Its headroom is the smallest `Threshold.headroom` of the
    comparisons that have a ceiling (the others can grow without end), None where none has: the largest margin
    the claim could have. `expected`, `measured` and `tolerance` are the report's text (default: the one
    comparison's own)."""
    pairs = [(float(v), th) for v, th in comparisons]
    margins = [th.margin(v) for v, th in pairs]
    worst = math.nan if not margins or any(math.isnan(m) for m in margins) else min(margins)
    rooms = [th.headroom for _, th in pairs if th.headroom is not None]
    passed = bool(pairs) and all(th.holds(v) for v, th in pairs)
    if len(pairs) == 1:
        texts = pairs[0][1].texts(pairs[0][0])
        expected = texts[0] if expected is None else expected
        measured = texts[1] if measured is None else measured
        tolerance = pairs[0][1].tolerance if tolerance is None else tolerance
    return claim(
        statement,
        reference,
        "" if expected is None else expected,
        measured,
        passed,
        tolerance or "",
        id=id,
        margin=worst,
        headroom=min(rooms) if rooms else None,
        kind=kind,
        premise=premise,
    )


def boolean_claim(
    statement: str,
    reference: str,
    expected,
    measured,
    passed: bool,
    *,
    id: str = "",
    kind: str = "empirical",
    premise: str = "",
) -> Claim:
    """The `Claim` of a structural yes/no check that has no numeric threshold (a count that must be met
    exactly, a construction that must exist): `passed` is the verdict, and its margin is None."""
    return claim(statement, reference, expected, measured, passed, id=id, kind=kind, premise=premise)


def claim_from_check(
    statement: str, reference: str, check: Check, *, id: str = "", kind: str = "empirical", premise: str = ""
) -> Claim:
    """The `Claim` that `check` (a measurement's `Check`) decides: expected ``<relation> bound``, the
    measured side, its tolerance, verdict and margin (`margin`; inequalities count their slack ``atol +
    rtol·|bound|`` as inside)."""
    tolerance = ", ".join(f"{name}={fmt(v)}" for name, v in (("rtol", check.rtol), ("atol", check.atol)) if v)
    bound, value = float(check.bound), float(check.measured)
    d = digits(value, bound, check.atol + check.rtol * abs(bound))
    return claim(
        statement,
        reference,
        f"{check.relation} {fmt(bound, d)}",
        fmt(value, d),
        check.passed,
        tolerance,
        id=id,
        margin=_check_margin(check),
        kind=kind,
        premise=premise,
    )


def _check_margin(check: Check) -> float:
    if check.relation == "==":
        return margin(float(check.measured), float(check.bound), "==", check.rtol, check.atol)
    allowed = check.atol + check.rtol * abs(float(check.bound))
    shifted = float(check.bound) + (allowed if check.relation == "<=" else -allowed)
    return margin(float(check.measured), shifted, check.relation)
