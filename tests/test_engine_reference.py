"""The engine against independent references: K steps of Adam, SGD with momentum and plain GD through
`train` and `train_ensemble` equal torch.optim's optimizers run on float64 copies of the members (to
1e-12), one GD step with λ > 0 is −lr·∇(C + R) from autograd, and GD on ridge regression reaches the
closed-form minimiser.

Each reference differentiates the full loss C + model.penalty(λ) and uses torch's own update code, so a
changed update formula (Adam's bias corrections, say) or a gradient of the cost alone (with the logged
loss still C + R) is caught.
"""

import copy

import pytest
import torch

import featurelab as fl
from featurelab.training import data_cost, train_ensemble

K = 25  # steps: enough for Adam's bias corrections to move well away from their first values


def problem(n=40):
    return fl.data.bottleneck_teacher((4, 2, 3), hidden=16, n_train=n, n_test=0, teacher_seed=0, data_seed=1)


DATA = problem()
MEMBERS = [(0.0, 1e-2, 0), (0.02, 3e-2, 1), (0.05, 5e-3, 2)]  # (λ, lr, init seed) per member


def member(seed: int) -> fl.MLP:
    return fl.MLP(4, 3, 8, depth=3, bias=1.0, seed=seed, dtype=torch.float64)


def torch_reference(model: fl.MLP, lam: float, make_optimizer, steps: int = K, scheduler=None) -> fl.MLP:
    """A float64 copy of `model` trained `steps` full-batch steps by a torch.optim optimizer on C + R."""
    ref = copy.deepcopy(model).double()
    opt = make_optimizer([p for p in ref.parameters() if p.requires_grad])
    sched = scheduler(opt) if scheduler is not None else None
    X, Y = DATA.X_train.double(), DATA.Y_train.double()
    for _ in range(steps):
        opt.zero_grad()
        (data_cost("mse", ref(X), Y) + ref.penalty(lam)).backward()
        opt.step()
        if sched is not None:
            sched.step()
    return ref


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


# optimizer of the Phase -> (phase keywords, torch.optim optimizer for lr, its scheduler or None)
OPTIMIZERS = {
    "adam": (dict(optimizer="adam"), lambda lr: lambda ps: torch.optim.Adam(ps, lr=lr), None),
    "adam-cosine": (
        dict(optimizer="adam", schedule="cosine"),  # lr_min 0: cosine annealing to 0 over the phase
        lambda lr: lambda ps: torch.optim.Adam(ps, lr=lr),
        lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=K),
    ),
    "sgd-momentum": (
        dict(optimizer="sgd", momentum=0.9),
        lambda lr: lambda ps: torch.optim.SGD(ps, lr=lr, momentum=0.9),
        None,
    ),
    "gd": (dict(optimizer="sgd"), lambda lr: lambda ps: torch.optim.SGD(ps, lr=lr), None),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_one_run_equals_torch_optim(name):
    """`train` (M = 1) takes torch.optim's steps on C + R, λ > 0."""
    kw, make, sched = OPTIMIZERS[name]
    lam, lr, seed = MEMBERS[1]
    model = member(seed)
    ref = torch_reference(model, lam, make(lr), scheduler=sched)
    config = fl.TrainConfig(lam=lam, log_every=K, phases=[fl.Phase(steps=K, lr=lr, **kw)])
    result = fl.train(model, DATA, config, progress=False)
    assert max_difference(model, ref) < 1e-12
    assert max_difference(model, member(seed)) > 1e-3  # it did move
    X, Y = DATA.X_train, DATA.Y_train
    with torch.no_grad():  # the logged loss is the cost plus the penalty at the final weights
        loss = float(data_cost("mse", ref(X), Y) + ref.penalty(lam))
    assert result.history["loss"].iloc[-1] == pytest.approx(loss, rel=1e-12)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_ensemble_members_equal_torch_optim(name):
    """`train_ensemble`: each member, with its own λ, lr and initialisation, takes torch.optim's steps."""
    kw, make, sched = OPTIMIZERS[name]
    models = [member(seed) for _, _, seed in MEMBERS]
    refs = [torch_reference(m, lam, make(lr), scheduler=sched) for m, (lam, lr, _) in zip(models, MEMBERS)]
    configs = [fl.TrainConfig(lam=lam, log_every=K, phases=[fl.Phase(steps=K, lr=lr, **kw)]) for lam, lr, _ in MEMBERS]
    results = train_ensemble(models, DATA, configs)
    assert not any(isinstance(r, Exception) for r in results)
    assert max(max_difference(m, r) for m, r in zip(models, refs)) < 1e-12


