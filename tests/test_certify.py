"""Exact critical points of ReLU networks (`featurelab.training.certify`): a kinked minimiser known in closed form,
points that must be refused (not stationary, a saddle), the snap on small nets, the Clarke residual against an
independent bounded least-squares solve, determinism, and the slopes' mode."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import lsq_linear
from torch import nn

from featurelab.data import Dataset, bottleneck_teacher
from featurelab.errors import FeaturelabError
from featurelab.models import MLP, LeakyResNet
from featurelab.training import Phase, TrainConfig, train
from featurelab.training.certify import (
    _at_kinks,
    _kinks_ahead,
    _newton_on,
    _release_start,
    _released,
    _sloped_gradient_norm,
    _snap,
    _whole,
    activation_inputs,
    certificate_at,
    certify,
    clarke_residual,
    identify,
    inert_entries,
    multipliers,
)
from featurelab.training.critical import _Problem

F64 = torch.float64


def kinked_data() -> Dataset:
    """x₁ = (1, 0) → 1, x₂ = (0, 1) → 0: for f(x) = v·relu(w·x) with λ(v² + ‖w‖²) the minimiser has w₂ = 0 exactly
    (w₂ > 0 adds output and penalty, w₂ < 0 adds penalty), so x₂'s pre-activation sits at the kink, and
    v = w₁ = ±√(1 − 2λ) (minimise ½(t² − 1)² + 2λt²)."""
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    Y = torch.tensor([[1.0], [0.0]])
    return Dataset(X, Y, X[:0], Y[:0])


def trained(net, data, lam, steps=1500, lr=3e-3):
    cfg = TrainConfig(
        lam=lam, log_every=steps, checkpoint_every=0, phases=[Phase(optimizer="adam", steps=steps, lr=lr)]
    )
    train(net, data, cfg, progress=False)
    return net


def test_kinked_minimiser_in_closed_form():
    lam = 0.05
    net = MLP(2, 1, 1, 2, seed=3)
    with torch.no_grad():  # start near the minimiser, on the side w₂ > 0 where the kink is reached from
        net.weights[0].copy_(torch.tensor([[0.8, 0.1]], dtype=F64))
        net.weights[1].copy_(torch.tensor([[0.8]], dtype=F64))
    found = certify(net, kinked_data(), "mse", lam)
    c = found.certificate
    t = math.sqrt(1 - 2 * lam)
    w = net.weights[0].detach()
    # x₂'s residual is 0, so its kink's output cotangent c is 0: the loss grows off the kink only at second order,
    # which the certificate does not examine, so the kind stays undecided (a minimum needs every c_k > 0)
    assert c.certified and c.kinks == 1 and c.clarke <= 1e-12 and c.kind == "undecided", c
    assert abs(float(w[0, 1])) <= 1e-14 and abs(float(w[0, 0]) - t) <= 1e-12
    assert abs(float(net.weights[1].detach()[0, 0]) - t) <= 1e-12
    assert c.loss_after == pytest.approx(0.5 * (t * t - 1) ** 2 + 2 * lam * t * t, abs=1e-14)


def kinked_saddle(lam: float = 0.05) -> tuple[MLP, Dataset, float]:
    """`kinked_data` with x₂'s target raised to 1/2, at w = (t, 0), v = t (t = √(1 − 2λ)): x₂'s unit is off.
    ``(net, data, t)``."""
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    Y = torch.tensor([[1.0], [0.5]])
    t = math.sqrt(1 - 2 * lam)
    net = MLP(2, 1, 1, 2, seed=3, dtype=F64)
    with torch.no_grad():
        net.weights[0].copy_(torch.tensor([[t, 0.0]], dtype=F64))
        net.weights[1].copy_(torch.tensor([[t]], dtype=F64))
    return net, Dataset(X, Y, X[:0], Y[:0]), t


def test_a_kink_the_loss_wants_to_leave_makes_a_saddle():
    """`kinked_saddle`: x₂'s unit is off with slope 0, so the point is Clarke critical (δ = 0), but its output
    cotangent c = 2v(0 − 1/2)/2 < 0: turning the unit on (w₂ > 0) lowers the loss at first order. Refused as a
    saddle."""
    lam = 0.05
    net, data, _ = kinked_saddle(lam)
    c = certificate_at(net, data, "mse", lam).certificate
    assert c.kinks == 1 and c.clarke <= 1e-12 and c.kind == "saddle" and not c.certified, c
    assert "the loss falls as 1 kinked input turn on" in c.rule, c.rule


def test_a_rank_deficient_kink_set_is_certified_by_its_min_norm_multipliers():
    """`kinked_data` with a third sample x₃ = (0, 2) → 0: its pre-activation 2w₂ sits at the kink with x₂'s, so J_0's
    two rows are parallel (rank 1 < K = 2: the multipliers are not unique, as at a dead unit's N kinks). The
    minimiser is v = w₁ = √(1 − 3λ), w₂ = 0 (minimise (1/3)(t² − 1)² + 2λt²): certified, its kind left undecided."""
    lam = 0.05
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 2.0]])
    Y = torch.tensor([[1.0], [0.0], [0.0]])
    net = MLP(2, 1, 1, 2, seed=3)
    with torch.no_grad():
        net.weights[0].copy_(torch.tensor([[0.8, 0.1]], dtype=F64))
        net.weights[1].copy_(torch.tensor([[0.8]], dtype=F64))
    c = certify(net, Dataset(X, Y, X[:0], Y[:0]), "mse", lam).certificate
    t = math.sqrt(1 - 3 * lam)
    w = net.weights[0].detach()
    assert c.certified and c.kinks == 2 and c.jacobian_rank == 1 and c.clarke <= 1e-12 and c.kind == "undecided", c
    assert abs(float(w[0, 1])) <= 1e-14 and abs(float(w[0, 0]) - t) <= 1e-12


def kinked_problem(w2: float, lam: float = 0.05):
    """The closed-form net of `kinked_data` at v = w₁ = √(1 − 2λ), w₂ given: one entry off the kink by w₂."""
    t = math.sqrt(1 - 2 * lam)
    net = MLP(2, 1, 1, 2, seed=3)
    with torch.no_grad():
        net.weights[0].copy_(torch.tensor([[t, w2]], dtype=F64))
        net.weights[1].copy_(torch.tensor([[t]], dtype=F64))
    problem = _Problem(net, kinked_data(), "mse", lam)
    return _whole(problem, problem.theta), t


def test_the_add_rule_puts_an_entry_the_snap_drives_to_its_kink_into_k():
    """K read too narrowly (30/β = 3e-6 < w₂ = 1e-3): the first Newton step drives a = w₂ to its kink, which a snap
    without the add rule refuses ("changed sign"); with it the entry joins K and the snap lands on the minimiser."""
    problem, t = kinked_problem(1e-3)
    start, end = _snap(problem, problem.theta, 1e7, 1e-8)
    assert not end.rule and end.slopes.numel() == 1 and end.delta <= 1e-12, end.rule
    assert abs(float(end.theta[1])) <= 1e-14 and abs(float(end.theta[0]) - t) <= 1e-12


def test_a_snap_within_the_tolerance_ends_there_when_a_step_would_cross(monkeypatch):
    """The small MLP's certified point moved by 1e-11: a Newton step that would move inputs off K across 0 (θ ↦ −θ,
    put in by hand) is not taken, nor is any revision of K (the add rule would take those inputs in and start
    again): the restoration ``−J_0⁺a_K`` alone brings the inputs on K back to their kink (within 1e-10 of their
    call's largest), and the snap ends there, within the tolerance at slopes in the box. Moved by 1e-8 instead,
    the point is judged within a tolerance of 1e-5 the same way: off M its δ at the slopes of K says nothing of
    the loss, but one restoration puts it on M."""
    import featurelab.training.certify as method

    net, data = small_mlp()
    kinks = certify(net, data, "mse", 0.02).certificate.kinks
    whole = _Problem(net, data, "mse", 0.02)
    problem = _whole(whole, whole.theta)
    gen = torch.Generator().manual_seed(0)
    monkeypatch.setattr(method, "snap_step", lambda problem, th, masks, m, damping=0.0: (-th, False))
    for size, tolerance, off in ((1e-11, 1e-8, False), (1e-8, 1e-5, True)):
        theta = problem.theta + size * torch.randn(problem.theta.shape, generator=gen, dtype=F64)
        inputs, _ = activation_inputs(problem, theta)
        _, end = _snap(problem, theta, 1e7, tolerance)
        assert not end.rule and end.iterations == 0 and end.m.feasible and end.delta <= tolerance, end.rule
        assert end.slopes.numel() == kinks > 0 and _at_kinks(problem, end)
        assert 0 < float((end.theta - theta).norm()) <= 10 * size
        top = [float(z.abs().max()) for z in inputs]
        on_k = [float(z[k].abs().max()) / t for z, k, t in zip(inputs, end.masks, top) if bool(k.any())]
        assert (max(on_k) > 1e-10) == off  # moved by 1e-8 the start is off M: the restoration puts it there


def test_a_snap_whose_steps_stay_off_m_ends_on_m_by_the_restoration(monkeypatch):
    """The small MLP's certified point moved by 1e-8, so its inputs on K sit up to about 1e-8 of their call's
    largest off their kink, with Newton's step replaced by one that stays where it is and is not trusted (as where
    a nearly flat reduced Hessian leaves each step's second-order remainder in a_K): the steps stall off M. The
    snap ends on M, at the restored point of least δ, with every input on K at its kink, and the certificate there
    passes at the tolerance 1e-5 (δ at the slopes of K is about 1e-8 there). Ending where the steps stalled, the
    certificate reads those inputs off the kink and their slopes as 0 or 1, and refuses the point."""
    import featurelab.training.certify as method

    net, data = small_mlp()
    kinks = certify(net, data, "mse", 0.02).certificate.kinks
    whole = _Problem(net, data, "mse", 0.02)
    problem = _whole(whole, whole.theta)
    monkeypatch.setattr(method, "snap_step", lambda problem, th, masks, m, damping=0.0: (th.clone(), False))
    gen = torch.Generator().manual_seed(2)
    theta = problem.theta + 1e-8 * torch.randn(problem.theta.shape, generator=gen, dtype=F64)
    start, end = method._snap(problem, theta, 1e7, 1e-5)
    assert not _at_kinks(problem, start)  # the start is off M
    assert not end.rule and end.delta <= 1e-5 and _at_kinks(problem, end), (end.rule, end.delta)
    assert end.slopes.numel() == kinks > 0 and 0 < float((end.theta - theta).norm()) <= 1e-6
    cert, _ = method._examine(problem, end, 1e-5, float(problem.evaluate(end.theta)[0]), 0)
    assert cert.certified and cert.clarke <= 1e-5, cert.rule


@pytest.mark.parametrize(
    "runaway_step",
    [lambda th: -th, lambda th: torch.cat([th[:-1], th.new_full((1,), math.nan)])],  # an output weight overflowed
    ids=["crossing", "overflowing"],
)
def test_an_untrusted_newton_step_that_crosses_signs_gives_way_to_damped_steps(monkeypatch, runaway_step):
    """The small MLP's certified point moved by 1e-8, with Newton's step replaced by θ ↦ −θ (or by an overflow) and
    marked untrusted, as the tangent solve's is where the reduced Hessian is singular (its step runs along the null
    direction across the signs of the inputs off K). The snap does not hand those inputs to the add rule: the
    damped (Levenberg–Marquardt) steps bring it back to the certified point, on the same kinks, at rounding.
    Without the damped steps the add rule takes every input that θ ↦ −θ flips into K; an overflow in the output
    layer changes no activation's sign, and taken as a step it would end the snap on a non-finite point."""
    import featurelab.training.certify as method

    net, data = small_mlp()
    c = certify(net, data, "mse", 0.02).certificate
    whole = _Problem(net, data, "mse", 0.02)
    problem = _whole(whole, whole.theta)
    real, tried = method.snap_step, []

    def runaway(problem, th, masks, m, damping=0.0):
        tried.append(damping)
        return (runaway_step(th), False) if damping == 0 else real(problem, th, masks, m, damping)

    monkeypatch.setattr(method, "snap_step", runaway)
    gen = torch.Generator().manual_seed(1)
    theta = problem.theta + 1e-8 * torch.randn(problem.theta.shape, generator=gen, dtype=F64)
    _, end = _snap(problem, theta, 1e7, 1e-10)
    assert not end.rule and end.delta <= 1e-12 and end.m.feasible, (end.rule, end.delta)
    assert end.slopes.numel() == c.kinks > 0 and _at_kinks(problem, end)
    assert float((end.theta - problem.theta).norm()) <= 1e-9
    assert 0.0 in tried and max(tried) > 0


