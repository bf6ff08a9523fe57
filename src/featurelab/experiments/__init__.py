"""The experiment registry: every experiment, by name, with its presets.

To add one, write a module that defines ``EXPERIMENT = Experiment(...)`` (see `base.py` and
`leaky_bottleneck.py`) and list it below.
"""

from __future__ import annotations

from ..errors import FeaturelabError
from . import (
    alignment,
    bn_rank_depth,
    cp_rank,
    escape_circle,
    forces,
    invariance_drift,
    leaky_bottleneck,
    leaky_discretization,
    leaky_hamiltonian,
    r1_properties,
    relu_noninvariance,
    saddle_digits,
    symmetry_learning,
    width_plateau,
)
from .base import Analysis, AnalysisContext, Experiment, TrainingUnit, UnitContext

EXPERIMENTS: list[Experiment] = [
    # Leaky ResNets (Jacot & Kaiser, arXiv 2405.17573)
    leaky_bottleneck.EXPERIMENT,
    leaky_hamiltonian.EXPERIMENT,
    leaky_discretization.EXPERIMENT,
    # bottleneck rank (Jacot, arXiv 2305.19008)
    bn_rank_depth.EXPERIMENT,
    r1_properties.EXPERIMENT,
    symmetry_learning.EXPERIMENT,
    # attraction/repulsion and sparsity (Jacot, Golikov, Hongler, Gabriel, arXiv 2205.15809)
    forces.EXPERIMENT,
    width_plateau.EXPERIMENT,
    cp_rank.EXPERIMENT,
    # saddle-to-saddle (Bantzis, Simon, Jacot)
    escape_circle.EXPERIMENT,
    saddle_digits.EXPERIMENT,
    saddle_digits.MNIST_EXPERIMENT,
    # training invariances (Le & Jegelka, arXiv 2201.11968)
    invariance_drift.EXPERIMENT,
    alignment.EXPERIMENT,
    relu_noninvariance.EXPERIMENT,
]
REGISTRY: dict[str, Experiment] = {e.name: e for e in EXPERIMENTS}


def get_experiment(name: str) -> Experiment:
    """The registered experiment `name`, or a one-line error listing the names."""
    if name not in REGISTRY:
        raise FeaturelabError(f"experiment {name!r} does not exist; choose one of: {', '.join(REGISTRY)}")
    return REGISTRY[name]


__all__ = [
    "Experiment",
    "TrainingUnit",
    "Analysis",
    "AnalysisContext",
    "UnitContext",
    "EXPERIMENTS",
    "REGISTRY",
    "get_experiment",
]
