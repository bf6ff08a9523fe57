"""SIGTERM stops `featurelab run` like Ctrl-C: exit status 143, one line saying how to continue, the
workers stopped, no warning of leaked resources; a model factory that calls ``exit(0)`` is one line and
status 2, never a silent success."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from featurelab.cli import main
from test_run_folders import INTERRUPTED


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").exists(), reason="reads /proc")
def test_sigterm_stops_a_run_like_ctrl_c(tmp_path):
    script, run = tmp_path / "sweep.py", tmp_path / "run"
    script.write_text(INTERRUPTED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    proc = subprocess.Popen([sys.executable, str(script), str(run)], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while len(list(run.glob("units/*/history.csv"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    err = proc.stderr.read()
    assert rc == 143, err
    assert err.strip().splitlines() == [
        "featurelab: terminated (SIGTERM); continue with the same command plus --resume"
    ]
    assert (run / "config.yaml").exists() and not (run / "results.json").exists()


def test_a_factory_that_calls_exit_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "quits.py").write_text("import sys\n\ndef model():\n    sys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "analysis"
    assert main(["analyze", "quits:model", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exit(0)" in err[0], err
    assert not out.exists()
