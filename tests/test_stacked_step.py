"""The stacked training step's shortcuts against plain autograd and torch's own functions, float64, to 1e-12:
the cross-entropy node (values, gradients, Hessian-vector products), the weight-decay node, the MLP's and
the cost's pullbacks chained by hand, the flat parameter buffer with λ‖θ‖² taken from it, Adam's fused
and per-member arithmetic, and the log's metrics from one stacked pass."""

import copy
from typing import cast

import pytest
import torch
import torch.nn.functional as F

import featurelab as fl
from featurelab.training import Phase, TrainConfig, _kernels, data_cost, error_rate, evaluate, train_ensemble
from featurelab.training.objectives import cost_pullback, cross_entropy
from featurelab.training.optim import ADAM_FULL_CORRECTION, adam_corrections
from featurelab.training.stack import Losses, Stack


def logits(gen, M: int, N: int, C: int, columns: bool) -> torch.Tensor:
    """``M x N x C`` float64 logits that require a gradient: a leaf, or (`columns`) the transposed view of an
    ``M x C x N`` leaf, as the stacked MLP returns them."""
    if columns:
        return torch.randn(M, C, N, generator=gen, dtype=torch.float64, requires_grad=True).mT
    return torch.randn(M, N, C, generator=gen, dtype=torch.float64, requires_grad=True)