def test_a_point_that_is_not_critical_is_refused():
    data = bottleneck_teacher((4, 2, 4), hidden=8, n_train=32, n_test=8)
    net = MLP(4, 4, 8, 3, seed=1)
    c = certificate_at(net, data, "mse", 0.01).certificate
    assert not c.certified and c.clarke > 1e-3 and "Clarke residual" in c.rule


def test_a_saddle_is_refused():
    """θ = 0 of a two-layer linear net: ∇𝓛 = 0, and the Hessian's block [[2λ, −G], [−Gᵀ, 2λ]] (G = the data's
    cross-covariance) has the negative eigenvalue 2λ − σ_max(G)."""
    data = bottleneck_teacher((3, 3, 3), hidden=8, n_train=32, n_test=8)
    net = MLP(3, 3, 3, 2, leak=1.0, seed=0)
    with torch.no_grad():
        for W in net.weights:
            W.zero_()
    c = certificate_at(net, data, "mse", 1e-3).certificate
    assert c.clarke == 0 and c.kind == "saddle" and not c.certified and "saddle" in c.rule
    assert c.min_reduced_eigenvalue is not None and c.min_reduced_eigenvalue < 0


def test_certify_leaves_a_saddle_for_the_global_minimum_of_a_linear_net():
    """θ = 0 of the two-layer linear net of `test_a_saddle_is_refused`: the gradient vanishes for every smoothing, so
    the continuation stays and the first point reached is that saddle (refused with ``escapes=0``). Escaping along
    the reduced Hessian's negative eigenvector, `certify` reaches a minimum. Every local minimum of
    ``C(W_2W_1) + λ(‖W_1‖² + ‖W_2‖²)`` at width >= rank is global and equals ``min_A C(A) + 2λ‖A‖_*`` (the nuclear
    norm's variational form), a convex problem solved here apart from featurelab by proximal gradient."""
    lam = 1e-3
    data = bottleneck_teacher((3, 3, 3), hidden=8, n_train=32, n_test=8)

    def at_zero() -> MLP:
        net = MLP(3, 3, 3, 2, leak=1.0, seed=0)
        with torch.no_grad():
            for W in net.weights:
                W.zero_()
        return net

    with pytest.raises(FeaturelabError, match=r"escapes=-1 is not allowed: it must be an integer >= 0"):
        certify(at_zero(), data, "mse", lam, escapes=-1)
    stayed = certify(at_zero(), data, "mse", lam, escapes=0).certificate
    assert stayed.kind == "saddle" and not stayed.certified and stayed.detail["escaped_saddles"] == [], stayed
    c = certify(at_zero(), data, "mse", lam).certificate
    X, Y = data.X_train.double().numpy(), data.Y_train.double().numpy()
    N = len(X)
    assert c.detail["escaped_saddles"] == [pytest.approx(float((Y**2).sum()) / N, rel=1e-14)], c.detail
    A, step = np.zeros((3, 3)), 0.5 / np.linalg.norm(2 * X.T @ X / N, 2)
    for _ in range(100_000):
        U, S, Vt = np.linalg.svd(A - step * 2 * (X @ A.T - Y).T @ X / N)
        A, previous = U @ np.diag(np.maximum(S - 2 * lam * step, 0)) @ Vt, A
        if np.abs(A - previous).max() <= 1e-16:
            break
    optimum = ((X @ A.T - Y) ** 2).sum() / N + 2 * lam * np.linalg.svd(A, compute_uv=False).sum()
    assert c.certified and c.clarke <= 1e-8 and c.kind != "saddle", c
    assert c.loss_after == pytest.approx(optimum, rel=1e-12)


