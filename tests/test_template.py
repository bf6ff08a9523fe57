"""The template experiment runs end to end, its claim is the closed form of its threshold, and a copy of it is
listed by adding one block to the copy alone."""

import json

import pandas as pd
import pytest

from featurelab import experiments
from featurelab.catalog import CATALOG, Entry, module_entries
from featurelab.experiments import template
from featurelab.runs import run_experiment


def test_the_template_runs_end_to_end_at_its_tiny_preset(tmp_path, monkeypatch):
    monkeypatch.setitem(experiments.REGISTRY, "template", template.EXPERIMENT)
    run_experiment("template", "tiny", out=tmp_path / "run", workers=1, progress=False)
    run = tmp_path / "run"
    (c,) = json.loads((run / "claims.json").read_text())
    unit = json.loads((run / "units" / "seed0" / "result.json").read_text())["result"]
    history = pd.read_csv(run / "units" / "seed0" / "history.csv")
    # the template's own mean squared error and the trainer's logged cost: two computations of (1/N)‖f(X) − Y‖²_F
    assert unit["initial_cost"] == pytest.approx(history["cost"].iloc[0], rel=1e-12)
    assert unit["final_cost"] == pytest.approx(history["cost"].iloc[-1], rel=1e-12)
    ratio = unit["final_cost"] / unit["initial_cost"]
    assert c["id"] == "template-fit" and c["expected"] == "<= 0.1"
    assert c["margin"] == pytest.approx((0.1 - ratio) / 0.1, rel=1e-12)  # (bound - measured)/|bound| for "<="
    assert c["passed"] is (ratio <= 0.1)


def test_the_template_is_not_listed_and_a_copy_with_a_block_is(tmp_path):
    assert "template" not in experiments.REGISTRY and all(e.name != "template" for e in CATALOG)
    text = open(template.__file__, encoding="utf-8").read()
    block = 'CATALOG = (\n    Entry("mine", ("quick", "tiny"), "Someone 2026 Fig. 1: what it checks", 61),\n)\n'
    copy = tmp_path / "mine.py"
    copy.write_text(text.replace("\nEXPERIMENT = Experiment(", "\n" + block + "\n\nEXPERIMENT = Experiment("))
    assert module_entries(copy) == (Entry("mine", ("quick", "tiny"), "Someone 2026 Fig. 1: what it checks", 61),)
    plain = tmp_path / "plain.py"
    plain.write_text(text)
    assert module_entries(plain) == ()


def test_a_module_whose_catalog_disagrees_with_its_experiments_is_refused(monkeypatch):
    """The registry checks each module's CATALOG block against the experiments it defines, naming the module."""
    import sys
    import types

    fake = types.ModuleType("featurelab.experiments.fake")
    fake.EXPERIMENT = template.EXPERIMENT  # named "template", presets quick and tiny
    fake.CATALOG = (Entry("template", ("quick", "paper"), "a listing whose presets differ", 99),)
    monkeypatch.setitem(sys.modules, "featurelab.experiments.fake", fake)
    with pytest.raises(ImportError, match=r"featurelab\.experiments\.fake: CATALOG lists"):
        experiments.module_experiments("fake")
    fake.CATALOG = (Entry("template", ("quick", "tiny"), "the same presets", 99),)
    assert experiments.module_experiments("fake") == {"template": template.EXPERIMENT}
