"""Training: phases of Adam / GD / SGD / L-BFGS on C + model.penalty(lam), with resumable run records."""

from .checkpoint import load_model, save_model
from .ensemble import ensemble_key, train_ensemble
from .objectives import OBJECTIVES, data_cost, error_rate
from .plateaus import Plateau, detect_plateaus, plateau_start
from .schedule import OptimizerConfig
from .trainer import Phase, TrainConfig, TrainResult, evaluate, param_norm, train

__all__ = [
    "Phase",
    "TrainConfig",
    "OptimizerConfig",
    "TrainResult",
    "train",
    "train_ensemble",
    "ensemble_key",
    "evaluate",
    "param_norm",
    "data_cost",
    "error_rate",
    "OBJECTIVES",
    "save_model",
    "load_model",
    # saddle-to-saddle plateaus of a loss curve
    "Plateau",
    "detect_plateaus",
    "plateau_start",
]
