"""Part 5 §4 and §7 facts 8-9: conv unfoldings, ratio >= 1/rank, the derived Theorem 2 bound; the
models' forward passes against their formulas; the separable data."""

import math

import pytest
import torch

from featurelab import MLP, FeaturelabError, HomogeneousNet, Phase, TrainConfig, train
from featurelab.data import separable
from featurelab.measurements import adjacent_alignment, layer_ratios, theorem2_bounds, theorem2_constants
from featurelab.measurements.ranks import numerical_rank, singular_values
from featurelab.models import Conv, Dense, Flatten, ResBlock
from featurelab.models.conv import unfold_after_conv, unfold_in, unfold_out

D = torch.float64


def op2(M):
    return float(singular_values(M, 1)[0]) ** 2


@pytest.mark.parametrize("shape", [(3, 2, 3, 3), (1, 5, 2, 2), (4, 9, 3, 3), (2, 1, 3, 1)])
def test_fact8_conv_unfolding_switch_cost(gen, shape):
    """‖B(K)‖²_op <= min(c_in, k_h k_w) ‖A(K)‖²_op; ‖B(K)‖_F = ‖A(K)‖_F = ‖K‖."""
    c_out, c_in, kh, kw = shape
    for _ in range(20):
        K = torch.randn(*shape, dtype=D, generator=gen)
        A, B = unfold_in(K), unfold_out(K)
        assert A.shape == (c_out * kh * kw, c_in) and B.shape == (c_out, c_in * kh * kw)
        assert op2(B) <= min(c_in, kh * kw) * op2(A) * (1 + 1e-12)
        assert float(A.norm()) == pytest.approx(float(K.norm())) == pytest.approx(float(B.norm()))


def test_fact8_equality_case():
    """c_out = 1, c_in = k_h k_w, K[0, i, q] = δ_iq: ‖B‖² = c_in = min(c_in, k_h k_w)·‖A‖²."""
    K = torch.eye(4, dtype=D).reshape(1, 4, 2, 2)
    assert op2(unfold_out(K)) == pytest.approx(4.0) and op2(unfold_in(K)) == pytest.approx(1.0)
    assert Conv(4, 1, 2).switch_factor == 4


def test_unfoldings_index_the_right_entries(gen):
    K = torch.randn(3, 2, 2, 2, dtype=D, generator=gen)
    A = unfold_in(K)
    # row (o, p, q), column i holds K[o, i, p, q]
    assert A[(1 * 2 + 0) * 2 + 1, 1] == K[1, 1, 0, 1]
    W = torch.randn(5, 2 * 6, dtype=D, generator=gen)  # reads 2 channels x 6 positions, channel-major
    AW = unfold_after_conv(W, 2)
    assert AW.shape == (30, 2) and AW[4 * 6 + 3, 1] == W[4, 1 * 6 + 3]
    # FC after conv: ‖W‖²_op <= min(c, S) ‖A(W)‖²_op
    assert op2(W) <= 2 * op2(AW) * (1 + 1e-12)


def test_fact9_ratio_at_least_one_over_rank(gen):
    net = HomogeneousNet(
        [
            Dense(6, 5, generator=gen),
            ResBlock("free", 5, 4, 3, sigma_in="linear", generator=gen),
            Dense(3, 1, 1.0, generator=gen),
        ]
    )
    first = net.stages[0].weight
    assert isinstance(first, torch.Tensor)
    with torch.no_grad():
        first[:, 3:] = 0  # rank 3
    for B, r in zip(net.weight_matrices(), layer_ratios(net)):
        assert 1 / numerical_rank(B.detach(), rtol=1e-10) - 1e-12 <= r <= 1 + 1e-12


def tail_net(g, s=0.5):
    """conv (linear) -> conv (linear, stride 2) -> FC after conv -> linear ResNetFree -> FC -> w."""
    kw = {"generator": g, "init_scale": s}
    return HomogeneousNet(
        [
            Conv(2, 3, 3, padding=1, leak=1.0, **kw),
            Conv(3, 3, 3, stride=2, padding=1, leak=1.0, **kw),
            Flatten(),
            Dense(12, 6, 1.0, **kw),
            ResBlock("free", 6, 5, 6, sigma_in="linear", sigma_out="linear", **kw),
            Dense(6, 4, 1.0, **kw),
            Dense(4, 1, 1.0, **kw),
        ],
        input_shape=(2, 4, 4),
    )


