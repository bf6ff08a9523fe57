"""Datasets, deterministic from their seeds; rows are samples."""

from .bn_tasks import bn_rank_two_task, symmetry_gd, symmetry_summary, symmetry_task
from .circle import circle_dataset
from .constructions import Construction, bipartite, oned, onehot_identity
from .dataset import Dataset
from .digits import digits
from .mnist import mnist, read_idx
from .separable import separable
from .teachers import bottleneck_teacher

__all__ = [
    "Dataset",
    "digits",
    "mnist",
    "read_idx",
    # synthetic tasks of the papers
    "bottleneck_teacher",
    "bn_rank_two_task",
    "symmetry_task",
    "symmetry_gd",
    "symmetry_summary",
    "Construction",
    "bipartite",
    "oned",
    "onehot_identity",
    "circle_dataset",
    "separable",
]
