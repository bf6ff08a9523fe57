"""analyze: every rank column against a numpy SVD, the hooks of conv nets and custom residual modules,
balancedness and alignment against independent computations, the bottleneck rank's invariance under
function-preserving rescaling, scalar-output Jacobians, frozen parameters in the NTK, train-mode
models, one-line errors, the tracker and the command line."""

import sys
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import featurelab as fl
from featurelab.analysis import AnalysisTracker
from featurelab.cli import main
from featurelab.measurements import balancedness_residual, entropy_rank, jacobian_ranks, ntk_trace


def numpy_ranks(M: np.ndarray, rel=0.1, tol=1e-3) -> dict:
    s = np.linalg.svd(M, compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return {
        "sv1": s[0],
        "sv2": s[1],
        "stable_rank": (s**2).sum() / s[0] ** 2,
        "nuclear_rank": s.sum() ** 2 / (s**2).sum(),
        "effective_rank": int((s >= rel * s[0]).sum()),
        "entropy_rank": float(np.exp(-(p * np.log(p)).sum())),
        "numerical_rank": int((s > tol * s[0]).sum()),
    }


def assert_row(row, M: np.ndarray):
    for key, value in numpy_ranks(M).items():
        assert row[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def seq_mlp(seed=0, dims=(64, 24, 16, 24, 10)):
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(dims) - 2 else [])
    return nn.Sequential(*layers)


class Block(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w))
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(x + self.body(x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.inp = nn.Linear(64, 16)
        self.blocks = nn.ModuleList([Block(16), Block(16)])
        self.out = nn.Linear(16, 10)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


@pytest.fixture(scope="module")
def data():
    d = fl.digits(300)
    return d.X_train.float(), d.Y_train


def test_entropy_rank_closed_forms():
    assert entropy_rank(torch.diag(torch.tensor([2.0, 2.0, 2.0, 0.0]))) == pytest.approx(3.0, rel=1e-14)
    assert entropy_rank(torch.zeros(3, 3)) == 0.0
    s = torch.tensor([3.0, 1.0])  # exp(H) with p = (3/4, 1/4)
    assert entropy_rank(torch.diag(s)) == pytest.approx(np.exp(-(0.75 * np.log(0.75) + 0.25 * np.log(0.25))))


def test_mlp_columns_against_numpy(data):
    X, Y = data
    seq = seq_mlp()
    res = fl.analyze(seq, X, Y)
    linears = [m for m in seq if isinstance(m, nn.Linear)]
    assert list(res.layers["name"]) == ["0", "2", "4", "6"]
    for (_, row), lin in zip(res.layers.iterrows(), linears):
        assert_row(row, lin.weight.detach().double().numpy())
        assert row["bias_sq"] == pytest.approx(float((lin.bias.detach().double() ** 2).sum()), rel=1e-12)
    # representations: input, the three ReLU outputs, output; ranks of the centred A/√N
    assert list(res.representations["type"]) == ["input", "ReLU", "ReLU", "ReLU", "output"]
    with torch.no_grad():
        A = X.double()
        reps = [A]
        net = seq.double()
        for m in net:
            A = m(A)
            if isinstance(m, nn.ReLU):
                reps.append(A)
        reps.append(A)
    for (_, row), R in zip(res.representations.iterrows(), reps):
        C = (R - R.mean(0)).numpy() / np.sqrt(len(R))
        assert_row(row, C)
        assert row["dead_share"] == pytest.approx(float((R.abs().amax(0) == 0).double().mean()))
    assert res.summary["train_error"] == pytest.approx(float((net(X.double()).argmax(1) != Y).double().mean()))


def test_balancedness_and_alignment_against_mlp_tools(data):
    seq = seq_mlp(2)
    res = fl.analyze(seq)
    mlp = fl.from_torch(seq)
    for l, r in enumerate(balancedness_residual(mlp)):
        assert res.layers["balance_residual"][l] == pytest.approx(float(r.max()), rel=1e-10)
    Ws = [W.detach().double() for W in mlp.weight_matrices()]
    for l in range(len(Ws) - 1):  # |<u_1(W_l), v_1(W_{l+1})>|
        u = torch.linalg.svd(Ws[l])[0][:, 0]
        v = torch.linalg.svd(Ws[l + 1])[2][0]
        assert res.layers["alignment"][l] == pytest.approx(float((u @ v).abs()), abs=1e-10)
    assert np.isnan(res.layers["alignment"].iloc[-1])


def test_bottleneck_is_invariant_under_rescaling(gen):
    """k_mid is read after rebalancing, so a function-preserving rescaling of two layers does not move it."""
    dims = [6, 12, 12, 12, 12, 12, 4]
    seq = nn.Sequential()
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        U, _ = torch.linalg.qr(torch.randn(b, b, generator=gen))
        V, _ = torch.linalg.qr(torch.randn(a, a, generator=gen))
        s = torch.logspace(0.3, -2.5, min(a, b))  # singular values from 2 down to 0.003
        lin = nn.Linear(a, b)
        with torch.no_grad():
            lin.weight.copy_(U[:, : len(s)] @ torch.diag(s) @ V[:, : len(s)].T)
            lin.bias.zero_()
        seq.append(lin)
        if i < len(dims) - 2:
            seq.append(nn.ReLU())
    base = fl.analyze(seq).summary["bottleneck"]
    scaled = fl.from_torch(seq)
    with torch.no_grad():  # neuron-wise c in, 1/c out at hidden layers 2 and 3
        c = torch.linspace(0.05, 20, 12)
        for l in (1, 2):
            scaled.weights[l].mul_(c[:, None])
            scaled.weights[l + 1][:, :12].div_(c[None, :])
    X = torch.randn(30, 6, generator=gen)
    assert torch.allclose(scaled(X), seq(X), atol=1e-4)
    moved = fl.analyze(fl.to_torch(scaled)).summary["bottleneck"]
    assert moved["k_mid"] == base["k_mid"] and moved["counts"] == base["counts"]
    assert moved["sq_norm_rebalanced"] == pytest.approx(base["sq_norm_rebalanced"], rel=1e-5)


def test_conv_net_kernels_and_image_inputs(data):
    X, Y = data
    torch.manual_seed(3)
    conv = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 16, 10))
    res = fl.analyze(conv, X.reshape(-1, 1, 8, 8), Y)
    first, last = conv[0], conv[4]
    assert isinstance(first, nn.Conv2d) and isinstance(last, nn.Linear)
    K = first.weight.detach().double()
    assert res.layers["matrix"][0] == "6x9" and res.layers["shape"][0] == "6x1x3x3"
    assert_row(res.layers.iloc[0], K.reshape(6, -1).numpy())
    # alignment with the Linear after Flatten: v = top eigenvector of Σ_p W[:, :, p]ᵀ W[:, :, p] (channel Gram)
    W = last.weight.detach().double().reshape(10, 6, 16)
    G = torch.einsum("ocp,odp->cd", W, W)
    v = torch.linalg.eigh(G)[1][:, -1]
    u = torch.linalg.svd(K.reshape(6, -1))[0][:, 0]
    assert res.layers["alignment"][0] == pytest.approx(float((u @ v).abs()), abs=1e-10)
    # per-channel balancedness: ‖kernel_c‖² + b_c² − Σ_p ‖W[:, c, p]‖²
    incoming = (K.reshape(6, -1) ** 2).sum(1) + first.bias.detach().double() ** 2
    assert np.allclose(res.balance["0"], (incoming - (W**2).sum((0, 2))).numpy(), atol=1e-12)
    rep = res.representations
    assert list(rep["shape"]) == ["1x8x8", "6x8x8", "10"]
    assert res.summary["bottleneck"] is None
    J = fl.measurements.jacobian(conv, X[:2].reshape(-1, 1, 8, 8))  # image inputs, flattened per sample
    assert J.shape == (2, 10, 64)


