"""Models: the rows convention, forward passes against independent numpy references, penalties,
and the Leaky-ResNet layer-step schemes (docs/theory/leaky-resnets.md §1-§2, Part 3 §1)."""

import numpy as np
import pytest
import torch

import featurelab as fl
from featurelab.models import adaptive_update


def numpy_mlp(Ws, X, beta, leak):
    """Reference forward pass in numpy with columns as samples (the papers' convention)."""
    Z = X.T
    for l, W in enumerate(Ws):
        inp = np.vstack([Z, beta * np.ones((1, Z.shape[1]))]) if beta > 0 else Z
        Z = W @ inp
        if l < len(Ws) - 1:
            Z = np.where(Z > 0, Z, leak * Z)
    return Z.T


@pytest.mark.parametrize("bias,leak", [(0.0, 0.0), (1.0, 0.0), (0.7, 0.3), (1.0, -0.5)])
def test_mlp_matches_numpy_reference_rows_are_samples(bias, leak):
    model = fl.MLP(5, 3, [7, 4], depth=3, leak=leak, bias=bias, seed=3, dtype=torch.float64)
    with torch.no_grad():  # non-zero biases so the bias column matters
        for W in model.weights:
            W.add_(0.1 * torch.randn_like(W))
    X = torch.randn(11, 5, dtype=torch.float64)
    out = model(X)
    assert out.shape == (11, 3)
    ref = numpy_mlp([W.detach().numpy() for W in model.weights], X.numpy(), bias, leak)
    np.testing.assert_allclose(out.detach().numpy(), ref, rtol=1e-12, atol=1e-12)
    fwd = model(X, return_layers=True)
    assert [z.shape for z in fwd.pre] == [(11, 7), (11, 4), (11, 3)]
    assert [a.shape for a in fwd.act] == [(11, 5), (11, 7), (11, 4)]
    assert torch.equal(fwd.act[0], X) and torch.equal(fwd.output, out)


@pytest.mark.parametrize("bias", [0.0, 0.7])
@pytest.mark.parametrize("per_member_inputs", [False, True])
def test_stacked_mlp_forward_matches_numpy_per_member(bias, per_member_inputs):
    """The ensembles' forward: weights stacked M x n_l x (n_{l-1}+1), inputs shared (N x d) or per member."""
    models = [fl.MLP(5, 3, [7, 4], depth=3, leak=0.2, bias=bias, seed=s, dtype=torch.float64) for s in range(3)]
    with torch.no_grad():
        for m in models:
            for W in m.weights:
                W.add_(0.1 * torch.randn_like(W))
    stacked = {f"weights.{l}": torch.stack([m.weights[l].detach() for m in models]) for l in range(3)}
    X = torch.randn(3, 11, 5, dtype=torch.float64) if per_member_inputs else torch.randn(11, 5, dtype=torch.float64)
    out = torch.func.functional_call(models[0], stacked, (X,))
    assert out.shape == (3, 11, 3)
    for i, m in enumerate(models):
        Xi = X[i] if per_member_inputs else X
        ref = numpy_mlp([W.detach().numpy() for W in m.weights], Xi.numpy(), bias, 0.2)
        np.testing.assert_allclose(out[i].detach().numpy(), ref, rtol=1e-12, atol=1e-12)


def test_linear_mlp_is_the_product_of_its_weights():
    model = fl.MLP(4, 2, 6, depth=4, leak=1.0, bias=0.0, seed=1, dtype=torch.float64)
    X = torch.randn(9, 4, dtype=torch.float64)
    P = torch.eye(4, dtype=torch.float64)
    for W in model.weight_matrices():
        P = W @ P
    torch.testing.assert_close(model(X), X @ P.T, rtol=1e-12, atol=1e-12)


