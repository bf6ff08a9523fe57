"""docs/theory/bottleneck-rank.md §5, checkable facts 1-6: the exact linear representation cost, its large-depth
expansion, the depth fit and pseudo-determinants (float64)."""

import math

import pytest
import torch

from featurelab import FeaturelabError
from featurelab.measurements import (
    balanced_factorization,
    estimate_representation_cost,
    linear_expansion,
    linear_representation_cost,
    log_pdet,
    pdet,
    pseudo_log,
)


def orthonormal(n, k, gen):
    q, _ = torch.linalg.qr(torch.randn(n, k, generator=gen, dtype=torch.float64))
    return q


def with_singular_values(s, m, n, gen):
    """An m x n matrix with the given nonzero singular values (rank len(s))."""
    k = len(s)
    return orthonormal(m, k, gen) @ torch.diag(torch.as_tensor(s, dtype=torch.float64)) @ orthonormal(n, k, gen).T


def uniform(gen, k, lo=0.3, hi=3.0):
    return (lo + (hi - lo) * torch.rand(k, generator=gen, dtype=torch.float64)).tolist()


def chain(Ws):
    P = Ws[0]
    for W in Ws[1:]:
        P = W @ P
    return P


# ---------------------------------------------------------------------------- fact 1
@pytest.mark.parametrize("L", [1, 2, 3, 7, 20])
def test_balanced_factorization_attains_linear_cost(gen, L):
    A = torch.randn(6, 3, generator=gen, dtype=torch.float64) @ torch.randn(3, 5, generator=gen, dtype=torch.float64)
    Ws = balanced_factorization(A, L)
    assert len(Ws) == L
    assert torch.allclose(chain(Ws), A, atol=1e-10, rtol=0)
    s = torch.linalg.svdvals(A)[:3]
    closed = L * float((s ** (2 / L)).sum())
    assert sum(float((W**2).sum()) for W in Ws) == pytest.approx(closed, rel=1e-9)
    assert linear_representation_cost(A, L) == pytest.approx(closed, rel=1e-9)


# ---------------------------------------------------------------------------- fact 2
def test_no_factorization_beats_the_linear_cost(gen):
    worst = math.inf
    for trial in range(40):
        L = 2 + trial % 5
        dims = [int(d) for d in torch.randint(2, 6, (L + 1,), generator=gen)]
        Ws = [torch.randn(dims[l + 1], dims[l], generator=gen, dtype=torch.float64) for l in range(L)]
        worst = min(worst, sum(float((W**2).sum()) for W in Ws) - linear_representation_cost(chain(Ws), L))
        # a balanced factorization moved along its symmetry orbit W_l -> G_l W_l G_{l-1}^{-1}
        A = chain(Ws)
        B = balanced_factorization(A, L)
        k = B[0].shape[0]
        Gs = [
            torch.eye(k, dtype=torch.float64) + 0.5 * torch.randn(k, k, generator=gen, dtype=torch.float64)
            for _ in range(L - 1)
        ]
        moved = [Gs[0] @ B[0]]
        moved += [torch.linalg.solve(Gs[l - 1].T, (Gs[l] @ B[l]).T).T for l in range(1, L - 1)]
        moved += [torch.linalg.solve(Gs[-1].T, B[-1].T).T]
        assert torch.allclose(chain(moved), A, atol=1e-8)
        worst = min(worst, sum(float((W**2).sum()) for W in moved) - linear_representation_cost(A, L))
    assert worst >= -1e-9


# ---------------------------------------------------------------------------- fact 3
def test_expansion_error_is_the_cubic_term(gen):
    L, checked, worst = 200, 0, 0.0
    while checked < 20:
        k = int(torch.randint(1, 5, (1,), generator=gen))
        s = uniform(gen, k)
        cube = sum(math.log(x) ** 3 for x in s)
        if abs(cube) <= 0.05:
            continue
        A = with_singular_values(s, 6, 5, gen)
        terms = linear_expansion(A)
        assert terms.rank == k
        assert terms.r3 == pytest.approx(4 / 3 * cube, rel=1e-9)
        remainder = L**2 * (linear_representation_cost(A, L) - terms.cost(L))
        worst = max(worst, abs(remainder / terms.r3 - 1))
        checked += 1
    assert worst < 0.05


def test_expansion_terms_match_pseudo_log(gen):
    A = with_singular_values([0.4, 1.7, 2.5], 5, 4, gen)
    terms = linear_expansion(A)
    assert terms.rank == 3
    assert terms.r1 == pytest.approx(2 * math.log(0.4 * 1.7 * 2.5), rel=1e-12)
    # R⁽²⁾ = ½‖Log_+ AᵀA‖²_F computed independently by an eigendecomposition
    assert terms.r2 == pytest.approx(0.5 * float((pseudo_log(A.T @ A) ** 2).sum()), rel=1e-9)


# ---------------------------------------------------------------------------- fact 4
@pytest.mark.parametrize(
    "depths, slope_tol, icpt_tol", [(range(10, 41, 5), 0.01, 0.1), (range(20, 201, 20), 1e-3, 0.02)]
)
def test_depth_fit_recovers_rank_and_log_pdet(gen, depths, slope_tol, icpt_tol):
    for _ in range(10):
        k = int(torch.randint(1, 5, (1,), generator=gen))
        A = with_singular_values(uniform(gen, k), 6, 6, gen)
        Ls = list(depths)
        fit = estimate_representation_cost(Ls, [linear_representation_cost(A, L) for L in Ls])
        assert fit.terms == 3
        assert abs(fit.R0 - k) < slope_tol
        assert abs(fit.R1 - 2 * log_pdet(A, rank=k)) < icpt_tol