def test_certify_leaves_a_kinked_saddle_for_the_minimiser_in_closed_form():
    """The saddle of `test_a_kink_the_loss_wants_to_leave_makes_a_saddle` (x₂'s unit off where the loss wants it on):
    from there `certify` ends at the net's minimiser (the continuation leaves it alone: a smoothed unit is never
    off). f = v·relu(w·x) on x₁, x₂ outputs u = v·w (w >= 0), and at
    balance λ(v² + ‖w‖²) = 2λ‖u‖, so the minimum is that of ½‖u − y‖² + 2λ‖u‖: u = y(1 − 2λ/‖y‖), loss
    2λ‖y‖ − 2λ², with both units on (no kink left); the saddle's loss is ½((t² − 1)² + ¼) + 2λt², t² = 1 − 2λ."""
    lam = 0.05
    net, data, t = kinked_saddle(lam)
    X, Y = data.X_train, data.Y_train
    c = certify(net, data, "mse", lam).certificate
    assert c.certified and c.kinks == 0 and c.clarke <= 1e-12 and c.kind == "minimum", c
    assert c.loss_after == pytest.approx(2 * lam * math.sqrt(1.25) - 2 * lam**2, rel=1e-13)
    assert c.loss_before == pytest.approx(0.5 * ((t * t - 1) ** 2 + 0.25) + 2 * lam * t * t, rel=1e-14)
    u = net(X.to(F64)).detach().squeeze(1)
    assert torch.allclose(u, Y.to(F64).squeeze(1) * (1 - 2 * lam / math.sqrt(1.25)), rtol=0, atol=1e-12)


def zero_linear_net() -> tuple[MLP, Dataset, float]:
    """The two-layer linear net at θ = 0 of `test_certify_leaves_a_saddle_for_the_global_minimum_of_a_linear_net`:
    its certification runs two rounds of stages (the saddle at 0, then below it after the escape)."""
    net = MLP(3, 3, 3, 2, leak=1.0, seed=0)
    with torch.no_grad():
        for W in net.weights:
            W.zero_()
    return net, bottleneck_teacher((3, 3, 3), hidden=8, n_train=32, n_test=8), 1e-3


@pytest.mark.parametrize("after", [2, 5])
def test_an_interrupted_certification_resumes_after_its_last_stage_to_the_same_bits(tmp_path, monkeypatch, after):
    """Interrupted after `after` continuation stages (in the first round, or after the escape in the second), a
    certification resumed from its checkpoint runs only the stages left and ends where an uninterrupted one ends,
    with the same steps and escaped saddles; a checkpoint of another problem (here another λ) is not used, and the
    file is gone once `certify` returns."""
    import featurelab.training.certify as certify_module

    stages, real = [], certify_module._stage

    def counted(*args):
        if len(stages) == stop[0]:
            raise KeyboardInterrupt
        stages.append(args[2])
        return real(*args)

    monkeypatch.setattr(certify_module, "_stage", counted)
    stop, kept = [-1], tmp_path / "stages.safetensors"
    net, data, lam = zero_linear_net()
    whole = certify(net, data, "mse", lam, checkpoint=kept)
    total, stages[:] = len(stages), []
    assert total == 8 and not kept.exists() and whole.certificate.detail["escaped_saddles"], (total, whole)

    stop[0] = after
    with pytest.raises(KeyboardInterrupt):
        certify(zero_linear_net()[0], data, "mse", lam, checkpoint=kept)
    assert kept.exists()
    stop[0], stages[:] = -1, []
    fresh = certify(zero_linear_net()[0], data, "mse", 2 * lam).certificate
    fresh_stages, stages[:] = len(stages), []
    other = certify(zero_linear_net()[0], data, "mse", 2 * lam, checkpoint=kept, resume=True).certificate
    assert len(stages) == fresh_stages and (other.iterations, other.loss_after) == (fresh.iterations, fresh.loss_after)
    assert not kept.exists()

    stop[0], stages[:] = after, []
    with pytest.raises(KeyboardInterrupt):
        certify(zero_linear_net()[0], data, "mse", lam, checkpoint=kept)
    stop[0], stages[:] = -1, []
    resumed_net = zero_linear_net()[0]
    resumed = certify(resumed_net, data, "mse", lam, checkpoint=kept, resume=True)
    assert len(stages) == total - after and not kept.exists()
    a, b = whole.certificate, resumed.certificate
    assert (b.iterations, b.detail["escaped_saddles"], b.loss_after) == (
        a.iterations,
        a.detail["escaped_saddles"],
        a.loss_after,
    ), (a, b)
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), resumed_net.parameters()))

    kept.write_bytes(b"not a safetensors file")  # a damaged checkpoint: one line naming the file and the fix
    with pytest.raises(FeaturelabError, match=r"stages\.safetensors' is not a valid safetensors file .*; delete it"):
        certify(zero_linear_net()[0], data, "mse", lam, checkpoint=kept, resume=True)


def test_certify_shows_its_continuation_stages_on_a_progress_bar(capsys):
    """The bar counts the stages of every round (the zero linear net runs 8 over two rounds, see above) and names
    the last one's β and smoothed stationarity; without `progress` nothing is written."""
    net, data, lam = zero_linear_net()
    certify(net, data, "mse", lam, progress=False)
    assert capsys.readouterr().err == ""
    certify(zero_linear_net()[0], data, "mse", lam, progress=True)
    err = capsys.readouterr().err
    assert "certify" in err and "8/8" in err and "β = 1e+05: smoothed stationarity" in err, err[-600:]


def small_mlp():
    data = bottleneck_teacher((4, 2, 4), hidden=8, n_train=32, n_test=8)
    return trained(MLP(4, 4, 6, 2, seed=0, dtype=F64), data, 0.02, steps=800, lr=1e-2), data


def test_snap_on_a_small_mlp_and_the_same_bits_twice():
    net, data = small_mlp()
    a, b = MLP(4, 4, 6, 2, dtype=F64), MLP(4, 4, 6, 2)
    a.load_state_dict(net.state_dict())
    b.load_state_dict(net.state_dict())
    first, second = certify(a, data, "mse", 0.02), certify(b, data, "mse", 0.02)
    c = first.certificate
    assert c.certified and c.clarke <= 1e-12 and c.kinks > 0 and c.gap >= 1e6, c
    assert c.jacobian_rank == c.kinks and c.kind in ("minimum", "undecided")
    # the same input, the same point (to rounding: MKL's float64 products may round differently with the
    # memory alignment of the operands)
    assert all(torch.allclose(p, q, rtol=0, atol=1e-14) for p, q in zip(a.parameters(), b.parameters()))
    assert torch.allclose(first.slopes, second.slopes, rtol=0, atol=1e-10)
    # the certified point, examined as it is, passes the same certificate
    again = certificate_at(a, data, "mse", 0.02).certificate
    assert again.certified and again.kinks == c.kinks and again.clarke <= 1e-12


