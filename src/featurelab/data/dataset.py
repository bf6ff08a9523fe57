"""The train/test container every loader returns (rows are samples)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch


@dataclass(frozen=True)
class Dataset:
    """Train and test tensors, samples as rows.

    X_train: N x d_in float.  Y_train: N x d_out float (regression) or N int64 labels (classification).
    n_classes: number of classes for classification, None for regression.
    meta: how it was made (seeds, sizes, normalisation constants), stored in run records.
    """

    X_train: torch.Tensor
    Y_train: torch.Tensor
    X_test: torch.Tensor
    Y_test: torch.Tensor
    n_classes: int | None = None
    meta: dict = field(default_factory=dict)

    @classmethod
    def split(cls, X, Y, n_train: int, meta: dict) -> Dataset:
        """A regression `Dataset` from numpy arrays whose first `n_train` rows are the training set and the
        rest the test set (rows are samples; float64 as given)."""
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
        return cls(t(X[:n_train]), t(Y[:n_train]), t(X[n_train:]), t(Y[n_train:]), None, meta)

    @property
    def d_in(self) -> int:
        return self.X_train.shape[1]

    @property
    def d_out(self) -> int:
        return self.n_classes if self.n_classes else self.Y_train.shape[1]

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> Dataset:
        """Cast the inputs (and float targets) to `dtype`, move everything to `device`."""

        def cast(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype if (dtype is not None and t.is_floating_point()) else t.dtype)

        return replace(
            self,
            X_train=cast(self.X_train),
            Y_train=cast(self.Y_train),
            X_test=cast(self.X_test),
            Y_test=cast(self.Y_test),
        )
