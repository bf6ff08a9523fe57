"""Validated configs: presets, ``--set key=value`` overrides and one-line errors.

Every config (each experiment's, and the trainer's `Phase` and `TrainConfig`) is a `Validated` pydantic
model with ``extra="forbid"``, strict booleans and integers (``true`` is no width) and no NaN or inf
floats, so a wrong key, type or range becomes a one-line `FeaturelabError` naming the field, the value
and what is allowed, from the CLI and the Python API alike. Every integer field whose name ends in
``seed`` (or list of them, ``seeds``) must lie in [0, 2**32).
"""

from __future__ import annotations

import contextvars
import difflib
from typing import TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from .errors import FeaturelabError

SEED_LIMIT = 2**32  # numpy's and most generators' seed range
B = TypeVar("B", bound=BaseModel)
_VALIDATING = contextvars.ContextVar("featurelab_validating", default=False)


def _checked(cls: type[BaseModel], where: str, build):
    """Run `build()`; its `ValidationError` becomes one line about `where`. A model validated inside
    another one (a `Phase` in a `TrainConfig`) lets the outer one report, with the full field path."""
    if _VALIDATING.get():
        return build()
    token = _VALIDATING.set(True)
    try:
        return build()
    except ValidationError as exc:
        raise one_line(exc, cls, where) from None
    finally:
        _VALIDATING.reset(token)


