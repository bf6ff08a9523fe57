"""``run --seeds`` and ``reproduce`` write several runs under ``--out``: a run folder (or a folder inside one)
is refused in one line with nothing written, and a variant that ends in an error makes the exit status 1
(no variant measured is not success)."""

import importlib

import pytest

from featurelab.cli import main
from featurelab.errors import FeaturelabError
from test_run_folders import TINY, files, tiny


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run = tmp_path_factory.mktemp("outs") / "run"
    tiny(run)
    return run


@pytest.mark.parametrize("inside", ["", "units", "deeper/still"])
def test_a_run_folder_or_a_folder_inside_it_is_refused_as_the_root_of_several_runs(finished, inside, capsys):
    before = files(finished)
    out = str(finished / inside) if inside else str(finished)
    for argv in (["run", TINY.name, "--seeds", "0,1", "--out", out], ["reproduce", "--out", out]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "run folder" in err[0], err
    assert files(finished) == before and not (finished / "deeper").exists()


def test_variants_that_all_end_in_an_error_exit_with_status_1(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise FeaturelabError("injected")

    monkeypatch.setattr(importlib.import_module("featurelab.runs.reproduce"), "run_experiment", broken)
    assert main(["run", TINY.name, "--seeds", "0,1", "--out", str(tmp_path / "seeds"), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "0/0" in out and "2 variant(s) ended in an error" in out
