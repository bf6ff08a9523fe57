"""The run from Python: ``overwrite=`` and ``resume=`` keywords (errors name them; the command line names its
flags), a build that raises stops the run at once naming its unit, progress bars with the time left, and the
run record's and training result's inline HTML (escaped)."""

import dataclasses
import re
import sys
import types

import pytest
import torch

import featurelab as fl
from featurelab import progress
from featurelab.claims import threshold_claim
from featurelab.cli import main
from featurelab.config import ExperimentConfig
from featurelab.data import bottleneck_teacher
from featurelab.experiments import REGISTRY
from featurelab.experiments.base import Analysis, Experiment, TrainingUnit
from featurelab.models import MLP
from featurelab.progress import show_progress
from featurelab.runs.runner import run_experiment
from featurelab.runs.work import BuildError
from featurelab.training import Phase, TrainConfig

BUILDS: list[tuple[str, str]] = []  # (unit, default device) of each build in this process, in order


class KeywordConfig(ExperimentConfig):
    broken: str = ""  # the unit whose build raises
    interrupt: bool = False  # the broken build raises KeyboardInterrupt instead


def units(cfg):
    return [{"id": "a"}, {"id": "b"}]


def build(cfg, unit):
    BUILDS.append((unit["id"], torch.empty(0).device.type))
    if unit["id"] == cfg.broken:
        if cfg.interrupt:
            raise KeyboardInterrupt
        raise RuntimeError("broken build <x>\nsecond line")
    data = bottleneck_teacher((3, 2, 3), "fcnn", 6, 12, 6, teacher_seed=0, data_seed=1)
    model = MLP(3, 3, 4, 2, seed=int(unit["id"] == "b"), dtype=torch.float64)
    return TrainingUnit(model, data, TrainConfig(lam=1e-3, phases=[Phase(steps=20, lr=1e-2)], log_every=10))


def finish(cfg, unit, model, result, ctx):
    return {"loss": float(result.history["loss"].iloc[-1])}


def analyze(cfg, results, ctx):
    worst = max(r["loss"] for r in results.values())
    return Analysis([threshold_claim("the loss <b>stays</b> finite", "tests", worst, 1e6, "<=", id="finite-loss")])


KEYWORDS = Experiment(
    name="test-run-keywords",
    summary="test-only two units",
    reference="tests",
    config=KeywordConfig,
    presets={"quick": {}},
    units=units,
    analyze=analyze,
    build=build,
    finish=finish,
)
REGISTRY[KEYWORDS.name] = KEYWORDS


def run(out, **kw):
    return run_experiment(KEYWORDS.name, out=out, workers=kw.pop("workers", 1), progress=False, **kw)


