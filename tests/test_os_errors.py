"""The operating system refusing a write (a full disk, no permission, a read-only file system, too many
open files) ends in one line naming the path, the cause and the remedy; nothing is half-written, and
``--resume`` once the cause is gone gives what an uninterrupted run gives.

A full disk is simulated where the OS itself answers ENOSPC: the n-th temporary file of the atomic writer
is real, but its bytes go to ``/dev/full``, which refuses every write with ENOSPC. Real full and read-only
file systems are used where this machine allows mounting (a 2 MB tmpfs; a read-only bind mount).
"""

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from safetensors.torch import load_file

import featurelab.io as fio
from featurelab.cli import main
from featurelab.errors import WriteError
from featurelab.io import TEMPORARY, read_json, write_bytes
from featurelab.runs.runner import run_experiment
from test_run_folders import TINY

needs_dev_full = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")


def failing_writes(monkeypatch, n: int, code: int = errno.ENOSPC) -> list[Path]:
    """From now on the `n`-th file write (1-based; 0: none) fails with `code`: ENOSPC while the data is
    written (the temporary file exists, its bytes go to /dev/full), any other code when the temporary
    file is created (as `os.open` fails). Returns the paths written so far (a list that grows)."""
    real, written = fio._temporary, []

    def temporary(path):
        written.append(path)
        if len(written) != n:
            return real(path)
        if code != errno.ENOSPC:
            raise OSError(code, os.strerror(code), str(path))
        fd, tmp = real(path)
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), tmp

    monkeypatch.setattr(fio, "_temporary", temporary)
    return written


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if TEMPORARY.fullmatch(p.name)]


def check_complete(run: Path) -> None:
    """Every file in `run` is whole: JSON parses (results with their checksum), safetensors load."""
    for p in run.rglob("*"):
        if p.name == "result.json":
            read_json(p, checksum=True, kind=dict)
        elif p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix == ".safetensors":
            load_file(str(p))
        elif p.name == "report.html":
            assert p.read_text().rstrip().endswith("</html>")


def unit_results(run: Path) -> dict:
    return {p.parent.name: read_json(p, checksum=True)["result"] for p in sorted(run.glob("units/*/result.json"))}


