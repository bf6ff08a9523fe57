"""The singular values of a convolution as the linear map it computes on inputs of a given size.

A Conv1d/Conv2d layer with kernel W (out x in/G x k...), stride, padding, dilation and G groups maps an input
of C_in x H x W to an output of C_out x H' x W'; bias excluded and a folded BatchNorm's factor s applied to the
output channels, that map is a linear operator A of (C_out·H'·W') x (C_in·H·W). Its singular values are not
those of the kernel's ``out x (in·k...)`` unfolding: the unfolding is the operator on one output position
whose receptive field is all inside the input, while A couples every position.

Three routes, in float64 (`operator_spectrum`):

- **fft** (circular padding, stride 1, output size = input size): A is block-circulant, so the 2-D discrete
  Fourier transform diagonalises it into one C_out x C_in matrix per frequency ω, P(ω) = Σ_a W[:, :, a]
  e^{−2πi⟨ω, a·d⟩/n} (the kernel, dilated by d, wrapped onto the H x W torus and transformed; a phase set by
  the padding offset drops out of the singular values). The singular values of A are the union over the H·W
  frequencies of those of P(ω) (Sedghi, Gupta & Long, "The singular values of convolutional layers", ICLR
  2019, arXiv 1805.10408, Thm. 6); a grouped conv is block-diagonal in every P(ω), so per group. Exact, all of
  them.
- **dense** (any other padding, C_in·H·W and C_out·H'·W' both <= `DENSE_MAX`): the Jacobian of the map,
  built by applying the conv to the identity basis, and all its singular values (`spectra.singular_values`).
- **lanczos** (larger): the top k by ARPACK's implicitly restarted Lanczos bidiagonalisation
  (``scipy.sparse.linalg.svds`` at tol 0, i.e. machine precision) on a LinearOperator whose products are the
  conv itself and its adjoint (``conv_transpose`` for zero padding, the vector-Jacobian product otherwise).
  For zero padding ‖A‖²_F is exact without the spectrum: output position p and kernel tap t read one input
  entry or a padded zero, and distinct taps read distinct entries, so ‖A‖²_F = Σ_t ‖s ⊙ W[:, :, t]‖²·c_t with
  c_t the number of output positions whose tap t lands inside the input; the stable rank ‖A‖²_F/s_1² is then
  exact too. Other paddings at this size: ‖A‖_F unknown, stable rank NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse.linalg
import torch
import torch.nn.functional as F
from torch import nn

from .spectra import singular_values

DENSE_MAX = 2048  # the dense Jacobian route up to this many inputs and outputs (about 2 s of float64 on one core)


@dataclass(frozen=True)
class OperatorSpectrum:
    """The singular values of a conv's operator on inputs of shape `input` (C x H x W or C x L), output shape
    `output`: `values` decreasing, all of them when `full`, else the top ones; `method` "fft", "dense" or
    "lanczos" (module docstring); `frobenius_sq` ‖A‖²_F (NaN when unknown)."""

    values: np.ndarray
    full: bool
    method: str
    input: tuple[int, ...]
    output: tuple[int, ...]
    frobenius_sq: float

    @property
    def stable_rank(self) -> float:
        """‖A‖²_F / ‖A‖²_op (NaN when ‖A‖_F is unknown or A = 0)."""
        top = float(self.values[0]) ** 2 if len(self.values) else 0.0
        return self.frobenius_sq / top if top > 0 else math.nan


def conv_map(conv: nn.Conv1d | nn.Conv2d, scale: torch.Tensor | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The conv as a linear map of a batch B x C x ... (float64): its own padding, stride, dilation and groups,
    no bias, output channel c multiplied by scale[c] (a folded BatchNorm)."""
    W = conv.weight.detach().to(torch.float64)
    s = None if scale is None else scale.to(torch.float64).reshape(-1, *[1] * (W.ndim - 2))

    def apply(x: torch.Tensor) -> torch.Tensor:
        y = conv._conv_forward(x, W, None)  # the module's own padding modes and string paddings
        return y if s is None else y * s

    return apply


def _adjoint(conv: nn.Conv1d | nn.Conv2d, scale, forward, input: tuple[int, ...]):
    """y ↦ Aᵀy for a batch of outputs: ``conv_transpose`` for zero padding given as integers, else the
    vector-Jacobian product of `forward` (exact for a linear map)."""
    W = conv.weight.detach().to(torch.float64)
    s = None if scale is None else scale.to(torch.float64).reshape(-1, *[1] * (W.ndim - 2))
    padding = conv.padding
    if conv.padding_mode == "zeros" and not isinstance(padding, str):
        transpose = F.conv_transpose1d if isinstance(conv, nn.Conv1d) else F.conv_transpose2d

        def apply(y: torch.Tensor) -> torch.Tensor:
            y = y if s is None else y * s
            out = y.shape[2:]
            extra = [
                size - ((o - 1) * st - 2 * p + d * (k - 1) + 1)
                for size, o, st, p, d, k in zip(
                    input[1:], out, conv.stride, padding, conv.dilation, conv.kernel_size, strict=True
                )
            ]
            return transpose(y, W, None, conv.stride, padding, extra, conv.groups, conv.dilation)

        return apply

    def vjp(y: torch.Tensor) -> torch.Tensor:
        x = torch.zeros(len(y), *input, dtype=torch.float64)
        return torch.func.vjp(forward, x)[1](y)[0]

    return vjp


def _circulant(conv: nn.Conv1d | nn.Conv2d, input: tuple[int, ...], output: tuple[int, ...]) -> bool:
    """Whether the fft route applies: circular padding, stride 1, output positions = input positions."""
    return conv.padding_mode == "circular" and all(st == 1 for st in conv.stride) and input[1:] == output[1:]


