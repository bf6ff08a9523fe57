"""The experiment registry: every experiment, by name, with its presets.

To add one, write a module that defines ``EXPERIMENT = Experiment(...)`` (see `base.py` and
`leaky_bottleneck.py`) and list it below.
"""
from __future__ import annotations

from ..errors import FeaturelabError
from . import leaky_bottleneck
from .base import Analysis, AnalysisContext, Experiment, UnitContext

EXPERIMENTS: list[Experiment] = [
    leaky_bottleneck.EXPERIMENT,
]
REGISTRY: dict[str, Experiment] = {e.name: e for e in EXPERIMENTS}


def get_experiment(name: str) -> Experiment:
    """The registered experiment `name`, or a one-line error listing the names."""
    if name not in REGISTRY:
        raise FeaturelabError(f"experiment {name!r} does not exist; choose one of: {', '.join(REGISTRY)}")
    return REGISTRY[name]


__all__ = ["Experiment", "Analysis", "AnalysisContext", "UnitContext", "EXPERIMENTS", "REGISTRY", "get_experiment"]