def test_the_release_rule_frees_the_kinks_whose_multipliers_need_a_slope_outside_the_box():
    """A kink set read too widely (30/β = 0.03) off an unconverged net holds an active entry whose multiplier needs a
    slope > 1: the least-squares slopes leave [0, 1], and `_released` drops exactly the kinks whose slope lies
    outside the box, and no other."""
    net, data = small_mlp()
    problem = _Problem(net, data, "mse", 0.02)
    inputs, leaks = activation_inputs(problem, problem.theta)
    masks, _ = identify(inputs, 30 / 1e3)
    _, end, _ = _newton_on(problem, problem.theta, masks, leaks, 1e-8)
    assert not end.m.feasible and end.m.rank == end.slopes.numel()
    outside = (end.m.slopes < -1e-9) | (end.m.slopes > 1 + 1e-9)
    released = _released(end)
    assert released is not None
    kept = torch.cat([k[m] for k, m in zip(released, masks)])  # over the old K: which kinks stay
    assert bool(outside.any()) and bool((~outside).any()) and torch.equal(kept, ~outside)
    assert all(bool((k <= m).all()) for k, m in zip(released, masks))  # nothing added
    # the new start moves each released input towards the side where the loss falls, by t, and no other (to first
    # order): s > 1 with c > 0 wants a > 0 (c(1 − s) < 0), s < 0 with c > 0 wants a < 0 (c·s < 0)
    s, c = end.m.slopes, end.m.cotangents
    side = torch.where(s > 1, torch.sign(c), -torch.sign(c))
    inputs = activation_inputs(problem, end.theta)[0]
    off = min(float(z[~m].abs().min()) for z, m in zip(inputs, masks))
    before = torch.cat([z[m] for z, m in zip(inputs, masks)])
    after = torch.cat([z[m] for z, m in zip(activation_inputs(problem, _release_start(problem, end))[0], masks)])
    t = 1e-2 * off
    expected = torch.where(outside, t * side, torch.zeros_like(s))
    assert bool((c[outside] != 0).all()) and bool((side[outside] != 0).all())
    assert float((after - before - expected).abs().max()) <= 1e-2 * t


def test_a_kink_set_too_large_for_the_dense_solve_is_refused(monkeypatch):
    """No unit of the trained net is off on every sample (nothing refused up front); the 9 kinks found exceed a cap
    of 8 at the end."""
    import featurelab.training.certify as method

    monkeypatch.setattr(method, "MAX_KINKS", 8)
    net, data = small_mlp()
    c = certify(net, data, "mse", 0.02).certificate
    assert not c.certified and "(9 entries, 48 parameters) is too large for the KKT solve" in c.rule


def test_the_kinks_a_net_promises():
    """Unit 0 is off on every sample (3 kinks to come), unit 1 lies within 0.03 of 0 on every sample (dying at a
    stage of kink width 0.03), unit 2 has one input exactly at 0; a leaky unit is never dead."""
    z = torch.tensor([[-1.0, 0.01, 2.0], [-2.0, -0.02, 0.0], [-0.5, 0.005, 1.0]], dtype=F64)
    assert _kinks_ahead([z], [0.0]) == (1, 4)
    assert _kinks_ahead([z], [0.0], 0.03) == (2, 7)
    assert _kinks_ahead([z], [0.1], 0.03) == (0, 1)


def test_a_unit_whose_inputs_all_sit_at_the_kink_promises_no_kinks_when_held():
    """Unit 3's weights have all but vanished under weight decay: its inputs are ±1e-12 (at the kink, 1e-10 of the
    call's largest |a| = 2, but not all <= 0). Like the off unit 0 it is dying, so a snap that holds neurons promises
    none of its kinks; only unit 2's entry at 0 is left."""
    z = torch.tensor([[-1.0, 0.01, 2.0, 1e-12], [-2.0, -0.02, 0.0, -3e-12], [-0.5, 0.005, 1.0, 0.0]], dtype=F64)
    assert _kinks_ahead([z], [0.0], held=True) == (2, 1)
    assert _kinks_ahead([z], [0.0]) == (2, 7)


class Unmarked(nn.Module):
    """An MLP behind a module that does not say where its neurons sit (no `neurons`), as a user's model."""

    def __init__(self, net: MLP):
        super().__init__()
        self.net = net

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.net(X)

    def penalty(self, lam: float) -> torch.Tensor:
        return self.net.penalty(lam)


def test_a_net_whose_dead_units_promise_too_many_kinks_is_refused_before_anything_moves(monkeypatch):
    """Hidden unit 2's incoming weights zeroed: it is off on all 32 samples, so weight decay will hold its 32 inputs
    at the kink, and a model that does not say where its neurons sit cannot hold them out of the solve: 32 kinks > a
    cap of 31, refused up front."""
    import featurelab.training.certify as method

    monkeypatch.setattr(method, "MAX_KINKS", 31)
    net, data = small_mlp()
    with torch.no_grad():
        net.weights[0][2].zero_()
    model = Unmarked(net)
    before = [p.detach().clone() for p in model.parameters()]
    c = certify(model, data, "mse", 0.02).certificate
    assert not c.certified and c.rule.startswith("too large to certify: 1 unit off on every sample"), c.rule
    assert "promise 32 kinks" in c.rule and c.iterations == 0 and c.loss_before == c.loss_after
    assert all(torch.equal(p.detach(), b.to(p.dtype)) for p, b in zip(model.parameters(), before))


def test_dead_neurons_are_held_at_zero_and_the_rest_is_the_net_without_them():
    """A width-12 net with biases at λ = 0.02 whose continuation kills neurons: the snap zeroes and holds their
    weights, their N kinks each leave the solve, and the Clarke residual reaches rounding on the whole θ. Deleting
    the held neurons gives a net without dead ones whose certificate, computed with every kink in the solve
    (nothing held), has the same loss, the same kinks and a Clarke residual at rounding. The point is a saddle:
    where the live coordinates' reduced Hessian has a negative eigenvalue, the net without the held neurons is the
    same saddle; where only a held neuron can escape, the net without them is certified."""
    data = bottleneck_teacher((4, 2, 4), hidden=8, n_train=32, n_test=8)
    net = trained(MLP(4, 4, 12, 2, bias=1.0, seed=0, dtype=F64), data, 0.02, steps=800, lr=1e-2)
    c = certify(net, data, "mse", 0.02, escapes=0).certificate
    assert c.detail["held_neurons"] >= 1 and c.clarke <= 1e-12 and c.kind == "saddle", c
    curved = c.min_reduced_eigenvalue < 0  # a saddle already in the live coordinates
    assert curved or ("a held neuron can escape" in c.rule and c.detail["held_escape"] > 1), c
    W1, W2 = net.weights[0].detach(), net.weights[1].detach()
    held = (W1.abs().sum(1) == 0) & (W2[:, :12].abs().sum(0) == 0)  # W2's last column: the bias
    assert int(held.sum()) == c.detail["held_neurons"]
    live = (~held).nonzero().squeeze(1)
    pruned = MLP(4, 4, len(live), 2, bias=1.0, dtype=F64)
    with torch.no_grad():
        pruned.weights[0].copy_(W1[live])
        pruned.weights[1].copy_(W2[:, torch.cat([live, torch.tensor([12])])])
    alone = certificate_at(pruned, data, "mse", 0.02).certificate
    assert alone.detail["held_neurons"] == 0 and alone.clarke <= 1e-12, alone
    assert alone.kinks == c.kinks and alone.loss_after == pytest.approx(c.loss_after, rel=1e-14, abs=0)
    assert (alone.kind == "saddle" and alone.rule == c.rule) if curved else alone.certified, alone