def reference_cross_entropy(z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``(M,)``: mean over samples of logsumexp(z_n) − z_{n, y_n}."""
    picked = z.gather(-1, labels.expand(z.shape[:-1])[..., None])[..., 0]
    return (z.logsumexp(-1) - picked).mean(-1)


@pytest.mark.parametrize("columns", [False, True])
@pytest.mark.parametrize("per_member", [False, True])
def test_cross_entropy_node_values_gradients_and_hvps(gen, columns, per_member):
    M, N, C = 3, 11, 4
    z = logits(gen, M, N, C, columns)
    labels = torch.randint(0, C, (M, N) if per_member else (N,), generator=gen)
    g, v = torch.randn(M, generator=gen, dtype=torch.float64), torch.randn(M, N, C, generator=gen, dtype=torch.float64)
    got, want = cross_entropy(z, labels), reference_cross_entropy(z, labels)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(got, F.cross_entropy(z.mT, labels.expand(M, N), reduction="none").mean(-1))
    (dz,), (dz_ref,) = torch.autograd.grad(got, z, g), torch.autograd.grad(want, z, g)
    torch.testing.assert_close(dz, dz_ref, rtol=0, atol=1e-12)

    def hvp(cost):
        (grad,) = torch.autograd.grad(cost(z, labels).sum(), z, create_graph=True)
        return torch.autograd.grad((grad * v).sum(), z)[0]

    torch.testing.assert_close(hvp(cross_entropy), hvp(reference_cross_entropy), rtol=0, atol=1e-12)


def test_cost_pullback_is_the_nodes_gradient(gen):
    """Called directly (no autograd graph), the cross-entropy's pullback gives autograd's gradient; other
    objectives have none."""
    M, N, C = 4, 9, 3
    z = logits(gen, M, N, C, columns=True)
    labels = torch.randint(0, C, (N,), generator=gen)
    g = torch.randn(M, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        cost, pullback = cast(tuple, cost_pullback("cross_entropy", z, labels))
        dz = pullback(g)
    torch.testing.assert_close(cost, reference_cross_entropy(z, labels), rtol=0, atol=1e-12)
    torch.testing.assert_close(dz, torch.autograd.grad(reference_cross_entropy(z, labels), z, g)[0], rtol=0, atol=1e-12)
    with torch.no_grad():  # a step that needs the gradient only: no cost, the same pullback
        no_cost, pullback = cast(tuple, cost_pullback("cross_entropy", z, labels, value=False))
        torch.testing.assert_close(pullback(g), dz, rtol=0, atol=0)
    assert no_cost is None
    assert cost_pullback("mse", z, torch.randn(N, C, dtype=torch.float64)) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cross_entropy_of_confident_logits_matches_torch(dtype):
    """Logits 10³ apart (a confident net: the other classes' exponentials underflow to 0, the ones of a
    float32 net already below −88) and tied at the top: the cost and its gradient equal torch's
    F.cross_entropy and its gradient to rounding (an unshifted exponential would overflow to inf and NaN)."""
    z = torch.tensor([[[1000.0, -1000.0, 0.0], [500.0, 500.0, -500.0], [-3.0, 2.0, 2.5]]], dtype=dtype)
    labels = torch.tensor([0, 1, 2])
    z.requires_grad_(True)
    got = cross_entropy(z, labels)
    want = F.cross_entropy(z[0], labels)
    torch.testing.assert_close(got[0], want)
    (dz,), (dz_ref,) = torch.autograd.grad(got.sum(), z), torch.autograd.grad(want, z)
    assert torch.isfinite(dz).all()
    torch.testing.assert_close(dz, dz_ref)


def mlp(seed: int = 0, **kw) -> fl.MLP:
    return fl.MLP(5, 3, [7, 4], 3, bias=0.5, seed=seed, dtype=torch.float64, **kw)


def holding(model: fl.MLP, Ws: list[torch.Tensor]) -> fl.MLP:
    """`model` with the tensors `Ws` as its weights (stacked ones, as the engine's twin holds them)."""
    for l, W in enumerate(Ws):
        model.weights._parameters[str(l)] = cast(torch.nn.Parameter, W)
    return model


@pytest.mark.parametrize("stacked", [False, True])
def test_weight_decay_node_values_gradients_and_hvps(gen, stacked):
    """``MLP.penalty`` as the training core takes it (`_kernels.penalty`: one node): λΣ‖W_l‖² with λ a float or per
    member, its gradient and its second derivative (a Hessian-vector product through the gradient) as plain
    autograd of the sum of squares."""
    model = mlp()
    shape = (3,) if stacked else ()
    Ws = [torch.randn(*shape, *W.shape, generator=gen, dtype=torch.float64, requires_grad=True) for W in model.weights]
    model = holding(model, Ws)
    lam = torch.tensor([0.5, 0.0, 2.0], dtype=torch.float64) if stacked else 0.3

    def reference() -> torch.Tensor:
        return lam * torch.stack([(W**2).sum((-2, -1)) for W in Ws]).sum(0)

    got, want = _kernels.penalty(model, lam), reference()
    assert type(got.grad_fn).__name__ == "WeightDecayBackward"
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    g = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, Ws, g), torch.autograd.grad(want, Ws, g)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    vs = [torch.randn(W.shape, generator=gen, dtype=torch.float64) for W in Ws]

    def hvp(penalty):
        grads = torch.autograd.grad(penalty().sum(), Ws, create_graph=True)
        return torch.autograd.grad(torch.stack([(d * v).sum() for d, v in zip(grads, vs)]).sum(), Ws)

    for a, b in zip(hvp(lambda: _kernels.penalty(model, lam)), hvp(reference)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("leak", [0.0, 0.3])
def test_mlp_pullback_is_autograds_gradient(gen, leak):
    """The MLP's pullback (`_kernels.pullback`) called directly: the stacked output and ∂⟨G, output⟩/∂W_l of plain
    autograd."""
    model = mlp(leak=leak)
    Ws = [torch.randn(4, *W.shape, generator=gen, dtype=torch.float64, requires_grad=True) for W in model.weights]
    X = torch.randn(10, 5, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        out, pullback = cast(tuple, _kernels.pullback(model, X, Ws))
    want = holding(model, Ws)(X, return_layers=True).output  # the plain path, layer by layer
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    G = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        grads = pullback(G)
    for a, b in zip(grads, torch.autograd.grad(want, Ws, G)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert _kernels.pullback(model, X.float(), Ws) is None  # another dtype than the weights': the plain path


def classification(n: int = 24, seed: int = 0) -> fl.Dataset:
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=gen, dtype=torch.float64)
    Y = torch.randint(0, 3, (n,), generator=gen)
    return fl.Dataset(X, Y, X[:7] + 0.1, Y[:7])


def configs(lams, lrs=(1e-2,), objective="cross_entropy", steps=4):
    return [
        TrainConfig.model_validate(
            dict(objective=objective, lam=lam, log_every=steps, phases=[Phase(optimizer="adam", steps=steps, lr=lr)])
        )
        for lam, lr in zip(lams, lrs * len(lams) if len(lrs) == 1 else lrs)
    ]


def losses_of(models, datas, cfgs) -> tuple[Stack, Losses, torch.Tensor, torch.Tensor]:
    stack = Stack(models)
    losses = Losses(stack, datas, cfgs, torch.device("cpu"))
    _, X, Y = losses.data_on(stack.dtype)
    return stack, losses, X, Y


@pytest.mark.parametrize("lams", [(0.0, 0.0, 0.0), (0.0, 0.05, 0.2)])
@pytest.mark.parametrize("shared", [True, False])
def test_the_chained_step_equals_autograd(lams, shared):
    """`Losses.value_and_grad` with the MLP's and the cross-entropy's pullbacks chained by hand (λ‖θ‖² taken
    from the flat buffer) gives plain autograd's loss C + λ‖θ‖² and its gradient, per member."""
    models = [mlp(seed=i) for i in range(3)]
    datas = [classification(seed=0 if shared else i) for i in range(3)]
    cfgs = configs(lams)
    refs = copy.deepcopy(models)
    stack, losses, X, Y = losses_of(models, datas, cfgs)
    assert losses.pullbacks and losses.decay_apart == (max(lams) > 0)
    loss, grad = losses.value_and_grad(X, Y, None)
    assert loss is not None
    for i, (ref, data, cfg) in enumerate(zip(refs, datas, cfgs)):
        ref_loss = data_cost("cross_entropy", ref(data.X_train), data.Y_train)
        ref_loss = ref_loss + ref.penalty(cfg.lam) if cfg.lam > 0 else ref_loss
        grads = torch.autograd.grad(ref_loss, list(ref.parameters()))
        torch.testing.assert_close(loss[i], ref_loss, rtol=0, atol=1e-12)
        torch.testing.assert_close(grad[i], torch.cat([g.reshape(-1) for g in grads]), rtol=0, atol=1e-12)


def test_the_flat_buffer_is_the_members_parameters():
    """Every member's module holds views of its row of `Stack.flat`; an update of the buffer shows in them."""
    models = [mlp(seed=i) for i in range(3)]
    before = [torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]
    stack = Stack(models)
    torch.testing.assert_close(stack.flat, torch.stack(before), rtol=0, atol=0)
    with torch.no_grad():
        stack.flat.mul_(2)
    for m, b in zip(models, before):
        torch.testing.assert_close(torch.cat([p.detach().reshape(-1) for p in m.parameters()]), 2 * b, rtol=0, atol=0)


def test_adam_ensembles_equal_torch_optim_with_shared_and_own_rates():
    """Members sharing lr and step count take torch.optim's fused Adam kernel, members with their own lr the
    per-member one; both equal torch.optim.Adam run on each member (C + R, λ > 0) to 1e-12."""
    data = classification()
    for lrs in ((1e-2,), (1e-2, 3e-2, 5e-3)):
        models = [mlp(seed=i) for i in range(3)]
        refs = copy.deepcopy(models)
        cfgs = configs((0.01, 0.0, 0.1), lrs, steps=15)
        train_ensemble(models, data, cfgs)
        for model, ref, cfg in zip(models, refs, cfgs):
            opt = torch.optim.Adam(ref.parameters(), lr=cfg.phases[0].lr)
            for _ in range(15):
                opt.zero_grad()
                pen = ref.penalty(cfg.lam) if cfg.lam > 0 else 0.0
                (data_cost("cross_entropy", ref(data.X_train), data.Y_train) + pen).backward()
                opt.step()
            for a, b in zip(model.parameters(), ref.parameters()):
                torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("objective", ["cross_entropy", "mse"])
def test_the_logged_metrics_of_a_stacked_pass_equal_evaluate(objective):
    """The history rows of an ensemble (one stacked pass per log) equal `evaluate` on each trained member."""
    data = classification()
    if objective == "mse":
        targets = [F.one_hot(Y, 3).double() for Y in (data.Y_train, data.Y_test)]
        data = fl.Dataset(data.X_train, targets[0], data.X_test, targets[1])
    models = [mlp(seed=i) for i in range(3)]
    cfgs = configs((0.0, 0.05, 0.2), objective=objective)
    results = train_ensemble(models, data, cfgs)
    for model, cfg, result in zip(models, cfgs, results):
        assert not isinstance(result, Exception)
        last = result.history.iloc[-1]
        want = evaluate(model, data, cfg)
        assert set(want) <= set(last.index) and any(k.startswith("sv") for k in want)
        for key, value in want.items():
            assert last[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


def test_error_rates_of_stacked_outputs_are_each_members(gen):
    """`error_rate` with a leading member axis: each member's rate, for labels, ±1 targets and regression."""
    out = torch.randn(3, 8, 2, generator=gen, dtype=torch.float64)
    cases = [
        ("cross_entropy", torch.randint(0, 2, (8,), generator=gen)),
        ("logistic", torch.randint(0, 2, (8,), generator=gen) * 2.0 - 1),
        ("mse", torch.randn(8, 2, generator=gen, dtype=torch.float64)),
        ("mse", torch.randn(3, 8, 2, generator=gen, dtype=torch.float64)),
    ]
    for objective, Y in cases:
        f = out[..., :1] if objective == "logistic" else out
        want = [error_rate(objective, f[i], Y[i] if Y.dim() == 3 else Y) for i in range(3)]
        torch.testing.assert_close(error_rate(objective, f, Y), torch.stack(want), rtol=0, atol=1e-15)


def test_adams_bias_correction_table_and_its_cap():
    """The looked-up corrections are torch.optim's ``1/(1 - β₁ᶜ)`` and ``√(1 - β₂ᶜ)``; past the table's last
    count both are exactly 1 in float64, so a count clamped to it takes the right values."""
    table = adam_corrections(10**6, torch.device("cpu"))
    assert len(table) == ADAM_FULL_CORRECTION + 1
    for c in (1, 2, 10, 1000, 36_313, ADAM_FULL_CORRECTION):
        assert table[c, 0].item() == pytest.approx(1 / (1 - 0.9**c), rel=1e-15)
        assert table[c, 1].item() == pytest.approx((1 - 0.999**c) ** 0.5, rel=1e-15)
    assert table[-1].tolist() == [1.0, 1.0] and (1 - 0.999**10**6) ** 0.5 == 1.0