def test_residual_module_hooks(data):
    X, _ = data
    net = ResNet()
    res = fl.analyze(net, X)  # default: the repeated blocks' outputs, the residual stream
    assert list(res.representations["name"]) == ["input", "blocks.0", "blocks.1", "output"]
    chosen = fl.analyze(net, X, representations=["blocks.*.body.1", nn.ReLU, "inp"])
    names = list(chosen.representations["name"])
    assert names == ["input", "inp", "blocks.0.body.1", "blocks.0.act", "blocks.1.body.1", "blocks.1.act", "output"]
    with torch.no_grad():
        h = net.double().inp(X.double())
        h = net.blocks[0](h)
    C = (h - h.mean(0)).numpy() / np.sqrt(len(h))
    assert_row(res.representations.set_index("name").loc["blocks.0"], C)
    assert len(res.layers) == 6 and res.layers["alignment"].notna().sum() == 2  # only inside each block body


def test_shared_activation_module_is_one_row_per_call(data):
    X, _ = data

    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.act = nn.Linear(64, 8), nn.Linear(8, 3), nn.ReLU()

        def forward(self, x):
            return self.act(self.b(self.act(self.a(x))))

    res = fl.analyze(Shared(), X)
    assert list(res.representations["name"]) == ["input", "act", "act#2", "output"]


