"""The experiment registry: every experiment, by name, with its presets.

It is derived from the modules of this package: a module that states its listing, ``CATALOG = (Entry(...),)``
(see `featurelab.catalog`), is imported and the experiments it names (its ``Experiment`` objects) are
registered, in the catalog's order. Adding an experiment is one file: copy ``template.py``, which has no
``CATALOG`` and so stays out of the registry, and give it one. A block whose names or presets differ from the
module's experiments is an error at import, naming the module.
"""

from __future__ import annotations

import importlib

from ..catalog import CATALOG, experiment_modules
from ..errors import FeaturelabError
from .base import Analysis, AnalysisContext, Experiment, TrainingUnit, UnitContext


def module_experiments(module_name: str) -> dict[str, Experiment]:
    """The `Experiment` objects defined at the top level of ``featurelab.experiments.<module_name>``, by name."""
    module = importlib.import_module(f"{__name__}.{module_name}")
    found = {e.name: e for e in vars(module).values() if isinstance(e, Experiment)}
    listed = {e.name: e.presets for e in module.CATALOG}
    defined = {name: tuple(e.presets) for name, e in found.items()}
    if listed != defined:
        raise ImportError(
            f"featurelab.experiments.{module_name}: CATALOG lists {listed}, but the module defines {defined} "
            "(names and presets, in order, must agree)"
        )
    return found


def _registry() -> dict[str, Experiment]:
    found: dict[str, Experiment] = {}
    for module_name in experiment_modules():
        found.update(module_experiments(module_name))
    return {e.name: found[e.name] for e in CATALOG}


REGISTRY: dict[str, Experiment] = _registry()
EXPERIMENTS: list[Experiment] = list(REGISTRY.values())


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
