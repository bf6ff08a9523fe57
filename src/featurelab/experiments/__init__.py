"""The experiment registry: every experiment, by name, with its presets.

To add one, write a module that defines ``EXPERIMENT = Experiment(...)`` (see `base.py` and
`leaky_bottleneck.py`) and list it below.
"""
from __future__ import annotations

from ..errors import FeaturelabError
from . import leaky_bottleneck

# --- Part 1 experiments (issue 3) ---
from . import leaky_discretization, leaky_hamiltonian
# --- Part 2 experiments (issue 4) ---
from . import bn_rank_depth, symmetry_learning
# --- Part 3 experiments (issue 5) ---
from . import cp_rank, forces, width_plateau
# --- Part 4 experiments (issue 6) ---
from . import escape_circle, saddle_digits
# --- Part 5 experiments (issue 7) ---
from . import alignment, invariance_drift, relu_noninvariance
from .base import Analysis, AnalysisContext, Experiment, TrainingUnit, UnitContext

EXPERIMENTS: list[Experiment] = [
    leaky_bottleneck.EXPERIMENT,
    # each part appends its experiments below its own marker
    # --- Part 1 (issue 3) ---
    leaky_hamiltonian.EXPERIMENT,
    leaky_discretization.EXPERIMENT,
    # --- Part 2 (issue 4) ---
    bn_rank_depth.EXPERIMENT,
    symmetry_learning.EXPERIMENT,
    # --- Part 3 (issue 5) ---
    forces.EXPERIMENT,
    width_plateau.EXPERIMENT,
    cp_rank.EXPERIMENT,
    # --- Part 4 (issue 6) ---
    escape_circle.EXPERIMENT,
    saddle_digits.EXPERIMENT,
    saddle_digits.MNIST_EXPERIMENT,
    # --- Part 5 (issue 7) ---
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


__all__ = ["Experiment", "TrainingUnit", "Analysis", "AnalysisContext", "UnitContext", "EXPERIMENTS", "REGISTRY", "get_experiment"]
