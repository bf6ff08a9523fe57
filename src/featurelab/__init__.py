"""featurelab: the science of feature learning in deep networks.

Train the networks of five theory papers exactly as they define them, compute every quantity they
define, reproduce their figures and check their claims. Samples are rows (``N x d``) throughout the
public API; the papers write columns.

The top level holds the core names; everything else lives in a namespace by concept:
`featurelab.models`, `featurelab.data`, `featurelab.training`, `featurelab.measurements`,
`featurelab.experiments` and `featurelab.runs` (docs/api.md). `analyze` measures any PyTorch model
(docs/analyze.md); `from_torch`/`to_torch` convert Linear/activation chains to and from `MLP`.
"""

import importlib as _importlib
import warnings as _warnings

from . import data, experiments, measurements, models, runs, training
from ._version import __version__
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

_NAMESPACES = ("measurements", "models", "data", "training")


def __getattr__(name: str):
    """Names that 0.1.0 exported at the top level still resolve, with a DeprecationWarning naming their
    namespace; they will be removed in 0.3.0 (CHANGELOG.md)."""
    for ns in _NAMESPACES:
        module = _importlib.import_module(f".{ns}", __name__)
        if name in module.__all__:
            _warnings.warn(
                f"featurelab.{name} is deprecated; use featurelab.{ns}.{name}", DeprecationWarning, stacklevel=2
            )
            return getattr(module, name)
    if name == "run_bench":
        _warnings.warn(
            "featurelab.run_bench is deprecated; use featurelab.bench.run_bench", DeprecationWarning, stacklevel=2
        )
        return _importlib.import_module(".bench", __name__).run_bench
    raise AttributeError(f"module 'featurelab' has no attribute {name!r}")
