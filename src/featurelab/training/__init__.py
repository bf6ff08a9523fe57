"""Training: phases of Adam / GD / SGD / L-BFGS on C + model.penalty(lam), with resumable run records."""
from .checkpoint import load_model, save_model
from .objectives import OBJECTIVES, data_cost, error_rate
from .trainer import Phase, TrainConfig, TrainResult, evaluate, param_norm, train

__all__ = ["Phase", "TrainConfig", "TrainResult", "train", "evaluate", "param_norm", "data_cost",
           "error_rate", "OBJECTIVES", "save_model", "load_model"]