def test_one_gd_step_is_minus_lr_times_the_gradient_of_cost_plus_penalty():
    """θ₁ = θ₀ − lr·∇(C + R)(θ₀), the gradient from autograd on a copy, for one run and per member."""
    lam, lr = 0.05, 0.1
    before = [member(seed) for seed in range(2)]
    expected = []
    for m in before:
        params = [p for p in m.parameters() if p.requires_grad]
        loss = data_cost("mse", m(DATA.X_train), DATA.Y_train) + m.penalty(lam)
        grads = torch.autograd.grad(loss, params)
        expected.append([(p - lr * g).detach() for p, g in zip(params, grads)])
    config = fl.TrainConfig(lam=lam, log_every=1, phases=[fl.Phase(optimizer="sgd", steps=1, lr=lr)])
    single = member(0)
    fl.train(single, DATA, config, progress=False)
    members = [member(seed) for seed in range(2)]
    train_ensemble(members, DATA, config)
    for trained, want in [(single, expected[0])] + list(zip(members, expected)):
        got = [p.detach() for p in trained.parameters() if p.requires_grad]
        assert max(float((a - b).abs().max()) for a, b in zip(got, want)) < 1e-14


def test_gd_reaches_the_ridge_closed_form():
    """A depth-1 MLP with a bias column is ridge regression: (1/N)‖Y − X̃Wᵀ‖² + λ‖W‖² with X̃ = [X, 1] has the
    minimiser W* = YᵀX̃(X̃ᵀX̃ + λN I)⁻¹ (solved). GD at lr = 1/L (L the largest Hessian eigenvalue, 2/N·X̃ᵀX̃
    + 2λ) contracts the error by 1 − μ/L per step, so 600 steps reach rounding; each member of an ensemble
    reaches the minimiser of its own λ."""
    g = torch.Generator().manual_seed(0)
    N, lams = 60, (1e-3, 0.1, 1.0)
    X = torch.randn(N, 5, generator=g, dtype=torch.float64)
    Y = torch.randn(N, 2, generator=g, dtype=torch.float64)
    data = fl.Dataset(X, Y, X, Y)
    Xt = torch.cat([X, torch.ones(N, 1, dtype=torch.float64)], 1)
    eye = torch.eye(6, dtype=torch.float64)
    hessians = [2 / N * Xt.T @ Xt + 2 * lam * eye for lam in lams]
    rates = [1 / float(torch.linalg.eigvalsh(H)[-1]) for H in hessians]
    assert max(1 - float(torch.linalg.eigvalsh(H)[0]) * r for H, r in zip(hessians, rates)) ** 600 < 1e-14
    configs = [
        fl.TrainConfig(lam=lam, log_every=600, phases=[fl.Phase(optimizer="sgd", steps=600, lr=r)])
        for lam, r in zip(lams, rates)
    ]
    models = [fl.MLP(5, 2, 4, 1, bias=1.0, seed=i, dtype=torch.float64) for i in range(len(lams))]
    single = fl.MLP(5, 2, 4, 1, bias=1.0, seed=0, dtype=torch.float64)
    fl.train(single, data, configs[0], progress=False)
    train_ensemble(models, data, configs)
    for model, lam in [(single, lams[0])] + list(zip(models, lams)):
        W_star = torch.linalg.solve(Xt.T @ Xt + lam * N * eye, Xt.T @ Y).T
        (W,) = model.weights  # stored layout: n_out x (n_in + 1), bias column last
        torch.testing.assert_close(W.detach(), W_star, rtol=0, atol=1e-12)
