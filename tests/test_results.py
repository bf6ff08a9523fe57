"""`Check` verdicts and tolerances, `to_dict`, and the claim a check decides."""

import math
import warnings
from typing import Any

import pytest
import torch

from featurelab.checks import renamed
from featurelab.claims import claim_from_check
from featurelab.errors import FeaturelabError
from featurelab.measurements import prop34_check, theorem31_bound
from featurelab.results import Check


@pytest.mark.parametrize(
    "measured, bound, relation, rtol, atol, passed",
    [
        (1.0, 2.0, "<=", 0.0, 0.0, True),
        (2.0 + 1e-9, 2.0, "<=", 0.0, 0.0, False),
        (2.0 + 1e-9, 2.0, "<=", 1e-8, 0.0, True),  # 1e-8·|2| allowed
        (2.0 + 1e-9, 2.0, "<=", 0.0, 1e-8, True),
        (1.0, 2.0, ">=", 0.0, 0.0, False),
        (2.0 - 1e-9, 2.0, ">=", 1e-8, 0.0, True),
        (3.0, 3.0 + 1e-13, "==", 0.0, 1e-12, True),
        (3.0, 3.1, "==", 0.01, 0.0, False),
        (math.nan, 2.0, "<=", 0.0, 0.0, False),
        (1.0, math.nan, "<=", 0.0, 0.0, False),
    ],
)
def test_check_holds(measured, bound, relation, rtol, atol, passed):
    assert Check.holds(measured, bound, relation, rtol, atol) is passed


def test_slack_sign_follows_relation():
    assert Check(passed=True, measured=1.0, bound=3.0).slack == 2.0
    assert Check(passed=True, measured=3.0, bound=1.0, relation=">=").slack == 2.0
    assert Check(passed=False, measured=3.0, bound=1.0, relation="==").slack == -2.0


def test_to_dict_is_json_plain_and_results_are_frozen():
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    G = torch.tensor([[1.0], [-1.0], [1.0]], dtype=torch.float64)
    t = theorem31_bound(X, G, 1.0, 3)
    d = t.to_dict()
    assert set(d) == {"c", "bounds"} and d["c"] == t.c and len(d["bounds"]) == 3
    with pytest.raises(AttributeError):
        t.c = 0.0  # type: ignore[misc]


def test_claim_from_check_carries_the_verdict():
    # a depth-2 net with L0 < 0 on three points: Prop 3.4's sum form holds
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    G = torch.tensor([[-1.0], [-1.0], [-2.0]], dtype=torch.float64)
    Ws = [torch.eye(2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)]
    check = prop34_check(Ws, X, G)
    c = claim_from_check("Prop 3.4 sum form", "Bantzis, Simon, Jacot, Prop 3.4", check, id="p34")
    assert c.passed is check.passed is True
    assert c.expected.startswith("<= ") and c.tolerance == "atol=1e-12" and c.id == "p34"
    assert check.to_dict()["measured"] == check.measured


def test_renamed_keyword_warns_and_maps():
    @renamed(tol="rtol")
    def f(x, *, rtol=1.0):
        return x * rtol

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(2, rtol=3) == 6
    deprecated: dict[str, Any] = {"tol": 5}  # the old name, which f's signature no longer names
    with pytest.warns(DeprecationWarning, match="use rtol="):
        assert f(2, **deprecated) == 10
    with pytest.raises(FeaturelabError, match="rtol= only"):
        f(2, **deprecated, rtol=2)
