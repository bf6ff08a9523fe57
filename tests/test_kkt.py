"""The snap's KKT algebra on products of J_0 (`featurelab.training._kkt`): the products and the row norms against a
dense Jacobian, the LSQR solves against numpy's SVD-based least squares (a rank-deficient J_0 included), and
`certify` with the dense and the matrix-free solves reaching the same point."""

from __future__ import annotations

import numpy as np
import torch

from featurelab.data import bottleneck_teacher
from featurelab.models import MLP, LeakyResNet
from featurelab.training import Phase, TrainConfig, train
from featurelab.training._kkt import Linearised, Projector, row_norms
from featurelab.training.certify import Pieces, activation_inputs, certify
from featurelab.training.critical import _Problem

F64 = torch.float64


def leaky_problem() -> _Problem:
    data = bottleneck_teacher((5, 2, 5), hidden=8, n_train=24, n_test=4)
    return _Problem(LeakyResNet(5, 5, width=6, depth=4, effective_depth=2.0, seed=1, dtype=F64), data, "mse", 0.02)


def masks_of(problem: _Problem, share: float, fixed: bool = False) -> list[torch.Tensor]:
    """The `share` of the activation inputs nearest 0 (over all calls) as kink masks; those of the first call (the
    fixed input map's outputs, which no parameter moves: zero rows of J_0) only when `fixed`."""
    inputs, _ = activation_inputs(problem, problem.theta)
    cut = float(torch.cat([z.abs().reshape(-1) for z in inputs]).quantile(share))
    return [(z.abs() <= cut) & (fixed or i > 0) for i, z in enumerate(inputs)]


def linearised(problem: _Problem, masks) -> Linearised:
    K = sum(int(m.sum()) for m in masks)
    return Linearised(problem, problem.theta, masks, Pieces(masks=masks, slopes=torch.zeros(K, dtype=F64)))


def dense_jacobian(problem: _Problem, masks) -> np.ndarray:
    """∂a_K/∂θ by `torch.autograd.functional.jacobian` (reverse mode, row by row), independent of `Linearised`."""
    K = sum(int(m.sum()) for m in masks)

    def a_K(theta):
        mode = Pieces(masks=masks, slopes=torch.zeros(K, dtype=F64))
        saved, problem.mode = problem.mode, lambda: mode
        try:
            problem.parts(theta)
        finally:
            problem.mode = saved
        return torch.cat([z[m] for z, m in zip(mode.inputs, masks)])

    return torch.autograd.functional.jacobian(a_K, problem.theta.clone()).numpy()


