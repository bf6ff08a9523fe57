"""The Ray backend: a sweep run as Ray tasks on a local head (127.0.0.1) gives the local
backend's results and claims, survives a worker killed mid-sweep (the task is retried), and
``--resume`` continues a local run on Ray. The handshake against a head started with token authentication
reads its versions with the token and refuses a missing or wrong one at once."""

import json
import os
import platform
from pathlib import Path

import pytest

from featurelab.errors import FeaturelabError
from featurelab.runs.ray_backend import handshake
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


@pytest.fixture(scope="module")
def token_head():
    """A Ray head started by ``ray start --head --block`` with ``RAY_AUTH_MODE=token`` on a free port of
    127.0.0.1 (its own process group, ended at teardown): its address and token, once its GCS answers."""
    import shutil
    import signal
    import socket
    import subprocess
    import sys
    import tempfile
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="fl-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    token = "featurelab-test-token-0123456789abcdef"
    env = os.environ | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}"]
    command += ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--include-dashboard=false", f"--temp-dir={temp}"]
    proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with pytest.MonkeyPatch.context() as mp:
                    mp.setenv("RAY_AUTH_TOKEN", token)
                    handshake(address, timeout=1)  # its GCS answers and has stated its versions
                break
            except FeaturelabError:
                time.sleep(0.5)
        else:
            why = proc.stderr.read().decode()[-300:] if proc.stderr and proc.poll() is not None else "still starting"
            pytest.skip(f"no Ray head came up on {address} within 90 s: {why}")
        yield address, token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.ray
def test_the_handshake_with_a_real_head_that_requires_a_token(token_head, monkeypatch, tmp_path):
    """Against Ray's own head: its versions with the token; a missing or wrong token is one line at once, where
    ``ray.init`` retries for 20 s and then reports a failed connection."""
    import time

    address, token = token_head
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("pathlib.Path.home", staticmethod(lambda: tmp_path))  # no ~/.ray/auth_token
    for env, message in ((None, "requires token authentication"), ("wrong", "refused the token from RAY_AUTH_TOKEN")):
        if env:
            monkeypatch.setenv("RAY_AUTH_TOKEN", env)
        t0 = time.monotonic()
        with pytest.raises(FeaturelabError, match=message):
            handshake(address)
        assert time.monotonic() - t0 < 2
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    head = handshake(address)
    assert head["ray_version"] == ray.__version__ and head["python_version"] == platform.python_version()
