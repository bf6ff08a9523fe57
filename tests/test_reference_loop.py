"""The engine's fast paths against the reference loop (`featurelab.training.reference`), float64, to 1e-12: one run
(`train`: the Leaky ResNet's fused steps, the MLP's weight-decay node) and ensembles (`train_ensemble`: stacked
members, the penalty read off the flat buffer, the chained pullbacks of the cross-entropy MLP, Adam on one flat
buffer), on MLPs and Leaky ResNets, through Adam with a cosine schedule, mini-batches, SGD with momentum and the
loss guard."""

import copy

import pytest
import torch

import featurelab as fl
from featurelab.errors import FeaturelabError
from featurelab.training import Phase, TrainConfig, train_ensemble
from featurelab.training.reference import reference_train

COLUMNS = ["step", "phase", "lr", "loss", "cost", "penalty", "param_norm"]


def config(objective: str, lam: float, lr: float, sgd_lr: float, seed: int = 0) -> TrainConfig:
    """Adam (cosine, mini-batches of 16) then SGD with momentum under a guard (an lr `sgd_lr` that makes it fire)."""
    phases = [
        Phase(optimizer="adam", steps=12, lr=lr, schedule="cosine", lr_min=lr / 10, batch_size=16),
        Phase(optimizer="sgd", steps=12, lr=sgd_lr, momentum=0.9, guard_window=4),
    ]
    return TrainConfig.model_validate(dict(objective=objective, lam=lam, seed=seed, log_every=5, phases=phases))


def mlps(n: int) -> list[fl.MLP]:
    return [fl.MLP(8, 3, 10, 3, leak=0.1, bias=1.0, seed=i, dtype=torch.float64) for i in range(n)]


def leaky_nets(n: int) -> list[fl.LeakyResNet]:
    return [fl.LeakyResNet(8, 3, 10, 6, 2.0 + 0.5 * i, seed=i, dtype=torch.float64) for i in range(n)]


def classification() -> fl.Dataset:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(40, 8, generator=gen, dtype=torch.float64)
    return fl.Dataset(X, (X[:, :3]).argmax(1), X[:0], torch.zeros(0, dtype=torch.int64), n_classes=3)


def regression() -> fl.Dataset:
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(40, 8, generator=gen, dtype=torch.float64)
    return fl.Dataset(X, torch.tanh(X[:, :3] @ torch.ones(3, 3, dtype=torch.float64)), X[:0], X[:0, :3])


def assert_same(model, reference, history, reference_history) -> None:
    for (k, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=k)
    torch.testing.assert_close(
        torch.tensor(history[COLUMNS].to_numpy()),
        torch.tensor(reference_history[COLUMNS].to_numpy()),
        rtol=1e-12,  # relative: a loss the guard then undoes can reach 1e14
        atol=1e-12,
    )


# models, data, objective, λ, Adam's lr, SGD's lr (large enough for the guard to fire for some member)
CASES = {
    "mlp-cross-entropy": (mlps, classification, "cross_entropy", 1e-3, 1e-2, 2.0),
    "mlp-mse": (mlps, regression, "mse", 1e-2, 1e-2, 0.4),
    "leaky-mse": (leaky_nets, regression, "mse", 1e-3, 1e-3, 5.0),
}


@pytest.mark.parametrize("case", CASES)
def test_one_run_follows_the_reference_loop(case):
    make, data_of, objective, lam, lr, sgd_lr = CASES[case]
    data, cfg = data_of(), config(objective, lam, lr, sgd_lr)
    (model,), (reference,) = make(1), make(1)
    result = fl.train(model, data, cfg)
    assert_same(model, reference, result.history, reference_train(reference, data, cfg))


@pytest.mark.parametrize("case", CASES)
def test_ensemble_members_follow_the_reference_loop(case):
    """Three members with their own init, λ, lr and mini-batch seed (and L̃ for the Leaky ResNets)."""
    make, data_of, objective, lam, lr, sgd_lr = CASES[case]
    data, members, references = data_of(), make(3), make(3)
    cfgs = [config(objective, lam * (1 + i), lr * (1 - 0.2 * i), sgd_lr * (1 - 0.2 * i), seed=i) for i in range(3)]
    results = train_ensemble(members, data, cfgs)
    guarded = 0
    for member, reference, result, cfg in zip(members, references, results, cfgs):
        assert not isinstance(result, Exception)
        history = reference_train(reference, data, cfg)
        assert_same(member, reference, result.history, history)
        guarded += bool((history["lr"][history["phase"] == 1] < cfg.phases[1].lr).any())
    assert guarded > 0  # the guard fired for some member: the test covers its restore


def test_the_reference_loop_names_what_it_leaves_to_the_engine():
    cfg = TrainConfig(phases=[Phase(optimizer="lbfgs", steps=2, lr=1.0)])
    with pytest.raises(FeaturelabError, match=r"phases\[0\]\.optimizer='lbfgs' is not covered"):
        reference_train(copy.deepcopy(mlps(1)[0]), regression(), cfg)
