"""The command line answers without importing torch, its help lists what it can run, Ctrl-C at any moment is
one line and exit 130, and a terminal that cannot encode a path never crashes it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from featurelab.catalog import CATALOG, presets

CLI = [sys.executable, "-m", "featurelab.cli"]
# What the installed `featurelab` script runs. Under `python -m` the interpreter itself re-raises SIGINT at exit
# (status -2, after our one line) when a KeyboardInterrupt once escaped a nested PyRun_String, which C code run
# during an import may call.
ENTRY_POINT = [sys.executable, "-c", "import sys; from featurelab.cli import main; sys.exit(main())"]


def modules_after(*argv: str) -> set[str]:
    """The modules a fresh interpreter holds after `featurelab ARGV` (its output discarded)."""
    code = (
        "import contextlib, io, sys\n"
        "from featurelab.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        f"        main({list(argv)!r})\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(' '.join(sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


@pytest.mark.parametrize("argv", [("--help",), ("list",), ("run", "--help"), ("analyze", "--help")])
def test_help_and_list_import_no_torch(argv):
    loaded = modules_after(*argv)
    assert not {"torch", "numpy", "sklearn", "featurelab.experiments"} & loaded


def test_import_featurelab_is_lazy_and_complete():
    code = "import sys, featurelab as fl; print('torch' in sys.modules); print(fl.train.__module__, fl.MLP.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.split()
    assert out == ["False", "featurelab.training.trainer", "MLP"]


def test_catalog_agrees_with_the_registry():
    from featurelab.experiments import EXPERIMENTS

    assert [(e.name, e.presets) for e in CATALOG] == [(e.name, tuple(e.presets)) for e in EXPERIMENTS]


def test_every_help_has_examples_experiments_and_defaults():
    def help_of(*argv):
        return subprocess.run([*CLI, *argv, "--help"], capture_output=True, text=True, timeout=60).stdout

    for command in ("list", "run", "reproduce", "bench", "report", "analyze"):
        assert f"examples:\n  featurelab {command}" in help_of(command), command
    helps = [help_of(command) for command in ("run", "reproduce", "bench")] + [help_of()]
    for e in CATALOG:
        assert all(f"  {e.name} " in text for text in helps), e.name
    run_help = helps[0]
    assert "default quick" in " ".join(run_help.split())
    assert set(presets()) == {"quick", "tiny", "paper", "depth4", "paper-cpu"}


def _as_from_a_terminal() -> None:
    """In the child before it starts: SIGINT handled by default and not blocked, as a shell started from a terminal
    leaves it. A child inherits an ignored or blocked SIGINT from its parent (a test runner, or a library loaded in
    it, may set either), and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


@pytest.mark.parametrize("delay", [0.5, 2.0])
def test_ctrl_c_during_start_up_or_training_is_one_line(tmp_path, delay):
    """Ctrl-C reaches the whole process group, as from a terminal: while torch is imported (0.5 s) or
    while the tiny run trains (2 s)."""
    proc = subprocess.Popen(
        [*ENTRY_POINT, "run", "leaky-bottleneck", "--preset", "tiny", "--out", str(tmp_path / "run"), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )
    time.sleep(delay)
    if proc.poll() is not None:
        pytest.skip(f"the run finished within {delay} s")
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert err == "featurelab: interrupted; continue with the same command plus --resume\n"


def test_a_terminal_without_unicode_shows_the_path_replaced(tmp_path):
    out = tmp_path / "rün-θ"
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    proc = subprocess.run(
        [*CLI, "run", "leaky-bottleneck", "--preset", "tiny", "--out", str(out), "--quiet"],
        capture_output=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode in (0, 1) and not proc.stderr, proc.stderr.decode("ascii", "replace")  # 1: a claim failed
    assert f"report: {tmp_path.resolve()}/r?n-?/report.html".encode() in proc.stdout
    assert (out / "report.html").exists()