def _fft_values(conv: nn.Conv1d | nn.Conv2d, scale, input: tuple[int, ...]) -> np.ndarray:
    """All singular values of a circular conv: per group, the kernel wrapped (dilated) onto the input's torus,
    its discrete Fourier transform over positions, and the out/G x in/G matrix of each frequency (module
    docstring)."""
    W = conv.weight.detach().to(torch.float64).numpy()
    if scale is not None:
        W = W * scale.to(torch.float64).numpy().reshape(-1, *[1] * (W.ndim - 1))
    sizes = input[1:]
    axes = tuple(range(2, W.ndim))
    values = []
    for Wg in np.split(W, conv.groups):
        torus = np.zeros((*Wg.shape[:2], *sizes))
        for tap in np.ndindex(*Wg.shape[2:]):
            at = tuple((a * d) % n for a, d, n in zip(tap, conv.dilation, sizes, strict=True))
            torus[(slice(None), slice(None), *at)] += Wg[(slice(None), slice(None), *tap)]
        P = np.moveaxis(np.fft.fftn(torus, axes=axes), (0, 1), (-2, -1)).reshape(-1, *Wg.shape[:2])
        values.append(np.linalg.svd(P, compute_uv=False).ravel())
    return np.sort(np.concatenate(values))[::-1]


def _dense(forward, input: tuple[int, ...]) -> np.ndarray:
    """The operator as a dense (outputs x inputs) matrix: the map applied to the identity basis."""
    n = math.prod(input)
    columns = forward(torch.eye(n, dtype=torch.float64).reshape(n, *input))
    return columns.reshape(n, -1).T.contiguous().numpy()


def _tap_counts(conv: nn.Conv1d | nn.Conv2d, input: tuple[int, ...]) -> torch.Tensor:
    """c_t per kernel tap t (flattened): the output positions whose tap t reads inside the input (zero padding),
    from the conv with one one-hot kernel per tap applied to an all-ones input."""
    taps = math.prod(conv.kernel_size)
    onehot = torch.eye(taps, dtype=torch.float64).reshape(taps, 1, *conv.kernel_size)
    ones = torch.ones(1, 1, *input[1:], dtype=torch.float64)
    fn = F.conv1d if isinstance(conv, nn.Conv1d) else F.conv2d
    return fn(ones, onehot, None, conv.stride, conv.padding, conv.dilation).reshape(taps, -1).sum(1)


def _frobenius_sq(conv: nn.Conv1d | nn.Conv2d, scale, input: tuple[int, ...]) -> float:
    """‖A‖²_F = Σ_t ‖s ⊙ W[:, :, t]‖²·c_t for zero padding (module docstring), NaN for other paddings."""
    if conv.padding_mode != "zeros":
        return math.nan
    W = conv.weight.detach().to(torch.float64)
    if scale is not None:
        W = W * scale.to(torch.float64).reshape(-1, *[1] * (W.ndim - 1))
    per_tap = (W**2).sum((0, 1)).reshape(-1)
    return float(per_tap @ _tap_counts(conv, input))


def operator_spectrum(
    conv: nn.Conv1d | nn.Conv2d, input: tuple[int, ...], scale: torch.Tensor | None = None, k: int = 5
) -> OperatorSpectrum:
    """The singular values of `conv` (bias excluded, output channels times `scale`) as a map of inputs of shape
    `input` (C x H x W or C x L): all of them by the fft or dense route, else the top `k` (module docstring)."""
    input = tuple(int(n) for n in input)
    forward = conv_map(conv, scale)
    with torch.no_grad():
        output = tuple(forward(torch.zeros(1, *input, dtype=torch.float64)).shape[1:])
    n_in, n_out = math.prod(input), math.prod(output)
    if _circulant(conv, input, output):
        s = _fft_values(conv, scale, input)
        return OperatorSpectrum(s, True, "fft", input, output, float((s**2).sum()))
    if max(n_in, n_out) <= DENSE_MAX:
        with torch.no_grad():
            s = singular_values(torch.from_numpy(_dense(forward, input))).numpy()
        return OperatorSpectrum(s, True, "dense", input, output, float((s**2).sum()))
    adjoint = _adjoint(conv, scale, forward, input)

    def matvec(v: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            x = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)).reshape(1, *input)
            return forward(x).reshape(-1).numpy()

    def rmatvec(v: np.ndarray) -> np.ndarray:
        y = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)).reshape(1, *output)
        return adjoint(y).detach().reshape(-1).numpy()

    A = scipy.sparse.linalg.LinearOperator((n_out, n_in), matvec=matvec, rmatvec=rmatvec, dtype=np.float64)
    top = min(k, min(n_in, n_out) - 1)
    s = scipy.sparse.linalg.svds(A, k=top, tol=0, return_singular_vectors=False, rng=np.random.default_rng(0))
    return OperatorSpectrum(np.sort(s)[::-1], False, "lanczos", input, output, _frobenius_sq(conv, scale, input))


def conv_inputs(net: nn.Module, X: torch.Tensor) -> dict[str, tuple[int, ...]]:
    """The per-sample input shape (C x H x W or C x L) of each Conv1d/Conv2d of `net` on its first call, from a
    forward pass of the first row of X."""
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []
    for name, m in net.named_modules():
        if isinstance(m, nn.Conv1d | nn.Conv2d):

            def hook(_module, args, name=name):
                if args and isinstance(args[0], torch.Tensor):
                    shapes.setdefault(name, tuple(args[0].shape[1:]))

            handles.append(m.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            net(X[:1])
    finally:
        for h in handles:
            h.remove()
    return shapes