def test_linear_tail_makes_last_layers_linear():
    model = fl.MLP(3, 1, 5, depth=4, linear_tail=2, seed=0, dtype=torch.float64)
    X = torch.randn(8, 3, dtype=torch.float64)
    W1, W2, W3, W4 = model.weight_matrices()
    h = torch.relu(X @ W1.T)
    ref = torch.relu(h @ W2.T) @ W3.T @ W4.T  # after layer 2 ReLU, after layer 3 identity
    torch.testing.assert_close(model(X), ref)


def test_mlp_penalty_is_lambda_times_squared_norm_with_bias_column():
    model = fl.MLP(3, 2, 4, depth=3, bias=1.0, seed=2, dtype=torch.float64)
    with torch.no_grad():
        model.weights[0][:, -1] = 0.5
    hand = sum(float((W.detach().numpy() ** 2).sum()) for W in model.weights)
    assert model.penalty(0.3).item() == pytest.approx(0.3 * hand, rel=1e-14)
    assert hand > sum(float((W.detach() ** 2).sum()) for W in model.weight_matrices())


def test_mlp_init_scales():
    wide = fl.MLP(400, 1, 300, depth=2, init="he", seed=0)
    assert wide.weights[0].std().item() == pytest.approx((2 / 400) ** 0.5, rel=0.02)
    small = fl.MLP(400, 1, 300, depth=2, init="absolute", init_scale=0.01, seed=0)
    assert small.weights[0].std().item() == pytest.approx(0.01, rel=0.02)


def numpy_leaky_resnet(model, X):
    """Reference Euler recursion with columns as samples: A_l = (1-ρL̃)A + ρ W [relu(A); 1]."""
    A = model.U_in.detach().numpy() @ X.T
    for l in range(model.depth):
        r = float(model.rho[l])
        S = np.vstack([np.maximum(A, 0), np.ones((1, A.shape[1]))])
        A = (1 - r * model.effective_depth) * A + r * model.W[l].detach().numpy() @ S
    return (model.V_out.detach().numpy() @ A).T


@pytest.mark.parametrize("steps", ["equidistant", "irregular", "adaptive"])
def test_leaky_resnet_forward_matches_recursion(steps):
    model = fl.LeakyResNet(4, 3, 6, depth=9, effective_depth=3.0, steps=steps, seed=5, dtype=torch.float64)
    X = torch.randn(10, 4, dtype=torch.float64)
    out, reps, acts = model(X, return_layers=True)
    assert out.shape == (10, 3) and len(reps) == 10 and reps[0].shape == (10, 6)
    assert len(acts) == 9 and torch.equal(acts[3], model.sigma(reps[3]))
    np.testing.assert_allclose(out.detach().numpy(), numpy_leaky_resnet(model, X.numpy()), rtol=1e-12, atol=1e-12)


def test_leaky_resnet_io_maps_are_isometries():
    model = fl.LeakyResNet(4, 3, 8, depth=5, effective_depth=2.0, seed=0, dtype=torch.float64)
    torch.testing.assert_close(model.U_in.T @ model.U_in, torch.eye(4, dtype=torch.float64))
    torch.testing.assert_close(model.V_out @ model.V_out.T, torch.eye(3, dtype=torch.float64))


def test_leaky_resnet_penalty_against_hand_computation():
    rho = torch.tensor([0.1, 0.3, 0.2, 0.4], dtype=torch.float64)
    model = fl.LeakyResNet(2, 2, 3, depth=4, effective_depth=1.5, steps=rho, seed=1, dtype=torch.float64)
    W = model.W.detach().numpy()
    hand = 0.02 / (2 * 1.5) * sum(rho[l].item() * (W[l] ** 2).sum() for l in range(4))
    assert model.penalty(0.02).item() == pytest.approx(hand, rel=1e-13)
    learned = fl.LeakyResNet(
        2, 2, 3, depth=4, effective_depth=1.5, steps=rho, io="learned", seed=1, dtype=torch.float64
    )
    extra = 0.02 / 2 * 4  # ‖U‖² = d_in = 2 and ‖V‖² = d_out = 2 for isometries
    assert learned.penalty(0.02).item() == pytest.approx(hand + extra, rel=1e-12)


