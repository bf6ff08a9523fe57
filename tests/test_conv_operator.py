"""A conv layer's operator (`featurelab.analysis.conv_operator`): its singular values on the data's input size
against the dense Jacobian of the layer (``torch.func.jacrev`` of the module on one input, reshaped outputs x
inputs), for zero padding with a folded BatchNorm, depthwise, strided and circular (fft) convs, the fft route
against the dense route, Lanczos against the dense spectrum, and the operator columns of `analyze`."""

import math

import numpy as np
import pytest
import torch
from torch import nn

import featurelab as fl
from featurelab.analysis import conv_operator, weights_module
from featurelab.analysis.conv_operator import operator_spectrum


def jacobian_values(f, shape):
    """All singular values of the affine map f at one input of `shape` (its linear part: the Jacobian)."""
    x = torch.randn(1, *shape, dtype=torch.float64)
    J = torch.func.jacrev(f)(x).reshape(-1, math.prod(shape))
    return np.linalg.svd(J.detach().numpy(), compute_uv=False)


def randomize_bn(bn: nn.BatchNorm2d) -> nn.BatchNorm2d:
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.3, 3)
        bn.weight.uniform_(0.5, 2)
        bn.bias.uniform_(-1, 1)
    return bn.eval()


def bn_scale(bn: nn.BatchNorm2d) -> torch.Tensor:
    return (bn.weight / (bn.running_var + bn.eps).sqrt()).detach()


CASES = {
    "3x3 zero padding": (lambda: nn.Conv2d(4, 6, 3, padding=1), (4, 6, 6)),
    "depthwise": (lambda: nn.Conv2d(5, 5, 3, padding=1, groups=5), (5, 7, 7)),
    "strided": (lambda: nn.Conv2d(3, 5, 3, stride=2, padding=1), (3, 9, 9)),
    "circular": (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"), (3, 6, 5)),
    "circular grouped dilated": (
        lambda: nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2, padding_mode="circular"),
        (4, 5, 6),
    ),
    "conv1d": (lambda: nn.Conv1d(3, 4, 5, padding=2), (3, 12)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_full_spectrum_against_the_dense_jacobian(case):
    torch.manual_seed(0)
    make, shape = CASES[case]
    conv = make().double()
    op = operator_spectrum(conv, shape)
    exact = jacobian_values(conv, shape)  # the bias only shifts: the Jacobian is the operator
    assert op.full and op.method == ("fft" if "circular" in case else "dense")
    assert len(op.values) == len(exact) and op.input == shape
    np.testing.assert_allclose(op.values, exact, atol=1e-6 * exact[0])
    assert op.stable_rank == pytest.approx((exact**2).sum() / exact[0] ** 2, rel=1e-6)


def test_folded_batchnorm_is_part_of_the_operator():
    torch.manual_seed(1)
    conv, bn = nn.Conv2d(4, 6, 3, padding=1, bias=False).double(), randomize_bn(nn.BatchNorm2d(6).double())
    exact = jacobian_values(nn.Sequential(conv, bn), (4, 6, 6))
    op = operator_spectrum(conv, (4, 6, 6), scale=bn_scale(bn))
    np.testing.assert_allclose(op.values, exact, atol=1e-6 * exact[0])
    # the unfolded kernel's spectrum is another object: its s_1 is below the operator's here
    unfolded = np.linalg.svd(
        (conv.weight * bn_scale(bn)[:, None, None, None]).detach().reshape(6, -1), compute_uv=False
    )
    assert unfolded[0] < 0.9 * exact[0]


@pytest.mark.parametrize("case", ["circular", "circular grouped dilated"])
def test_fft_route_against_the_dense_route(case):
    torch.manual_seed(2)
    make, shape = CASES[case]
    conv = make().double()
    fft = operator_spectrum(conv, shape).values
    dense = np.linalg.svd(conv_operator._dense(conv_operator.conv_map(conv), shape), compute_uv=False)
    np.testing.assert_allclose(fft, dense, rtol=0, atol=1e-10 * dense[0])


@pytest.mark.parametrize(
    "make",
    [
        lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1, dilation=1),
        lambda: nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2),
        lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),
    ],
)
def test_lanczos_top_values_and_exact_frobenius(make, monkeypatch):
    """Above `DENSE_MAX`: the top 5 by ARPACK through conv / conv_transpose (or the vector-Jacobian product for
    reflect padding) match the dense spectrum; for zero padding ‖A‖²_F from the tap counts is exact, so the stable
    rank is too; for reflect padding it is NaN."""
    torch.manual_seed(3)
    conv = make().double()
    shape = (conv.in_channels, 9, 7)
    exact = jacobian_values(conv, shape)
    monkeypatch.setattr(conv_operator, "DENSE_MAX", 50)
    op = operator_spectrum(conv, shape, k=5)
    assert op.method == "lanczos" and not op.full
    np.testing.assert_allclose(op.values, exact[:5], rtol=1e-9)
    if conv.padding_mode == "zeros":
        assert op.frobenius_sq == pytest.approx((exact**2).sum(), rel=1e-12)
        assert op.stable_rank == pytest.approx((exact**2).sum() / exact[0] ** 2, rel=1e-9)
    else:
        assert np.isnan(op.stable_rank)


