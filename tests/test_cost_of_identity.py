"""Part 1 §4 T5-T7: the cost of identity (Prop. 1-2) against closed forms and dense solves (float64,
rows are samples, so the papers' w×N matrix A is an N×w tensor here)."""

import pytest
import torch

import featurelab as fl
from featurelab.measurements.cost_of_identity import constant_coi_path, cost_of_identity, features, kernel_metric


def dense_coi(A, bias, gamma=0.0):
    """Tr[Aᵀ (K + γI)⁻¹ A] by a dense solve (K invertible or γ > 0)."""
    S = features(A, bias)
    K = S @ S.T + gamma * torch.eye(A.shape[0], dtype=A.dtype)
    return float((A * torch.linalg.solve(K, A)).sum())


def test_prop1_cost_of_identity_bounds_the_stable_ranks(gen):
    checked = 0
    for _ in range(300):
        scale = float(torch.exp(torch.randn(1, generator=gen, dtype=torch.float64)))
        shift = float(torch.randn(1, generator=gen, dtype=torch.float64))
        A = scale * torch.randn(10, 40, generator=gen, dtype=torch.float64) + shift  # N = 10, w = 40
        Kbar = features(A, False) @ features(A, False).T
        if not torch.linalg.cond(Kbar) <= 1e10:  # also skips the all-zero σ̄(A) (cond = nan)
            continue
        checked += 1
        coi = dense_coi(A, bias=False)
        assert fl.measurements.cost_of_identity(A, bias=False) == pytest.approx(coi, rel=1e-8)
        sr_nuc, sr_op = fl.measurements.nuclear_rank(A), fl.measurements.stable_rank(A)
        assert coi >= sr_nuc - 1e-9
        assert sr_op <= sr_nuc + 1e-12 and sr_nuc <= torch.linalg.matrix_rank(A) + 1e-12
    assert checked >= 200, checked


def test_stable_ranks_closed_forms():
    A = torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
    assert fl.measurements.stable_rank(A) == pytest.approx(14 / 9)
    assert fl.measurements.nuclear_rank(A) == pytest.approx(36 / 14)
    assert fl.measurements.effective_rank(A, rtol=0.5) == 2


def test_prop2_non_negative_low_rank_representation(gen):
    N, w, r = 15, 12, 4
    U = torch.rand(w, r, generator=gen, dtype=torch.float64)
    V = torch.rand(r, N, generator=gen, dtype=torch.float64)
    A = (U @ V).T  # rows are samples
    assert fl.measurements.cost_of_identity(A, bias=False) == pytest.approx(r, abs=1e-6)
    assert fl.measurements.cost_of_identity(A, bias=True) == pytest.approx(r, abs=1e-6)
    s = torch.linalg.svdvals(A)
    for gamma in (1e-3, 0.1, 10.0):
        closed = float((s**2 / (s**2 + gamma)).sum())
        assert fl.measurements.cost_of_identity(A, False, gamma, "absolute") == pytest.approx(closed, rel=1e-10)
    assert fl.measurements.cost_of_identity(A, True, 1e-10, "relative") == pytest.approx(r, abs=1e-3)


@pytest.mark.parametrize("c", [0.3, 1.0, 4.0])
def test_bias_path_constant_representation(c):
    A = torch.full((7, 1), c, dtype=torch.float64)
    assert fl.measurements.cost_of_identity(A) == pytest.approx(c**2 / (c**2 + 1), rel=1e-10)


def test_outside_the_image_is_infinite_and_projection_is_finite():
    A = torch.tensor([[-1.0, 0.0], [0.0, -2.0], [-1.0, -1.0], [0.5, -3.0]], dtype=torch.float64)
    assert fl.measurements.cost_of_identity(A, bias=False) == float("inf")
    S = features(A, False)
    Z = torch.linalg.pinv(S) @ A  # test-only reference for the projected value
    assert fl.measurements.cost_of_identity(A, bias=False, projected=True) == pytest.approx(
        float((Z**2).sum()), rel=1e-9
    )


def test_scale_invariance_and_monotonicity_in_gamma(gen):
    A = torch.randn(10, 25, generator=gen, dtype=torch.float64) + 0.3
    for c in (0.01, 7.0):
        assert fl.measurements.cost_of_identity(c * A, bias=False) == pytest.approx(
            fl.measurements.cost_of_identity(A, bias=False), rel=1e-10
        )
        assert fl.measurements.nuclear_rank(c * A) == pytest.approx(fl.measurements.nuclear_rank(A), rel=1e-10)
    gammas = (1e-8, 1e-4, 1e-2, 1.0, 100.0)
    # non-negative with N > w + 1: inside the image, σ(P) = [P, 1] has full column rank, so COI(P) = w
    P = torch.rand(30, 6, generator=gen, dtype=torch.float64)
    assert fl.measurements.cost_of_identity(P) == pytest.approx(6.0, rel=1e-8)
    values = [fl.measurements.cost_of_identity(P, True, g, "absolute") for g in gammas]
    assert all(a >= b for a, b in zip(values, values[1:])) and values[0] <= 6.0
    assert values[0] == pytest.approx(6.0, abs=1e-4)
    # Gaussian with N > w + 1: outside the image, COI = inf and COI_γ grows without bound as γ -> 0
    B = torch.randn(30, 6, generator=gen, dtype=torch.float64)
    assert fl.measurements.cost_of_identity(B) == float("inf")
    values = [fl.measurements.cost_of_identity(B, True, g, "absolute") for g in gammas]
    assert all(a >= b for a, b in zip(values, values[1:])) and values[0] > 1e6
    assert dense_coi(B, True, 0.01) == pytest.approx(
        fl.measurements.cost_of_identity(B, True, 0.01, "absolute"), rel=1e-9
    )


