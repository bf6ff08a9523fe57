"""from_torch / to_torch: equal outputs both ways (float64, 1e-12), the MLP tools accept a plain chain,
and a chain that is not an MLP is a one-line error naming the layer."""

import pytest
import torch
from torch import nn

import featurelab as fl
from featurelab.measurements import (
    balancedness_residual,
    bottleneck_rank,
    caratheodory_reduce,
    layer_forces,
    representation_spectra,
)


def chain(gen, act=lambda: nn.LeakyReLU(0.2), bias=True, dims=(5, 7, 6, 3)):
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        lin = nn.Linear(a, b, bias=bias, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(b, a, generator=gen, dtype=torch.float64))
            if bias:
                lin.bias.copy_(torch.randn(b, generator=gen, dtype=torch.float64))
        layers.append(lin)
        if i < len(dims) - 2 and act is not None:
            layers.append(act())
    return nn.Sequential(*layers)


@pytest.mark.parametrize(
    "act,bias", [(lambda: nn.LeakyReLU(0.2), True), (nn.ReLU, False), (nn.Tanh, True), (None, True)]
)
def test_round_trip_outputs_and_parameters(gen, act, bias):
    seq = chain(gen, act, bias)
    X = torch.randn(20, 5, generator=gen, dtype=torch.float64)
    mlp = fl.from_torch(seq)
    assert mlp.bias == (1.0 if bias else 0.0) and mlp.weights[0].dtype == torch.float64
    assert torch.allclose(mlp(X), seq(X), atol=1e-12, rtol=0)
    back = fl.to_torch(mlp)
    assert torch.allclose(back(X), seq(X), atol=1e-12, rtol=0)
    for p, q in zip(seq.parameters(), back.parameters()):
        assert torch.equal(p, q)


def test_linear_tail_and_bias_amount(gen):
    seq = nn.Sequential(*chain(gen, nn.ReLU, dims=(4, 6, 5)), nn.Linear(5, 2, dtype=torch.float64))
    mlp = fl.from_torch(seq)  # the last hidden layer has no activation: a linear tail
    X = torch.randn(10, 4, generator=gen, dtype=torch.float64)
    assert mlp.linear_tail == 2 and torch.allclose(mlp(X), seq(X), atol=1e-12, rtol=0)
    half = fl.MLP(4, 2, 6, 3, leak=0.1, bias=0.5, seed=3, dtype=torch.float64)
    with torch.no_grad():
        for W in half.weights:
            W[:, -1] = torch.randn(W.shape[0], generator=gen, dtype=torch.float64)
    back = fl.to_torch(half)
    first = back[0]
    assert isinstance(first, nn.Linear)
    assert torch.allclose(first.bias, 0.5 * half.weights[0][:, -1]) and torch.allclose(back(X), half(X), atol=1e-12)


def test_mixed_biases_become_zero_columns(gen):
    seq = chain(gen, nn.ReLU)
    second = seq[2]
    assert isinstance(second, nn.Linear)
    second.bias = None  # a Linear without bias, as nn.Linear(..., bias=False) builds it
    mlp = fl.from_torch(seq)
    X = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    assert torch.equal(mlp.weights[1][:, -1], torch.zeros(6, dtype=torch.float64))
    assert torch.allclose(mlp(X), seq(X), atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "seq,words",
    [
        (nn.Sequential(nn.Conv1d(1, 2, 3)), "Conv1d"),
        (nn.Sequential(nn.Linear(3, 3), nn.ReLU()), "after the last Linear"),
        (nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1)), "one activation"),
        (nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 1)), "only the last layers"),
        (nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(3, 1)), "reads 3 features"),
        (nn.Linear(3, 1), "nn.Sequential"),
    ],
)
def test_non_chains_are_one_line_errors(seq, words):
    with pytest.raises(fl.FeaturelabError, match=words) as err:
        fl.from_torch(seq)
    assert "\n" not in str(err.value)


def test_mlp_tools_accept_a_chain(gen):
    seq = chain(gen, nn.ReLU, dims=(3, 12, 12, 2))
    X = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    mlp = fl.from_torch(seq)
    assert bottleneck_rank(seq) == bottleneck_rank(mlp)
    for a, b in zip(balancedness_residual(seq), balancedness_residual(mlp)):
        assert torch.equal(a, b)
    for a, b in zip(representation_spectra(seq, X), representation_spectra(mlp, X)):
        assert torch.allclose(a, b, atol=1e-13)
    reduced, report = caratheodory_reduce(seq, X)  # N = 4: each hidden layer needs <= N(N+1) = 20 neurons
    with torch.no_grad():
        out, ref = fl.to_torch(reduced)(X), seq(X)
    assert torch.allclose(out, ref, atol=1e-8 * float(ref.abs().max()))
    Y = torch.tensor([0, 1, 1, 0])
    f64 = layer_forces(seq, X, Y, 1e-3)
    f8 = layer_forces(seq, X, Y.to(torch.uint8), 1e-3)  # labels of any integer dtype
    assert all(torch.equal(a.attraction, b.attraction) for a, b in zip(f64, f8))


def test_train_names_from_torch_for_a_plain_chain(gen):
    seq = chain(gen, nn.ReLU, dims=(64, 8, 10))
    config = fl.TrainConfig(objective="cross_entropy", lam=1e-3, phases=[fl.Phase(steps=1, lr=1e-3)])
    with pytest.raises(fl.FeaturelabError, match="from_torch"):
        fl.train(seq, fl.digits(100), config, progress=False)
