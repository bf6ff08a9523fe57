"""`analyze` of a model whose output it cannot read as rows: one line naming what is wrong."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import featurelab as fl
from featurelab.errors import FeaturelabError


class Scalar(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x).sum()


class Poisoned(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x) * float("nan")


@pytest.mark.parametrize("model, words", [(Scalar(), "is a scalar"), (Poisoned(), "contains NaN or inf")])
def test_unreadable_outputs_are_one_line(model, words):
    with pytest.raises(FeaturelabError, match=words) as info:
        fl.analyze(model, torch.randn(8, 3))
    assert "\n" not in str(info.value)