def test_an_existing_run_names_the_python_keywords_from_python_and_the_flags_from_the_command(tmp_path, capsys):
    run(tmp_path / "run")
    with pytest.raises(fl.FeaturelabError) as exc:
        run(tmp_path / "run")
    text = str(exc.value)
    assert "pass resume=True to continue it, overwrite=True to start over" in text and "--" not in text
    assert main(["run", KEYWORDS.name, "--out", str(tmp_path / "run"), "--quiet", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "pass --resume to continue it, --force to start over, or --out DIR for a new run" in err
    with pytest.raises(fl.FeaturelabError, match="^resume=True and overwrite=True exclude each other"):
        run(tmp_path / "run", resume=True, overwrite=True)
    assert run(tmp_path / "run", resume=True).already_finished is True


def test_overwrite_removes_the_old_run_and_starts_over(tmp_path, capsys):
    folder = tmp_path / "run"
    first = run(folder)
    stale = folder / "units" / "a" / "stale.txt"
    stale.write_text("from the old run")
    (folder / "figures").mkdir()
    (folder / "figures" / "old.png").write_bytes(b"not a png")
    again = run(folder, overwrite=True)
    assert again.already_finished is False and not stale.exists() and not (folder / "figures").exists()
    assert [c["id"] for c in again.claims] == [c["id"] for c in first.claims]
    assert main(["run", KEYWORDS.name, "--out", str(folder), "--quiet", "--workers", "1", "--force"]) == 0


@pytest.mark.parametrize("foreign", ["notes.txt", None])
def test_overwrite_refuses_a_folder_that_holds_no_run(tmp_path, foreign):
    """Only what a run writes is removed: a folder with any other file, or without the run's config.yaml, is
    refused in one line and left as it was."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "units").mkdir()
    keep = {folder / "units" / "data.csv": "1,2\n"}
    if foreign:
        keep[folder / "config.yaml"] = "seed: 0\n"
        keep[folder / foreign] = "precious\n"
    for path, text in keep.items():
        path.write_text(text)
    with pytest.raises(fl.FeaturelabError) as exc:
        run(folder, overwrite=True)
    assert "\n" not in str(exc.value) and str(exc.value).startswith("overwrite=True removes only a featurelab run")
    assert (repr(foreign) if foreign else "holds no config.yaml") in str(exc.value)
    assert all(path.read_text() == text for path, text in keep.items())


@pytest.mark.parametrize("batch,workers", [(True, 1), (False, 1), pytest.param(False, 2, marks=pytest.mark.slow)])
def test_a_build_that_raises_stops_the_run_at_once_naming_the_unit(tmp_path, batch, workers):
    """Planned ensembles (build in the parent), one-by-one units (build inside the unit's run) and worker
    processes: the run stops with one line naming the unit and the exception's first line, built once."""
    BUILDS.clear()
    with pytest.raises(BuildError) as exc:
        run(tmp_path / "run", overrides={"broken": "b"}, batch=batch, workers=workers)
    text = str(exc.value)
    assert "\n" not in text
    assert text.startswith("unit 'b' of test-run-keywords cannot be built: RuntimeError: broken build <x>")
    assert (tmp_path / "run" / "units" / "b" / "error.txt").read_text().count("broken build") >= 1
    assert not (tmp_path / "run" / "results.json").exists()
    if workers == 1:
        assert BUILDS.count(("b", "cpu")) == 1  # never retried (the memory estimate builds on "meta" first)


def test_units_that_cannot_be_listed_are_one_line_naming_the_experiment(tmp_path, monkeypatch):
    def broken_units(cfg):
        raise RuntimeError("no width\nmore")

    monkeypatch.setitem(REGISTRY, KEYWORDS.name, dataclasses.replace(KEYWORDS, units=broken_units))
    with pytest.raises(fl.FeaturelabError) as exc:
        run(tmp_path / "run")
    assert str(exc.value) == "the units of test-run-keywords cannot be listed: RuntimeError: no width"
    assert isinstance(exc.value.__cause__, RuntimeError) and not (tmp_path / "run").exists()


def test_ctrl_c_in_a_build_is_not_swallowed(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "run", overrides={"broken": "a", "interrupt": True})


def test_progress_shows_unit_and_step_bars_with_the_time_left(tmp_path, capsys, monkeypatch):
    class Eager(progress.text_bar):  # every update is drawn, however fast or slow this machine is
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "mininterval": 0})

    monkeypatch.setattr(progress, "text_bar", Eager)
    run_experiment(KEYWORDS.name, out=tmp_path / "run", workers=1, progress=True, batch=False)
    err = capsys.readouterr().err
    assert re.search(r"test-run-keywords: .*\d+/2 \[\d\d:\d\d<\d\d:\d\d", err)  # the units
    assert re.search(r"MLP: .*\d+/20 \[\d\d:\d\d<(\d\d:\d\d|\?), ", err)  # each unit's steps, time left ("?" at 0)
    run_experiment(KEYWORDS.name, out=tmp_path / "quiet", workers=1, progress=False, batch=False)
    assert capsys.readouterr().err == ""


def test_in_a_notebook_without_widgets_the_text_bars_share_one_line(tmp_path, capsys, monkeypatch):
    """A notebook's output cannot move the cursor up: the units' bar and each unit's step bar are drawn on one
    line (no newline, no cursor-up escape), where a terminal would stack them."""
    import featurelab.progress as progress

    monkeypatch.setattr(progress, "in_kernel", lambda: True)
    monkeypatch.setattr(progress, "_widget_bar", lambda: None)
    run_experiment(KEYWORDS.name, out=tmp_path / "run", workers=1, batch=False)  # progress=None: on in a kernel
    err = capsys.readouterr().err
    assert "test-run-keywords: " in err and "MLP: " in err
    assert "\x1b[A" not in err and "\n" not in err


def test_bars_are_on_by_default_in_a_notebook_kernel_only(monkeypatch):
    assert show_progress(None) is False  # pytest: stderr is no terminal, no kernel
    assert show_progress(True) is True and show_progress(False) is False
    shell = types.SimpleNamespace(kernel=object())
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    assert show_progress(None) is True and show_progress(False) is False
    shell.kernel = None  # a terminal IPython shell without a kernel: no notebook
    assert show_progress(None) is False


def test_run_record_renders_inline_escaped_with_its_claims_and_figures(tmp_path):
    record = run(tmp_path / "run")
    page = record._repr_html_()
    assert "<code>finite-loss</code>" in page and "the loss &lt;b&gt;stays&lt;/b&gt; finite" in page
    assert "<b>stays</b>" not in page and "NOT MEASURED" in page  # the legend
    assert page.count("<table") == page.count("overflow-x:auto;max-width:100%'><table")
    assert "RunRecord(" in repr(record) and "DataFrame" not in repr(record) and len(repr(record)) < 300


def test_train_result_renders_its_final_terms_and_curve_escaped():
    Net = type("<i>Net", (MLP,), {})
    data = bottleneck_teacher((3, 2, 3), "fcnn", 6, 12, 6, teacher_seed=0, data_seed=1)
    model = Net(3, 3, 4, 2, seed=0, dtype=torch.float64)
    result = fl.train(model, data, TrainConfig(lam=1e-3, phases=[Phase(steps=30, lr=1e-2)], log_every=10))
    page = result._repr_html_()
    last = result.history.iloc[-1]
    assert "&lt;i&gt;Net: 30 steps in" in page and "<i>Net" not in page
    for col in ("loss", "cost", "penalty"):
        assert f"<td>{last[col]:.4g}</td>" in page
    assert page.count("data:image/png;base64,") == 1
    assert repr(result).startswith("TrainResult(<i>Net: 30 steps in") and f"loss={last['loss']:.4g}" in repr(result)
