"""Where computations run: device choice, thread count, version stamps."""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import os
import platform
import sys
from functools import lru_cache
from typing import TypeVar

import torch

from .errors import FeaturelabError

DEVICES = ("cpu", "cuda", "auto")

M = TypeVar("M", bound=torch.nn.Module)


def resolve_device(device: str | torch.device = "cpu") -> torch.device:
    """Map "cpu", "cuda", "cuda:N" or "auto" to a torch.device; "cuda" without a GPU is a one-line error."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise FeaturelabError(f"device={name!r} is not available on this machine (no CUDA GPU); use cpu or auto")
        return torch.device(name)
    raise FeaturelabError(f"device={name!r} is not allowed; choose one of: cpu, cuda, cuda:N, auto")


def float64_copy(model: M) -> M:
    """A float64 copy of `model` on the CPU with parameter gradients off: where diagnostics run
    (docs/theory/conventions.md, "Diagnostics run in float64 on the stored parameters")."""
    return copy.deepcopy(model).cpu().to(torch.float64).requires_grad_(False)


def machine_memory(device: str | torch.device = "cpu") -> int:
    """Bytes of memory of `device`: the GPU's for a CUDA device, else the machine's RAM."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(what: str, n_bytes: float, device: str | torch.device = "cpu") -> None:
    """A one-line error, with the estimate, when `what` would need more than `device`'s memory."""
    total = machine_memory(device)
    if n_bytes > total:
        raise FeaturelabError(
            f"{what} would need about {n_bytes / 2**30:.3g} GiB, more than the {total / 2**30:.3g} GiB of this "
            "machine; choose smaller sizes"
        )


def set_threads(n: int) -> None:
    """Set torch's intra-op threads and those of numpy's and scipy's BLAS and OpenMP pools (threadpoolctl; their
    libraries are loaded first, since a limit reaches only the libraries loaded). Small featurelab models run fastest
    on one thread (docs/theory/conventions.md), and a BLAS pool wider than the cores it gets spins: scipy's L-BFGS-B
    on the demo net's 26 240 parameters took 740 ms an iteration with two OpenBLAS threads on a loaded 2-core
    machine, and 8 ms with one."""
    import scipy.linalg  # noqa: F401  (loads scipy's BLAS, which numpy's import does not)
    from threadpoolctl import threadpool_limits

    n = max(1, int(n))
    torch.set_num_threads(n)
    threadpool_limits(n)


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


@lru_cache(maxsize=1)
def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in the process (blocks up to 32 MB from the heap, no trimming);
    True where it took effect (glibc only). By default glibc returns freed blocks over 128 kB to the OS, so
    every training step's activations fault their pages in again: 1400 page faults per step of 16 digits MLPs
    (bench (b)), a third of its CPU time. Memory then stays at the process's peak until it exits."""
    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    if mallopt is None:  # not glibc
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, 1 << 30)) and bool(mallopt(M_MMAP_THRESHOLD, 32 << 20))


def tune_cpu(device: str | torch.device = "cpu") -> bool:
    """Tune this process for training on the CPU; nothing for another device. Returns whether it tuned.

    Two process-wide settings, neither of which torch can read back or featurelab undoes:
    `torch.set_flush_denormal` (denormal floats become 0: weight decay drives unused float32 weights and
    activations below 1.2e-38, where x86 arithmetic is about 100x slower; a deep net trained to its bottleneck
    ran 6.8x faster) and glibc's malloc keeping freed memory (`keep_freed_memory`). `featurelab run`,
    `run_experiment` (and each of its worker processes) and `featurelab bench` call it; `train` and
    `train_ensemble` do not, so a program that calls them on the CPU calls this first for the same speed and
    the same bits as the command line (docs/scale.md, "CPU tuning").
    """
    if resolve_device(device).type != "cpu":
        return False
    torch.set_flush_denormal(True)
    keep_freed_memory()
    return True


def versions() -> dict[str, str]:
    """Versions of the interpreter and the numerical stack, stamped into every run record."""
    import matplotlib
    import numpy
    import scipy

    from ._version import __version__

    info = {
        "featurelab": __version__,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "matplotlib": matplotlib.__version__,
        "platform": platform.platform(),
        "cuda": torch.version.cuda or "none",
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info
