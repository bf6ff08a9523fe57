"""Datasets, deterministic from their seeds; rows are samples."""
from .dataset import Dataset
from .digits import digits
from .mnist import mnist, read_idx
from .teachers import bottleneck_teacher

__all__ = ["Dataset", "bottleneck_teacher", "digits", "mnist", "read_idx"]