def test_two_term_fit_is_biased_at_small_depth(gen):
    """The 3-term fit beats the 2-term one on L = 4..12 (docs/theory/bottleneck-rank.md §3.5)."""
    A = with_singular_values([0.3], 3, 3, gen)
    Ls = list(range(4, 13))
    norms = [linear_representation_cost(A, L) for L in Ls]
    two = estimate_representation_cost(Ls, norms, terms=2, rank=1)
    three = estimate_representation_cost(Ls, norms, rank=1)
    assert abs(three.R0 - 1) < abs(two.R0 - 1)
    assert abs(three.R1 - 2 * math.log(0.3)) < abs(two.R1 - 2 * math.log(0.3))
    # the robust intercept median(‖θ‖² − kL) is R⁽¹⁾ + R⁽²⁾/L at the median depth
    assert two.R1_given_rank == pytest.approx(
        2 * math.log(0.3) + 2 * math.log(0.3) ** 2 / 8 + 4 / 3 * math.log(0.3) ** 3 / 64, abs=0.05
    )


# ---------------------------------------------------------------------------- fact 5
def test_pseudo_determinant_identities(gen):
    rel = 1e-9
    A = with_singular_values(uniform(gen, 3), 6, 5, gen)
    U, V = orthonormal(6, 6, gen), orthonormal(5, 5, gen)
    pA = pdet(A, rank=3)
    assert pdet(A.T, rank=3) == pytest.approx(pA, rel=rel)
    assert pdet(U @ A @ V.T, rank=3) == pytest.approx(pA, rel=rel)
    assert pdet(-2.5 * A, rank=3) == pytest.approx(2.5**3 * pA, rel=rel)
    B = with_singular_values(uniform(gen, 2), 3, 4, gen)
    assert pdet(torch.block_diag(A, B), rank=5) == pytest.approx(pA * pdet(B, rank=2), rel=rel)
    S = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    assert pdet(S, rank=4) == pytest.approx(abs(float(torch.linalg.det(S))), rel=rel)
    C = torch.randn(7, 3, generator=gen, dtype=torch.float64)  # full column rank
    assert pdet(C, rank=3) == pytest.approx(math.sqrt(float(torch.linalg.det(C.T @ C))), rel=rel)
    D = torch.randn(3, 6, generator=gen, dtype=torch.float64)  # full row rank
    assert pdet(C @ D, rank=3) == pytest.approx(pdet(C, rank=3) * pdet(D, rank=3), rel=rel)
    # equal ranks: |AB|_+ <= |A|_+|B|_+
    for _ in range(20):
        P = with_singular_values(uniform(gen, 2), 5, 4, gen)
        Q = with_singular_values(uniform(gen, 2), 4, 6, gen)
        if torch.linalg.matrix_rank(P @ Q) == 2:
            assert pdet(P @ Q, rank=2) <= pdet(P, rank=2) * pdet(Q, rank=2) * (1 + rel)
        # ranks add: |P+R|_+ <= |P|_+|R|_+
        R = with_singular_values(uniform(gen, 2), 5, 4, gen)
        assert pdet(P + R, rank=4) <= pdet(P, rank=2) * pdet(R, rank=2) * (1 + rel)


# ---------------------------------------------------------------------------- fact 6
def test_subadditivity_of_linear_costs(gen):
    for _ in range(30):
        A = torch.randn(4, 5, generator=gen, dtype=torch.float64)
        B = torch.randn(5, 3, generator=gen, dtype=torch.float64)
        L1, L2 = (int(x) for x in torch.randint(1, 8, (2,), generator=gen))
        assert (
            linear_representation_cost(A @ B, L1 + L2)
            <= linear_representation_cost(A, L1) + linear_representation_cost(B, L2) + 1e-9
        )
        C = torch.randn(4, 5, generator=gen, dtype=torch.float64)
        L = int(torch.randint(2, 10, (1,), generator=gen))
        # ‖A+C‖_p^p <= ‖A‖_p^p + ‖C‖_p^p with p = 2/L, i.e. R(·;L)/L is sub-additive
        assert (
            linear_representation_cost(A + C, L)
            <= linear_representation_cost(A, L) + linear_representation_cost(C, L) + 1e-9
        )
        a = torch.diag(torch.tensor(uniform(gen, 3), dtype=torch.float64))
        b = torch.diag(torch.tensor(uniform(gen, 3), dtype=torch.float64))
        r2 = lambda M: linear_expansion(M).r2
        assert math.sqrt(r2(a @ b)) <= math.sqrt(r2(a)) + math.sqrt(r2(b)) + 1e-12


# ---------------------------------------------------------------------------- bad input
def test_bad_input_is_a_one_line_error():
    with pytest.raises(FeaturelabError, match="at least 2"):
        estimate_representation_cost([8, 8], [1.0, 2.0])
    with pytest.raises(FeaturelabError, match="NaN or inf"):
        estimate_representation_cost([4, 8], [1.0, float("nan")])
    with pytest.raises(FeaturelabError, match="one norm per depth"):
        estimate_representation_cost([4, 8, 12], [1.0, 2.0])
    with pytest.raises(FeaturelabError, match="terms=3"):
        estimate_representation_cost([4, 8], [1.0, 2.0], terms=3)
    with pytest.raises(FeaturelabError, match="no nonzero singular value"):
        log_pdet(torch.zeros(3, 2))
    with pytest.raises(FeaturelabError, match="rank=3"):
        log_pdet(torch.ones(3, 2), rank=3)
    with pytest.raises(FeaturelabError, match="L=0"):
        linear_representation_cost(torch.eye(2), 0)
    with pytest.raises(FeaturelabError, match="2-D"):
        balanced_factorization(torch.ones(3), 2)
