"""`make gpu-check`'s plumbing (featurelab/gpucheck.py), run as its CPU dry run: the presets step keeps its run
folders under ``--runs`` and resumes them, and a bad ``--only`` is refused in one line before anything is written."""

from __future__ import annotations

from featurelab import gpucheck


def test_a_second_call_resumes_the_presets_it_kept_under_runs(tmp_path):
    runs, table = tmp_path / "runs", tmp_path / "gpu-check.md"
    args = ["--device", "cpu", "--steps", "presets", "--only", "escape-circle", "--budget", "5"]
    assert gpucheck.main([*args, "--runs", str(runs), "--out", str(table)]) == 0
    units = sorted((runs / "escape-circle" / "units").glob("*/result.json"))
    assert units and (runs / "escape-circle" / "claims.json").exists()
    stamps = [m.stat().st_mtime_ns for m in units]
    assert gpucheck.main([*args, "--runs", str(runs), "--out", str(table)]) == 0
    assert [m.stat().st_mtime_ns for m in units] == stamps  # resumed: no unit run again
    (row,) = [line for line in table.read_text().splitlines() if "escape-circle --preset tiny" in line]
    assert " passed |" in row and "error" not in row


def test_an_unknown_experiment_in_only_is_refused_before_anything_is_written(tmp_path, capsys):
    table = tmp_path / "gpu-check.md"
    code = gpucheck.main(["--device", "cpu", "--steps", "presets", "--only", "escape-circle,nope", "--out", str(table)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 2 and not table.exists()
    assert len(out) == 1 and "--only" in out[0] and "nope" in out[0] and "leaky-bottleneck" in out[0]
