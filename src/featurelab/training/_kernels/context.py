"""What the kernels share: whether torch.func or a torch function mode watches, and the stand-in context of
an ``autograd.Function`` called directly."""

from __future__ import annotations

import torch


def watched() -> bool:
    """Whether a torch.func transform or a torch function mode is active (the kernels then step aside for the
    models' formulas). These are torch's private hooks: where one is missing, assume watched."""
    try:
        return bool(torch._C._are_functorch_transforms_active()) or torch._C._len_torch_function_stack() > 0
    except AttributeError:
        return True


class DirectContext:
    """A stand-in for the context an ``autograd.Function`` gets, to call its ``forward`` and ``backward``
    directly, without an autograd graph (a training step that chains them itself). Its backward runs once
    (`once`: it may reuse what the forward kept, in place)."""

    once = True

    def __init__(self, inputs: int):
        self.needs_input_grad = (False,) * inputs

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved_tensors = tensors
