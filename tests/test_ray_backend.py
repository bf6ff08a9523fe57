"""The Ray backend: a sweep run as Ray tasks on a local head (127.0.0.1) gives the local
backend's results and claims, survives a worker killed mid-sweep (the task is retried), and
``--resume`` continues a local run on Ray."""

import json
import os
from pathlib import Path

import pytest

from featurelab.runs.runner import run_experiment
from test_sweep import SEEDS, max_weight_difference

ray = pytest.importorskip("ray", reason='the optional Ray extra is not installed (pip install "featlab[ray]")')


@pytest.fixture(scope="module")
def local_head():
    tests = str(Path(__file__).parent)
    ray.init(
        num_cpus=2,
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}},
    )
    yield
    ray.shutdown()


@pytest.mark.ray
def test_ray_sweep_matches_local_and_survives_a_killed_worker(tmp_path, local_head):
    local = run_experiment(SEEDS.name, out=tmp_path / "local", workers=2, progress=False)
    marker = tmp_path / "killed"
    remote = run_experiment(
        SEEDS.name,
        out=tmp_path / "ray",
        workers=2,
        progress=False,
        backend="ray",
        retries=2,
        overrides={"kill_marker": str(marker)},
    )
    assert marker.exists()  # a worker process did die mid-sweep (the first ensemble's task)
    record = json.loads((tmp_path / "ray" / "results.json").read_text())
    assert record["failed"] == {} and record["ensembles"] == [2, 2] and remote.all_passed
    assert [c["passed"] for c in remote.claims] == [c["passed"] for c in local.claims]
    assert max_weight_difference(tmp_path / "ray", tmp_path / "local") < 1e-10


@pytest.mark.ray
def test_resume_a_local_run_on_ray(tmp_path, local_head):
    run = tmp_path / "run"
    settings = {"kill_marker": str(tmp_path / "failed"), "kill_mode": "raise"}
    first = run_experiment(SEEDS.name, out=run, workers=1, progress=False, overrides=settings)
    assert not first.all_passed
    again = run_experiment(SEEDS.name, out=run, progress=False, backend="ray", resume=True, overrides=settings)
    record = json.loads((run / "results.json").read_text())
    assert len(record["skipped_on_resume"]) == 3 and record["failed"] == {} and again.all_passed
    assert (run / "units" / "s0-lam0" / "history.csv").exists()  # the task's files landed on the driver


@pytest.mark.ray
def test_ray_task_that_keeps_dying_is_reported_failed(tmp_path, local_head):
    """retries=0: the killed task is not re-run; its units are failed, the others finish."""
    remote = run_experiment(
        SEEDS.name,
        out=tmp_path / "ray",
        workers=2,
        progress=False,
        backend="ray",
        retries=0,
        overrides={"kill_marker": str(tmp_path / "killed")},
    )
    record = json.loads((tmp_path / "ray" / "results.json").read_text())
    assert sorted(record["failed"]) == ["s0-lam0", "s0-lam0.01"]
    assert all("ray task failed: " in e and "dies 0 times" in e for e in record["failed"].values())
    assert not remote.all_passed and len(remote.claims) == 2
