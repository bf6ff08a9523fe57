"""Bias-free convolutional layers and their matrix unfoldings (docs/theory/invariances.md §1, §4; Le & Jegelka).

Images are ``N x c x H x W`` (PyTorch layout). A kernel ``K`` is ``c_out x c_in x k_h x k_w``. Part 5 §1
reads a kernel through two matrices whose rows/columns are channels:

    B(K) = K.reshape(c_out, -1)                          (c_out x c_in·k_h·k_w, output side),
    A(K) = K.permute(0, 2, 3, 1).reshape(-1, c_in)       (c_out·k_h·k_w x c_in, input side),

and an FC layer ``W`` (``m x c·S``) reading a conv output flattened channel-major through

    A(W) = W.reshape(m, c, S).permute(0, 2, 1).reshape(m·S, c).

Theorem 1 compares ``B`` of one layer with ``A`` of the next; §4's switch costs bound
``‖B‖²_op <= r·‖A‖²_op`` with r = min(c_in, k_h k_w) (conv) and r = min(c, S) (FC after conv).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import int_at_least, non_negative
from ..errors import FeaturelabError


def unfold_out(K: torch.Tensor) -> torch.Tensor:
    """B(K): ``c_out x (c_in·k_h·k_w)`` (Part 5 §1). Also accepts a matrix (returned unchanged)."""
    return K.reshape(K.shape[0], -1)


def unfold_in(K: torch.Tensor) -> torch.Tensor:
    """A(K): ``(c_out·k_h·k_w) x c_in``, one column per input channel (Part 5 §1)."""
    return K.permute(0, 2, 3, 1).reshape(-1, K.shape[1])


def unfold_after_conv(W: torch.Tensor, channels: int) -> torch.Tensor:
    """A(W) of a matrix ``m x (channels·S)`` reading a channel-major flattened conv output:
    ``(m·S) x channels`` (Part 5 §1)."""
    m, n = W.shape
    if n % channels:
        raise FeaturelabError(f"a matrix with {n} columns cannot read {channels} channels (columns must be channels·S)")
    return W.reshape(m, channels, n // channels).permute(0, 2, 1).reshape(-1, channels)


def leak_kind(leak: torch.Tensor) -> str:
    """Which of `leaky`'s paths the slopes `leak` take: "linear" (all 1), "relu" (all 0) or "leaky"."""
    return "linear" if bool((leak == 1.0).all()) else "relu" if bool((leak == 0.0).all()) else "leaky"


def leaky(z: torch.Tensor, leak: torch.Tensor, dim: int = 1, kind: str | None = None) -> torch.Tensor:
    """Unit-wise σ(z) = z for z > 0, leak·z otherwise; `leak` has one entry per unit along `dim`
    (0 = ReLU, 1 = linear). σ'(0) = leak, as torch's ReLU.

    Stacked members: `leak` ``M x n`` (one row per member) and z ``M x ...`` with its units along
    ``dim + 1`` (e.g. ``M x N x n``, or ``M x N x c x H x W`` with dim=1).
    kind: ``leak_kind(leak)`` when the caller keeps it (`Dense` and `Conv` do): reading it from `leak` waits
    for the device, which a captured CUDA graph cannot do."""
    kind = leak_kind(leak) if kind is None else kind
    if kind == "linear":
        return z
    if kind == "relu":
        return torch.relu(z)
    shape = [1] * z.ndim
    if leak.dim() == 1:
        shape[dim] = -1
    else:
        shape[0], shape[dim + 1] = leak.shape[0], leak.shape[1]
    return torch.where(z > 0, z, leak.view(shape).to(z.dtype) * z)


def register_leaks(module: nn.Module, leak, n: int) -> None:
    """Give `module` its buffer ``leak`` (`unit_leaks`) and the attribute ``leak_kind`` (`leak_kind`), which
    `load_state_dict` keeps in step with the loaded slopes."""
    module.register_buffer("leak", unit_leaks(leak, n))
    _keep_leak_kind(module)
    module.register_load_state_dict_post_hook(_keep_leak_kind)


def _keep_leak_kind(module, *_) -> None:
    module.leak_kind = leak_kind(module.get_buffer("leak"))


def unit_leaks(leak, n: int, name: str = "leak") -> torch.Tensor:
    """`leak` (a number, or one number per unit) as a float64 vector of length `n`."""
    t = torch.as_tensor(leak, dtype=torch.float64).reshape(-1)
    if t.numel() == 1:
        t = t.expand(n).clone()
    if t.numel() != n or not torch.isfinite(t).all():
        raise FeaturelabError(f"{name}={leak!r} is not allowed: give one finite number or {n} of them (one per unit)")
    return t


