"""Part 3 experiment helpers on known numbers: the plateau start of docs/theory/sparsity.md §6's measured table,
ray share and class separation on constructed representations."""

import torch

from featurelab.measurements.sparsity import class_separation, ray_share
from featurelab.training.plateaus import plateau_start


def test_plateau_start_on_the_measured_digits_table():
    """docs/theory/sparsity.md §6: with its m(w) table, n*(5%) = 10 and n*(1%) = 24 (<= 48)."""
    widths = [2, 4, 6, 8, 10, 12, 16, 24, 32, 64, 128]
    m = [0.829, 0.224, 0.160, 0.139, 0.136, 0.135, 0.133, 0.131, 0.132, 0.130, 0.131]
    assert plateau_start(widths, m, 0.05) == 10
    assert plateau_start(widths, m, 0.01) == 24
    assert plateau_start(widths, m, 0.0) == 64


def test_ray_share_and_class_separation():
    gen = torch.Generator().manual_seed(0)
    base = torch.rand(50, 3, generator=gen, dtype=torch.float64) + 0.1
    Z = torch.cat([base, 2.0 * base[:, :1], -torch.ones(50, 1, dtype=torch.float64)], dim=1)
    assert ray_share(Z, 0.99999) == 0.5  # 2 of the 4 alive neurons are on one ray; the dead one is ignored
    labels = torch.arange(50) % 2
    Zc = torch.stack([labels.double() * 10, torch.zeros(50, dtype=torch.float64)], dim=1)
    assert class_separation(Zc, labels) == 1.0
