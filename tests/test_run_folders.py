"""Run folders that can be trusted: one writer at a time (an OS lock), a finished run never changes,
every stored result and checkpoint is checked against its sha256, every file a command reads gives a
one-line error when damaged, claims resting on a collapsed network are "not measured", bad input is
refused before anything is written, and sweep workers never outlive their parent.

`TINY` is a test-only experiment (2 units: a small float64 MLP regression, 40 Adam steps); its unit
``dead`` starts from zero weights, where every gradient vanishes: a network whose output never depends
on its input.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from featurelab import FeaturelabError
from featurelab.claims import claim
from featurelab.cli import main
from featurelab.config import ExperimentConfig, parse_overrides
from featurelab.data import Dataset, bottleneck_teacher
from featurelab.experiments import REGISTRY
from featurelab.experiments.base import Analysis, Experiment, TrainingUnit
from featurelab.models import MLP, LeakyResNet
from featurelab.runs.lock import LOCK_NAME, RunLock
from featurelab.runs.report import render_report
from featurelab.runs.runner import run_experiment
from featurelab.training import Phase, TrainConfig, train
from featurelab.training.health import training_health


class TinyConfig(ExperimentConfig):
    dead: bool = False  # add a unit that starts from zero weights
    fail: bool = False  # the unit "b" raises in finish
    sleep: float = 0.0  # seconds each unit's finish waits (a long sweep)
    steps: int = 40
    width: int = 6  # of the MLP's hidden layers


def tiny_units(cfg):
    return [{"id": u} for u in ("a", "b", *(["dead"] if cfg.dead else []))]


def tiny_build(cfg, unit):
    data = bottleneck_teacher((4, 2, 4), "fcnn", 8, 24, 8, teacher_seed=cfg.seed, data_seed=cfg.seed + 1)
    scale = 0.0 if unit["id"] == "dead" else 1.0
    model = MLP(4, 4, cfg.width, 3, init_scale=scale, seed=cfg.seed + (unit["id"] == "b"), dtype=torch.float64)
    tc = TrainConfig(lam=1e-3, phases=[Phase(steps=cfg.steps, lr=1e-2)], log_every=10, checkpoint_every=10)
    return TrainingUnit(model, data, tc)


def tiny_finish(cfg, unit, model, result, ctx):
    if cfg.fail and unit["id"] == "b":
        raise RuntimeError("injected failure")
    time.sleep(cfg.sleep)
    return {"final_loss": float(result.history["loss"].iloc[-1])}


def tiny_analyze(cfg, results, ctx):
    worst = max(results[u]["final_loss"] for u in ("a", "b"))  # needs both units
    return Analysis(
        [claim("the loss falls below its start", "test", "< 10", worst, worst < 10, id="bounded")],
        tables={"losses": __import__("pandas").DataFrame({"unit": list(results)})},
    )


TINY = Experiment(
    name="test-run-folders",
    summary="test-only two-unit regression",
    reference="tests",
    config=TinyConfig,
    presets={"quick": {}},
    units=tiny_units,
    analyze=tiny_analyze,
    build=tiny_build,
    finish=tiny_finish,
)
REGISTRY[TINY.name] = TINY


def tiny(out, **kw):
    return run_experiment(TINY.name, out=out, workers=1, progress=False, **kw)


def files(folder: Path) -> dict:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != LOCK_NAME}


def one_line(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run = tmp_path_factory.mktemp("finished") / "run"
    tiny(run)
    return run


# ----------------------------------------------------------------------------------- lock
def test_second_writer_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    with RunLock(run):
        with pytest.raises(FeaturelabError) as exc:
            tiny(run)
    assert f"process {os.getpid()} (started " in one_line(exc)
    assert not (run / "config.yaml").exists()


@pytest.mark.slow
def test_second_writer_from_the_command_line_gets_one_line(tmp_path):
    run = tmp_path / "run"
    with RunLock(run):
        proc = subprocess.run(
            [sys.executable, "-m", "featurelab.cli", "run", "leaky-bottleneck", "--preset", "tiny", "--out", str(run)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"is being written by process {os.getpid()}" in proc.stderr


def test_report_of_a_folder_being_written_says_what_report_can_do(finished, tmp_path, capsys):
    run = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished), str(run)], check=True)
    with RunLock(run):
        assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"featurelab: error: run folder '{run}' is being written by process {os.getpid()} (")
    assert err.endswith("); wait for it to finish, then try again\n") and err.count("\n") == 1


def test_lock_of_a_dead_process_is_taken_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text(json.dumps({"pid": 2**22 + 12345, "started": "long ago"}))  # no OS lock held
    assert tiny(run).claims[0]["passed"] is True


# ------------------------------------------------------------------- finished runs, checksums
def test_resume_of_a_finished_run_refuses_a_garbled_file_and_changes_nothing(finished, tmp_path):
    run = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished), str(run)], check=True)
    (run / "units" / "a" / "history.csv").write_bytes(b"\xff\xfe\x00garbage")
    before = files(run)
    with pytest.raises(FeaturelabError, match="history.csv' differs from the sha256 in its manifest"):
        tiny(run, resume=True)
    assert files(run) == before


def test_results_json_is_written_only_after_the_report(tmp_path, monkeypatch):
    import featurelab.runs.runner as runner

    def broken(*args):
        raise RuntimeError("report failed")

    monkeypatch.setattr(runner, "render_report", broken)
    with pytest.raises(RuntimeError):
        tiny(tmp_path / "run")
    assert (tmp_path / "run" / "claims.json").exists() and not (tmp_path / "run" / "results.json").exists()
    monkeypatch.undo()
    record = tiny(tmp_path / "run", resume=True)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["skipped_on_resume"] == ["a", "b"]
    assert not record.already_finished


def unfinished(tmp_path, monkeypatch) -> Path:
    """A run whose units finished but whose report did not."""
    import featurelab.runs.runner as runner

    monkeypatch.setattr(runner, "render_report", lambda *a: (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError):
        tiny(tmp_path / "run")
    monkeypatch.undo()
    return tmp_path / "run"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda t: t.replace('"final_loss": ', '"final_loss": 1'), "fails its sha256 checksum"),
        (lambda t: t[: len(t) // 2], "is not valid JSON"),
    ],
)
def test_damaged_unit_result_is_one_line_naming_the_file_and_the_fix(tmp_path, monkeypatch, damage, message):
    run = unfinished(tmp_path, monkeypatch)
    path = run / "units" / "a" / "result.json"
    path.write_text(damage(path.read_text()))
    with pytest.raises(FeaturelabError) as exc:
        tiny(run, resume=True)
    assert message in one_line(exc) and str(path) in str(exc.value) and "delete the folder" in str(exc.value)


def interrupted_training(folder: Path, model_fn, config):
    class Stop:  # interrupted after the checkpoint of step 10 was written
        def on_step(self, step, *args):
            if step == 11:
                raise KeyboardInterrupt

    data = bottleneck_teacher((4, 2, 4), "fcnn", 8, 24, 0, teacher_seed=0, data_seed=1)
    with pytest.raises(KeyboardInterrupt):
        train(model_fn(), data, config, run_dir=folder, callbacks=[Stop()])
    assert (folder / "checkpoint.safetensors").exists()
    return data


def test_checkpoint_with_other_weights_or_nan_bytes_is_refused(tmp_path):
    config = TrainConfig(lam=1e-3, phases=[Phase(steps=20, lr=1e-2)], log_every=10, checkpoint_every=10)
    make = lambda: MLP(4, 4, 6, 3, seed=0, dtype=torch.float64)  # noqa: E731
    data = interrupted_training(tmp_path, make, config)
    path = tmp_path / "checkpoint.safetensors"
    original = path.read_bytes()
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    tensors = {k: (v * 1.5 if k.startswith("model.") else v) for k, v in tensors.items()}  # finite, different
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(FeaturelabError) as exc:
        train(make(), data, config, run_dir=tmp_path, resume=True)
    assert "fails its sha256 checksum" in one_line(exc) and str(path) in str(exc.value)
    path.write_bytes(original[:-8] + torch.tensor([float("nan")], dtype=torch.float64).numpy().tobytes())
    with pytest.raises(FeaturelabError, match="fails its sha256 checksum"):
        train(make(), data, config, run_dir=tmp_path, resume=True)
    path.write_bytes(original)
    other = TrainConfig(lam=1e-2, phases=[Phase(steps=20, lr=1e-2)], log_every=10, checkpoint_every=10)
    with pytest.raises(FeaturelabError, match="another config"):
        train(make(), data, other, run_dir=tmp_path, resume=True)
    path.write_bytes(original[:100])
    with pytest.raises(FeaturelabError, match="is not a valid safetensors file"):
        train(make(), data, config, run_dir=tmp_path, resume=True)


def test_resume_keeps_the_float64_step_buffer_and_is_bit_identical(tmp_path):
    config = TrainConfig(lam=1e-2, phases=[Phase(steps=20, lr=1e-2)], log_every=10, checkpoint_every=10)
    make = lambda: LeakyResNet(4, 4, 6, 8, 4.0, seed=0)  # noqa: E731  float32 weights, float64 ρ
    data = interrupted_training(tmp_path, make, config)
    reference = train(make(), data, config)
    model = make()
    resumed = train(model, data, config, run_dir=tmp_path, resume=True)
    assert model.rho.dtype == torch.float64
    assert load_file(str(tmp_path / "model.safetensors"))["rho"].dtype == torch.float64
    assert resumed.history["loss"].iloc[-1] == reference.history["loss"].iloc[-1]


KILLED_SWEEP = """
import os, signal, sys
from pathlib import Path

