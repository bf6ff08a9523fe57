"""Matrix products on the CPU: torch's BLAS (Intel MKL), or oneDNN where MKL leaves the processor half idle.

torch's CPU products (``@``, addmm, bmm) call MKL, which picks its AVX-512 kernels on Intel processors only:
on an AMD processor with AVX-512 (Zen 4, Zen 5) it runs AVX2 code. On a Zen 5 core that is about half of
what the core does: a 2048 x 2048 float32 product runs at 105 GFLOP/s in one thread, against 224 GFLOP/s
in XLA. oneDNN, which torch also ships, chooses its kernels by instruction set, so its AVX-512 kernels run
there (2.1x MKL's speed on the 256 x 65 x 1000 product of the digits MLP ensemble's first layer, 2.0-2.3x on
the Leaky ResNet's 200 x 201 x 1000 steps; measured on that core). `product` sends a float32 product
through oneDNN's inner-product primitive (``torch.ops.mkldnn._linear_pointwise``, the op torch's compiler
emits for linear layers on the CPU) when `onednn_products` holds and the product is large enough for its
fixed cost (about 10 µs a call) to pay: at least `ONEDNN_MIN_FLOPS`. Everything else, float64 included
(oneDNN has no float64 kernels), takes torch's own products. Both sum in their own order, so results
agree to rounding, not bit for bit.

``FEATURELAB_GEMM=onednn`` or ``=mkl`` (environment) overrides the choice.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache

import torch

from ...errors import FeaturelabError

ONEDNN_MIN_FLOPS = 4e6  # 2·m·k·n: from about 2 MFLOP on, oneDNN's product is faster than MKL's on a Zen 5 core
GEMM_CHOICES = ("auto", "onednn", "mkl")


def _amd_with_avx512() -> bool:
    """An AMD x86 processor whose AVX-512 torch uses (Linux: the vendor read from /proc/cpuinfo)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("vendor_id") and "AuthenticAMD" in line for line in f)
    except OSError:
        return False


@lru_cache(maxsize=1)
def onednn_products() -> bool:
    """Whether large float32 CPU products go through oneDNN: ``FEATURELAB_GEMM`` when set, else on AMD processors
    with AVX-512 (where MKL runs AVX2 code), when this torch has oneDNN's inner-product op."""
    choice = os.environ.get("FEATURELAB_GEMM", "auto").strip().lower() or "auto"
    if choice not in GEMM_CHOICES:
        raise FeaturelabError(f"FEATURELAB_GEMM={choice!r} is not allowed; choose one of: {', '.join(GEMM_CHOICES)}")
    available = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    if choice == "mkl" or not available:
        return False
    return choice == "onednn" or _amd_with_avx512()


def _through_onednn(A: torch.Tensor, B: torch.Tensor) -> bool:
    m, k = A.shape[-2:]
    return (
        A.dtype == B.dtype == torch.float32
        and A.device.type == B.device.type == "cpu"
        and 2.0 * m * k * B.shape[-1] >= ONEDNN_MIN_FLOPS
        and not (torch.is_grad_enabled() and (A.requires_grad or B.requires_grad))  # the op has no derivative
        and onednn_products()
    )


def product(A: torch.Tensor, B: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
    """``A @ B (+ add)``: A ``m x k``, B ``k x n`` (either may be a transposed view), add ``m x n`` or None; or
    batched, A ``M x m x k`` and B ``M x k x n`` (each member's product on its own). Large float32 CPU products
    go through oneDNN (module docstring), the rest through torch. Returns the ``m x n`` (``M x m x n``) result:
    a new tensor, or `add` itself updated in place (its old values are not kept either way)."""
    if not _through_onednn(A, B):
        if add is None:
            return A @ B
        return (add.baddbmm_ if A.dim() == 3 else add.addmm_)(A, B)
    if A.dim() == 3:
        return torch.stack([product(a, b, None if add is None else add[i]) for i, (a, b) in enumerate(zip(A, B))])
    linear = torch.ops.mkldnn._linear_pointwise  # A @ weightᵀ with weight = Bᵀ
    if add is None:
        return linear(A, B.mT, None, "none", [], "")
    return linear.binary(A, add, B.mT, None, "add")
