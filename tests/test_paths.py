"""Part 5 §2 and §7 facts 1-3: Lemma 1 (f = T∘h), the path form of w_e ∂f/∂w_e, Euler on cuts."""

import pytest
import torch

from featurelab import MLP, FeaturelabError, HomogeneousNet
from featurelab.measurements import enumerate_paths, path_enumeration, tree_network
from featurelab.models import Conv, Dense, Flatten, ResBlock

D = torch.float64


def fc_net(g, leak=0.0):
    return HomogeneousNet(
        [Dense(3, 4, leak, generator=g), Dense(4, 3, leak, generator=g), Dense(3, 1, 1.0, generator=g)]
    )


def free_net(g):
    return HomogeneousNet(
        [
            Dense(2, 3, 0.0, generator=g),
            ResBlock("free", 3, 2, 3, sigma_in="relu", sigma_out="relu", generator=g),
            Dense(3, 1, 1.0, generator=g),
        ]
    )


def identity_net(g):
    return HomogeneousNet(
        [
            Dense(2, 3, 0.0, generator=g),
            ResBlock("identity", 3, 2, sigma_in="relu", generator=g),
            Dense(3, 1, 1.0, generator=g),
        ]
    )


def nets(g):
    return {
        "fc": fc_net(g),
        "leaky": fc_net(g, leak=0.2),
        "free": free_net(g),
        "identity": identity_net(g),
        "diagonal": HomogeneousNet(
            [Dense(2, 3, 0.0, generator=g), ResBlock("diagonal", 3, 2, generator=g), Dense(3, 1, 1.0, generator=g)]
        ),
        "conv": HomogeneousNet(
            [Conv(1, 2, 2, stride=2, padding=1, generator=g), Flatten(), Dense(8, 1, 1.0, generator=g)],
            input_shape=(1, 3, 3),
        ),
        "mlp": MLP(3, 1, [4, 3], 3, bias=0.0, linear_tail=1, dtype=D, seed=3),
    }


def inputs(net, g, n=7):
    d = len(enumerate_paths(net).graph.inputs)
    return torch.randn(n, d, dtype=D, generator=g)


@pytest.mark.parametrize("name", ["fc", "leaky", "free", "identity", "diagonal", "conv", "mlp"])
def test_fact1_lemma1_tree_network(gen, name):
    net = nets(gen)[name]
    X = inputs(net, gen)
    paths = enumerate_paths(net)
    assert len(paths) <= 200
    T = tree_network(net)
    f = net(X)[:, 0].detach()
    assert torch.allclose(T(path_enumeration(net, X)), f, rtol=0, atol=1e-10 * (1 + float(f.abs().max())))
    # T depends on the signs only: rescale every magnitude, keep the signs, keep T
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(torch.rand(p.shape, dtype=D, generator=gen) * 3 + 0.1)
    f2 = net(X)[:, 0].detach()
    assert not torch.allclose(f, f2)
    assert torch.allclose(T(path_enumeration(net, X)), f2, rtol=0, atol=1e-10 * (1 + float(f2.abs().max())))


def test_fact1_fc_path_count_is_d_times_widths(gen):
    # m = d Π n_l for an FC net (Part 5 §2): 3·4·3·1 = 36
    assert len(enumerate_paths(fc_net(gen))) == 36


@pytest.mark.parametrize("name", ["fc", "free", "diagonal", "conv"])
def test_fact2_edge_contribution_is_sum_over_paths(gen, name):
    """w_e ∂f/∂w_e = Σ_{p∋e} h_p ∂T/∂z_p (Part 5 §3), shared conv entries summed over their edges."""
    net = nets(gen)[name]
    x = inputs(net, gen, n=1)
    paths = enumerate_paths(net)
    T = tree_network(net)
    h = path_enumeration(net, x, paths=paths).detach().requires_grad_(True)
    (dT,) = torch.autograd.grad(T(h).sum(), h)
    params = list(net.parameters())
    grads = torch.autograd.grad(net(x).sum(), params)
    for p, gp in zip(params, grads):
        lhs = (p * gp).reshape(-1).detach()
        rhs = paths.incidence(p).T @ (h * dT).detach()[0]
        assert torch.allclose(lhs, rhs, rtol=1e-9, atol=1e-12 * float(rhs.abs().max() + 1))


@pytest.mark.parametrize(
    "name,cuts",
    [
        ("fc", [["weight"]]),
        ("free", [["V1", "V3"], ["V2", "V3"]]),
        ("diagonal", [["V1", "d"], ["V2", "d"]]),
        ("conv", [["weight"]]),
    ],
)
def test_fact3_euler_on_every_cut(gen, name, cuts):
    """Σ_{e∈cut} w_e ∂f/∂w_e = f for every learnable cut (Lemma 3, Part 5 §3)."""
    net = nets(gen)[name]
    X = inputs(net, gen)
    f = net(X)[:, 0].detach()
    layers = [s for s in net.stages if not isinstance(s, Flatten)]
    for stage in layers:
        for cut in cuts if isinstance(stage, ResBlock) else [["weight"]]:
            ps = [getattr(stage, n) for n in cut]
            for i in range(X.shape[0]):
                gs = torch.autograd.grad(net(X[i : i + 1])[0, 0], ps)
                euler = sum(float((p * g).sum().detach()) for p, g in zip(ps, gs))
                assert abs(euler - float(f[i])) <= 1e-10 * (1 + abs(float(f[i])))


def test_fact3_euler_cut_through_fixed_skip(gen):
    """In a ResNetIdentity block, {V_1} ∪ {skip edges} is a cut: the fixed edges' share comes from the
    paths through them (Σ h_p ∂T/∂z_p), the learnable share from autograd."""
    net = identity_net(gen)
    paths = enumerate_paths(net)
    T = tree_network(net)
    fixed = sum(p.numel() for p in paths.graph.params)  # the index of fixed edges (weight 1)
    through_skip = torch.tensor([float(fixed in e) for e in paths.edges], dtype=D)
    block = net.stages[1]
    assert isinstance(block, ResBlock)
    X = inputs(net, gen, n=20)
    h = path_enumeration(net, X, paths=paths).detach().requires_grad_(True)
    (dT,) = torch.autograd.grad(T(h).sum(), h)
    skip_share = (h * dT * through_skip).sum(1).detach()
    f = net(X)[:, 0].detach()
    v1_share = torch.stack(
        [(block.V1 * torch.autograd.grad(net(X[i : i + 1])[0, 0], block.V1)[0]).sum() for i in range(len(X))]
    ).detach()
    assert torch.allclose(v1_share + skip_share, f, rtol=0, atol=1e-10 * (1 + float(f.abs().max())))
    assert float((v1_share - f).abs().max()) > 1e-3  # {V_1} alone is not a cut


def test_path_limit_refuses_with_count(gen):
    net = HomogeneousNet([Dense(10, 32, generator=gen), Dense(32, 32, generator=gen), Dense(32, 1, 1.0, generator=gen)])
    with pytest.raises(FeaturelabError, match="10240 input→output paths"):
        enumerate_paths(net)


def test_paths_refuse_models_out_of_scope():
    with pytest.raises(FeaturelabError, match="bias"):
        tree_network(MLP(3, 1, 4, 2, bias=1.0))
