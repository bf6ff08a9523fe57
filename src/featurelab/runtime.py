"""Where computations run: device choice, thread count, version stamps."""

from __future__ import annotations

import copy
import os
import platform
import sys
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
    """Set torch's intra-op threads. Small featurelab models run fastest on one thread (docs/theory/conventions.md)."""
    torch.set_num_threads(max(1, int(n)))


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
