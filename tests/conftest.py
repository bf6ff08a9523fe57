"""Shared test set-up: one torch thread (featurelab's small matrices lose to thread overhead), float64
reference computations where a test asks for them, and a headless matplotlib."""

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
torch.set_num_threads(1)


@pytest.fixture
def gen():
    """A seeded torch generator, so a test's random draws never depend on test order."""
    return torch.Generator().manual_seed(1234)