def test_fact9_derived_bound_holds_at_random_weights(gen):
    """ratio_k >= ρ_k - (E_k + ρ_k f_k)/‖B_k‖²_F holds exactly (the chain of §4 steps 1-5) at the point
    where the constants are taken, for every tail stage, with the switch costs r_j."""
    for seed in range(10):
        net = tail_net(torch.Generator().manual_seed(seed), s=1.0 + seed)
        consts = theorem2_constants(net)
        assert [c.stage for c in consts] == [0, 1, 3, 4, 5, 6]
        by_stage = {c.stage: c for c in consts}
        # switch costs: FC after conv r = min(3, 4) = 3; conv r = min(3, 9) = 3; ResNetFree r = 2
        assert by_stage[3].rho == pytest.approx(1 / 2)  # ρ_3 = 1/r_block
        assert by_stage[1].rho == pytest.approx(1 / (2 * 3))  # × 1/r_(FC after conv)
        assert by_stage[0].rho == pytest.approx(1 / (2 * 3 * 3))
        assert by_stage[0].rho_paper == pytest.approx(1 / (8 * 9))
        for stage, (ratio, bound, _) in theorem2_bounds(net, consts).items():
            assert ratio >= bound - 1e-12, (seed, stage)


def test_fact9_fc_tail_bound_is_one_minus_D_over_norm(gen):
    """For an all-FC tail the derived bound is 1 - D_k/‖W_k‖²_F with D_k = Σ_j (‖C_j‖_op - tr C_j)."""
    mlp = MLP(4, 1, [5, 3, 3], 4, init="fan_in", linear_tail=3, dtype=D, seed=2)
    consts = theorem2_constants(mlp)
    W = [w.detach() for w in mlp.weight_matrices()]
    C = [W[j + 1].T @ W[j + 1] - W[j] @ W[j].T for j in range(3)]
    for k in (1, 2):
        Dk = sum(float(torch.linalg.matrix_norm(C[j], 2)) - float(C[j].trace()) for j in range(k, 3))
        bound = theorem2_bounds(mlp, consts)[k][1]
        assert bound == pytest.approx(1 - Dk / float(W[k].norm() ** 2), abs=1e-12)


def test_fact9_bound_holds_under_gd_up_to_drift():
    d = separable(60, 0, 32, seed=3)
    net = tail_net(torch.Generator().manual_seed(0), s=0.5)
    consts = theorem2_constants(net)
    margins = []

    class Check:
        def on_log(self, step, model, row):
            margins.extend(r - b for r, b, _ in theorem2_bounds(model, consts).values())

    train(
        net,
        d,
        TrainConfig(objective="logistic", lam=0.0, phases=[Phase(optimizer="sgd", lr=0.05, steps=200)], log_every=20),
        callbacks=[Check()],
        progress=False,
    )
    assert min(margins) >= -1e-3


def test_alignment_of_rank_one_chain():
    """Adjacent layers W_{k+1} = a v uᵀ-style rank one with matching vectors align to 1."""
    u = torch.tensor([0.6, 0.8, 0.0], dtype=D)
    mlp = MLP(2, 1, [3], 2, bias=0.0, leak=1.0, dtype=D)
    with torch.no_grad():
        mlp.weights[0].copy_(torch.outer(u, torch.tensor([1.0, -2.0], dtype=D)))
        mlp.weights[1].copy_(3 * u[None, :])
    assert adjacent_alignment(mlp)["0→1"] == pytest.approx(1.0)
    assert layer_ratios(mlp) == pytest.approx([1.0, 1.0])