def test_identity_init_is_scaled_identity_plus_small_noise():
    model = fl.LeakyResNet(2, 2, 50, depth=10, effective_depth=4.0, seed=0, dtype=torch.float64)
    noise = model.W[:, :, :50] - 4.0 * torch.eye(50, dtype=torch.float64)
    assert noise.std().item() == pytest.approx((0.01 / 51) ** 0.5, rel=0.05)


# ------------------------------------------------------------------------- step schemes
@pytest.mark.parametrize("L", [5, 8, 13, 50])
def test_step_schemes_sum_to_one(L):
    assert fl.models.equidistant_steps(L).sum().item() == pytest.approx(1.0, abs=1e-12)
    assert fl.models.irregular_steps(L, 0.5).sum().item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("L,a", [(10, 0.5), (11, 0.5), (20, 0.9)])
def test_irregular_formula(L, a):
    l = np.arange(1, L + 1)
    raw = 1 / L + (a / L) * (0.25 - np.abs(l / L - 0.5))
    expected_sum = 1.0 if L % 2 == 0 else 1 - a / (4 * L**2)
    assert raw.sum() == pytest.approx(expected_sum, abs=1e-14)
    np.testing.assert_allclose(fl.models.irregular_steps(L, a).numpy(), raw / raw.sum(), rtol=1e-14)
    if L % 2 == 0:
        assert fl.models.irregular_steps(L, a).max().item() == pytest.approx((1 + a / 4) / L, rel=1e-14)


def test_invalid_steps_are_refused_unless_allowed():
    with pytest.raises(fl.FeaturelabError, match="effective_depth"):
        fl.LeakyResNet(2, 2, 4, depth=4, effective_depth=4.0)
    fl.LeakyResNet(2, 2, 4, depth=4, effective_depth=3.6)  # equidistant: 4 > 3.6 is valid
    with pytest.raises(fl.FeaturelabError):  # irregular(0.5) needs L > 1.125 L̃ = 4.05
        fl.LeakyResNet(2, 2, 4, depth=4, effective_depth=3.6, steps="irregular")
    fl.LeakyResNet(2, 2, 4, depth=4, effective_depth=4.0, allow_invalid_steps=True)


def test_adaptive_update_fixed_point_and_hand_computation():
    # a path with equal relative increments: A_l = 1.2^l A_0, so ‖A_l - A_{l-1}‖/‖A_l‖ = 1/6 for every l
    A0 = torch.randn(7, 3, dtype=torch.float64)
    reps = [A0 * 1.2**l for l in range(6)]
    rho = torch.full((5,), 0.2, dtype=torch.float64)
    torch.testing.assert_close(adaptive_update(rho, reps), rho, rtol=1e-13, atol=0)
    # unequal increments against a hand computation of c̃_l = ρ_l ‖A_l‖ / ‖A_l - A_{l-1}‖
    reps = [A0, 2 * A0, 2.5 * A0, 5 * A0]
    rho = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    c = np.array([0.5 * 2 / 1, 0.25 * 2.5 / 0.5, 0.25 * 5 / 2.5])
    np.testing.assert_allclose(adaptive_update(rho, reps).numpy(), c / c.sum(), rtol=1e-13)


def test_projection_onto_bounded_simplex():
    rho = torch.tensor([0.001, 0.5, 0.3, 0.1, 0.05, 0.049], dtype=torch.float64)
    low, high = 0.1 / 6, 0.9 / 3
    p = fl.models.project_steps(rho, low, high)
    assert p.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert (p >= low - 1e-15).all() and (p <= high + 1e-15).all()
    with pytest.raises(fl.FeaturelabError):
        fl.models.project_steps(rho, 0.5, 0.9)