def test_a_zero_neuron_added_to_a_certified_net_can_escape_as_its_second_order_term_says():
    """A critical width-12 net plus a 13th neuron with zero weights: the same critical point (same δ and loss),
    the new neuron held. Near it the loss moves by λ(‖w‖² + ‖v‖²) + vᵀDᵀrelu(Xw) (X the inputs, D = ∂C/∂Ŷ): an
    escape exists iff max_{‖w‖=1} ‖Dᵀrelu(Xw)‖ > 2λ. Checked apart from featurelab: σ_max(D)σ_max(X) is the upper
    bound reported, a plain projected-gradient ascent finds a w beyond 2λ, and the loss of the net with the 13th
    neuron set to ε(w, −Dᵀrelu(Xw)/(2λ)) falls below the critical value, as the certificate's "saddle" says."""
    lam = 0.02
    data = bottleneck_teacher((4, 2, 4), hidden=8, n_train=32, n_test=8)
    net = trained(MLP(4, 4, 12, 2, seed=1, dtype=F64), data, lam, steps=800, lr=1e-2)
    c = certify(net, data, "mse", lam).certificate
    assert c.clarke <= 1e-10 and c.detail["held_neurons"] == 0, c
    big = MLP(4, 4, 13, 2, dtype=F64)
    with torch.no_grad():
        big.weights[0].zero_()
        big.weights[1].zero_()
        big.weights[0][:12].copy_(net.weights[0])
        big.weights[1][:, :12].copy_(net.weights[1])
    a = certificate_at(big, data, "mse", lam).certificate
    assert a.detail["held_neurons"] == 1 and a.loss_after == pytest.approx(c.loss_after, rel=1e-14, abs=0)
    assert a.clarke == pytest.approx(c.clarke, rel=1e-6) and a.kinks == c.kinks
    X, Y = data.X_train.to(F64), data.Y_train.to(F64)
    out = net(X).detach().requires_grad_()
    (D,) = torch.autograd.grad(((out - Y) ** 2).sum() / len(X), out)
    top = float(np.linalg.norm(D.numpy(), 2) * np.linalg.norm(X.numpy(), 2))
    assert a.detail["held_escape_bound"] * 2 * lam == pytest.approx(top, rel=1e-9)
    gen = torch.Generator().manual_seed(1)
    best, w_best = 0.0, None
    for _ in range(64):
        w = torch.randn(4, generator=gen, dtype=F64)
        for _ in range(300):
            w = (w / w.norm()).detach().requires_grad_()
            value = (D.T @ torch.relu(X @ w)).norm()
            (g,) = torch.autograd.grad(value, w)
            if float(value.detach()) > best:
                best, w_best = float(value.detach()), w.detach().clone()
            w = w.detach() + 0.1 * g
    assert w_best is not None and best > 2 * lam and a.detail["held_escape"] * 2 * lam >= 0.99 * best
    assert a.kind == "saddle" and not a.certified
    v = -(D.T @ torch.relu(X @ w_best)) / (2 * lam)
    with torch.no_grad():
        big.weights[0][12] = 1e-2 * w_best
        big.weights[1][:, 12] = 1e-2 * v
    with torch.no_grad():
        moved = float(((big(X) - Y) ** 2).sum() / len(X) + big.penalty(lam))
    assert moved < a.loss_after - 1e-6 * 1e-4 * float(v.norm()) ** 2


def bvls_clarke(net, X: np.ndarray, Y: np.ndarray, lam: float, mask: np.ndarray) -> float:
    """The Clarke residual of a one-hidden-layer bias-free net (mse), built apart from featurelab: ∇𝓛_s is affine in
    the slopes s at the kinks `mask` (N x h), ∇_{W₁}𝓛_s = ((G W₂) ⊙ D_s)ᵀX + 2λW₁ with D_s the ReLU derivative (s at
    the kinks) and G = ∂C/∂f of C = (1/N)‖f(X) − Y‖²_F; minimised over s ∈ [0, 1]^K by scipy's bounded least squares,
    relative to ‖∇R‖."""
    W1, W2 = (W.detach().numpy() for W in net.weights)
    Z = X @ W1.T
    G = 2 * (np.maximum(Z, 0) @ W2.T - Y) / len(Y)
    back = G @ W2  # N x h
    D = (Z > 0).astype(float) * ~mask  # slope 0 at the kinks in the base; s adds through the columns
    base = np.concatenate([((back * D).T @ X + 2 * lam * W1).ravel(), (G.T @ np.maximum(Z, 0) + 2 * lam * W2).ravel()])
    cols = []
    for n, i in zip(*np.nonzero(mask)):
        col = np.zeros_like(W1)
        col[i] = back[n, i] * X[n]
        cols.append(np.concatenate([col.ravel(), np.zeros(W2.size)]))
    A = np.stack(cols, 1)
    penalty = 2 * lam * np.concatenate([W1.ravel(), W2.ravel()])
    ls = lsq_linear(A, -base, bounds=(0, 1), method="bvls", tol=1e-15)
    return float(np.linalg.norm(A @ ls.x + base) / np.linalg.norm(penalty))


def test_clarke_residual_against_bounded_least_squares():
    """One hidden layer: ∇𝓛_s is affine in the slopes s at the kinks, ∇_{W₁}𝓛_s = ((G W₂) ⊙ D_s)ᵀX + 2λW₁ with
    D_s the ReLU derivative (s at the kinks) and G = ∂C/∂f; the other gradients do not depend on s. Built by hand
    and minimised over s ∈ [0, 1]^K by scipy's bounded least squares, it gives the certificate's δ."""
    net, data = small_mlp()
    lam = 0.02
    certify(net, data, "mse", lam)
    found = certificate_at(net, data, "mse", lam)
    delta = bvls_clarke(net, data.X_train.numpy(), data.Y_train.numpy(), lam, found.kink_masks[0].numpy())
    assert found.certificate.clarke == pytest.approx(delta, abs=1e-12)
    assert found.certificate.clarke <= 1e-12


def test_slopes_mode_makes_the_clarke_gradient_vanish():
    net, data = small_mlp()
    found = certify(net, data, "mse", 0.02)
    params = list(net.parameters())

    def grad_norm():
        cost = ((net(data.X_train) - data.Y_train) ** 2).sum() / len(data.Y_train)
        loss = cost + net.penalty(0.02)
        return float(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).norm())

    plain = grad_norm()
    with found.slopes_mode():
        at_kinks = grad_norm()
    assert at_kinks <= 1e-10 * float(torch.cat([p.detach().reshape(-1) for p in params]).norm())
    assert plain > 1e3 * at_kinks  # relu'(0) = 0 leaves a residual at the kinks


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_snap_on_small_leaky_resnets(seed):
    """N = 64, w = 12, L = 6, L̃ = 2, λ = 0.02: each seed reaches a strict local minimum at ReLU kinks."""
    data = bottleneck_teacher((6, 2, 6), hidden=16, n_train=64, n_test=16)
    net = trained(LeakyResNet(6, 6, width=12, depth=6, effective_depth=2.0, seed=seed, dtype=F64), data, 0.02)
    c = certify(net, data, "mse", 0.02).certificate
    assert c.certified and c.clarke <= 1e-10 and c.kinks > 0 and c.gap >= 1e6 and c.kind == "minimum", c
    assert c.previous_clarke > c.clarke


