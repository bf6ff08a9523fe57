"""Models: deep fully-connected nets and Leaky ResNets (rows are samples)."""
from .leaky_resnet import (LeakyResNet, adaptive_update, equidistant_steps, irregular_steps,
                           project_steps)
from .mlp import MLP, Forward, leaky_relu

__all__ = ["MLP", "Forward", "leaky_relu", "LeakyResNet", "equidistant_steps", "irregular_steps",
           "adaptive_update", "project_steps"]