def test_adapt_steps_keeps_weights_and_bounds():
    model = fl.LeakyResNet(3, 3, 6, depth=12, effective_depth=4.0, steps="adaptive", seed=0, dtype=torch.float64)
    W = model.W.detach().clone()
    rho = model.adapt_steps(torch.randn(20, 3, dtype=torch.float64))
    assert torch.equal(model.W.detach(), W)
    assert rho.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert (rho <= 0.9 / 4.0 + 1e-15).all() and (rho >= 0.1 / 12 - 1e-15).all()
    assert model.rho_history == [rho.tolist()]


def test_weight_list_from_model_or_matrices():
    model = fl.MLP(3, 2, [5, 4], depth=3, bias=1.0, seed=0)
    Ws = fl.models.weight_list(model)
    assert [tuple(W.shape) for W in Ws] == [(5, 3), (4, 5), (2, 4)]  # bias columns left out
    assert all(W.dtype == torch.float64 for W in Ws)
    again = fl.models.weight_list([W.detach().numpy() for W in Ws])
    assert all(torch.equal(a, b.detach()) for a, b in zip(again, Ws))
    with pytest.raises(fl.FeaturelabError, match=r"weights\[1\] has shape \(4, 4\)"):
        fl.models.weight_list([torch.ones(5, 3), torch.ones(4, 4)])
    with pytest.raises(fl.FeaturelabError, match="non-empty list"):
        fl.models.weight_list([])


def _nets():
    from featurelab.models import Conv, Dense, Flatten, HomogeneousNet, ResBlock

    g = torch.Generator().manual_seed(0)
    yield (
        "mlp",
        fl.MLP(4, 2, 6, 3, bias=1.0, leak=0.1, seed=0, dtype=torch.float64),
        torch.randn(5, 4, dtype=torch.float64),
    )
    yield "leaky-resnet", fl.LeakyResNet(4, 2, 6, 4, 2.0, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    dense = [Dense(4, 6, [0.0, 1.0, 0.5, 0.0, 0.0, 1.0], generator=g), Dense(6, 6, 0.0, generator=g)]
    blocks = [ResBlock(kind, 6, 3, 6, generator=g) for kind in ("identity", "diagonal", "free")]
    yield "homogeneous", HomogeneousNet([*dense, *blocks, Dense(6, 1, 1.0, generator=g)]), torch.randn(5, 4).double()
    conv = [Conv(1, 2, 2, stride=2, padding=1, generator=g), Flatten(), Dense(8, 1, 1.0, generator=g)]
    yield "conv", HomogeneousNet(conv, input_shape=(1, 3, 3)), torch.randn(5, 9, dtype=torch.float64)


@pytest.mark.parametrize("which", ["mlp", "leaky-resnet", "homogeneous", "conv"])
def test_a_training_step_reads_no_tensor_on_the_host(which):
    """Forward, penalty and backward of every model type run without a host read, so the whole step can be
    captured as a CUDA graph (unit-wise slopes decide their activation path at construction, not per call)."""
    from test_ensemble import no_host_reads

    name, net, X = next(n for n in _nets() if n[0] == which)
    with no_host_reads():
        (net(X).square().sum() + net.penalty(0.1)).backward()


def test_the_activation_path_follows_the_slopes_through_load_state_dict():
    from featurelab.models import Dense

    relu, linear = Dense(3, 2, 0.0), Dense(3, 2, 1.0, weight=torch.nn.Parameter(torch.eye(2, 3, dtype=torch.float64)))
    assert (relu.leak_kind, linear.leak_kind, Dense(3, 2, [0.0, 0.5]).leak_kind) == ("relu", "linear", "leaky")
    relu.load_state_dict(linear.state_dict())
    z = torch.tensor([[-1.0, 2.0]], dtype=torch.float64)
    assert relu.leak_kind == "linear" and torch.equal(relu.act(z), z)
