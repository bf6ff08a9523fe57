"""featurelab: the science of feature learning in deep networks.

Train the networks of five theory papers exactly as they define them, compute every quantity they
define, reproduce their figures and check their claims. Samples are rows (``N x d``) throughout the
public API; the papers write columns.

The top level holds the core names; everything else lives in a namespace by concept:
`featurelab.models`, `featurelab.data`, `featurelab.training`, `featurelab.measurements`,
`featurelab.experiments` and `featurelab.runs` (docs/api.md). `analyze` measures any PyTorch model
(docs/analyze.md); `from_torch`/`to_torch` convert Linear/activation chains to and from `MLP`.

Every name is imported on first use (PEP 562), so ``import featurelab`` and the command line's help
do not pay for torch, scikit-learn or the experiments until they are needed.
"""

from __future__ import annotations

import importlib as _importlib
import warnings as _warnings
from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:  # what the lazy table below resolves to, for type checkers and editors
    from . import data, experiments, measurements, models, runs, training
    from .analysis import analyze
    from .data import Dataset, digits
    from .errors import FeaturelabError
    from .models import MLP, HomogeneousNet, LeakyResNet, from_torch, to_torch
    from .runs import RunRecord, render_report, run_experiment
    from .training import Phase, TrainConfig, load_model, save_model, train, train_ensemble

__all__ = [
    "__version__",
    "data",
    "experiments",
    "measurements",
    "models",
    "runs",
    "training",
    "MLP",
    "LeakyResNet",
    "HomogeneousNet",
    "Dataset",
    "digits",
    "Phase",
    "TrainConfig",
    "train",
    "train_ensemble",
    "save_model",
    "load_model",
    "run_experiment",
    "render_report",
    "RunRecord",
    "FeaturelabError",
    "analyze",
    "from_torch",
    "to_torch",
]

_SUBPACKAGES = ("data", "experiments", "measurements", "models", "runs", "training")

# top-level name -> the module that defines it
_LAZY = {
    "analyze": ".analysis",
    "Dataset": ".data",
    "digits": ".data",
    "FeaturelabError": ".errors",
    "MLP": ".models",
    "HomogeneousNet": ".models",
    "LeakyResNet": ".models",
    "from_torch": ".models",
    "to_torch": ".models",
    "RunRecord": ".runs",
    "render_report": ".runs",
    "run_experiment": ".runs",
    "Phase": ".training",
    "TrainConfig": ".training",
    "load_model": ".training",
    "save_model": ".training",
    "train": ".training",
    "train_ensemble": ".training",
}

# names that 0.1.0 exported at the top level: they resolve from these namespaces with a DeprecationWarning
_DEPRECATED_FROM = ("measurements", "models", "data", "training")


def __getattr__(name: str):
    """Import a top-level name on first use. Names that 0.1.0 exported at the top level still resolve,
    with a DeprecationWarning naming their namespace; they are removed in 0.3.0 (CHANGELOG.md)."""
    if name in _SUBPACKAGES:
        value = _importlib.import_module(f".{name}", __name__)
    elif name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
    elif name == "run_bench":
        _warnings.warn(
            "featurelab.run_bench is deprecated; use featurelab.bench.run_bench", DeprecationWarning, stacklevel=2
        )
        return _importlib.import_module(".bench", __name__).run_bench
    else:
        for ns in _DEPRECATED_FROM:
            module = _importlib.import_module(f".{ns}", __name__)
            if name in module.__all__:
                _warnings.warn(
                    f"featurelab.{name} is deprecated; use featurelab.{ns}.{name}", DeprecationWarning, stacklevel=2
                )
                return getattr(module, name)
        raise AttributeError(f"module 'featurelab' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