def test_products_are_those_of_the_dense_jacobian():
    problem = leaky_problem()
    masks = masks_of(problem, 0.2)
    lin, J = linearised(problem, masks), dense_jacobian(problem, masks)
    gen = torch.Generator().manual_seed(0)
    v, mu = torch.randn(lin.P, generator=gen, dtype=F64), torch.randn(lin.K, generator=gen, dtype=F64)
    assert lin.K > 20 and J.shape == (lin.K, lin.P)
    np.testing.assert_allclose(lin.J(v).numpy(), J @ v.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(lin.Jt(mu).numpy(), J.T @ mu.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(lin.dense().numpy(), J, rtol=0, atol=1e-13)


def test_row_norms_are_estimated_within_a_preconditioners_need():
    problem = leaky_problem()
    masks = masks_of(problem, 0.2)
    lin, J = linearised(problem, masks), dense_jacobian(problem, masks)
    ratio = row_norms(lin).numpy() / np.linalg.norm(J, axis=1)
    assert 0.5 <= ratio.min() and ratio.max() <= 1.5, ratio


def test_solves_are_numpy_least_squares_at_full_rank():
    problem = leaky_problem()
    masks = masks_of(problem, 0.1)
    lin, J = linearised(problem, masks), dense_jacobian(problem, masks)
    free = Projector(lin)
    assert np.linalg.matrix_rank(J) == lin.K and free.rank == lin.K
    g0, a_K = lin.g0.numpy(), lin.a_K.numpy()
    nu, r = free.solve_multipliers()
    nu_np = np.linalg.lstsq(J.T, -g0, rcond=None)[0]
    np.testing.assert_allclose(nu.numpy(), nu_np, rtol=0, atol=1e-10 * np.abs(nu_np).max())
    np.testing.assert_allclose(r.numpy(), g0 + J.T @ nu_np, rtol=0, atol=1e-10 * np.abs(g0).max())
    restore = np.linalg.lstsq(J, -a_K, rcond=None)[0]
    np.testing.assert_allclose(free.restoration().numpy(), restore, rtol=0, atol=1e-10 * np.abs(restore).max())
    v = torch.randn(lin.P, generator=torch.Generator().manual_seed(1), dtype=F64)
    U = np.linalg.svd(J.T, full_matrices=False)[0]
    np.testing.assert_allclose(free.project(v).numpy(), v.numpy() - U @ (U.T @ v.numpy()), rtol=0, atol=1e-10)


def test_solves_on_a_rank_deficient_jacobian():
    """Kinks of the fixed input map (zero rows of J_0) and more kinks per unit than its layer has inputs: r and the
    projector are unique and agree with numpy's SVD to their sensitivity to rounding, κ²·1e-16 (κ: J_0's condition
    on its range); the restoration lies in range(J_0ᵀ) (min-norm) and solves the row-scaled normal equations
    ``J_0ᵀD⁻²(J_0d + a_K) = 0``; the rank is reported as not full."""
    problem = leaky_problem()
    masks = masks_of(problem, 0.5, fixed=True)
    lin, J = linearised(problem, masks), dense_jacobian(problem, masks)
    free = Projector(lin)
    U, sv, _ = np.linalg.svd(J.T, full_matrices=False)
    rank = int((sv > 1e-10 * sv[0]).sum())
    U, tol = U[:, :rank], 1e-16 * (sv[0] / sv[rank - 1]) ** 2
    assert rank < lin.K and free.rank == -1
    g0, a_K = lin.g0.numpy(), lin.a_K.numpy()
    _, r = free.solve_multipliers()
    np.testing.assert_allclose(r.numpy(), g0 - U @ (U.T @ g0), rtol=0, atol=tol * np.abs(g0).max())
    v = torch.randn(lin.P, generator=torch.Generator().manual_seed(1), dtype=F64)
    expected = v.numpy() - U @ (U.T @ v.numpy())
    np.testing.assert_allclose(free.project(v).numpy(), expected, rtol=0, atol=tol * float(v.norm()))
    d = free.restoration().numpy()
    D2 = 1 / free.scale.numpy() ** 2
    np.testing.assert_allclose(d - U @ (U.T @ d), 0, atol=tol * np.abs(d).max())
    normal = J.T @ (D2 * (J @ d + a_K))
    assert np.abs(normal).max() <= tol * np.abs(J.T @ (D2 * a_K)).max()


def small_mlp():
    data = bottleneck_teacher((4, 2, 4), hidden=8, n_train=32, n_test=8)
    net = MLP(4, 4, 6, 2, seed=0, dtype=F64)
    cfg = TrainConfig(lam=0.02, log_every=800, checkpoint_every=0, phases=[Phase(optimizer="adam", steps=800, lr=1e-2)])
    train(net, data, cfg, progress=False)
    return net, data


def test_certify_reaches_the_same_point_with_dense_and_matrix_free_solves(monkeypatch):
    import featurelab.training.certify as method

    net, data = small_mlp()
    dense, free = MLP(4, 4, 6, 2, dtype=F64), MLP(4, 4, 6, 2, dtype=F64)
    dense.load_state_dict(net.state_dict())
    free.load_state_dict(net.state_dict())
    a = certify(dense, data, "mse", 0.02)
    monkeypatch.setattr(method, "MAX_JACOBIAN_BYTES", 0)
    b = certify(free, data, "mse", 0.02)
    c, d = a.certificate, b.certificate
    assert c.certified and d.certified and c.kinks == d.kinks > 0, (c, d)
    assert d.clarke <= 1e-12 and d.jacobian_rank == d.kinks
    # the kind rests on the smallest reduced eigenvalue, a zero mode here (below): neither path may call it a saddle,
    # and which of "minimum" and "undecided" each reads depends on rounding at the 1e-10 threshold
    assert {c.kind, d.kind} <= {"minimum", "undecided"}
    assert all(torch.allclose(p, q, rtol=0, atol=1e-10) for p, q in zip(dense.parameters(), free.parameters()))
    assert torch.allclose(a.slopes, b.slopes, rtol=0, atol=1e-10)
    assert min(c.gap, d.gap) >= 1e10  # max |a| on K is at rounding level in both, so the gaps agree only roughly
    # the smallest reduced eigenvalue is a zero mode here (both ~1e-10..1e-9: Lanczos on a projection to 1e-10)
    assert c.min_reduced_eigenvalue is not None and d.min_reduced_eigenvalue is not None
    assert abs(d.min_reduced_eigenvalue - c.min_reduced_eigenvalue) <= 1e-8