def run_cli(capsys, run: Path, *extra: str) -> tuple[int, str]:
    """`featurelab run` of the test experiment (one process, batched); its status and its stderr."""
    rc = main(["run", TINY.name, "--out", str(run), "--workers", "1", "--quiet", *extra])
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """An uninterrupted run of the test experiment and the paths it wrote, in order."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    with pytest.MonkeyPatch.context() as mp:
        written = failing_writes(mp, 0)
        assert main(["run", TINY.name, "--out", str(run), "--workers", "1", "--quiet"]) == 0
    return run, [p.relative_to(run) for p in written]


# ------------------------------------------------------------------------------- the writer
@needs_dev_full
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    write_bytes(path, b"old")
    failing_writes(monkeypatch, 1)
    with pytest.raises(WriteError) as exc:
        write_bytes(path, b"new" * 100_000)
    assert str(exc.value) == f"cannot write '{path}': No space left on device; free space on its file system"
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["results.json"]


@pytest.mark.parametrize(
    "code, cause_and_remedy",
    [
        (errno.EACCES, "Permission denied; give this user write permission on '{d}' (e.g. chmod -R u+w '{d}')"),
        (errno.EPERM, "Operation not permitted; give this user write permission on '{d}' (e.g. chmod -R u+w '{d}')"),
        (errno.EROFS, "Read-only file system; '{d}' lies on a read-only file system: remount it read-write"),
        (errno.EMFILE, "Too many open files; raise the limit on open files (ulimit -n)"),
    ],
)
def test_each_cause_names_its_remedy(tmp_path, monkeypatch, code, cause_and_remedy):
    path = tmp_path / "units" / "a" / "checkpoint.safetensors"
    failing_writes(monkeypatch, 1, code)
    with pytest.raises(WriteError) as exc:
        write_bytes(path, b"x")
    assert str(exc.value) == f"cannot write '{path}': " + cause_and_remedy.format(d=path.parent)
    assert not temporaries(tmp_path)


def test_a_write_error_crosses_process_boundaries_intact():
    err = WriteError("run/units/a/x", "No space left on device", "free space").then("go on", exit_code=1)
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.exit_code) == (str(err), 1) and str(back).endswith("; free space, then go on")


def test_files_take_the_umask(tmp_path):
    for umask, mode in ((0o022, 0o644), (0o027, 0o640), (0o002, 0o664)):
        old = os.umask(umask)
        try:
            write_bytes(tmp_path / f"{umask:o}.txt", b"x")
        finally:
            os.umask(old)
        assert (tmp_path / f"{umask:o}.txt").stat().st_mode & 0o777 == mode


# ------------------------------------------------------------------------- runs, in-process
@needs_dev_full
@pytest.mark.parametrize(
    "name",
    [
        "config.yaml",
        "checkpoint.safetensors",
        "history.csv",
        "model.safetensors",
        "result.json",
        "losses.csv",
        "claims.json",
        "report.html",
        "results.json",
    ],
)
def test_a_full_disk_at_any_write_is_one_line_and_resume_gives_the_uninterrupted_run(
    uninterrupted, tmp_path, monkeypatch, capsys, name
):
    reference, written = uninterrupted
    n = 1 + next(i for i, p in enumerate(written) if p.name == name)  # the first write of a file called `name`
    run = tmp_path / "run"
    failing_writes(monkeypatch, n)
    rc, err = run_cli(capsys, run)
    started = n > 1  # config.yaml is the first write: before it, the run has not started
    fix = "continue with the same command plus --resume" if started else "run the same command again"
    path = run / written[n - 1]
    cause = "No space left on device; free space on its file system"
    assert err == f"featurelab: error: cannot write '{path}': {cause}, then {fix}\n"
    assert rc == (1 if started else 2)
    if not started:  # nothing of the run is left
        assert not run.exists()
        return
    assert not temporaries(run) and not (run / "results.json").exists()
    check_complete(run)
    monkeypatch.undo()
    rc, err = run_cli(capsys, run, "--resume")
    assert (rc, err) == (0, "")
    assert unit_results(run) == unit_results(reference)
    assert json.loads((run / "claims.json").read_text()) == json.loads((reference / "claims.json").read_text())


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS, errno.EMFILE])
def test_a_refused_unit_write_stops_the_run_in_one_line(uninterrupted, tmp_path, monkeypatch, capsys, code):
    written = uninterrupted[1]
    n = 1 + [p.name for p in written].index("checkpoint.safetensors")
    failing_writes(monkeypatch, n, code)
    rc, err = run_cli(capsys, tmp_path / "run")
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith(
        f"featurelab: error: cannot write '{tmp_path / 'run' / written[n - 1]}': {os.strerror(code)}; "
    )
    assert err.endswith(", then continue with the same command plus --resume\n")
    assert not list((tmp_path / "run" / "units").rglob("error.txt"))  # not a failed unit: a stopped run


# ---------------------------------------------------------------- read-only folders, real mounts
@contextmanager
def read_only(folder: Path):
    """`folder` and all it holds read-only for this process: ``chmod a-w`` for a user; root ignores
    modes, so a read-only bind mount for root (skipped where mounting is not allowed)."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
        for p, m in modes.items():
            p.chmod(m & ~0o222)
        try:
            yield
        finally:
            for p, m in modes.items():
                p.chmod(m)
        return
    if shutil.which("mount") is None or subprocess.run(["mount", "--bind", folder, folder]).returncode:
        pytest.skip("no read-only folder: root, and bind mounts are not allowed")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", folder, folder]).returncode:
            pytest.skip("no read-only folder: root, and read-only remounts are not allowed")
        yield
    finally:
        subprocess.run(["umount", folder], check=True)


def test_a_read_only_units_folder_on_resume_is_one_line(uninterrupted, tmp_path, monkeypatch, capsys):
    reference = uninterrupted[0]
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    for f in ("results.json", "report.html", "claims.json"):
        (run / f).unlink()
    for unit in (run / "units").iterdir():  # fresh units again: resumed as one batched ensemble
        for f in unit.iterdir():
            f.unlink()
    with read_only(run / "units"):
        rc, err = run_cli(capsys, run, "--resume")
    assert rc == 1 and err.count("\n") == 1, err
    assert err.startswith(f"featurelab: error: cannot write '{run / 'units'}/")
    assert err.endswith(", then continue with the same command plus --resume\n")
    rc, err = run_cli(capsys, run, "--resume")
    assert (rc, err) == (0, "") and unit_results(run) == unit_results(reference)
    assert not list(run.rglob("ensemble_fallback.txt"))