sys.path.insert(0, {tests!r})
import featurelab.training.engine as engine
from test_run_folders import tiny

original = engine.save_checkpoint


def save_then_die(folder, model, optimizer, info, *extra):
    original(folder, model, optimizer, info, *extra)
    if info["step"] == 20 and Path(folder).name == "b":  # the ensemble's last member is saved
        os.kill(os.getpid(), signal.SIGKILL)


engine.save_checkpoint = save_then_die
tiny(Path({out!r}), overrides={{"width": {width}}})
"""


def as_text(obj) -> str:
    """JSON with every float as its shortest round-trip repr: equal texts are equal bits (NaN included)."""
    return json.dumps(obj, sort_keys=True)


@pytest.fixture(scope="module")
def killed_sweep(tmp_path_factory) -> Path:
    """The test experiment (hidden width 16; its two units train as one ensemble) killed by SIGKILL right
    after both units saved the checkpoint of step 20 (of 40): a run folder to copy, never changed."""
    from featurelab.training.checkpoint import load_checkpoint

    run = tmp_path_factory.mktemp("killed") / "run"
    script = KILLED_SWEEP.format(tests=str(Path(__file__).parent), out=str(run), width=16)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    for unit in ("a", "b"):
        info = load_checkpoint(run / "units" / unit)[1]
        assert (info["step"], info["done"], info["ensemble"]) == (20, False, ["a", "b"])
        assert not (run / "units" / unit / "result.json").exists()
    return run


def test_a_sweep_killed_mid_ensemble_resumes_bit_identically(killed_sweep, tmp_path):
    """``--resume`` of `killed_sweep`: the members continue together, so every tensor saved (models,
    checkpoints with their optimizer state), every history entry, unit result, claim and summary number
    equals the uninterrupted run's bit for bit. Resumed one by one, each member sums its matmuls in another
    order (the weights differ by about 1e-16) and the results record no ensemble."""
    from featurelab.io import read_json
    from featurelab.training.checkpoint import load_tensors

    finished, run, width = tmp_path / "whole", tmp_path / "run", 16
    tiny(finished, overrides={"width": width})
    shutil.copytree(killed_sweep, run)
    tiny(run, resume=True, overrides={"width": width})
    units = sorted(p.name for p in (finished / "units").iterdir())
    assert units == sorted(p.name for p in (run / "units").iterdir()) == ["a", "b"]
    for unit in units:
        whole, cut = finished / "units" / unit, run / "units" / unit
        names = sorted(p.name for p in whole.glob("*.safetensors"))
        assert names == sorted(p.name for p in cut.glob("*.safetensors")) and "checkpoint.safetensors" in names
        for name in names:
            a, b = load_tensors(whole / name), load_tensors(cut / name)
            assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
        history = lambda f: pd.read_csv(f / "history.csv").drop(columns="seconds")  # noqa: E731
        pd.testing.assert_frame_equal(history(whole), history(cut), check_exact=True)
        result = lambda f: read_json(f / "result.json", checksum=True)["result"]  # noqa: E731
        assert as_text(result(whole)) == as_text(result(cut)), unit
        assert not (cut / "ensemble_fallback.txt").exists()
    assert (finished / "claims.json").read_text() == (run / "claims.json").read_text()
    timing = {"seconds", "unit_seconds", "skipped_on_resume"}
    results = lambda f: {k: v for k, v in json.loads((f / "results.json").read_text()).items() if k not in timing}  # noqa: E731
    assert as_text(results(finished)) == as_text(results(run))
    assert results(run)["ensembles"] == [2]  # resumed together


def test_only_a_whole_interrupted_ensemble_is_regrouped(killed_sweep, tmp_path):
    """The sweep's plan regroups the members of `killed_sweep` as one ensemble, in their order; a member
    that is gone (fresh again), damaged or finished leaves the others to resume one by one."""
    from featurelab.config import validate
    from featurelab.runs.sweep import plan

    cfg, run = validate(TinyConfig, {"width": 16}, TINY.name), tmp_path / "run"
    units = [{"id": "a"}, {"id": "b"}]

    def items(pending):
        return plan(TINY, cfg, pending, run, batch=True, workers=1)[0]

    shutil.copytree(killed_sweep, run)
    assert items(units[::-1]) == [units]
    checkpoint = run / "units" / "b" / "checkpoint.safetensors"
    original = checkpoint.read_bytes()
    checkpoint.write_bytes(original[:-8])  # damaged: b reports it, a resumes alone
    assert items(units) == [[units[0]], [units[1]]]
    checkpoint.unlink()  # b fresh (planned first, alone): a resumes alone
    assert items(units) == [[units[1]], [units[0]]]
    checkpoint.write_bytes(original)  # b finished (not pending), another unit fresh: a resumes alone
    assert items([units[0], {"id": "c"}]) == [[{"id": "c"}], [units[0]]]


def test_a_fresh_ensemble_that_cannot_run_falls_back_to_runs_from_scratch(tmp_path, monkeypatch):
    """A run started with ``--resume`` whose fresh ensemble fails after writing (here: unreadable
    checkpoints): each member trains alone from scratch, never from what the failed ensemble left."""
    import featurelab.training.ensemble as ensemble

    def fails(models, datas, configs, *, run_dirs, **kwargs):
        for folder in run_dirs:
            (Path(folder) / "checkpoint.safetensors").write_bytes(b"partial")
        raise RuntimeError("cannot batch")

    monkeypatch.setattr(ensemble, "train_ensemble", fails)
    record = tiny(tmp_path / "run", resume=True)
    assert record.failed == {} and record.claims[0]["passed"] is True
    assert all((tmp_path / "run" / "units" / u / "ensemble_fallback.txt").exists() for u in ("a", "b"))


# ---------------------------------------------------------------------- files a command reads
@pytest.mark.parametrize(
    "name, content, message",
    [
        ("claims.json", b'[{"statement": "x"', "is not valid JSON"),
        (
            "claims.json",
            b'[{"statement": "x", "reference": "", "expected": "", "measured": "", "tolerance": ""}]',
            "lacks passed",
        ),
        ("claims.json", None, "is missing"),
        ("results.json", b"\x00\xff\x13binary", "cannot be read"),
        ("results.json", b"[1, 2]", "holds a list, not a dict"),
        ("config.yaml", b"a: [1, 2", "is not valid YAML"),
        ("tables/losses.csv", b'a,b\n"1,2\n3', "is not a valid CSV table"),
    ],
)
def test_report_checks_every_file_it_reads(finished, tmp_path, name, content, message):
    run = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished), str(run)], check=True)
    if content is None:
        (run / name).unlink()
    else:
        (run / name).write_bytes(content)
    with pytest.raises(FeaturelabError) as exc:
        render_report(run)
    assert message in one_line(exc) and str(run / name) in str(exc.value)


def test_empty_table_renders(finished, tmp_path):
    run = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished), str(run)], check=True)
    (run / "tables" / "fits.csv").write_text("\n")  # what an empty DataFrame writes
    assert "<h2>Table: fits</h2>(empty)" in render_report(run).read_text()


@pytest.mark.parametrize(
    "content, message",
    [(b"seed: [0", "is not valid YAML"), (b"\x89PNG\x00\xff", "cannot be read"), (b"- 1\n- 2\n", "not a dict")],
)
def test_damaged_config_on_resume_is_one_line(finished, tmp_path, content, message):
    run = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(finished), str(run)], check=True)
    for name in ("manifest.json", "results.json"):  # an interrupted run: no manifest vouches for the folder yet
        (run / name).unlink()
    (run / "config.yaml").write_bytes(content)
    with pytest.raises(FeaturelabError) as exc:
        tiny(run, resume=True)
    assert message in one_line(exc) and "config.yaml" in str(exc.value)


# ---------------------------------------------------------------------------------- health
def test_training_health_closed_cases():
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.5]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 0, 0])  # 0 exactly where x1 >= x2
    data = Dataset(X, labels, X[:0], labels[:0], n_classes=2)
    net = torch.nn.Linear(2, 2, dtype=torch.float64)
    with torch.no_grad():  # logits (x1 - x2, x2 - x1): argmax 0 exactly where x1 >= x2 (ties go to 0)
        net.weight.copy_(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
        net.bias.zero_()
    assert training_health(net, data, "cross_entropy") == ""  # every label right
    flipped = Dataset(X, 1 - labels, X[:0], labels[:0], n_classes=2)
    # every label wrong: error 1 >= the majority-class guess's 1/4
    assert training_health(net, flipped, "cross_entropy").startswith("chance level: training error 1 vs 0.25")
    with torch.no_grad():
        net.weight.zero_()
    assert training_health(net, data, "cross_entropy").startswith("collapsed: the output is the same")
    with torch.no_grad():
        net.bias.fill_(float("nan"))
    assert training_health(net, data, "cross_entropy").startswith("diverged")


def test_unhealthy_unit_leaves_claims_not_measured_and_exits_1(tmp_path, capsys):
    record = tiny(tmp_path / "api", overrides={"dead": True})
    assert record.unhealthy.keys() == {"dead"} and "collapsed" in record.unhealthy["dead"]
    (c,) = [c for c in record.claims if c["id"] == "bounded"]
    assert c["passed"] is None and c["reason"].startswith("unit unhealthy: dead: collapsed")
    html = (tmp_path / "api" / "report.html").read_text()
    assert "NOT MEASURED" in html and "Unhealthy runs" in html
    rc = main(["run", TINY.name, "--out", str(tmp_path / "cli"), "--workers", "1", "--quiet", "--set", "dead=true"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 1 and out[-1].startswith("featurelab: units 1 unhealthy (dead)")
    assert any("[NOT MEASURED] the loss falls" in line for line in out)


def test_failed_unit_exits_1_and_an_analysis_that_needs_it_is_one_line(tmp_path, capsys):
    with pytest.raises(FeaturelabError) as exc:
        tiny(tmp_path / "run", overrides={"fail": True})
    assert "cannot do without its 1 failed units (b; first: RuntimeError: injected failure)" in one_line(exc)


@pytest.mark.parametrize(
    "name, preset, sets, unhealthy",
    [
        ("escape-circle", "tiny", ["lr=1e30", "widths=[2]", "restarts=2", "steps=20", "rank_one_widths=[2]"], "dead"),
        ("alignment", "quick", ["lr=1000", "steps=200", "seeds=[1]", "n_train=50"], "collapsed"),
        (
            "width-plateau",
            "tiny",
            ["datasets=[digits]", "digits.adam_lr=1e6", "digits.widths=[4]", "digits.adam_steps=100"],
            "unit unhealthy: digits-w4-t0",  # chance level after training; the float64 polish may collapse it
        ),
    ],
)
def test_claims_on_dead_networks_are_not_measured(tmp_path, capsys, name, preset, sets, unhealthy):
    args = ["run", name, "--preset", preset, "--out", str(tmp_path / "run"), "--quiet", "--workers", "1"]
    rc = main(args + [a for s in sets for a in ("--set", s)])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 1 and "unhealthy" in out[-1]
    claims = [c for c in json.loads((tmp_path / "run" / "claims.json").read_text()) if c["id"] != "sweep-complete"]
    assert claims and all(c["passed"] is None and unhealthy in c["reason"] for c in claims)


# ------------------------------------------------------------------------------ validation
def no_folder_left(run: Path) -> bool:
    return not run.exists()


@pytest.mark.parametrize(
    "name, preset, overrides, kwargs, message",
    [
        ("leaky-bottleneck", "tiny", "lam=inf", {}, "lam=inf is not allowed"),
        ("leaky-bottleneck", "tiny", "lam=1e400", {}, "lam=inf is not allowed"),
        ("leaky-bottleneck", "tiny", "teacher_dims=[5,0,5]", {}, "teacher_dims.1=0 is not allowed"),
        ("leaky-bottleneck", "tiny", "width=true", {}, "width=True is not allowed"),
        ("leaky-bottleneck", "tiny", "depth=1000000000", {}, "would need about"),
        ("leaky-bottleneck", "tiny", "", {"seed": -1}, "seeds must lie in [0, 2**32)"),
        ("leaky-bottleneck", "tiny", "", {"seed": 2**64}, "seeds must lie in [0, 2**32)"),
        ("leaky-bottleneck", "tiny", "", {"workers": 0}, "workers=0 is not allowed"),
        ("leaky-bottleneck", "tiny", "", {"workers": -1}, "workers=-1 is not allowed"),
        ("leaky-bottleneck", "tiny", "", {"workers": "2"}, "workers='2' is not allowed"),
        ("leaky-bottleneck", "tiny", "", {"threads": 0}, "threads=0 is not allowed"),
        ("leaky-bottleneck", "tiny", "", {"overrides": "lam=1"}, "overrides='lam=1' is not allowed"),
        ("escape-circle", "tiny", "widths=[8,8]", {}, "would share the id 'pgd-w8'"),
        ("relu-noninvariance", "quick", "etas=[.nan,0.1]", {}, "etas.0=nan is not allowed"),
        ("relu-noninvariance", "quick", "etas=[-0.1,0.1]", {}, "etas.0=-0.1 is not allowed"),
        ("invariances", "quick", "archs=[foo]", {}, "archs=['foo'] is not allowed"),
        ("width-plateau", "paper", "", {}, "mnist path is not set"),
        ("forces", "paper", "", {}, "mnist path is not set"),
        ("forces", "tiny", "", {"overrides": {"dataset": "mnist", "mnist_path": "/no/mnist"}}, "does not exist"),
        ("saddle-mnist", "quick", "", {}, "mnist path is not set"),
        ("bn-rank-depth", "quick", "width=1000000", {}, "would need about"),
    ],
)
def test_bad_config_is_one_line_before_anything_is_written(
    tmp_path, monkeypatch, name, preset, overrides, kwargs, message
):
    monkeypatch.delenv("FEATURELAB_MNIST", raising=False)
    run = tmp_path / "run"
    args = {"overrides": parse_overrides([overrides] if overrides else []), **kwargs}
    with pytest.raises(FeaturelabError) as exc:
        run_experiment(name, preset, out=run, progress=False, **args)
    assert message in one_line(exc) and no_folder_left(run)


def test_bad_out_is_one_line(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    for out, message in [
        (file, "is a file, not a folder"),
        (file / "sub", "lies under the file"),
        (123, "out=123 is not allowed"),
    ]:
        with pytest.raises(FeaturelabError) as exc:
            tiny(out)
        assert message in one_line(exc)
    if Path("/proc").exists():  # no folder can be made there, not even by root
        with pytest.raises(FeaturelabError, match="cannot write '/proc/featurelab-run'"):
            tiny("/proc/featurelab-run")


def test_a_run_inside_another_runs_folder_is_refused(finished, tmp_path, capsys):
    unfinished = tmp_path / "unfinished"  # a run killed early: config.yaml and units/ only
    (unfinished / "units" / "a").mkdir(parents=True)
    (unfinished / "config.yaml").write_text("seed: 0\n")
    for parent, out in [
        (finished, finished / "units" / "new"),
        (finished, finished / "tables" / "deeper" / "new"),
        (unfinished, unfinished / "units" / "a" / "new"),
    ]:
        assert main(["run", TINY.name, "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert (
            err
            == f"featurelab: error: --out '{out}' lies inside the run folder '{parent}'; choose a folder outside it\n"
        )
        assert not out.exists()
    sibling = tmp_path / "units" / "new"  # a folder called units/ next to a run is no run folder
    assert tiny(sibling).claims[0]["passed"] is True


def test_every_file_takes_the_umask(tmp_path):
    for umask, file_mode, dir_mode in ((0o022, 0o644, 0o755), (0o027, 0o640, 0o750)):
        run = tmp_path / f"run{umask:o}"
        old = os.umask(umask)
        try:
            tiny(run)
        finally:
            os.umask(old)
        paths = [run, *run.rglob("*")]
        assert {p.stat().st_mode & 0o777 for p in paths if p.is_file()} == {file_mode}
        assert {p.stat().st_mode & 0o777 for p in paths if p.is_dir()} == {dir_mode}


def test_temporaries_of_a_killed_writer_are_removed_by_the_next_writer(tmp_path, monkeypatch):
    run = unfinished(tmp_path, monkeypatch)
    left = [  # what a writer killed mid-write leaves (old and new temporary names)
        run / "units" / "a" / ".checkpoint.safetensors.k2j4_x9a.tmp",
        run / ".results.json.0a1b2c3d.tmp",
        run / "tables" / ".losses.csv.5f3e9a01.tmp",
    ]
    kept = [run / "units" / "a" / "notes.tmp", run / ".draft.tmp", run / "units" / ".a.b.toolongname.tmp"]
    with RunLock(run):  # a live writer's temporaries are never touched by a refused one
        for p in left + kept:
            p.write_bytes(b"partial")
        with pytest.raises(FeaturelabError, match="is being written by"):
            tiny(run, resume=True)
        assert all(p.exists() for p in left)
    tiny(run, resume=True)
    assert not any(p.exists() for p in left) and all(p.exists() for p in kept)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda X, Y: (None, Dataset(X, Y, X[:0], Y[:0])), "model=NoneType is not allowed"),
        (lambda X, Y: (MLP(3, 2, 4, 2, dtype=torch.float64), Dataset(X, Y, X[:0], Y[:0])), "cannot take data.X_train"),
        (lambda X, Y: (MLP(4, 3, 4, 2, dtype=torch.float64), Dataset(X, Y, X[:0], Y[:0])), "the model has 3 outputs"),
        (lambda X, Y: (MLP(4, 2, 4, 2, dtype=torch.float64), Dataset(X, Y[:5], X[:0], Y[:0])), "has 5 rows but"),
        (lambda X, Y: (MLP(4, 2, 4, 2, dtype=torch.float64), Dataset(X, Y[:, 0], X[:0], Y[:0])), "must be N x d_out"),
        (lambda X, Y: (MLP(4, 2, 4, 2, dtype=torch.float64), Dataset(X[None], Y, X[:0], Y[:0])), "float matrix"),
        (lambda X, Y: (MLP(4, 2, 4, 2, dtype=torch.float64), Dataset(X.long(), Y, X[:0], Y[:0])), "float matrix"),
        (lambda X, Y: (MLP(4, 2, 4, 2, dtype=torch.float64), Dataset(X, Y.numpy(), X[:0], Y[:0])), None),
        (
            lambda X, Y: (
                MLP(4, 2, 4, 2, dtype=torch.float64),
                Dataset(X, torch.arange(8) % 3, X[:0], Y[:0, 0].long()),
            ),
            "labels must lie in [0, 1]",
        ),
    ],
)
def test_train_checks_its_arguments_in_one_line(make, message):
    X = torch.randn(8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model, data = make(X, X[:, :2].clone())
    config = TrainConfig(
        objective="cross_entropy" if data.Y_train.dtype == torch.int64 else "mse", phases=[Phase(steps=2, lr=1e-3)]
    )
    if message is None:  # numpy arrays are taken as tensors
        assert len(train(model, data, config).history) == 2
        return
    with pytest.raises(FeaturelabError) as exc:
        train(model, data, config)
    assert message in one_line(exc)


def test_measurements_rescale_or_refuse_in_one_line():
    from featurelab.measurements import cost_of_identity, stable_rank
    from featurelab.measurements.escape import find_escape_directions

    A = torch.randn(12, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    coi = cost_of_identity(A, bias=False, gamma=0.1)
    assert cost_of_identity(A * 1e155, bias=False, gamma=0.1) == pytest.approx(coi, rel=1e-12)  # scale-invariant
    assert stable_rank(A * 1e155) == pytest.approx(stable_rank(A), rel=1e-12)
    for call, message in [
        (lambda: cost_of_identity(A * 1e155, gamma=0.1), "rescale A"),
        (lambda: cost_of_identity(A[:0]), "A has shape (0, 5)"),
        (lambda: cost_of_identity(A[:, :0]), "A has shape (12, 0)"),
        (lambda: find_escape_directions(A[:0, :2], A[:0, :2], 3, 4, restarts=1, steps=1), "X has shape (0, 2)"),
    ]:
        with pytest.raises(FeaturelabError, match=message.replace("(", r"\(").replace(")", r"\)")):
            call()


# ------------------------------------------------------------------------------- processes
WATCHED = """
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from featurelab.runs.sweep import watch_parent

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=watch_parent, initargs=(os.getpid(),))
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 120)
    time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_workers_die_with_their_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(WATCHED)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    assert alive(worker)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(worker)