def test_block_forwards_match_formulas(gen):
    x = torch.randn(5, 4, dtype=D, generator=gen)
    relu = torch.relu
    for kind in ("identity", "diagonal", "free"):
        blk = ResBlock(kind, 4, 3, 4, sigma_in="relu", sigma_out="relu", generator=gen)
        skip = x if kind == "identity" else x * blk.d if kind == "diagonal" else x @ blk.V3.T
        want = relu(relu(x @ blk.V1.T) @ blk.V2.T + skip)
        net = HomogeneousNet([blk, Dense(4, 1, 1.0, generator=gen)])
        last = net.stages[1].weight
        assert isinstance(last, torch.Tensor)
        assert torch.allclose(net(x), want @ last.T)
    conv = Conv(2, 3, 3, stride=2, padding=1, leak=0.5, generator=gen)
    img = torch.randn(2, 2, 5, 5, dtype=D, generator=gen)
    z = torch.nn.functional.conv2d(img, conv.weight, stride=2, padding=1)
    assert torch.allclose(conv.act(conv(img)), torch.where(z > 0, z, 0.5 * z))
    assert conv.out_shape((2, 5, 5)) == (3, 3, 3)


def test_bad_architectures_are_refused(gen):
    with pytest.raises(FeaturelabError, match="one linear output"):
        HomogeneousNet([Dense(3, 2, generator=gen)])
    with pytest.raises(FeaturelabError, match="reads width 5"):
        HomogeneousNet([Dense(3, 4, generator=gen), Dense(5, 1, 1.0, generator=gen)])
    with pytest.raises(FeaturelabError, match="c=3"):
        ResBlock("identity", 4, 2, 3)
    with pytest.raises(FeaturelabError, match="kind"):
        ResBlock("dense", 4, 2)
    with pytest.raises(FeaturelabError, match="leak"):
        Dense(3, 4, [0.0, 1.0])


def test_separable_data_has_margin_and_labels():
    d = separable(200, 50, 10, margin=0.1, seed=0)
    w = torch.tensor(d.meta["w_star"], dtype=D)
    m = d.X_train @ w
    assert d.X_train.shape == (200, 10) and d.Y_train.shape == (200, 1)
    assert float(m.abs().min()) > 0.1 and torch.equal(d.Y_train[:, 0], torch.sign(m))
    assert math.isclose(float(w.norm()), 1.0)
    with pytest.raises(FeaturelabError, match="n_train"):
        separable(0)


# ------------------------------------------------------------- Theorem 2 with a non-homogeneous g
def test_linear_tail_constants_match_the_junction_computation():
    """D_k from the tail matrices alone equals the bound of `theorem2_constants` (invariant junctions)."""
    from featurelab.measurements import linear_tail_bounds, linear_tail_constants

    mlp = MLP(4, 1, [5, 3, 3], 4, init="fan_in", linear_tail=3, dtype=D, seed=2)
    tail = mlp.weight_matrices()[1:]
    ours = linear_tail_bounds(linear_tail_constants(tail), tail)
    ref = theorem2_bounds(mlp, theorem2_constants(mlp))
    for k, (ratio, bound) in enumerate(ours, start=1):
        assert ratio == pytest.approx(ref[k][0], abs=1e-12) and bound == pytest.approx(ref[k][1], abs=1e-12)


def test_tail_invariants_are_conserved_behind_a_tanh_g():
    """Theorem 2's g may be non-homogeneous: behind tanh layers, C_j = W_{j+1}ᵀW_{j+1} - W_jW_jᵀ of the linear
    tail has zero derivative along -∇R (torch.func.jvp), while the pair (g's last layer, first tail layer),
    whose units are tanh, does not (the control)."""
    net = MLP(6, 1, [8, 5, 4], 4, activation="tanh", init="fan_in", linear_tail=2, dtype=D, seed=4)
    d = separable(40, 0, 6, seed=1)
    params = [w.detach().clone() for w in net.weights]

    def risk(*ws):
        out = torch.func.functional_call(net, {f"weights.{i}": w for i, w in enumerate(ws)}, (d.X_train.double(),))
        return torch.logaddexp(torch.zeros(()), -d.Y_train.double().reshape(-1) * out.reshape(-1)).mean()

    flow = [-g for g in torch.func.grad(risk, argnums=tuple(range(4)))(*params)]

    def C(j):
        return lambda *ws: ws[j + 1].T @ ws[j + 1] - ws[j] @ ws[j].T

    for j, conserved in ((1, False), (2, True)):
        out = torch.func.jvp(C(j), tuple(params), tuple(flow))
        value, rate = out[0], out[1]
        rel = float(rate.abs().max() / (value.abs().max() * max(float(f.abs().max()) for f in flow)))
        assert (rel <= 1e-12) if conserved else (rel >= 1e-3)