@pytest.mark.parametrize("N,w", [(40, 6), (9, 12)])
def test_woodbury_path_agrees_with_the_cholesky_path(gen, N, w):
    A = torch.randn(N, w, generator=gen, dtype=torch.float64) + 0.2
    M = torch.randn(N, 3 * w, generator=gen, dtype=torch.float64)
    for gamma in (1e-6, 1e-3, 1.0):
        chol = kernel_metric(A, True, gamma, "relative", "cholesky")
        wood = kernel_metric(A, True, gamma, "relative", "woodbury")
        assert chol.gamma == pytest.approx(wood.gamma, rel=1e-12)
        G = chol.whiten(M).T @ chol.whiten(M)
        torch.testing.assert_close(wood.whiten(M).T @ wood.whiten(M), G, rtol=1e-8, atol=1e-8 * float(G.abs().max()))
        assert wood.condition == pytest.approx(chol.condition, rel=1e-6)


@pytest.mark.parametrize("gamma", [0.0, 1e-3])
def test_the_pseudo_inverse_from_the_metric_svd_equals_lapack_gelsd(gen, gamma):
    """σ(A)⁺M from the thin SVD a metric holds (N > w+1) against LAPACK's gelsd on σ(A), rank-deficient σ(A)
    included (two equal columns, a ReLU column that is zero on every sample)."""
    A = torch.randn(30, 5, generator=gen, dtype=torch.float64)
    A[:, 1] = A[:, 0]
    A[:, 2] = -A[:, 2].abs()
    M = torch.randn(30, 7, generator=gen, dtype=torch.float64)
    metric = kernel_metric(A, True, gamma)
    assert isinstance(metric.factor, tuple) and metric.method == ("pinv" if gamma == 0 else "woodbury")
    lapack = torch.linalg.lstsq(features(A), M, rcond=1e-10, driver="gelsd").solution
    torch.testing.assert_close(metric.pinv(M), lapack, rtol=1e-10, atol=1e-12)
    D = torch.randn(30, 5, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(
        fl.measurements.lagrangian_weights(A, D, 2.0, metric=metric),
        (torch.linalg.pinv(features(A), rtol=1e-10) @ (2.0 * A + D)).T,
    )


def test_kernel_metric_jitter_and_conditioning(gen):
    A = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    metric = kernel_metric(A, True, 1e-3, "relative")
    assert metric.op_norm == pytest.approx(float(torch.linalg.matrix_norm(features(A), 2)) ** 2, rel=1e-10)
    assert metric.condition == pytest.approx((metric.op_norm + metric.gamma) / metric.gamma, rel=1e-8)
    assert metric.jitter == 0.0


def test_bad_inputs_name_the_argument():
    A = torch.randn(5, 3, dtype=torch.float64)
    for kw, word in [({"gamma": -1.0}, "gamma"), ({"gamma_mode": "log"}, "gamma_mode")]:
        with pytest.raises(fl.FeaturelabError, match=word):
            fl.measurements.cost_of_identity(A, **kw)
    with pytest.raises(fl.FeaturelabError, match="A"):
        fl.measurements.cost_of_identity(torch.full((3, 2), float("nan")))


def test_prop3_constant_coi_path(gen):
    """Jacot & Kaiser Prop. 3: with w > N(N+1) a path of constant COI reaches a representation with a zero neuron;
    checked against the kernels and the COI recomputed from each A_t."""
    N, w = 3, 20
    A = torch.randn(N, w, generator=gen, dtype=torch.float64)
    path, c = constant_coi_path(A, [0.0, 0.25, 0.5, 1.0])
    torch.testing.assert_close(path[0], A, rtol=0, atol=0)
    assert int((c > 0).sum()) <= N * (N + 1)
    assert int((path[-1].abs().sum(0) == 0).sum()) >= w - N * (N + 1)
    coi = cost_of_identity(A)
    for At in path:
        torch.testing.assert_close(At @ At.T, A @ A.T, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(torch.relu(At) @ torch.relu(At).T, torch.relu(A) @ torch.relu(A).T)
        assert cost_of_identity(At) == pytest.approx(coi, rel=1e-9)
        assert cost_of_identity(At, gamma=1e-3) == pytest.approx(cost_of_identity(A, gamma=1e-3), rel=1e-9)
    # the kernel pair is kept, so a representation that is not non-negative stays so (K ≠ K_σ)
    assert float(path[-1].clamp(max=0).abs().sum()) > 0
