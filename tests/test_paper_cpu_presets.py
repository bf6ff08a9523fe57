"""The `paper-cpu` presets: the paper preset's nets, data and λ, with fewer training steps, samples or seeds
(docs/reproduction.md, "Paper presets on the 2-core CPU")."""

import pytest

from featurelab.catalog import CATALOG
from featurelab.runs.runner import resolve_config

# What a paper-cpu preset may change, per experiment: step counts, the number of training points, the seeds
# (or repeats) and, for width-plateau, which of the paper's panels run.
MAY_CHANGE = {
    "leaky-hamiltonian": {"n_train", "adam_steps", "gd_steps"},
    "leaky-discretization": {"n_train", "n_seeds", "adam_steps", "gd_steps"},
    "bn-rank-depth": {"seeds", "steps"},
    "r1-properties": {"seeds"},
    "forces": {"gd_steps"},
    "width-plateau": {"datasets"},
    "saddle-mnist": {"n_train", "steps"},
}
NAMES = [e.name for e in CATALOG if "paper-cpu" in e.presets]


def test_every_paper_cpu_preset_is_listed_here():
    assert sorted(NAMES) == sorted(MAY_CHANGE)


@pytest.mark.parametrize("name", NAMES)
def test_paper_cpu_cuts_only_steps_samples_or_seeds(name, monkeypatch, tmp_path):
    """Every other field (widths, depths, λ, learning rates, data, certification) equals the paper preset's;
    every changed count is smaller; every unit is one of the paper preset's units."""
    monkeypatch.setenv("FEATURELAB_MNIST", str(tmp_path))  # the MNIST presets' pre-flight check only needs a path
    exp, cpu = resolve_config(name, "paper-cpu")
    _, paper = resolve_config(name, "paper")
    a, b = cpu.model_dump(), paper.model_dump()
    changed = {k for k in a if a[k] != b[k]}
    assert changed and changed <= MAY_CHANGE[name], changed
    for k in changed:
        old, new = b[k], a[k]
        if isinstance(old, list):
            assert set(new) < set(old), (k, old, new)
        else:
            assert new < (old if old is not None else float("inf")), (k, old, new)
    paper_ids = {u["id"] for u in exp.units(paper)}
    cpu_ids = {u["id"] for u in exp.units(cpu)}
    assert cpu_ids <= paper_ids