def cut_data(keep_negatives: bool = True) -> Dataset:
    """x = (t, 0) → t² for six t in [0.5, 1.5]; x_b = (0, 1) → 0, whose first-layer inputs W₁[:, 1] weight decay
    takes exactly to 0 (genuine kinks); x_c = (−1, 0), (−0.5, 0) → 0, cut by strictly negative first-layer inputs
    once every live unit's W₁[j, 0] > 0. Both samples' representation is 0 after the first layer."""
    t = torch.linspace(0.5, 1.5, 6)
    X = torch.cat([torch.stack([t, torch.zeros(6)], 1), torch.tensor([[0.0, 1.0], [-1.0, 0.0], [-0.5, 0.0]])])
    Y = torch.cat([(t**2).unsqueeze(1), torch.zeros(3, 1)])
    if not keep_negatives:
        X, Y = X[:7], Y[:7]
    return Dataset(X, Y, X[:0], Y[:0])


def test_inert_kinks_leave_the_kink_set_and_the_net_without_their_samples_agrees():
    """A bias-free MLP of depth 4: x_b's and the x_c's representations are 0 after the first layer, so their inputs
    of the second and third layers are 0 for every nearby weight. Counted apart from featurelab (layer by layer, the
    samples whose inputs are all <= 0, times the layer's live units), they are the inert kinks, outside K: J_0 has
    full rank on the rest. The x_c's rows of ∂a/∂θ (a dense Jacobian of the true net) vanish. The same point on the
    data without the x_c's (λ scaled by N/N', so the loss is (N/N')·𝓛) passes the same certificate with the same K
    and a Clarke residual at rounding."""
    lam, data = 0.01, cut_data()
    net = trained(MLP(2, 1, 5, 4, seed=0, dtype=F64), data, lam, steps=2000, lr=1e-2)
    c = certify(net, data, "mse", lam).certificate
    # rounding: ‖∇R‖ is 0.04 here, and the gradient's float64 sums leave ‖∇𝓛‖ near 1e-13
    assert c.certified and c.clarke <= 1e-11 and c.jacobian_rank == c.kinks, c
    Ws = [W.detach() for W in net.weights]
    h, expected = data.X_train.to(F64), 0
    for layer, W in enumerate(Ws[:-1]):
        a = h @ W.T
        live = (W.abs().sum(1) > 0) | (Ws[layer + 1].abs().sum(0) > 0)
        zero = (h == 0).all(1) if layer else torch.zeros(len(h), dtype=torch.bool)
        expected += int(zero.sum()) * int(live.sum())
        h = torch.relu(a)
        h = torch.where(a.abs() <= 1e-10 * a.abs().max(), 0.0, h)  # x_b's kinks, at rounding off 0
    assert expected > 0 and c.detail["inert_kinks"] == expected, (c.detail, expected)

    def later_inputs(*flat):
        h = data.X_train.to(F64)[7:]
        out = []
        for i, W in enumerate(flat[:-1]):
            a = h @ W.T
            out += [a] if i else []
            h = torch.relu(a)
        return torch.cat(out, 1)

    jac = torch.autograd.functional.jacobian(later_inputs, tuple(Ws))
    assert all(bool((j == 0).all()) for j in jac)
    kept = cut_data(keep_negatives=False)
    ratio = len(kept.X_train) / len(data.X_train)
    alone = certificate_at(net, kept, "mse", lam / ratio).certificate
    assert alone.certified and alone.clarke <= 1e-11 and alone.kinks == c.kinks, alone
    assert alone.loss_after == pytest.approx(c.loss_after / ratio, rel=1e-13, abs=0)


def test_a_net_with_biases_has_no_inert_kinks():
    """Hand-set weights: x_c's first-layer inputs are all < 0 (W₁[:, 0] > 0), so its representation is 0. Bias-free,
    its later inputs are inert (and promise no kinks); with a bias column, even one set to 0, ∂a/∂b = β ≠ 0 on them:
    nothing is inert, and the entries at 0 are promised as kinks."""
    W1 = torch.tensor([[1.0, 0.5], [0.7, -0.3], [0.2, 0.9]], dtype=F64)
    W2 = torch.tensor([[0.5, -1.0, 0.3], [0.4, 0.8, -0.6], [1.0, 0.1, 0.2]], dtype=F64)
    W3 = torch.tensor([[1.0, -0.5, 0.7]], dtype=F64)
    data = cut_data()
    for bias in (0.0, 1.0):
        net = MLP(2, 1, 3, 3, bias=bias, dtype=F64)
        with torch.no_grad():
            for W, V in zip(net.weights, (W1, W2, W3)):
                W.zero_()
                W[:, :3].copy_(V) if V.shape[1] == 3 else W[:, :2].copy_(V)
        problem = _Problem(net, data, "mse", 0.01)
        inert = inert_entries(problem, problem.theta)
        inputs, leaks = activation_inputs(problem, problem.theta)
        negative = (inputs[0] < 0).all(1)
        if bias == 0:
            assert torch.equal(negative, torch.tensor([False] * 7 + [True, True]))
            assert not bool(inert[0].any()) and torch.equal(inert[1], negative.unsqueeze(1).expand(-1, 3))
            assert _kinks_ahead(inputs, leaks, inert=inert) == (0, 0)
        else:
            assert not any(bool(i.any()) for i in inert) and bool((inputs[1][negative] == 0).all())
            assert _kinks_ahead(inputs, leaks, inert=inert) == (0, 6)


