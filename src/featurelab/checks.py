"""Argument checks shared by the public API: each failure is a one-line `FeaturelabError`.

Conventions: samples are rows, so a data matrix is ``N x d``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import numpy as np
import torch

from .errors import FeaturelabError

P = ParamSpec("P")
R = TypeVar("R")


def as_matrix(name: str, value, dtype=torch.float64) -> torch.Tensor:
    """Return `value` as a finite 2-D tensor of `dtype` (rows are samples), or raise naming `name`."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor):
        raise FeaturelabError(f"{name} must be a 2-D tensor or array (rows are samples), got {type(value).__name__}")
    if value.ndim != 2:
        raise FeaturelabError(f"{name} must be 2-D (rows are samples), got shape {tuple(value.shape)}")
    if value.numel() and not torch.isfinite(value).all():
        raise FeaturelabError(f"{name} contains NaN or inf; all entries must be finite")
    return value.to(dtype)


def nonempty(name: str, M: torch.Tensor) -> torch.Tensor:
    """Raise unless the matrix `M` has at least one row and one column."""
    if M.shape[0] == 0 or M.shape[1] == 0:
        raise FeaturelabError(f"{name} has shape {tuple(M.shape)}; it needs at least one row (sample) and one column")
    return M


def same_rows(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """Raise unless `a` and `b` have the same number of rows (samples)."""
    if a.shape[0] != b.shape[0]:
        raise FeaturelabError(
            f"{name_a} has {a.shape[0]} rows but {name_b} has {b.shape[0]}; both need one row per sample"
        )


def positive(name: str, value: float) -> float:
    """Raise unless `value` is a finite number > 0."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise FeaturelabError(f"{name}={value!r} is not allowed: it must be a finite number > 0")
    return float(value)


def non_negative(name: str, value: float) -> float:
    """Raise unless `value` is a finite number >= 0."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise FeaturelabError(f"{name}={value!r} is not allowed: it must be a finite number >= 0")
    return float(value)


def int_at_least(name: str, value: int, low: int) -> int:
    """Raise unless `value` is an integer >= `low`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise FeaturelabError(f"{name}={value!r} is not allowed: it must be an integer >= {low}")
    return value


def one_of(name: str, value, allowed) -> None:
    """Raise unless `value` is in `allowed`."""
    if value not in allowed:
        raise FeaturelabError(f"{name}={value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


def renamed(**old_to_new: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator keeping old keyword names working for one release: ``@renamed(tol="rtol")`` maps
    ``f(tol=x)`` to ``f(rtol=x)`` with a `DeprecationWarning` (both at once is an error)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise FeaturelabError(f"{fn.__name__}: give {new}= only ({old}= is its deprecated name)")
                    warnings.warn(
                        f"{fn.__name__}({old}=...) is deprecated; use {new}=", DeprecationWarning, stacklevel=2
                    )
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return inner

    return wrap
