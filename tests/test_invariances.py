"""Part 5 §3 and §7 facts 4-7: invariants' flow derivatives, the negative control, the exact GD step,
and the noninvariance flow Φ of Lemma 4; the tracker; out-of-scope models."""

import pytest
import torch

from featurelab import MLP, FeaturelabError, HomogeneousNet, LeakyResNet, Phase, TrainConfig, train
from featurelab.data import separable
from featurelab.measurements import (
    InvariantTracker,
    flow_derivative,
    gram_difference,
    identity_block_controls,
    invariants,
    noninvariance_flow,
)
from featurelab.measurements.invariances import GRAD, active_units
from featurelab.models import Conv, Dense, Flatten, ResBlock

D = torch.float64


def make(kind, g):
    kw = {"generator": g}
    if kind == "fc":
        return HomogeneousNet(
            [Dense(6, 8, 0.0, **kw), Dense(8, 8, [1.0] * 3 + [0.0] * 5, **kw), Dense(8, 1, 1.0, **kw)]
        )
    if kind == "conv":  # case 2 (conv→conv) with stride 2 and padding 1, case 5 (conv→FC)
        return HomogeneousNet(
            [
                Conv(2, 3, 3, padding=1, leak=1.0, **kw),
                Conv(3, 3, 3, stride=2, padding=1, leak=0.0, **kw),
                Flatten(),
                Dense(12, 5, 0.0, **kw),
                Dense(5, 1, 1.0, **kw),
            ],
            input_shape=(2, 4, 4),
        )
    if kind == "conv-free":  # case 6 (conv→ResNetFree)
        return HomogeneousNet(
            [
                Conv(2, 3, 3, padding=1, leak=1.0, **kw),
                Flatten(),
                ResBlock("free", 48, 5, 6, sigma_in="linear", **kw),
                Dense(6, 1, 1.0, **kw),
            ],
            input_shape=(2, 4, 4),
        )
    blocks = [
        ResBlock(kind, 6, 5, 6, sigma_in="relu", sigma_out="linear", **kw),
        ResBlock(kind, 6, 5, 6, sigma_in="linear", sigma_out="relu", **kw),
    ]
    return HomogeneousNet([Dense(6, 6, 0.0, **kw), *blocks, Dense(6, 1, 1.0, **kw)])


def data(net, g, n=24):
    X = torch.randn(n, net.d_in, dtype=D, generator=g)
    return X, torch.where(torch.randn(n, 1, dtype=D, generator=g) > 0, 1.0, -1.0).to(D)