class Conv(nn.Module):
    """Bias-free 2-D convolution followed by a unit-wise (leaky-)ReLU or identity (Part 5 §1, §6a).

    Args:
        c_in, c_out: channels; kernel: k (square k x k) ; stride, padding: as torch.nn.functional.conv2d.
        leak: per-channel slope for z <= 0 (0 ReLU, 1 linear), a number or ``c_out`` numbers.
        init_scale: s, weights ~ N(0, s²/fan_in) with fan_in = c_in·k² (Part 5 §6).
        generator: torch.Generator for the init; dtype: parameter dtype.
    ``forward`` maps ``N x c_in x H x W`` to the pre-activation ``N x c_out x H' x W'``; `act` applies σ.

    Stacked members (``weight`` ``M x c_out x c_in x k x k``, ``leak`` ``M x c_out``, as the training
    engine's ensembles pass them): ``forward`` maps ``N x c_in x H x W`` (shared) or ``M x N x c_in x H x W``
    to ``M x N x c_out x H' x W'``: a shared input is convolved with all ``M·c_out`` kernels at once, a
    stacked one by one grouped convolution (``groups=M``: each member's kernels read only its channels).
    """

    leak: torch.Tensor  # buffer, one slope per output channel
    leak_kind: str  # leak_kind(leak), kept from construction and load_state_dict

    def __init__(
        self,
        c_in: int,
        c_out: int,
        kernel: int,
        stride: int = 1,
        padding: int = 0,
        leak=0.0,
        init_scale: float = 1.0,
        generator: torch.Generator | None = None,
        dtype=torch.float64,
    ):
        super().__init__()
        for name, v, low in (
            ("c_in", c_in, 1),
            ("c_out", c_out, 1),
            ("kernel", kernel, 1),
            ("stride", stride, 1),
            ("padding", padding, 0),
        ):
            int_at_least(name, v, low)
        non_negative("init_scale", init_scale)
        self.stride, self.padding = stride, padding
        std = init_scale / math.sqrt(c_in * kernel * kernel)
        w = torch.randn(c_out, c_in, kernel, kernel, generator=generator, dtype=torch.float64) * std
        self.weight = nn.Parameter(w.to(dtype))
        register_leaks(self, leak, c_out)

    @property
    def switch_factor(self) -> int:
        """r = min(c_in, k_h k_w): ‖B(K)‖²_op <= r ‖A(K)‖²_op, tight (Part 5 §4 step 2, fact 8)."""
        c_out, c_in, kh, kw = self.weight.shape
        return min(c_in, kh * kw)

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """Output ``(c_out, H', W')`` for input ``(c_in, H, W)``."""
        c_out, c_in, kh, kw = self.weight.shape
        if len(shape) != 3 or shape[0] != c_in:
            raise FeaturelabError(f"Conv with c_in={c_in} cannot read input of shape {shape} (need (c_in, H, W))")
        h = (shape[1] + 2 * self.padding - kh) // self.stride + 1
        w = (shape[2] + 2 * self.padding - kw) // self.stride + 1
        if h < 1 or w < 1:
            raise FeaturelabError(f"Conv kernel {kh}x{kw} does not fit input of shape {shape}")
        return (c_out, h, w)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        K = self.weight
        if K.dim() == 4:
            return F.conv2d(a, K, stride=self.stride, padding=self.padding)
        M, c_out, c_in, kh, kw = K.shape  # stacked members: channels member-major
        if a.dim() == 4:  # a shared input: one convolution with the members' M·c_out kernels
            z = F.conv2d(a, K.reshape(M * c_out, c_in, kh, kw), stride=self.stride, padding=self.padding)
        else:  # one grouped convolution: member m's kernels read only member m's channels
            x = a.transpose(0, 1).reshape(a.shape[1], M * c_in, *a.shape[-2:])
            z = F.conv2d(x, K.reshape(M * c_out, c_in, kh, kw), stride=self.stride, padding=self.padding, groups=M)
        return z.reshape(z.shape[0], M, c_out, *z.shape[-2:]).transpose(0, 1)

    def act(self, z: torch.Tensor) -> torch.Tensor:
        return leaky(z, self.leak, dim=1, kind=self.leak_kind)

    def extra_repr(self) -> str:
        return f"weight={tuple(self.weight.shape)}, stride={self.stride}, padding={self.padding}"