class Validated(BaseModel):
    """A pydantic model whose every validation error (construction, `model_validate`, assignment) is a
    one-line `FeaturelabError` naming the field, the value and what is allowed; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_as_numbers(cls, values):
        """``width: true`` is a mistake, not width 1 (pydantic would coerce it)."""
        if isinstance(values, dict):
            for name, value in values.items():
                field = cls.model_fields.get(name)
                if field is None or "bool" in str(field.annotation):
                    continue
                if any(isinstance(v, bool) for v in (value if isinstance(value, list) else [value])):
                    raise ValueError(f"{name}={value!r} is not allowed: true/false is not a value of this field")
        return values

    @model_validator(mode="after")
    def _seeds_in_range(self):
        for name in type(self).model_fields:
            if name.endswith("seed") or name.endswith("seeds"):
                value = getattr(self, name)
                for s in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(s, int) and not 0 <= s < SEED_LIMIT:
                        raise ValueError(f"{name}={value!r} is not allowed: seeds must lie in [0, 2**32)")
        return self

    def __init__(self, **values):
        _checked(type(self), type(self).__name__, lambda: super(Validated, self).__init__(**values))

    @classmethod
    def model_validate(cls, obj, **kwargs):
        return _checked(cls, cls.__name__, lambda: super(Validated, cls).model_validate(obj, **kwargs))

    def __setattr__(self, name, value):
        _checked(type(self), type(self).__name__, lambda: super(Validated, self).__setattr__(name, value))


class ExperimentConfig(Validated):
    """Base of every experiment config: unknown keys are errors; `seed` is the master seed.

    A sub-config field (a pydantic model, e.g. a `featurelab.training.OptimizerConfig`) given as a partial
    dict (a preset, ``--set optimizer.adam_lr=1e-3``) updates the field's default rather than replacing it.
    """

    model_config = ConfigDict(validate_assignment=True)  # merged with Validated's extra="forbid"
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _update_sub_configs(cls, values):
        if not isinstance(values, dict):
            return values
        out = dict(values)
        for name, field in cls.model_fields.items():
            if isinstance(out.get(name), dict) and isinstance(field.default, BaseModel):
                out[name] = merge(field.default.model_dump(), out[name])
        return out


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


def _allowed(cls: type[BaseModel], loc: tuple) -> list[str]:
    """The keys allowed at `loc` (the field path of an unknown key): the fields of the model that holds it."""
    node: object = cls
    for part in loc[:-1]:
        if isinstance(part, int):  # an entry of a list field: its item type
            args = get_args(node)
            node = args[0] if len(args) == 1 else None
            continue
        field = node.model_fields.get(part) if isinstance(node, type) and issubclass(node, BaseModel) else None
        node = getattr(field, "annotation", None)
    return list(node.model_fields) if isinstance(node, type) and issubclass(node, BaseModel) else []


def did_you_mean(key: str, allowed: list[str], prefix: str = "") -> str:
    """ " (did you mean 'lam'?)" for an unknown `key` close to an allowed one: the closest by
    `difflib.get_close_matches` (cutoff 0.6, case ignored), shown after `prefix` (``"optimizer."``); "" when
    none is close."""
    lowered = {k.lower(): k for k in allowed}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {prefix + lowered[close[0]]!r}?)" if close else ""


def one_line(exc: ValidationError, cls: type[BaseModel], where: str) -> FeaturelabError:
    """The first error of a pydantic `ValidationError` as a one-line `FeaturelabError` about `where`."""
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc) or "config"
    if err["type"] == "extra_forbidden":
        allowed = _allowed(cls, loc)
        close = did_you_mean(str(loc[-1]), allowed, key.rpartition(".")[0] + "." if "." in key else "")
        return FeaturelabError(f"unknown key {key!r} for {where}{close}; allowed keys: {', '.join(allowed)}")
    msg = err["msg"].replace("Value error, ", "")
    if not loc:
        return FeaturelabError(f"invalid config for {where}: {msg}")
    value = err.get("input")
    shown = f"={value!r}" if not isinstance(value, dict) else ""
    return FeaturelabError(f"{key}{shown} is not allowed for {where}: {msg}")


REPEATS = ("steps", "restarts", "trials", "epochs", "iters")  # fields that repeat the work: counts, not sizes
NOT_SIZES = ("seed", "every", "patience", "log")  # integer fields that size nothing
FLOP_LIMIT = 1e17  # about a month of float64 work on one CPU core: a bigger config is a typing mistake


def sizes(cfg: BaseModel, prefix: str = "") -> tuple[dict[str, int], dict[str, int]]:
    """The config's sizes (integer fields and the entries of integer lists: data, teachers, widths, depths,
    grid points) and its repeats (`REPEATS`, and the lengths of lists of sizes), by dotted field name."""
    size, repeat = {}, {}
    for name, value in cfg:
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            s, r = sizes(value, f"{key}.")
            size, repeat = size | s, repeat | r
        elif any(w in name for w in NOT_SIZES) or isinstance(value, bool):
            continue
        elif isinstance(value, int):
            (repeat if any(w in name for w in REPEATS) else size)[key] = value
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
            size[key], repeat[f"len({key})"] = max(value), len(value)
    return size, repeat


def check_sizes(cfg: BaseModel, where: str) -> None:
    """Memory and time of the largest work `cfg` can set, from its numbers alone (no model is built): a
    matrix of its two largest sizes in float64 must fit the machine's memory, and so must one such matrix per
    layer of each depth field (a depth times the two largest other sizes); that matrix times its
    third size, times its largest repeat and the count of its list entries, must stay under `FLOP_LIMIT`
    flops; one line naming the fields and the limit otherwise."""
    from .runtime import check_memory

    size, repeat = sizes(cfg)
    big = sorted(size, key=lambda k: size[k], reverse=True)[:3]
    if len(big) >= 2:
        check_memory(
            f"{where}: a {size[big[0]]} x {size[big[1]]} float64 matrix ({big[0]}, {big[1]})",
            8.0 * size[big[0]] * size[big[1]],
        )
    for depth in (k for k in size if "depth" in k.rpartition(".")[2]):
        a, b = sorted((k for k in size if k != depth), key=lambda k: size[k], reverse=True)[:2] or ("", "")
        check_memory(
            f"{where}: {depth}={size[depth]} layers of {size.get(a, 1)} x {size.get(b, 1)} float64 ({a}, {b})",
            8.0 * size[depth] * size.get(a, 1) * size.get(b, 1),
        )
    lengths = [k for k in repeat if k.startswith("len(")]
    named = big + [max((k for k in repeat if k not in lengths), key=lambda k: repeat[k], default="")] + lengths
    flops = 1.0
    for k in filter(None, named):
        flops *= size.get(k, repeat.get(k, 1))
    if flops > FLOP_LIMIT:
        raise FeaturelabError(
            f"{where}: {' x '.join(f'{k}={size.get(k, repeat.get(k))}' for k in filter(None, named))} is about "
            f"{flops:.3g} flops, over the limit of {FLOP_LIMIT:.3g}; choose smaller sizes"
        )


def validate(cls: type[B], values: dict, where: str) -> B:
    """Build `cls` from `values` and check its sizes (`check_sizes`); a failure becomes a one-line
    `FeaturelabError` about `where` (e.g. the experiment's name)."""
    cfg = _checked(cls, where, lambda: cls.model_validate(values))
    check_sizes(cfg, where)
    return cfg
