"""Measurements of the quantities the papers define, in float64 (rows are samples)."""
from .ranks import effective_rank, nuclear_rank, numerical_rank, singular_values, stable_rank

__all__ = ["singular_values", "stable_rank", "nuclear_rank", "effective_rank", "numerical_rank"]
