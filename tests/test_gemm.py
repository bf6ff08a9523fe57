"""CPU matrix products through oneDNN or torch (`featurelab.training._kernels.gemm`): each path against a float64
product, the choice itself, and the float32 models that use them (the digits MLP ensemble's first layer, the Leaky
ResNet's residual steps) against float64 plain autograd, with oneDNN forced on and off."""

import copy

import pytest
import torch

import featurelab as fl
from featurelab.errors import FeaturelabError
from featurelab.models import leaky_resnet as lr
from featurelab.training import Phase, TrainConfig, data_cost
from featurelab.training._kernels import gemm
from featurelab.training._kernels.leaky_resnet import ResidualSteps
from featurelab.training.stack import Losses, Stack

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
PATHS = [pytest.param("onednn", marks=pytest.mark.skipif(not ONEDNN, reason="this torch has no oneDNN")), "mkl"]


@pytest.fixture
def products(monkeypatch):
    """``products(choice)`` sets FEATURELAB_GEMM for the test (the cached choice is dropped before and after)."""

    def choose(choice: str) -> None:
        monkeypatch.setenv("FEATURELAB_GEMM", choice)
        gemm.onednn_products.cache_clear()

    yield choose
    gemm.onednn_products.cache_clear()
    monkeypatch.undo()
    gemm.onednn_products.cache_clear()


def f32(gen, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def assert_product_close(got: torch.Tensor, want64: torch.Tensor, k: int) -> None:
    """float32 rounding of a length-k sum of products of N(0, 1) entries: a few ulps of √k, well below 1e-4."""
    assert got.dtype == torch.float32 and got.shape == want64.shape
    torch.testing.assert_close(got.double(), want64, rtol=0, atol=1e-5 * k**0.5)


@pytest.mark.parametrize("path", PATHS)
def test_products_and_sums_of_each_path_match_float64(gen, products, path):
    """A @ B and A @ B + add for plain and transposed operands, and batched members, above the size at which
    oneDNN is used: each equals the float64 product to float32 rounding (a transposed operand read as the
    plain one, the sum left out or one member's product given to another would not)."""
    products(path)
    m, k, n = 48, 130, 700
    assert 2 * m * k * n >= gemm.ONEDNN_MIN_FLOPS
    A, B, C = f32(gen, m, k), f32(gen, k, n), f32(gen, m, n)
    assert gemm._through_onednn(A, B) == (path == "onednn")
    want = A.double() @ B.double()
    assert_product_close(gemm.product(A, B), want, k)
    assert_product_close(gemm.product(A.mT.contiguous().mT, B.mT.contiguous().mT), want, k)
    assert_product_close(gemm.product(A, B, add=C.clone()), want + C.double(), k)
    As, Bs, Cs = f32(gen, 3, m, k), f32(gen, 3, k, n), f32(gen, 3, m, n)
    want3 = As.double() @ Bs.double()
    assert_product_close(gemm.product(As, Bs), want3, k)
    assert_product_close(gemm.product(As, Bs, add=Cs.clone()), want3 + Cs.double(), k)


def test_small_float64_and_differentiated_products_take_torchs_matmul(gen, products):
    """Below `ONEDNN_MIN_FLOPS`, in float64, and where autograd must differentiate the product, torch's own
    matmul runs whatever the choice: its result bit for bit, and a gradient."""
    products("onednn")
    small = f32(gen, 8, 8), f32(gen, 8, 8)
    big64 = f32(gen, 64, 200).double(), f32(gen, 200, 300).double()
    for A, B in (small, big64):
        assert not gemm._through_onednn(A, B)
        assert torch.equal(gemm.product(A, B), A @ B)
    A = f32(gen, 64, 200).requires_grad_(True)
    B = f32(gen, 200, 300)
    gemm.product(A, B).sum().backward()
    assert A.grad is not None
    torch.testing.assert_close(A.grad, B.sum(1).expand(64, -1))


def test_the_choice_follows_the_environment_and_names_bad_values(products):
    products("mkl")
    assert not gemm.onednn_products()
    products("onednn")
    assert gemm.onednn_products() == ONEDNN
    products("auto")
    assert gemm.onednn_products() == (ONEDNN and gemm._amd_with_avx512())
    products("blas")
    with pytest.raises(FeaturelabError, match=r"FEATURELAB_GEMM='blas' is not allowed; choose one of: auto"):
        gemm.onednn_products()


@pytest.mark.parametrize("path", PATHS)
def test_a_float32_ensemble_gradient_matches_float64_autograd(products, path):
    """Three float32 digits MLPs as one ensemble (first layer 64 -> 16 over 1000 samples: a product large enough
    for oneDNN, with the bias amount 0.5 in its row of the shared input): the chained step's gradient of each
    member's C + λ‖θ‖² equals float64 autograd's to float32 rounding (a bias row of ones instead of 0.5, or
    the first layer's gradient taken for another member, would not)."""
    products(path)
    data = fl.digits(1000, seed=0)
    models = [fl.MLP(64, 10, 16, 3, bias=0.5, seed=i) for i in range(3)]
    refs = [copy.deepcopy(m).double() for m in models]
    cfg = TrainConfig(objective="cross_entropy", lam=1e-3, phases=[Phase(optimizer="adam", steps=1, lr=1e-3)])
    stack = Stack(models)
    losses = Losses(stack, [data] * 3, [cfg] * 3, torch.device("cpu"))
    _, X, Y = losses.data_on(stack.dtype)
    first_layer = torch.empty(48, 65), torch.empty(65, len(X))  # all members' weights, the input with its bias row
    assert losses.pullbacks and gemm._through_onednn(*first_layer) == (path == "onednn")
    _, grad = losses.value_and_grad(X, Y, None, value=False)
    for i, ref in enumerate(refs):
        loss = data_cost("cross_entropy", ref(data.X_train.double()), data.Y_train) + ref.penalty(1e-3)
        want = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(ref.parameters()))])
        torch.testing.assert_close(grad[i].double(), want, rtol=0, atol=1e-6 * float(want.abs().max()))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("members", [None, 2])
