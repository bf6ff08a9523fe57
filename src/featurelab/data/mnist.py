"""MNIST from local files only (IDX, optionally gzipped, or one .npz); nothing is ever downloaded."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import torch

from ..errors import FeaturelabError
from .dataset import Dataset

ENV_VAR = "FEATURELAB_MNIST"
FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (magic 2051 images or 2049 labels, big-endian sizes; ``.gz`` allowed)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    magic = struct.unpack(">I", data[:4])[0]
    if zero != 0 or dtype_code != 0x08 or magic not in (2049, 2051):
        raise FeaturelabError(f"{path} is not an MNIST IDX file (magic {magic}; expected 2049 or 2051)")
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (folder / name).exists():
            return folder / name
    return None


def mnist_path(path: str | Path | None = None) -> Path:
    """The existing MNIST location `path` (default: the FEATURELAB_MNIST environment variable), or a
    one-line error saying how to provide it."""
    raw = path if path is not None else os.environ.get(ENV_VAR)
    if raw is None:
        raise FeaturelabError(
            f"mnist path is not set: pass path=... (a folder of IDX files or an .npz) or set {ENV_VAR}"
        )
    p = Path(raw).expanduser()
    if not p.exists():
        raise FeaturelabError(
            f"mnist path '{p}' does not exist: put MNIST's IDX files (or an .npz) there; "
            "featurelab never downloads data"
        )
    return p


def require_mnist(cfg) -> None:
    """An experiment's pre-flight check: when its config names "mnist" in ``dataset`` (one name) or
    ``datasets`` (a list), the files at ``cfg.mnist_path`` must exist before anything is written."""
    names = cfg.datasets if hasattr(cfg, "datasets") else [cfg.dataset]
    if "mnist" in names:
        mnist_path(cfg.mnist_path)


def mnist(path: str | Path | None = None, normalize: str = "standardize") -> Dataset:
    """MNIST as a classification `Dataset` (X: N x 784 float64, Y: N int64 labels, 10 classes).

    path: a folder with the four IDX files (``train-images-idx3-ubyte[.gz]`` ...) or an ``.npz`` with
        arrays x_train, y_train, x_test, y_test; defaults to the FEATURELAB_MNIST environment variable.
    normalize: "standardize" maps x -> (x/255 - μ)/σ with scalar μ, σ over all training pixels
        (Part 4 §6, ≈ 0.1307, 0.3081); "unit" divides by 255.
    """
    p = mnist_path(path)
    if p.is_file():
        with np.load(p) as z:
            missing = [k for k in FILES if k not in z]
            if missing:
                raise FeaturelabError(f"mnist file '{p}' lacks arrays {missing}; it needs {list(FILES)}")
            arrays = {k: z[k] for k in FILES}
    else:
        arrays = {}
        for key, stem in FILES.items():
            f = _find(p, stem)
            if f is None:
                raise FeaturelabError(f"mnist folder '{p}' has no {stem}[.gz]; it needs the four IDX files")
            arrays[key] = read_idx(f)
    xtr = arrays["x_train"].reshape(len(arrays["x_train"]), -1).astype(np.float64) / 255.0
    xte = arrays["x_test"].reshape(len(arrays["x_test"]), -1).astype(np.float64) / 255.0
    meta: dict[str, object] = {"name": "mnist", "path": str(p), "normalize": normalize}
    if normalize == "standardize":
        mu, sd = xtr.mean(), xtr.std()
        xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
        meta.update(mu=float(mu), sigma=float(sd))
    t = torch.from_numpy
    return Dataset(
        t(xtr), t(arrays["y_train"].astype(np.int64)), t(xte), t(arrays["y_test"].astype(np.int64)), 10, meta
    )
