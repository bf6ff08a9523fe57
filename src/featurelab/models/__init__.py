"""Models: deep fully-connected nets, Leaky ResNets and homogeneous conv/residual nets (rows are samples)."""

from .conv import Conv
from .convert import as_mlp, from_torch, to_torch
from .forward import Forward
from .leaky_resnet import LeakyResNet, adaptive_update, equidistant_steps, irregular_steps, project_steps
from .mlp import MLP, leaky_relu, mlp_with_weights
from .residual import Dense, Flatten, HomogeneousNet, ResBlock, as_homogeneous
from .weights import weight_list

__all__ = [
    # fully-connected nets (Parts 2-5)
    "MLP",
    "Forward",
    "leaky_relu",
    "mlp_with_weights",
    # plain PyTorch chains <-> MLP
    "from_torch",
    "to_torch",
    "as_mlp",
    "weight_list",
    # Leaky ResNets and their layer steps (Part 1)
    "LeakyResNet",
    "equidistant_steps",
    "irregular_steps",
    "adaptive_update",
    "project_steps",
    # homogeneous conv and residual nets (Part 5)
    "HomogeneousNet",
    "Conv",
    "Dense",
    "Flatten",
    "ResBlock",
    "as_homogeneous",
]
