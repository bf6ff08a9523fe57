"""Training: phases of Adam / GD / SGD / L-BFGS on C + model.penalty(lam), with resumable run records."""

from .checkpoint import load_model, save_model
from .critical import Certificate, polish, stationarity
from .engine import evaluate, param_norm
from .ensemble import ensemble_key, train_ensemble
from .objectives import OBJECTIVES, data_cost, error_rate
from .phases import Phase, TrainConfig, TrainResult
from .plateaus import Plateau, detect_plateaus, plateau_start
from .schedule import OptimizerConfig
from .trainer import train

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
    # critical points of the regularised loss: float64 certificate and second-order polish
    "Certificate",
    "stationarity",
    "polish",
]
