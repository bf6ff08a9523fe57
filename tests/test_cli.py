"""End to end through the command line: a tiny run writes a complete run folder, bad input is one
line, a finished run is left as it is on --resume, and an existing run is never overwritten."""

import json
import subprocess
import sys

import pytest
import yaml


def featurelab(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "featurelab.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    proc = featurelab("run", "leaky-bottleneck", "--preset", "tiny", "--out", str(out), "--quiet")
    assert proc.returncode == expected_status(out), proc.stderr
    return out, proc


def expected_status(out) -> int:
    """0 when every empirical claim of the run in `out` passed, else 1 (the tiny preset is a smoke size:
    its claims need not pass)."""
    claims = json.loads((out / "claims.json").read_text())
    return 0 if all(c["passed"] is True for c in claims if c["kind"] == "empirical") else 1


def test_run_folder_is_complete(tiny_run):
    out, proc = tiny_run
    assert f"report: {out.resolve()}/report.html" in proc.stdout
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["depth"] == 8 and cfg["adam_steps"] == 300
    unit = next((out / "units").iterdir())
    for name in ("result.json", "history.csv", "model.safetensors", "checkpoint.safetensors"):
        assert (unit / name).exists(), name
    for name in ("bottleneck_spectra", "training_curves"):
        assert (out / "figures" / f"{name}.png").exists() and (out / "figures" / f"{name}.svg").exists()
    claims = json.loads((out / "claims.json").read_text())
    assert claims and set(claims[0]) == {
        "statement",
        "reference",
        "expected",
        "measured",
        "tolerance",
        "passed",
        "id",
        "reason",
        "units",
        "kind",
        "margin",
        "headroom",
        "premise",
        "stationarity",
        "certified_passed",
        "certified_measured",
        "certified_margin",
        "certified_reason",
        "error_bar",
        "clarke",
    }
    assert all(c["id"] for c in claims) and len({c["id"] for c in claims}) == len(claims)
    assert isinstance(claims[0]["passed"], bool) or claims[0]["reason"]  # a claim not measured says why
    results = json.loads((out / "results.json").read_text())
    assert results["claims_total"] == sum(c["kind"] == "empirical" for c in claims) and "torch" in results["versions"]
    html = (out / "report.html").read_text()
    assert "data:image/png;base64," in html and "<th>statement</th>" in html and "dominant singular values" in html


def test_resume_of_a_finished_run_changes_nothing(tiny_run):
    out, _ = tiny_run
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    proc = featurelab("run", "leaky-bottleneck", "--preset", "tiny", "--out", str(out), "--resume", "--quiet")
    assert proc.returncode == expected_status(out), proc.stderr
    assert "holds a finished run; nothing was changed" in proc.stdout
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_existing_run_is_not_overwritten_and_resume_needs_same_config(tiny_run):
    out, _ = tiny_run
    proc = featurelab("run", "leaky-bottleneck", "--preset", "tiny", "--out", str(out))
    assert proc.returncode == 2 and "already exists: pass --resume" in proc.stderr
    proc = featurelab("run", "leaky-bottleneck", "--preset", "tiny", "--out", str(out), "--resume", "--set", "lam=0.1")
    assert proc.returncode == 2 and "lam: stored 0.02, now 0.1" in proc.stderr


def test_bad_value_is_one_line_naming_the_field(tmp_path):
    proc = featurelab("run", "leaky-bottleneck", "--set", "lam=-1", "--out", str(tmp_path / "x"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "lam" in proc.stderr and "Traceback" not in proc.stderr


def test_list_and_report(tiny_run):
    out, _ = tiny_run
    assert "leaky-bottleneck" in featurelab("list").stdout
    (out / "report.html").unlink()
    proc = featurelab("report", str(out))
    assert proc.returncode == 0 and (out / "report.html").exists()
