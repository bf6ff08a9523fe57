"""Batched ensembles: train M same-shape runs as one computation, each with `train`'s semantics.

Members may differ in anything that is a tensor (initial weights, so seed and init scale; buffers such as the
Leaky-ResNet steps ρ; the data, if same-shaped) and in λ, learning rates, ``lr_min``, the mini-batch seed, and
the float attributes the model class declares in ``member_floats`` (the Leaky-ResNet effective depth L̃; an
undeclared float that differs is an error naming it). Everything else (shapes, the phase list, optimizers,
schedules, logging) must be equal; `ensemble_key` says when two runs can share an ensemble. The loop is the
training engine's (`featurelab.training.engine`), the same one `train` runs: `MLP`, `LeakyResNet` and
`HomogeneousNet` members train with batched matmuls (grouped convolutions) on stacked ``M x out x in`` weights,
other models are vmapped. In float64 a member agrees with its one-by-one run to rounding (the batched matmuls
sum in another order), see docs/scale.md. L-BFGS (a line search per member) is not batched: at an L-BFGS phase
each member goes on alone, in memory, through the remaining phases (a float64 polish after batched Adam phases,
say); `ensemble_key` returns None for runs that start with one, since nothing could be batched.

Every member gets `train`'s run record in its own folder (``history.csv``, ``model.safetensors``
and a ``checkpoint.safetensors`` in `train`'s format, optimizer state included), so a member can be
resumed one-by-one by `train(..., resume=True)` (to rounding), and the members together by
``train_ensemble(..., resume=True)`` (bit-identical to the uninterrupted run).
docs/theory/conventions.md (training conventions).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..data.dataset import Dataset
from ..errors import FeaturelabError
from .engine import run
from .phases import TrainConfig, TrainResult
from .stack import member_floats
from .trainer import check_training_inputs

PER_MEMBER_PHASE_FIELDS = ("lr", "lr_min")


def _static_attrs(model: nn.Module) -> tuple:
    """The plain attributes of `model` and its submodules that must be equal across an ensemble: all but tensors,
    modules and the floats its class declares in ``member_floats``."""
    declared = set(getattr(type(model), "member_floats", ()))
    items = []
    for prefix, mod in model.named_modules():
        for k, v in sorted(vars(mod).items()):
            if k.startswith("_") or k == "training" or isinstance(v, (torch.Tensor, nn.Module)):
                continue
            if not prefix and k in declared:
                continue
            items.append((prefix, k, repr(v)))
    return tuple(items)


def _shapes(tensors) -> tuple:
    return tuple((k, tuple(v.shape), str(v.dtype), bool(getattr(v, "requires_grad", False))) for k, v in tensors)


def ensemble_key(model: nn.Module, data: Dataset, config: TrainConfig) -> tuple | None:
    """A hashable key; runs with equal keys can be trained as one ensemble. None: nothing to batch (the
    first phase is L-BFGS). Differences allowed inside a key: tensor values, the float attributes the model
    class declares in ``member_floats``, ``lam``, ``seed`` and each phase's ``lr``/``lr_min``."""
    config = TrainConfig.model_validate(config)
    if config.phases and config.phases[0].optimizer == "lbfgs":
        return None
    phases = tuple(
        tuple(sorted((k, repr(v)) for k, v in p.model_dump().items() if k not in PER_MEMBER_PHASE_FIELDS))
        for p in config.phases
    )
    cfg = tuple(sorted((k, repr(v)) for k, v in config.model_dump().items() if k not in ("lam", "seed", "phases")))
    data_shapes = tuple(
        (k, tuple(v.shape), str(v.dtype))
        for k, v in (
            ("X_train", data.X_train),
            ("Y_train", data.Y_train),
            ("X_test", data.X_test),
            ("Y_test", data.Y_test),
        )
    )
    return (
        type(model).__qualname__,
        _shapes(model.named_parameters()),
        _shapes(model.named_buffers()),
        _static_attrs(model),
        data_shapes,
        data.n_classes,
        cfg,
        phases,
    )


def _as_list(value, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise FeaturelabError(f"{name} has {len(value)} entries; give one per model ({n}) or a single one")
        return list(value)
    return [value] * n


def train_ensemble(
    models: Sequence[nn.Module],
    data: Dataset | list[Dataset],
    configs: TrainConfig | list[TrainConfig],
    *,
    device: str = "cpu",
    run_dirs: Sequence[str | Path | None] | None = None,
    resume: bool = False,
    callbacks=None,
    progress: bool | None = None,
) -> list[TrainResult | FeaturelabError]:
    """Train ``M = len(models)`` same-shape models as one batched computation; returns one entry per
    member: its `TrainResult` (as `train` would return it), or the `FeaturelabError` that `train`
    would have raised (a member whose loss diverged; the others go on).

    models: modules of equal type and parameter shapes, trained in place (rows are samples, as in `train`).
    data: one `Dataset` for all, or one per member (equal shapes).
    configs: one `TrainConfig` or one per member, equal up to ``lam``, ``seed`` and each phase's
        ``lr``/``lr_min`` (checked with `ensemble_key`).
    run_dirs: per member, a folder for `train`'s run record, or None.
    callbacks: per member, a sequence of `train`-style callbacks; only ``on_log(step, model, row)`` is
        supported (an ``on_step`` hook would need a per-step host loop, so it is an error).
    resume: continue the members' checkpoints in `run_dirs` (written by this ensemble, all at one step) as
        one ensemble again: the batched arithmetic of the uninterrupted run, so every tensor it saves is
        bit-identical to that run's (a member resumed alone by `train(..., resume=True)` sums its batched
        matmuls in another order, so it agrees only to rounding).
    docs/theory/conventions.md; docs/scale.md.
    """
    M = len(models)
    if M == 0:
        raise FeaturelabError("models is empty; give at least one model")
    cfgs = [TrainConfig.model_validate(c) for c in _as_list(configs, M, "configs")]
    checked: dict[int, Dataset] = {}  # each dataset checked once, against the first member given it
    datas = []
    for m, d, c in zip(models, _as_list(data, M, "data"), cfgs):
        if id(d) not in checked or not isinstance(m, nn.Module):
            checked[id(d)] = check_training_inputs(m, d, c.objective)
        datas.append(checked[id(d)])
    dirs = [Path(d) if d is not None else None for d in _as_list(run_dirs, M, "run_dirs")]
    cbs = [tuple(c) for c in (callbacks if callbacks is not None else [()] * M)]
    if len(cbs) != M:
        raise FeaturelabError(f"callbacks has {len(cbs)} entries; give one sequence per model ({M})")
    if any(hasattr(cb, "on_step") for c in cbs for cb in c):
        raise FeaturelabError("callbacks with on_step cannot run in an ensemble; use train() per model")
    member_floats(models)  # an undeclared float that differs is an error naming it
    keys = [ensemble_key(m, d, c) for m, d, c in zip(models, datas, cfgs)]
    if keys[0] is None:
        raise FeaturelabError("configs start with an lbfgs phase, which cannot be batched; use train() per model")
    if any(k != keys[0] for k in keys):
        bad = next(i for i, k in enumerate(keys) if k != keys[0])
        raise FeaturelabError(
            f"models[{bad}] cannot join the ensemble of models[0]: shapes, attributes, data "
            "shapes or training phases differ (only values, lam, seed, lr and lr_min may)"
        )
    return run(models, datas, cfgs, device=device, dirs=dirs, resume=resume, callbacks=cbs, progress=progress)