KINDS = ["fc", "conv", "conv-free", "free", "diagonal", "identity"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("objective", ["logistic", "mse"])
def test_fact4_flow_derivative_of_invariants_vanishes(gen, kind, objective):
    """The JVP along -∇R of every Theorem 1 / Lemma 2 / Lemma 3 invariant is 0 on its in-scope entries."""
    net = make(kind, gen)
    X, Y = data(net, gen)
    found = invariants(net)
    active, _ = active_units(net, X, found.junctions)
    kinds = {inv.kind for inv in found.items}
    assert {"vertex", "cut"} <= kinds
    out_of_scope = []
    for inv in found.items:
        rate = flow_derivative(net, X, Y, inv.value, objective=objective)
        scale = float((inv.P1(lambda p: p).abs().max() + inv.P2(lambda p: p).abs().max()).detach())
        m = inv.scope(active)
        assert float(rate[m].abs().max()) <= 1e-10 * scale, inv.name
        if (~m).any():
            out_of_scope.append(float(rate[~m].abs().max()) / scale)
    if kind == "fc":  # the ReLU pairs out of scope do move (the test can fail)
        assert max(out_of_scope) > 1e-4


def test_case4_matrix_form_fails_for_identity_and_diagonal_blocks(gen):
    """Theorem 1 case 4 needs ResNetFree: across Diagonal blocks only the vertex form is listed, and the
    off-diagonal entries of [V_2, D]-[V_1'; D'] indeed move."""
    net = make("diagonal", gen)
    X, Y = data(net, gen)
    found = invariants(net)
    jn = next(j for j in found.junctions if j.name == "1→2")
    assert not jn.full and not any(i.kind == "matrix" and i.junction is jn for i in found.items)
    rate = flow_derivative(net, X, Y, jn.C, objective="logistic")
    off = ~torch.eye(6, dtype=torch.bool)
    assert float(rate[off].abs().max()) > 1e-4 * float(jn.C().detach().abs().max())
    assert float(rate.diagonal().abs().max()) <= 1e-10 * float(jn.C().detach().abs().max())
    assert any("junction 1→2" in s for s in found.skipped)


def test_fact5_identity_block_control_is_not_conserved(gen):
    net = make("identity", gen)
    X, Y = data(net, gen)
    controls = identity_block_controls(net)
    assert len(controls) == 2
    for c in controls:
        rate = float(flow_derivative(net, X, Y, c.value, objective="logistic"))
        assert abs(rate) > 1e-4 * float(c.P1(lambda p: p).detach())
    found = invariants(net)
    assert any("ResNetIdentity" in s and "skip" in s for s in found.skipped)


@pytest.mark.parametrize("kind", KINDS)
def test_fact6_one_gd_step_is_exactly_eta_squared(gen, kind):
    """ΔQ = η² q(G) exactly on in-scope entries, for one full-batch GD step."""
    net = make(kind, gen)
    X, Y = data(net, gen)
    found = invariants(net)
    active, _ = active_units(net, X, found.junctions)
    before = [inv.value().detach() for inv in found.items]
    from featurelab.training.objectives import data_cost

    net.zero_grad()
    data_cost("logistic", net(X), Y).backward()
    eta = 0.3
    with torch.no_grad():
        q = [inv.value(GRAD) for inv in found.items]
        for p in net.parameters():
            assert p.grad is not None  # backward() reached every parameter
            p -= eta * p.grad
        for inv, b, qk in zip(found.items, before, q):
            m = inv.scope(active)
            after = inv.value()
            err = (after - b - eta**2 * qk)[m].abs().max()
            assert float(err) <= 1e-12 * (1 + float(after.abs().max())), inv.name
            assert float((eta**2 * qk)[m].abs().max()) > 0  # the η² term is really there


def test_fact6_relu_gram_step_has_first_order_phi_term(gen):
    """ΔI = ηΦ + η²(G_l G_lᵀ - G_{l+1}ᵀ G_{l+1}) for the full ReLU Gram difference (Lemma 4, GD)."""
    net = make("fc", gen)
    X, Y = data(net, gen)
    from featurelab.training.objectives import data_cost

    phi = noninvariance_flow(net, X, Y, 1, objective="logistic")
    I0 = gram_difference(net, 1).detach()
    net.zero_grad()
    data_cost("logistic", net(X), Y).backward()
    eta = 0.2
    with torch.no_grad():
        second = gram_difference(net, 1, GRAD)
        for p in net.parameters():
            assert p.grad is not None  # backward() reached every parameter
            p -= eta * p.grad
        dI = gram_difference(net, 1) - I0
    assert float((dI - eta * phi - eta**2 * second).abs().max()) <= 1e-10 * float(I0.abs().max())
    assert float(phi.abs().max()) > 1e-3 * float(I0.abs().max())


@pytest.mark.parametrize("objective", ["logistic", "mse"])
def test_fact7_phi_structure_and_autograd(gen, objective):
    """Φ is symmetric with zero diagonal, vanishes on equal patterns (linear pairs; duplicated ReLU
    neurons), and equals dI/dt by forward-mode autodiff."""
    net = make("fc", gen)
    second = net.stages[1]
    assert isinstance(second, Dense)
    with torch.no_grad():  # neuron 7 of layer 2 = 2 x neuron 6: identical activation patterns
        second.weight[7] = 2 * second.weight[6]
    X, Y = data(net, gen)
    for stage in (0, 1):
        phi = noninvariance_flow(net, X, Y, stage, objective=objective)
        auto = flow_derivative(net, X, Y, lambda get: gram_difference(net, stage, get), objective=objective)
        assert float((phi - auto).abs().max()) <= 1e-9 * float(phi.abs().max())
        assert torch.equal(phi, phi.T)
        assert float(phi.diagonal().abs().max()) == 0.0
    phi = noninvariance_flow(net, X, Y, 1, objective=objective)
    assert float(phi[:3, :3].abs().max()) <= 1e-14 * float(phi.abs().max())  # linear units 0-2
    assert float(phi[6, 7].abs()) <= 1e-14 * float(phi.abs().max())
    assert float(phi[3:, 3:].abs().max()) > 1e-3 * float(phi.abs().max())


def test_tracker_records_drift_residual_and_signs():
    d = separable(40, 0, 6, seed=1)
    net = make("identity", torch.Generator().manual_seed(0))
    tracker = InvariantTracker(net, d.X_train, extra=identity_block_controls(net))
    res = train(
        net,
        d,
        TrainConfig(objective="logistic", lam=0.0, phases=[Phase(optimizer="sgd", lr=0.05, steps=60)], log_every=20),
        callbacks=[tracker],
        progress=False,
    )
    s = tracker.summary().set_index("invariant")
    inscope = s[s.kind != "control"]
    assert float(inscope.step_residual.max()) <= 1e-12
    assert float(inscope.cumulative_residual.max()) <= 1e-11
    assert float(s[s.kind == "control"].rel_drift.min()) > 10 * float(inscope.rel_drift.max())
    assert tracker.skipped and "sign_flips" in res.history and any(c.startswith("drift:") for c in res.history)
    signs = tracker.sign_summary()
    assert len(signs["direction"]) == 4 and signs["direction"].cos_to_final.iloc[-1] == pytest.approx(1.0)


@pytest.mark.parametrize("arch", ["fc", "identity", "diagonal", "free", "conv"])
def test_the_tracker_step_reads_nothing_on_the_host(arch):
    """`on_step` keeps its maxima and counts on the device, so a GPU run waits for the device only at log steps;
    a run with the tracker gives the counts it logs as integers."""
    from types import SimpleNamespace

    from test_ensemble import no_host_reads

    net = make(arch, torch.Generator().manual_seed(0))
    d = separable(24, 0, net.d_in, seed=1)
    tracker = InvariantTracker(net, d.X_train)
    net(d.X_train).square().mean().backward()  # on_step reads the step's gradient
    with torch.no_grad():
        for p in net.parameters():
            assert p.grad is not None  # backward() reached every parameter
            p.sub_(0.05 * p.grad)
    with no_host_reads():
        tracker.on_step(1, net, SimpleNamespace(param_groups=[{"lr": 0.05}]), None)
    row: dict = {}
    tracker.on_log(1, net, row)
    assert isinstance(row["sign_flips"], int) and isinstance(row["activation_flips"], int)


def test_invariants_of_mlp_match_homogeneous_net():
    mlp = MLP(5, 1, [4, 3], 3, bias=0.0, init="fan_in", linear_tail=2, dtype=D, seed=0)
    found = invariants(mlp)
    names = [i.name for i in found.items]
    assert names == ["vertex 0→1", "matrix 0→1", "vertex 1→2", "matrix 1→2", "cut W0-W1", "cut W1-W2"]
    W = mlp.weight_matrices()
    C = next(i for i in found.items if i.name == "matrix 1→2").value()
    assert torch.allclose(C, W[2].T @ W[2] - W[1] @ W[1].T)


@pytest.mark.parametrize(
    "model,match",
    [
        (MLP(3, 1, 4, 3, bias=1.0), "bias"),
        (MLP(3, 1, 4, 3, activation="tanh"), "homogeneous"),
        (MLP(3, 2, 4, 3), "one output"),
        (LeakyResNet(3, 3, 4, 2, 1.0), "LeakyResNet"),
    ],
)
def test_out_of_scope_models_are_refused_with_reason(model, match):
    with pytest.raises(FeaturelabError, match=match):
        invariants(model)


def test_network_with_no_invariant_lists_every_skipped_layer(gen):
    net = HomogeneousNet(
        [ResBlock("identity", 3, 2, sigma_in="linear", generator=gen), Dense(3, 1, 1.0, generator=gen)]
    )
    found = invariants(net)  # the block's hidden junction remains
    assert [i.kind for i in found.items] == ["vertex", "matrix"]
    assert any("junction 0→1" in s for s in found.skipped) and any("no learnable cut" in s for s in found.skipped)
