"""A misspelt config key is one line that names it, suggests the close allowed keys and lists them all."""

import difflib

import pytest

import featurelab as fl
from featurelab.config import ExperimentConfig, did_you_mean, validate
from featurelab.training import OptimizerConfig


class Config(ExperimentConfig):
    width: int = 4
    depth: int = 2
    optimizer: OptimizerConfig = OptimizerConfig(adam_steps=10)


@pytest.mark.parametrize(
    "values,key,suggested",
    [
        ({"widht": 8}, "widht", "width"),
        ({"DEPTH": 3}, "DEPTH", "depth"),
        ({"optimizer": {"adam_step": 5}}, "optimizer.adam_step", "optimizer.adam_steps"),
    ],
)
def test_unknown_key_suggests_the_closest_allowed_key(values, key, suggested):
    with pytest.raises(fl.FeaturelabError) as err:
        validate(Config, values, "demo")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"unknown key {key!r} for demo (did you mean {suggested!r}?); allowed keys: ")


def test_a_key_far_from_every_allowed_key_gets_no_suggestion():
    with pytest.raises(fl.FeaturelabError) as err:
        validate(Config, {"zzzzzz": 1}, "demo")
    assert "did you mean" not in str(err.value)
    assert str(err.value).endswith("allowed keys: seed, width, depth, optimizer")


def test_a_key_in_a_list_of_sub_configs_lists_that_model_s_keys():
    """``phases.0.optimiser`` is looked up among `Phase`'s fields (a list entry), not left with no keys."""
    with pytest.raises(fl.FeaturelabError) as err:
        fl.TrainConfig.model_validate({"phases": [{"steps": 1, "lr": 0.1, "optimiser": "adam"}]})
    text = str(err.value)
    assert "(did you mean 'phases.0.optimizer'?)" in text
    assert text.endswith("allowed keys: " + ", ".join(fl.Phase.model_fields))


def test_the_suggestion_is_difflib_s_closest_match():
    allowed = ["lam", "lams", "lr", "steps", "seed"]
    (close,) = difflib.get_close_matches("lamda", allowed, n=1, cutoff=0.6)
    assert close == "lam"
    assert did_you_mean("lamda", allowed) == " (did you mean 'lam'?)"
    assert did_you_mean("qqqq", allowed) == ""