def test_float32_residual_steps_match_float64_autograd(gen, products, path, members):
    """The Leaky ResNet's residual steps (width 64, 600 samples: products large enough for oneDNN) as one node
    in float32, one net or two stacked members, against plain autograd of `euler_steps` in float64: A_L and
    the gradients with respect to A_0 and W, to a float32-sized tolerance relative to their scale."""
    products(path)
    L, w, N = 3, 64, 600
    lead = () if members is None else (members,)
    A0 = torch.randn(*lead, N, w, generator=gen)
    W = torch.randn(*lead, L, w, w + 1, generator=gen) / w**0.5
    rho = torch.full((*lead, L), 1 / L, dtype=torch.float64)
    G = torch.randn(*lead, N, w, generator=gen)
    A0_32, W_32 = A0.clone().requires_grad_(True), W.clone().requires_grad_(True)
    out = ResidualSteps.apply(A0_32, W_32, rho, 2.0)
    dA0, dW = torch.autograd.grad(out, (A0_32, W_32), G)
    A0_64, W_64 = A0.double().requires_grad_(True), W.double().requires_grad_(True)
    ref = lr.euler_steps(A0_64, W_64, rho, 2.0)[-1]
    dA0_ref, dW_ref = torch.autograd.grad(ref, (A0_64, W_64), G.double())
    for got, want in ((out, ref), (dA0, dA0_ref), (dW, dW_ref)):
        assert got.dtype == torch.float32
        scale = float(want.detach().abs().max())
        torch.testing.assert_close(got.detach().double(), want.detach(), rtol=0, atol=1e-5 * scale)


def test_a_bad_choice_stops_a_run_before_it_writes(products, tmp_path, capsys):
    """`featurelab run` and `train` name FEATURELAB_GEMM and its choices in one line, and write nothing."""
    from featurelab.cli import main

    products("blas")
    assert main(["run", "leaky-bottleneck", "--preset", "tiny", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["featurelab: error: FEATURELAB_GEMM='blas' is not allowed; choose one of: auto, onednn, mkl"]
    cfg = TrainConfig(phases=[Phase(optimizer="adam", steps=1, lr=1e-3)])
    with pytest.raises(FeaturelabError, match="FEATURELAB_GEMM"):
        fl.train(fl.MLP(64, 10, 16, 3), fl.digits(100), cfg, run_dir=tmp_path / "unit")
    assert not (tmp_path / "run").exists() and not (tmp_path / "unit").exists()