def test_featurelab_models(data):
    X, Y = data
    mlp = fl.MLP(64, 10, 16, 3, bias=0.5, seed=0)
    res = fl.analyze(mlp, X, Y)
    assert len(res.layers) == 3 and res.summary["bottleneck"]["k_mid"] >= 1
    b = 0.5 * mlp.weights[0][:, -1].detach().double()
    assert res.layers["bias_sq"][0] == pytest.approx(float((b**2).sum()))
    net = fl.LeakyResNet(64, 10, 64, 4, 2.0)
    res = fl.analyze(net, X)
    assert list(res.layers["name"]) == ["W[0]", "W[1]", "W[2]", "W[3]"]
    assert_row(res.layers.iloc[2], net.W[2].detach().double().numpy())
    assert list(res.representations["name"]) == ["input", "A_0", "A_1", "A_2", "A_3", "A_4", "output"]


def test_scalar_output_jacobian_rank():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 1), nn.Flatten(0))
    ranks = jacobian_ranks(net, torch.randn(10, 64))
    assert ranks.shape == (10,) and int(ranks.max()) == 1


def test_ntk_trace_leaves_frozen_parameters_out():
    """Only the last layer trainable: Tr Θ(x, x) = d_out (‖α_{L-1}(x)‖² + 1) (∂f_o/∂W_L[o, :] = α_{L-1}(x))."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).double()
    net[0].requires_grad_(False)
    X = torch.randn(4, 5, dtype=torch.float64)
    alpha = torch.relu(net[0](X))
    assert torch.allclose(ntk_trace(net, X), 3 * ((alpha**2).sum(1) + 1), rtol=1e-12)
    assert (ntk_trace(net, X, include_frozen=True) > ntk_trace(net, X) + 1e-6).all()


def test_train_mode_models(data):
    X, _ = data
    net = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    net.train()
    with pytest.raises(fl.FeaturelabError, match=r"model.eval\(\)"):
        jacobian_ranks(net, X[:3])
    res = fl.analyze(net, X, jacobian=2)  # analysed as in eval mode, on a copy
    assert net.training and net[3].training
    net.eval()
    with torch.no_grad():
        out = net(X).double()
    C = (out - out.mean(0)).numpy() / np.sqrt(len(out))
    assert res.representations["sv1"].iloc[-1] == pytest.approx(np.linalg.svd(C, compute_uv=False)[0], rel=1e-5)


def test_one_line_errors(data):
    X, _ = data

    class DictOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 2)

        def forward(self, x):
            return {"logits": self.lin(x)}

    not_a_module: Any = "model"  # the wrong type on purpose: analyze must refuse it in one line

    cases = [
        (lambda: fl.analyze(DictOut(), X), "returned a dict"),
        (lambda: fl.analyze(nn.Sequential(nn.Conv2d(1, 2, 3)), X), "N x c x H x W"),
        (lambda: fl.analyze(not_a_module), "nn.Module"),
        (lambda: fl.analyze(nn.ReLU()), "no weight matrix"),
        (lambda: fl.analyze(seq_mlp(), X, torch.zeros(3)), "Y has 3 rows"),
    ]
    for call, words in cases:
        with pytest.raises(fl.FeaturelabError, match=words) as err:
            call()
        assert "\n" not in str(err.value)


def test_tracker_in_trainer_and_own_loop(data, tmp_path):
    X, Y = data
    d = fl.digits(300)
    model = fl.MLP(64, 10, 16, 3, bias=1.0, seed=0)
    tracker = AnalysisTracker(X, Y)
    config = fl.TrainConfig(
        objective="cross_entropy", lam=1e-3, log_every=20, top_singular_values=0, phases=[fl.Phase(steps=40, lr=1e-2)]
    )
    history = fl.train(model, d, config, callbacks=[tracker], progress=False).history
    assert tracker.steps == [0, 20, 40] and list(history["k_mid"]) == [
        r.summary["bottleneck"]["k_mid"] for r in tracker.results
    ]
    assert set(tracker.layers["step"]) == {0, 20, 40} and len(tracker.layers) == 9
    own = AnalysisTracker(every=3)
    for _ in range(7):
        own.step(model)
    assert own.steps == [0, 3, 6]
    tracker.plot()
    path = tracker.results[-1].report(tmp_path / "report")
    assert "data:image/png;base64," in path.read_text()
    assert (tmp_path / "report" / "tables" / "layers.csv").exists()


def test_balance_drift_is_first_order_in_the_step(gen):
    """q_i = ‖w_in‖² + b² − ‖w_out‖² of a biased, leaky-ReLU, 3-output net under gradient descent on the MSE
    (λ = 0): a gradient-flow invariant, so its drift over a fixed time T is O(η): halving η halves it."""
    torch.manual_seed(0)
    X = torch.randn(20, 4, generator=gen, dtype=torch.float64)
    Y = torch.randn(20, 3, generator=gen, dtype=torch.float64)
    drifts = []
    for eta in (0.02, 0.01):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 6), nn.LeakyReLU(0.1), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).double()
        tracker = AnalysisTracker(every=round(1.0 / eta))
        for _ in range(round(1.0 / eta) + 1):  # T = 1
            tracker.step(net)
            net.zero_grad()
            ((net(X) - Y) ** 2).mean().backward()
            with torch.no_grad():
                for p in net.parameters():
                    assert p.grad is not None  # backward() reached every parameter
                    p -= eta * p.grad
        drifts.append(tracker.balance_drift()["drift"].iloc[-1])
    assert 0 < drifts[1] < 1e-2
    assert drifts[0] / drifts[1] == pytest.approx(2.0, rel=0.1)


FACTORY = """
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 10))
"""


def test_cli_safetensors_and_factory(tmp_path, monkeypatch, capsys):
    from safetensors.torch import save_file

    (tmp_path / "mynets.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mynets", raising=False)
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 10))
    first, last = seq[0], seq[4]
    assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
    save_file(seq.state_dict(), str(tmp_path / "w.safetensors"))
    assert main(["analyze", "w.safetensors", "--out", "weights"]) == 0
    table = pd.read_csv(tmp_path / "weights" / "tables" / "layers.csv")
    assert len(table) == 3 and (tmp_path / "weights" / "report.html").exists()
    assert table["sv1"][2] == pytest.approx(np.linalg.svd(last.weight.detach().double().numpy())[1][0], rel=1e-6)
    assert table["bias_sq"][0] == pytest.approx(float((first.bias.detach().double() ** 2).sum()), rel=1e-6)
    assert main(["analyze", "mynets:make", "--data", "digits", "--n", "200", "--out", "fac"]) == 0
    reps = pd.read_csv(tmp_path / "fac" / "tables" / "representations.csv")
    assert list(reps["name"]) == ["input", "1", "3", "output"] and (tmp_path / "fac" / "report.html").exists()
    capsys.readouterr()
    for args, words in (
        (("missing.safetensors",), "missing.safetensors"),
        (("mynets:nothing", "--data", "digits"), "mynets:nothing"),
        (("nomodule:make",), "nomodule"),
    ):
        assert main(["analyze", *args]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1