def test_report_of_a_read_only_finished_run_says_what_to_do(uninterrupted, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted[0], run)
    with read_only(run):
        rc = main(["report", str(run)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--out" not in err, err
    assert err.startswith(f"featurelab: error: cannot write '{run}/")
    assert "give this user write permission on" in err or "remount it read-write" in err


@contextmanager
def small_tmpfs(folder: Path, free_kb: int):
    """A 2 MB tmpfs at `folder` with `free_kb` KB left free (skipped where mounting is not allowed)."""
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)]
    if shutil.which("mount") is None or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("mounting a tmpfs is not allowed here")
    try:
        st = os.statvfs(folder)
        (folder / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - free_kb * 1024))
        yield folder / "filler"
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def cli(*args: str) -> subprocess.CompletedProcess:
    """``featurelab`` with the test experiment registered, in a new process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    script = "import sys, test_run_folders; from featurelab.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=600)


def full_disk_then_resume(run: Path, filler: Path, *args: str) -> None:
    """`featurelab run ... --out run` on a full disk: one line, status 1, nothing half-written; then
    free the space and ``--resume``: the run finishes."""
    proc = cli("run", *args, "--out", str(run), "--quiet")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"featurelab: error: cannot write '{run}/")
    assert proc.stderr.endswith(
        "No space left on device; free space on its file system, then continue with the same command plus --resume\n"
    )
    assert not temporaries(run)
    check_complete(run)
    filler.unlink()
    proc = cli("run", *args, "--out", str(run), "--quiet", "--resume")
    assert proc.returncode in (0, 1) and "error" not in proc.stderr, proc.stderr  # 1: unhealthy units, as uninterrupted
    assert (run / "results.json").exists() and not temporaries(run)


def test_a_real_full_disk_is_one_line_and_resume_gives_the_uninterrupted_run(tmp_path):
    args = (TINY.name, "--workers", "2")  # two workers: a unit each, trained alone, not as one ensemble
    assert cli("run", *args, "--out", str(tmp_path / "whole"), "--quiet").returncode == 0
    with small_tmpfs(tmp_path / "disk", 40) as filler:
        run = filler.parent / "run"
        full_disk_then_resume(run, filler, *args)
        assert unit_results(run) == unit_results(tmp_path / "whole")


# ------------------------------------------------------------ a paper's tiny preset (minutes)
@pytest.fixture(scope="module")
def hamiltonian(tmp_path_factory):
    """An uninterrupted ``leaky-hamiltonian --preset tiny`` run (one process) under umask 022, and the
    paths it wrote, in order."""
    run = tmp_path_factory.mktemp("hamiltonian") / "run"
    old = os.umask(0o022)
    try:
        with pytest.MonkeyPatch.context() as mp:
            written = failing_writes(mp, 0)
            run_experiment("leaky-hamiltonian", "tiny", out=run, workers=1, progress=False)
    finally:
        os.umask(old)
    return run, [p.relative_to(run) for p in written]


def run_results(run: Path) -> dict:
    """The run's unit results, summary and claims as {path: leaf}, wall times left out."""
    results = json.loads((run / "results.json").read_text())
    record = [unit_results(run), results["summary"], json.loads((run / "claims.json").read_text())]
    leaves = {}

    def walk(obj, path):
        if isinstance(obj, dict | list):
            for k, v in obj.items() if isinstance(obj, dict) else enumerate(obj):
                if "seconds" not in str(k):
                    walk(v, f"{path}/{k}")
        else:
            leaves[path] = obj

    walk(record, "")
    return leaves


def assert_same_run(run: Path, reference: Path) -> None:
    """Equal results bit for bit, every number and verdict: an ensemble interrupted mid-training resumes
    as that ensemble (its members resumed one by one would differ in the last digits). JSON texts compare
    floats by their shortest round-trip repr, NaN included."""
    got, want = run_results(run), run_results(reference)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert json.dumps(got[k]) == json.dumps(v), (k, got[k], v)


@pytest.mark.slow
def test_every_file_of_a_finished_run_takes_the_umask(hamiltonian):
    run = hamiltonian[0]
    modes = {str(p.relative_to(run)): p.stat().st_mode & 0o777 for p in run.rglob("*")}
    assert {m for p, m in modes.items() if not (run / p).is_dir()} == {0o644}, modes
    assert {m for p, m in modes.items() if (run / p).is_dir()} == {0o755}, modes


@needs_dev_full
@pytest.mark.slow
@pytest.mark.parametrize(
    "name, again",
    [
        ("checkpoint.safetensors", False),  # before the ensemble saved anything
        ("checkpoint.safetensors", True),  # mid-phase: every member's checkpoint is at one step
        ("profiles.svg", False),
    ],
)
def test_a_full_disk_in_a_paper_preset_is_one_line_and_resume_gives_the_uninterrupted_run(
    hamiltonian, tmp_path, monkeypatch, name, again
):
    """The first write of a file `name` (`again`: the first that replaces one) fails; ``--resume`` once the
    space is free gives the uninterrupted run, bit for bit."""
    reference, written = hamiltonian
    n = 1 + next(i for i, p in enumerate(written) if p.name == name and (not again or p in written[:i]))
    run = tmp_path / "run"
    failing_writes(monkeypatch, n)
    with pytest.raises(WriteError) as exc:
        run_experiment("leaky-hamiltonian", "tiny", out=run, workers=1, progress=False)
    assert str(exc.value) == (
        f"cannot write '{run / written[n - 1]}': No space left on device; free space on its file system, "
        "then continue with the same call with resume=True"  # the Python API names its keyword
    )
    assert exc.value.exit_code == 1 and not temporaries(run) and not (run / "results.json").exists()
    check_complete(run)
    monkeypatch.undo()
    run_experiment("leaky-hamiltonian", "tiny", out=run, workers=1, progress=False, resume=True)
    assert_same_run(run, reference)


@pytest.mark.slow
def test_a_real_full_disk_in_a_paper_preset(hamiltonian, tmp_path):
    with small_tmpfs(tmp_path / "disk", 300) as filler:
        run = filler.parent / "run"
        full_disk_then_resume(run, filler, "leaky-hamiltonian", "--preset", "tiny", "--workers", "1")
        assert_same_run(run, hamiltonian[0])