def test_tail_bound_holds_behind_a_tanh_g_under_gd():
    """ratio_k >= 1 - D_k/‖W_k‖² (constants at init) along GD of a tanh-g net, up to the O(η²) drift."""
    from featurelab.measurements import linear_tail_bounds, linear_tail_constants

    d = separable(60, 0, 10, seed=3)
    net = MLP(10, 1, [16, 8, 8], 4, activation="tanh", init="fan_in", init_scale=0.5, linear_tail=3, dtype=D)
    consts = linear_tail_constants(net.weight_matrices()[1:])  # g = tanh(W_1 x); the tail is W_2, W_3, W_4
    margins = []

    class Check:
        def on_log(self, step, model, row):
            margins.extend(r - b for r, b in linear_tail_bounds(consts, model.weight_matrices()[1:]))

    train(
        net,
        d,
        TrainConfig(objective="logistic", lam=0.0, phases=[Phase(optimizer="sgd", lr=0.05, steps=200)], log_every=20),
        callbacks=[Check()],
        progress=False,
    )
    assert len(margins) > 10 and min(margins) >= -1e-3


def test_conv_tail_net_chains_theorem2_through_its_conv_and_resnetfree_stages():
    """`conv_tail_net`: the ReLU conv g ends the chain, and the limits of eq. (14) follow from the switch costs in
    closed form: block r = 2, FC after the stride-2 conv min(c = 4, S = 2·2) = 4, conv 4→4 min(4, 3·3) = 4, so
    ρ = 1, 1/2, 1/8, 1/32 at stages 5, 4, 2, 1 (the paper-style 1, 1/8, 1/8, 1/72 with 8 per block, 1 after a conv,
    k_h k_w = 9 per conv). A g counted as linear, or a wrong switch cost, changes the list."""
    from featurelab.experiments.alignment import conv_tail_net

    net = conv_tail_net(0.5, 1)
    consts = {c.stage: c for c in theorem2_constants(net)}
    assert sorted(consts) == [1, 2, 4, 5, 6]
    assert [consts[k].rho for k in (6, 5, 4, 2, 1)] == pytest.approx([1, 1, 1 / 2, 1 / 8, 1 / 32])
    assert [consts[k].rho_paper for k in (6, 5, 4, 2, 1)] == pytest.approx([1, 1, 1 / 8, 1 / 8, 1 / 72])


def test_conv_claim_holds_under_gd_and_fails_a_ratio_below_its_bound():
    """theorem2-bound-conv-resnet on 60 GD steps of `conv_tail_net` (the invariants drift by O(η²) only): every
    stage but the last stays above its bound, the last (the vector w, ratio = bound = 1) is left out. A history whose
    stage-2 ratio dips 0.01 below its bound fails it by 0.01 − 0.005 (the GD slack)."""
    from featurelab.experiments.alignment import Config, conv_claim, conv_results, run_unit

    class Ctx:
        device, progress = "cpu", False

    cfg = Config.model_validate({"conv_steps": 60, "log_every": 20})
    res = run_unit(cfg, {"id": "conv-seed0", "seed": 0, "g": "conv"}, Ctx())
    found = conv_results({"conv-seed0": res})
    assert sorted(found["stages"]) == ["1", "2", "4", "5"]
    c = conv_claim(found, 1)
    assert (
        c.passed
        and c.id == "theorem2-bound-conv-resnet"
        and c.margin == pytest.approx(found["min_bound_margin"] + 0.005)
    )
    hist = res["history"]
    hist["ratio_s2"] = [b - 0.01 for b in hist["bound_s2"]]
    c = conv_claim(conv_results({"conv-seed0": res}), 1)
    assert not c.passed and c.margin == pytest.approx(-0.005)
