"""The analysis renders inline in a notebook: `_repr_html_` carries every layer and its spectral norm."""

import numpy as np
import torch
from torch import nn

import featurelab as fl


def test_repr_html_lists_every_layer_with_its_spectral_norm():
    torch.manual_seed(0)
    first, last = nn.Linear(5, 7).double(), nn.Linear(7, 3).double()
    model = nn.Sequential(first, nn.ReLU(), last)
    x = np.random.default_rng(0).normal(size=(32, 5))
    result = fl.analyze(model, x)
    page = result._repr_html_()
    for layer, module in (("0", first), ("2", last)):
        s1 = torch.linalg.matrix_norm(module.weight.detach(), ord=2).item()
        assert f"{s1:.4g}" in page
        assert f"<td>{layer}</td>" in page
    assert "overflow-x:auto" in page