def test_adjoint_is_the_transpose():
    """⟨Ax, y⟩ = ⟨x, Aᵀy⟩ for a strided conv on an input size that leaves a remainder (output_padding)."""
    torch.manual_seed(4)
    conv = nn.Conv2d(3, 5, 4, stride=3, padding=1).double()
    shape = (3, 11, 10)
    forward = conv_operator.conv_map(conv)
    adjoint = conv_operator._adjoint(conv, None, forward, shape)
    x = torch.randn(2, *shape, dtype=torch.float64)
    y = torch.randn_like(forward(x))
    assert float((forward(x) * y).sum()) == pytest.approx(float((x * adjoint(y)).sum()), rel=1e-12)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.dw = nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6)
        self.fc = nn.Linear(6 * 16, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.relu(self.dw(x)).flatten(1))


def test_analyze_operator_columns():
    """With data, each conv row carries its operator on the input the data gives (BatchNorm folded); without data
    the columns are NaN and a note says why; the unfolding's columns stay."""
    torch.manual_seed(5)
    net = Net()
    randomize_bn(net.bn)
    X = torch.randn(20, 1, 8, 8)
    res = fl.analyze(net, X)
    layers = res.layers.set_index("name")
    net = net.double()
    exact = jacobian_values(nn.Sequential(net.conv, net.bn), (1, 8, 8))
    row = layers.loc["conv"]
    assert row["operator_input"] == "1x8x8" and row["operator_method"] == "dense"
    assert row["operator_sv1"] == pytest.approx(exact[0], rel=1e-6)
    assert row["operator_stable_rank"] == pytest.approx((exact**2).sum() / exact[0] ** 2, rel=1e-6)
    dw = jacobian_values(net.dw, (6, 8, 8))
    assert layers.loc["dw", "operator_sv1"] == pytest.approx(dw[0], rel=1e-6)
    assert layers.loc["dw", "operator_sv2"] == pytest.approx(dw[1], rel=1e-6)
    assert layers.loc["dw", "matrix"] == "6x54" and np.isnan(layers.loc["fc", "operator_sv1"])
    bare = fl.analyze(net).layers.set_index("name")
    assert np.isnan(bare.loc["conv", "operator_sv1"]) and bare.loc["conv", "sv1"] == pytest.approx(row["sv1"])
    assert any("operator_*" in n and "no inputs X" in n for n in fl.analyze(net).summary["notes"])


def test_weights_file_reads_depthwise_convs_per_group(tmp_path):
    """A file stores no groups: a [C, 1, k, k] kernel after a layer writing C channels is depthwise (its singular
    values are its filters' norms, as the model's own analysis gives); a [C, 1, k, k] first layer is a dense conv
    of one input channel; a kernel reading fewer channels than the layer before writes gets a note naming it."""
    from safetensors.torch import save_file

    torch.manual_seed(6)
    net = Net()
    state = {k: v for k, v in net.state_dict().items() if not k.startswith("bn")}
    state["grouped.weight"] = torch.randn(8, 2, 3, 3)  # natural order: after "fc" (10 outputs), reads 2
    save_file(state, str(tmp_path / "w.safetensors"))
    res = fl.analyze(weights_module(tmp_path / "w.safetensors"))
    layers = res.layers.set_index("name")
    assert layers.loc["dw", "kind"] == "grouped conv" and layers.loc["dw", "groups"] == 6
    norms = np.sort(net.dw.weight.detach().double().reshape(6, -1).norm(dim=1).numpy())[::-1]
    np.testing.assert_allclose(res.spectra["dw"], norms, rtol=1e-12)
    model_rows = fl.analyze(net).layers.set_index("name")
    assert layers.loc["dw", "stable_rank"] == pytest.approx(model_rows.loc["dw", "stable_rank"], rel=1e-12)
    assert layers.loc["conv", "kind"] == "conv" and layers.loc["conv", "matrix"] == "6x9"
    assert layers.loc["grouped", "groups"] == 1
    assert any("conv grouped reads 2 channels" in n and "writes 10" in n for n in res.summary["notes"])