def paired_kinks(seed: int):
    """Units 0–2 see only x₄, and samples 0–2 (with their doubles 6–8) have x₄ = 0: 18 kinks at exactly 0 whose rows
    of J_0 come in parallel pairs (rank 9), so the least-squares multipliers form an affine family (a 9-dimensional
    one). ``(net, X, Y, λ, problem, leaks, mask)``."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(6, 4, generator=gen, dtype=F64)
    X[:3, 3] = 0.0
    X = torch.cat([X, 2 * X[:3]])
    Y = torch.randn(9, 2, generator=gen, dtype=F64)
    lam = 0.02
    net = MLP(4, 2, 5, 2, seed=1 + seed, dtype=F64)
    with torch.no_grad():
        net.weights[0][:3, :3] = 0.0
    problem = _Problem(net, Dataset(X, Y, X[:0], Y[:0]), "mse", lam)
    _, leaks = activation_inputs(problem, problem.theta)
    mask = torch.zeros(9, 5, dtype=torch.bool)
    mask[[0, 1, 2, 6, 7, 8], :3] = True
    return net, X, Y, lam, problem, leaks, mask


@pytest.mark.parametrize("products", [False, True], ids=["dense", "matrix-free"])
def test_a_rank_deficient_kink_set_gets_the_bounded_least_squares_residual(products, monkeypatch):
    """`paired_kinks`: no least-squares multiplier of the family has its slopes in [0, 1]. With one hidden layer and
    a = 0 at the kinks, ∇𝓛_s is affine in s: built by hand and minimised over the box by scipy's BVLS, its minimum
    is the Clarke residual, to rounding. (L-BFGS-B on ‖∇𝓛_s‖² from the clipped min-norm slopes stops 2e-10 above
    it here; its gradient in s shrinks with the residual, so near a critical point it stops where it starts.) The
    same on products of J_0, where the bounded problem is solved without the dense factors."""
    if products:
        import featurelab.training.certify as method

        monkeypatch.setattr(method, "MAX_JACOBIAN_BYTES", 0)
    net, X, Y, lam, problem, leaks, mask = paired_kinks(0)
    m = multipliers(problem, problem.theta, [mask], leaks)
    delta, slopes = clarke_residual(problem, problem.theta, [mask], m)
    assert m.rank == (-1 if products else 9) and not m.feasible and bool(((slopes >= 0) & (slopes <= 1)).all())
    expected = bvls_clarke(net, X.numpy(), Y.numpy(), lam, mask.numpy())
    assert delta == pytest.approx(expected, rel=1e-12, abs=0)


def test_a_cotangent_at_underflow_keeps_its_slope_out_of_the_family_search(monkeypatch):
    """`paired_kinks` with one kink's output cotangent set to 1e-320 by hand (1/c overflows): the multipliers
    determine no slope there, and the linear program over the family leaves that kink out instead of failing on
    infinite coefficients; the Clarke residual is still the bounded minimum at slopes in the box."""
    import featurelab.training.certify as method

    net, X, Y, lam, problem, leaks, mask = paired_kinks(0)
    true = method._output_cotangents

    def underflow(*args):
        c = true(*args).clone()
        c[0] = 1e-320
        return c

    monkeypatch.setattr(method, "_output_cotangents", underflow)
    m = multipliers(problem, problem.theta, [mask], leaks)
    delta, slopes = clarke_residual(problem, problem.theta, [mask], m)
    assert math.isfinite(delta) and bool(((slopes >= 0) & (slopes <= 1)).all()) and not m.feasible


def test_the_multipliers_family_is_searched_for_slopes_in_the_box(monkeypatch):
    """`paired_kinks` over 30 draws: the min-norm multipliers' slopes leave [0, 1] in 29, and the linear program over
    the family (`_least_outside`) finds slopes in the box exactly where the bounded minimum (BVLS on the hand-built
    affine ∇𝓛_s) equals the least-squares residual δ_LS, which happens for draw 24 only: there the certificate's δ
    is δ_LS, at slopes that lie in the box, with no bounded solve."""
    import featurelab.training.certify as method

    searched, found = [], []
    search = method._least_outside

    def counted(*args):
        searched.append(True)
        return search(*args)

    monkeypatch.setattr(method, "_least_outside", counted)
    for seed in range(30):
        net, X, Y, lam, problem, leaks, mask = paired_kinks(seed)
        searched.clear()
        m = multipliers(problem, problem.theta, [mask], leaks)
        expected = bvls_clarke(net, X.numpy(), Y.numpy(), lam, mask.numpy())
        assert m.feasible == (expected <= m.delta * (1 + 1e-12)), seed
        if m.feasible and searched:
            found.append(seed)
            delta, slopes = clarke_residual(problem, problem.theta, [mask], m)
            assert delta == pytest.approx(m.delta, rel=1e-12) and bool(((slopes >= 0) & (slopes <= 1)).all())
    assert found == [24]


def paired_kinks_reach_the_bounded_minimum() -> None:
    """Over 30 `paired_kinks` draws: J_0 of rank 9, slopes in the box, and δ the bounded minimum of the hand-built
    affine ∇𝓛_s (scipy's BVLS), to rounding."""
    for seed in range(30):
        net, X, Y, lam, problem, leaks, mask = paired_kinks(seed)
        m = multipliers(problem, problem.theta, [mask], leaks)
        delta, slopes = clarke_residual(problem, problem.theta, [mask], m)
        expected = bvls_clarke(net, X.numpy(), Y.numpy(), lam, mask.numpy())
        assert m.rank == 9 and bool(((slopes >= 0) & (slopes <= 1)).all()), seed
        assert delta == pytest.approx(expected, rel=1e-10, abs=1e-15), seed


def test_a_family_search_stopped_at_its_iteration_cap_leaves_the_clarke_residual_to_the_bounded_solve(monkeypatch):
    """`paired_kinks` over 30 draws with HiGHS stopped after one iteration (`FAMILY_ITERATIONS`, the cap that bounds
    the linear program where it runs into numerical difficulties; every call sees it): the program's unfinished
    point is not read as slopes, and the Clarke residual is still the bounded minimum of the hand-built affine
    ∇𝓛_s (scipy's BVLS), to rounding, at slopes in the box."""
    import featurelab.training.certify as method

    caps, real = [], method.linprog

    def recorded(*args, **kwargs):
        caps.append(kwargs["options"]["maxiter"])
        return real(*args, **kwargs)

    monkeypatch.setattr(method, "FAMILY_ITERATIONS", 1)
    monkeypatch.setattr(method, "linprog", recorded)
    paired_kinks_reach_the_bounded_minimum()
    assert caps and set(caps) == {1}  # the family was searched, under the cap


def test_a_family_too_large_to_search_leaves_the_clarke_residual_to_the_bounded_solve(monkeypatch):
    """`paired_kinks` over 30 draws with `MAX_FAMILY` = 0: the family is never searched (in draw 24 it holds slopes
    in the box that the min-norm ones miss), and the Clarke residual is still the bounded minimum of the hand-built
    affine ∇𝓛_s (scipy's BVLS), to rounding, at slopes in the box."""
    import featurelab.training.certify as method

    def never(*args):
        raise AssertionError("the family was searched")

    monkeypatch.setattr(method, "MAX_FAMILY", 0)
    monkeypatch.setattr(method, "_least_outside", never)
    paired_kinks_reach_the_bounded_minimum()


def test_a_capped_bounded_slope_solve_still_bounds_the_clarke_residual_from_above(monkeypatch):
    """`paired_kinks` with the family search off and BVLS capped at one iteration (`BVLS_ITERATIONS`, the cap that
    bounds its cost on large kink sets; every call sees it): the slopes returned lie in the box, the δ reported is
    the gradient norm at the slopes reported (evaluated apart), and it is never below the exact bounded minimum
    (scipy's BVLS run to the end on the hand-built affine ∇𝓛_s); at the default cap the two agree to rounding."""
    import featurelab.training.certify as method

    caps, real = [], method.lsq_linear

    def recorded(*args, **kwargs):
        caps.append(kwargs.get("max_iter"))
        return real(*args, **kwargs)

    monkeypatch.setattr(method, "MAX_FAMILY", 0)
    monkeypatch.setattr(method, "lsq_linear", recorded)
    solved = 0
    for seed in range(30):
        net, X, Y, lam, problem, leaks, mask = paired_kinks(seed)
        expected = bvls_clarke(net, X.numpy(), Y.numpy(), lam, mask.numpy())
        for cap in (1, method.BVLS_ITERATIONS):
            monkeypatch.setattr(method, "BVLS_ITERATIONS", cap)
            caps.clear()
            m = multipliers(problem, problem.theta, [mask], leaks)
            delta, slopes = clarke_residual(problem, problem.theta, [mask], m)
            assert all(c is not None and c <= cap for c in caps), (seed, caps)
            solved += bool(caps)
            assert bool(((slopes >= 0) & (slopes <= 1)).all()), seed
            direct = _sloped_gradient_norm(problem, problem.theta, [mask], slopes) / m.penalty_norm
            assert delta == pytest.approx(direct, rel=1e-12, abs=1e-15), seed
            assert delta >= expected * (1 - 1e-10) - 1e-15, seed
            if cap > 1:
                assert delta == pytest.approx(expected, rel=1e-10, abs=1e-15), seed
    assert solved > 0  # the min-norm slopes leave the box on some draws, and the bounded solve runs there


def test_more_kinks_than_parameters_build_no_k_by_k_factor_beyond_the_family_bound(monkeypatch):
    """A width-2 net (P = 6 parameters) with all 40 first-layer inputs of 20 samples taken as kinks (K = 40 > P):
    the whole of null(J_0ᵀ) needs a K x K factor. Within `MAX_FAMILY` the SVD builds it; beyond, no factor larger
    than K x P is built (the bound that keeps a 55 000-kink set from taking 24 GB), and the Clarke residual is the
    same to rounding, since every member of the family leaves the same residual and the bounded solve finds it."""
    import featurelab.training.certify as method

    gen = torch.Generator().manual_seed(3)
    X, Y = torch.randn(20, 2, generator=gen, dtype=F64), torch.randn(20, 1, generator=gen, dtype=F64)
    net = MLP(2, 1, 2, 2, seed=3, dtype=F64)
    problem = _Problem(net, Dataset(X, Y, X[:0], Y[:0]), "mse", 0.05)
    _, leaks = activation_inputs(problem, problem.theta)
    mask = torch.ones(20, 2, dtype=torch.bool)
    P, K = problem.theta.numel(), 40
    assert P == 6
    svd, largest = torch.linalg.svd, []

    def recorded(*args, **kwargs):
        out = svd(*args, **kwargs)
        largest.append(max(t.numel() for t in out))
        return out

    monkeypatch.setattr(torch.linalg, "svd", recorded)
    deltas = []
    for bound in (10**6, K * K - 1):
        monkeypatch.setattr(method, "MAX_FAMILY", bound)
        largest.clear()
        m = multipliers(problem, problem.theta, [mask], leaks)
        deltas.append(clarke_residual(problem, problem.theta, [mask], m)[0])
        assert (max(largest) == K * K) == (bound >= K * K), bound
        assert max(largest) <= max(K * P, K * K if bound >= K * K else 0)
    assert deltas[1] == pytest.approx(deltas[0], rel=1e-9)


def test_held_neurons_that_can_escape_are_revived_one_saddle_at_a_time_down_to_a_strict_minimum():
    """The width-12 net above, whose first Clarke critical point is a saddle where held neurons can escape: with
    escapes allowed, `certify` leaves it along the held neuron's second-order direction and each later saddle in
    turn, so the saddles' losses fall strictly and the end point lies below them all. Checked apart from the
    certificate: no random direction lowers the loss there (a strict local minimum rises along every direction:
    off M at first order since every c_k > 0, on M at second order); the loss there is recomputed by hand."""
    data = bottleneck_teacher((4, 2, 4), hidden=8, n_train=32, n_test=8)
    X, Y = data.X_train.to(F64), data.Y_train.to(F64)

    def loss(net: MLP, shift: list[torch.Tensor] | None = None) -> float:
        with torch.no_grad():
            weights = [W + (0 if shift is None else d) for W, d in zip(net.weights, shift or net.weights)]
            H = torch.cat([X, torch.ones(len(X), 1, dtype=F64)], 1)
            Z = torch.relu(H @ weights[0].T)
            out = torch.cat([Z, torch.ones(len(Z), 1, dtype=F64)], 1) @ weights[1].T
            return float(((out - Y) ** 2).sum() / len(X) + 0.02 * sum((W**2).sum() for W in weights))

    net = trained(MLP(4, 4, 12, 2, bias=1.0, seed=0, dtype=F64), data, 0.02, steps=800, lr=1e-2)
    c = certify(net, data, "mse", 0.02).certificate
    saddles = c.detail["escaped_saddles"]
    assert c.certified and c.kind == "minimum" and c.detail["held_neurons"] == 0 and c.clarke <= 1e-12, c
    assert len(saddles) >= 1 and all(a > b for a, b in zip(saddles, [*saddles[1:], c.loss_after])), c.detail
    assert loss(net) == pytest.approx(c.loss_after, rel=1e-13, abs=0)
    gen = torch.Generator().manual_seed(0)
    scale = 1e-5 * float(torch.cat([W.flatten() for W in net.weights]).norm())
    for _ in range(200):
        d = [torch.randn(W.shape, generator=gen, dtype=F64) for W in net.weights]
        norm = float(torch.cat([x.flatten() for x in d]).norm())
        assert loss(net, [scale * x / norm for x in d]) > loss(net)


def test_a_held_neuron_before_a_kinked_layer_turns_those_kinks_on_one_side_only():
    """A zero neuron added to the first hidden layer of a certified depth-3 net whose second layer has kinks: its
    output t²·vσ(Xw) moves those kinked inputs off 0, where relu answers with slope 1 on the side v_j > 0 and slope
    0 on the other. The loss along (tw, tv) is then, at second order, λ(‖w‖² + ‖v‖²) + Σ_j v_j(D_±ᵀrelu(Xw))_j with
    D_up (slope 1 at the kinks) where v_j > 0 and D_down (slope 0) where v_j < 0. Checked apart from featurelab: that
    coefficient equals the loss's own second difference along random (w, v) (Richardson, t = 1e-3), a two-sided
    linear model does not, and a plain projected-gradient ascent of ‖e(w)‖ (e_j = max(relu(−(D_upᵀr)_j),
    relu((D_downᵀr)_j))) agrees with the lower bound the certificate reports."""
    lam = 0.02
    data = bottleneck_teacher((4, 2, 4), hidden=8, n_train=32, n_test=8)
    net = trained(MLP(4, 4, 8, 3, seed=1, dtype=F64), data, lam, steps=800, lr=1e-2)
    c = certify(net, data, "mse", lam).certificate
    assert c.certified and c.kind == "minimum" and c.detail["held_neurons"] == 0, c
    X, Y = data.X_train.to(F64), data.Y_train.to(F64)
    W1, W2, W3 = (W.detach() for W in net.weights)
    Z2 = torch.relu(X @ W1.T) @ W2.T
    kink = Z2.abs() <= 1e-10 * Z2.abs().max()
    assert int(kink.sum()) >= 1
    G = 2 * (torch.relu(Z2) @ W3.T - Y) / len(X) @ W3  # ∂C/∂relu(Z2)
    up, down = G * ((Z2 > 0) | kink), G * ((Z2 > 0) & ~kink)

    def loss(w: torch.Tensor, v: torch.Tensor, t: float) -> float:
        A, B = torch.cat([W1, t * w[None]]), torch.cat([W2, t * v[:, None]], 1)
        out = torch.relu(torch.relu(X @ A.T) @ B.T) @ W3.T
        return float(((out - Y) ** 2).sum() / len(X) + lam * ((A**2).sum() + (B**2).sum() + (W3**2).sum()))

    gen = torch.Generator().manual_seed(0)
    off = 0.0
    for _ in range(5):
        w, v = torch.randn(4, generator=gen, dtype=F64), torch.randn(8, generator=gen, dtype=F64)
        r = torch.relu(X @ w)
        model = float(lam * (w @ w + v @ v) + torch.where(v > 0, v * (up.T @ r), v * (down.T @ r)).sum())
        linear = float(lam * (w @ w + v @ v) + v @ (up.T @ r))
        here = loss(w, v, 0.0)
        second = [(loss(w, v, t) - here) / t**2 for t in (1e-3, 5e-4)]
        measured = (4 * second[1] - second[0]) / 3
        assert model == pytest.approx(measured, rel=1e-6)
        off = max(off, abs(linear - measured) / abs(measured))
    assert off > 0.1
    best = 0.0
    for _ in range(64):
        w = torch.randn(4, generator=gen, dtype=F64)
        for _ in range(300):
            w = (w / w.norm()).detach().requires_grad_()
            r = torch.relu(X @ w)
            value = torch.maximum(torch.relu(-(up.T @ r)), torch.relu(down.T @ r)).norm()
            (g,) = torch.autograd.grad(value, w)
            best, w = max(best, float(value.detach())), w.detach() + 0.1 * g
    big = MLP(4, 4, [9, 8], 3, dtype=F64)
    with torch.no_grad():
        for W in big.weights:
            W.zero_()
        big.weights[0][:8], big.weights[1][:, :8] = W1, W2
        big.weights[2].copy_(W3)
    a = certificate_at(big, data, "mse", lam).certificate
    assert a.detail["held_neurons"] == 1 and a.kinks == c.kinks and a.clarke <= 1e-12, a
    assert 0.99 * best <= a.detail["held_escape"] * 2 * lam <= 1.01 * best
    assert a.detail["held_escape"] <= a.detail["held_escape_bound"]
    if best > 2 * lam * 1.01:
        assert a.kind == "saddle" and a.detail["held_escape_falls"], a
