"""Fault injection into a finished run folder: every file a verdict rests on (config, units' results, models,
checkpoints, histories, tables, claims, results, the manifest itself) is flipped, truncated, emptied,
replaced by JSON of the wrong type, or (claims) has its verdict edited; ``--resume``, ``featurelab report``
and ``reproduce --collect``'s reader (`finished_record`) each refuse it in one line naming the file, and
change nothing. A finished unit of an unfinished run is checked the same way before it is skipped."""

import json
import shutil
from pathlib import Path

import pytest

from featurelab import FeaturelabError
from featurelab.cli import main
from featurelab.runs.manifest import MANIFEST, run_files
from featurelab.runs.runner import finished_record
from test_run_folders import files, tiny


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("faults") / "run"
    tiny(run)
    return run


def flip(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]


FAULTS = {
    "flip": flip,
    "truncate": lambda data: data[: len(data) // 3],
    "empty": lambda data: b"",
    "wrong type": lambda data: b'["a list", 1]\n',
}


def listed(run: Path) -> list[str]:
    return [*run_files(run), MANIFEST]


def test_the_manifest_lists_every_kind_of_file_a_verdict_rests_on(finished):
    names = listed(finished)
    for name in ("config.yaml", "claims.json", "results.json", "tables/losses.csv", "units/a/result.json"):
        assert name in names
    for suffix in ("history.csv", "model.safetensors"):
        assert any(n.startswith("units/a/") and n.endswith(suffix) for n in names), (suffix, names)


def damaged(finished: Path, tmp_path: Path, name: str, fault: str) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    path = run / name
    path.write_bytes(FAULTS[fault](path.read_bytes()))
    return run


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_damaged_file_is_refused_by_resume_report_and_collect(finished, tmp_path, fault, capsys):
    for k, name in enumerate(listed(finished)):
        run = damaged(finished, tmp_path / str(k), name, fault)
        before = files(run)
        with pytest.raises(FeaturelabError) as exc:
            tiny(run, resume=True)
        msg = str(exc.value)
        assert "\n" not in msg and Path(name).name in msg, (name, msg)
        with pytest.raises(FeaturelabError):
            finished_record(run)
        assert main(["report", str(run)]) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and Path(name).name in err, (name, err)
        assert files(run) == before


def test_an_edited_verdict_is_never_shown_as_passing(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    claims = json.loads((run / "claims.json").read_text())
    for c in claims:
        c["passed"], c["measured"] = True, 0.0
    (run / "claims.json").write_text(json.dumps(claims))
    with pytest.raises(FeaturelabError, match="claims.json' differs from the sha256"):
        finished_record(run)
    assert main(["report", str(run)]) != 0 and "claims.json" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["model.safetensors", "history.csv"])
def test_a_damaged_unit_of_an_unfinished_run_is_refused_before_it_is_skipped(finished, tmp_path, name):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    for p in ("results.json", MANIFEST, "claims.json", "report.html"):
        (run / p).unlink()
    path = next((run / "units" / "a").glob(f"*{name}"))
    path.write_bytes(flip(path.read_bytes()))
    with pytest.raises(FeaturelabError) as exc:
        tiny(run, resume=True)
    assert path.name in str(exc.value) and "resume=True" in str(exc.value)  # the Python API names its keyword


def test_a_finished_run_without_its_manifest_is_refused(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    (run / MANIFEST).unlink()
    with pytest.raises(FeaturelabError, match="no manifest.json"):
        tiny(run, resume=True)
