"""Validated configs: presets, ``--set key=value`` overrides and one-line errors.

Every experiment's config is a pydantic model with ``extra="forbid"``, so a wrong key, type or range
becomes a `FeaturelabError` naming the field, the value and what is allowed.
"""
from __future__ import annotations

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import FeaturelabError


class ExperimentConfig(BaseModel):
    """Base of every experiment config: unknown keys are errors; `seed` is the master seed."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    seed: int = 0


def parse_overrides(pairs: list[str]) -> dict:
    """``["lam=0.01", "widths=[2,4]", "train.lr=1e-3"]`` -> nested dict; values are parsed as YAML."""
    out: dict = {}
    for pair in pairs:
        if "=" not in pair:
            raise FeaturelabError(f"--set {pair!r} is not of the form key=value")
        key, raw = pair.split("=", 1)
        key = key.strip()
        if not key:
            raise FeaturelabError(f"--set {pair!r} has an empty key")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def merge(base: dict, extra: dict) -> dict:
    """Recursive dict merge; values of `extra` win."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _allowed(cls: type[BaseModel], loc: tuple) -> str:
    node = cls
    for part in loc[:-1]:
        field = node.model_fields.get(part) if isinstance(part, str) else None
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return ""
        node = ann
    return ", ".join(node.model_fields)


def validate(cls: type[BaseModel], values: dict, where: str):
    """Build `cls` from `values`; a validation failure becomes a one-line `FeaturelabError`."""
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "config"
        if err["type"] == "extra_forbidden":
            raise FeaturelabError(f"unknown key {key!r} for {where}; allowed keys: {_allowed(cls, loc)}") from None
        msg = err["msg"].replace("Value error, ", "")
        if not loc:
            raise FeaturelabError(f"invalid config for {where}: {msg}") from None
        value = err.get("input")
        shown = f"={value!r}" if not isinstance(value, dict) else ""
        raise FeaturelabError(f"{key}{shown} is not allowed for {where}: {msg}") from None
