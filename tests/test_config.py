"""Config validation: a wrong key, type or range is one line naming the field and what is allowed."""

from typing import Any

import pytest

import featurelab as fl
from featurelab.config import parse_overrides
from featurelab.runs.runner import resolve_config


def raw(**fields: Any) -> dict[str, Any]:
    """Keyword arguments as untyped input (a YAML file, a notebook) gives them: validation, not the signature,
    must refuse the wrong ones."""
    return fields


def test_parse_overrides_types_and_nesting():
    got = parse_overrides(["lam=1e-3", "widths=[2, 4]", "name=abc", "train.lr=0.5", "flag=true"])
    assert got == {"lam": 1e-3, "widths": [2, 4], "name": "abc", "train": {"lr": 0.5}, "flag": True}
    with pytest.raises(fl.FeaturelabError, match="key=value"):
        parse_overrides(["lam"])


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        ({"lam": -1}, r"^lam=-1 is not allowed for leaky-bottleneck: Input should be greater than 0$"),
        (
            {"lamda": 1},
            r"^unknown key 'lamda' for leaky-bottleneck \(did you mean 'lam'\?\); allowed keys: seed, .*lam",
        ),
        ({"depth": "abc"}, r"^depth='abc' is not allowed for leaky-bottleneck: .*integer"),
        ({"steps": "random"}, r"^steps='random' is not allowed .*'equidistant', 'irregular' or 'adaptive'"),
        ({"effective_depth": 20}, r"^invalid config for leaky-bottleneck: depth=16 is too small"),
    ],
)
def test_config_errors_are_one_line(overrides, pattern):
    with pytest.raises(fl.FeaturelabError, match=pattern) as err:
        resolve_config("leaky-bottleneck", "quick", overrides)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "build,pattern",
    [
        (
            lambda: fl.Phase(steps=10, lr=0.1, optimizer="adam", max_step=0.2),
            r"^invalid config for Phase: max_step needs optimizer 'sgd' without momentum$",
        ),
        (lambda: fl.Phase(steps=10, lr=-1.0), r"^lr=-1.0 is not allowed for Phase: Input should be greater than 0$"),
        (
            lambda: fl.TrainConfig(**raw(phases=[{"steps": -1, "lr": 0.1}])),
            r"^phases.0.steps=-1 is not allowed for TrainConfig: Input should be greater than or equal to 0$",
        ),
        (
            lambda: fl.TrainConfig.model_validate({"phases": [], "objective": "hinge"}),
            r"^objective='hinge' is not allowed for TrainConfig: Input should be 'mse', 'cross_entropy' or 'logistic'$",
        ),
        (
            lambda: fl.TrainConfig(**raw(phases=[], lamda=1.0)),
            r"^unknown key 'lamda' for TrainConfig \(did you mean 'lam'\?\); allowed keys: objective, lam",
        ),
        (
            lambda: setattr(resolve_config("leaky-bottleneck", "quick")[1], "lam", -1.0),
            r"^lam=-1.0 is not allowed for Config: Input should be greater than 0$",
        ),
    ],
)
def test_python_api_config_errors_are_one_line(build, pattern):
    """The Python API says the same one line as the CLI, not pydantic's multi-line report."""
    with pytest.raises(fl.FeaturelabError, match=pattern) as err:
        build()
    assert "\n" not in str(err.value)


def test_presets_and_seed_override():
    _, cfg = resolve_config("leaky-bottleneck", "paper", {"lam": 0.01}, seed=5)
    assert (cfg.width, cfg.depth, cfg.lam, cfg.seed) == (200, 50, 0.01, 5)
    with pytest.raises(fl.FeaturelabError, match="preset='huge' is not defined"):
        resolve_config("leaky-bottleneck", "huge")
    with pytest.raises(fl.FeaturelabError, match="does not exist; choose one of"):
        resolve_config("no-such-experiment")


OWN_EXPERIMENTS = sorted(n for n, e in fl.experiments.REGISTRY.items() if e.units.__module__.startswith("featurelab."))


@pytest.mark.parametrize("name", [n for n in OWN_EXPERIMENTS if n != "saddle-mnist"])  # MNIST: local files
def test_certification_is_one_config_field_everywhere(name):
    """An experiment whose units can be certified takes the tolerance from its config's `certify` field, so
    `--set certify=null` turns it off and `--set certify=1e-9` sets the tolerance each unit receives; a unit that
    read a module constant, or a field it never passes on, would ignore both."""
    exp = fl.experiments.REGISTRY[name]
    preset = "tiny" if "tiny" in exp.presets else "quick"
    _, cfg = resolve_config(name, preset)
    if exp.build is None:
        pytest.skip("no built units to inspect")
    unit = exp.units(cfg)[0]
    if exp.build(cfg, unit).certify is None and "certify" not in type(cfg).model_fields:
        pytest.skip("certifies nothing")
    for value in (None, 1e-9):
        _, changed = resolve_config(name, preset, {"certify": value})
        assert exp.build(changed, unit).certify == value, name
