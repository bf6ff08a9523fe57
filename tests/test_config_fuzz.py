"""Fuzzing every config field of every experiment through the command line: each random ``--set`` value,
and each numeric field at 0, -1, NaN, inf and 1e12 (a sample per experiment; the whole grid is marked slow),
gives either a valid config (the run starts) or exit status 2 with exactly one line and no run folder.

The run itself is replaced by a stub once the config has been accepted and written, so nothing trains.
The values are drawn with a fixed seed: the test is reproducible. Checking one value may take at most
`LIMIT` seconds: a config that makes the checks themselves hang (a size that builds a huge dataset) fails.
"""

import random
import signal

import pytest
from pydantic import BaseModel

import featurelab.runs.runner as runner
from featurelab.cli import main
from featurelab.experiments import EXPERIMENTS

VALUES = [
    "0", "1", "-1", "2", "3", "7", "0.5", "-0.5", "1e-3", "1e400", "-1e400", ".nan", ".inf", "-.inf", "nan",
    "inf", "true", "false", "null", "foo", "''", "[]", "[0]", "[1, 1]", "[2, 3]", "[-1, 2]", "[0.5, .nan]",
    "[foo]", "{}", "{a: 1}", "4294967296", "123456789012345678901234567890", "1e12",
]  # fmt: skip


def fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted names of every field of a config, nested configs included."""
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += fields(ann, f"{prefix}{name}.")
        out.append(f"{prefix}{name}")
    return out


LIMIT = 20


class Started(Exception):
    pass


def stub(*args, **kwargs):
    raise Started


def too_slow(*args):
    raise TimeoutError(f"checking the config took more than {LIMIT} s")


EXTREMES = ["0", "-1", ".nan", ".inf", "1000000000000"]


def numeric_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted names of the config's fields that hold a number or a list of numbers, nested configs included."""
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += numeric_fields(ann, f"{prefix}{name}.")
        elif any(t in str(ann) for t in ("int", "float")) and ann is not bool:
            out.append(f"{prefix}{name}")
    return out


def grid(exp, sample: int | None) -> list[tuple[str, str]]:
    """Every numeric field at every extreme (as itself, and as a one-entry list for list fields), or a
    reproducible sample of `sample` of them."""
    pairs = [(k, v) for k in numeric_fields(exp.config) for v in EXTREMES]
    pairs += [(k, f"[{v}]") for k, v in pairs if "list" in str(_annotation(exp.config, k))]
    return pairs if sample is None else random.Random(f"grid-{exp.name}").sample(pairs, min(sample, len(pairs)))


def _annotation(model: type[BaseModel], key: str):
    *parents, leaf = key.split(".")
    for p in parents:
        model = model.model_fields[p].annotation  # type: ignore[assignment]
    return model.model_fields[leaf].annotation


def valid_or_one_line(exp, pairs, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(runner, "_run", stub)
    previous = signal.signal(signal.SIGALRM, too_slow)
    preset = "tiny" if "tiny" in exp.presets else "quick"
    for i, (key, value) in enumerate(pairs):
        out = tmp_path / f"run{i}"
        args = ["run", exp.name, "--preset", preset, "--out", str(out), "--quiet", "--workers", "1"]
        signal.alarm(LIMIT)
        try:
            rc = main([*args, "--set", f"{key}={value}"])
        except Started:
            assert (out / "config.yaml").exists()
            continue
        finally:
            signal.alarm(0)
        err = capsys.readouterr().err
        assert rc == 2, f"{key}={value}: exit {rc}"
        assert err.count("\n") == 1 and err.startswith("featurelab: error: "), f"{key}={value}: {err}"
        assert not out.exists(), f"{key}={value} left a folder behind"
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("exp", EXPERIMENTS, ids=lambda e: e.name)
def test_random_values_of_every_field_are_valid_or_one_line(exp, tmp_path, monkeypatch, capsys):
    rng = random.Random(f"fuzz-{exp.name}")
    pairs = [(key, rng.choice(VALUES)) for key in fields(exp.config)]
    valid_or_one_line(exp, pairs, tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("exp", EXPERIMENTS, ids=lambda e: e.name)
def test_a_sample_of_extreme_values_is_valid_or_one_line(exp, tmp_path, monkeypatch, capsys):
    valid_or_one_line(exp, grid(exp, 6), tmp_path, monkeypatch, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("exp", EXPERIMENTS, ids=lambda e: e.name)
def test_every_numeric_field_at_every_extreme_is_valid_or_one_line(exp, tmp_path, monkeypatch, capsys):
    valid_or_one_line(exp, grid(exp, None), tmp_path, monkeypatch, capsys)