INTERRUPTED = """
import signal, sys
from test_run_folders import TINY
from featurelab.cli import main

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, also when started in the background
    args = ["--out", sys.argv[1], "--workers", "2", "--quiet", "--no-batch", "--set", "sleep=120"]
    sys.exit(main(["run", TINY.name, *args]))
"""


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_ctrl_c_stops_a_sweep_within_seconds(tmp_path):
    script, run = tmp_path / "sweep.py", tmp_path / "run"
    script.write_text(INTERRUPTED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    proc = subprocess.Popen([sys.executable, str(script), str(run)], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while len(list(run.glob("units/*/history.csv"))) < 2 and time.monotonic() < deadline:  # both units in finish
        time.sleep(0.2)
    workers = children(proc.pid)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=30)
    err = proc.stderr.read()
    assert time.monotonic() - t0 < 10 and rc == 130, err
    assert "interrupted; continue with the same command plus --resume" in err
    time.sleep(1)
    assert not any(alive(w) for w in workers)
    assert (run / "config.yaml").exists() and not (run / "results.json").exists()


def test_unreachable_ray_cluster_is_one_line_before_anything_is_written(tmp_path):
    pytest.importorskip("ray")
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(FeaturelabError) as exc:
        tiny(tmp_path / "run", backend="ray", address=f"127.0.0.1:{port}")
    assert f"could not connect to the Ray cluster at 127.0.0.1:{port}" in one_line(exc)
    assert no_folder_left(tmp_path / "run")


def test_an_unhealthy_unit_gates_only_the_claims_resting_on_it():
    from featurelab.claims import claim
    from featurelab.runs.runner import _claim_gate

    everywhere = claim("rests on every unit", "ref", "> 0", 1.0, True, id="all")
    digits = claim("rests on the digits units", "ref", "> 0", 1.0, True, id="d").rests_on(["digits-w4-t0"])
    teacher = claim("rests on the teacher units", "ref", "> 0", 1.0, True, id="t").rests_on(["teacher-w1-t0"])
    gated = {c.id: c for c in _claim_gate([everywhere, digits, teacher], {"teacher-w1-t0": "collapsed: x"})}
    assert gated["all"].passed is None and gated["t"].passed is None
    assert gated["t"].reason == "unit unhealthy: teacher-w1-t0: collapsed: x"
    assert gated["d"].passed is True and gated["d"].reason == ""
    assert gated["d"].to_dict()["units"] == ("digits-w4-t0",)
