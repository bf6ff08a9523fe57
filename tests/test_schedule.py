"""`OptimizerConfig`: the phases it builds are the ones an experiment used to write by hand."""

import pytest
import torch

from featurelab.config import ExperimentConfig, validate
from featurelab.data import Dataset
from featurelab.errors import FeaturelabError
from featurelab.models import MLP
from featurelab.training import OptimizerConfig, Phase, TrainConfig, train


def test_phases_in_order_and_empty_ones_left_out():
    opt = OptimizerConfig(
        adam_steps=300, adam_lr=3e-3, adam_schedule="cosine", adam_lr_min=3e-6, adapt_every=100, gd_steps=50, gd_lr=0.01
    )
    assert opt.phases() == [
        Phase(optimizer="adam", steps=300, lr=3e-3, schedule="cosine", lr_min=3e-6, adapt_every=100),
        Phase(optimizer="sgd", steps=50, lr=0.01),
    ]
    assert OptimizerConfig(gd_steps=10).phases() == [Phase(optimizer="sgd", steps=10, lr=0.05)]
    polish = OptimizerConfig(adam_steps=5, lbfgs_steps=3, lbfgs_lr=0.5).phases()[-1]
    assert polish == Phase(optimizer="lbfgs", steps=3, lr=0.5, dtype="float64")
    assert OptimizerConfig().phases() == []


def test_train_config_carries_the_logging_intervals():
    opt = OptimizerConfig(adam_steps=20, log_every=5, checkpoint_every=10)
    cfg = opt.train_config("cross_entropy", 1e-3, top_singular_values=0, seed=4)
    assert cfg == TrainConfig(
        objective="cross_entropy",
        lam=1e-3,
        phases=[Phase(optimizer="adam", steps=20, lr=1e-3)],
        log_every=5,
        checkpoint_every=10,
        top_singular_values=0,
        seed=4,
    )


def test_nested_in_an_experiment_config_with_dotted_overrides():
    class Config(ExperimentConfig):
        optimizer: OptimizerConfig = OptimizerConfig(adam_steps=100, gd_steps=10)

    cfg = validate(Config, {"optimizer": {"adam_lr": 1e-2}}, "demo")
    assert cfg.optimizer.adam_steps == 100 and cfg.optimizer.adam_lr == 1e-2  # the field's defaults are kept
    with pytest.raises(FeaturelabError, match="optimizer.gd_lr"):
        validate(Config, {"optimizer": {"gd_lr": -1.0}}, "demo")
    with pytest.raises(FeaturelabError, match="unknown key 'optimizer.adam_step'"):
        validate(Config, {"optimizer": {"adam_step": 5}}, "demo")


def test_the_phases_train():
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(32, 3, generator=gen, dtype=torch.float64)
    data = Dataset(X, X @ torch.ones(3, 1, dtype=torch.float64), X[:0], X[:0, :1])
    model = MLP(3, 1, 8, 2, dtype=torch.float64)
    opt = OptimizerConfig(adam_steps=40, adam_lr=1e-2, gd_steps=20, gd_lr=0.05, log_every=20)
    result = train(model, data, opt.train_config("mse", top_singular_values=0), progress=False)
    assert list(result.history["step"]) == [0, 20, 40, 60]
    assert result.history["loss"].iloc[-1] < result.history["loss"].iloc[0]
