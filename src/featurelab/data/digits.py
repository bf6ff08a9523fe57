"""scikit-learn's bundled 8x8 digits (1797 images, 10 classes): featurelab's offline real dataset."""

from __future__ import annotations

import numpy as np
import torch

from ..checks import one_of
from ..errors import FeaturelabError
from .dataset import Dataset

NORMALIZATIONS = ("unit", "standardize")


def digits(n_train: int | None = 1000, seed: int = 0, normalize: str = "unit") -> Dataset:
    """The digits as a classification `Dataset` (X: N x 64 float64, Y: N int64 labels, 10 classes).

    n_train: size of a stratified train split (seeded); the rest is the test split
        (Part 3 §6: 1000 train / 797 test). ``None`` trains on all 1797 and leaves the test split empty.
    normalize: "unit" divides pixels by 16 (Part 3); "standardize" maps x -> (x/16 - μ)/σ with scalar
        μ, σ over all pixels (Part 4 §6: μ = 0.30526, σ = 0.37605).
    """
    from sklearn.datasets import load_digits

    one_of("normalize", normalize, NORMALIZATIONS)
    bunch = load_digits()
    X = bunch.data.astype(np.float64) / 16.0
    y = bunch.target.astype(np.int64)
    meta = {"name": "digits", "normalize": normalize, "seed": seed}
    if normalize == "standardize":
        mu, sd = X.mean(), X.std()
        X = (X - mu) / sd
        meta.update(mu=float(mu), sigma=float(sd))
    if n_train is None:
        tr, te = np.arange(len(y)), np.arange(0)
    else:
        if not 10 <= n_train < len(y):
            raise FeaturelabError(f"n_train={n_train!r} is not allowed: it must be in [10, {len(y) - 1}] or None")
        from sklearn.model_selection import train_test_split

        tr, te = train_test_split(np.arange(len(y)), train_size=n_train, stratify=y, random_state=seed)
    t = torch.from_numpy
    return Dataset(t(X[tr]), t(y[tr]), t(X[te]), t(y[te]), 10, meta | {"n_train": len(tr), "n_test": len(te)})
