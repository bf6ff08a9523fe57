"""The two tasks of docs/theory/bottleneck-rank.md §4 (Jacot, NeurIPS 2023): a BN-rank-2 synthetic regression
(§4a, Fig. 1) and symmetry learning from gradient-descent loss curves (§4b, Fig. 2).

Rows are samples everywhere. Each task is deterministic from its seeds and returns a float64 `Dataset`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..checks import as_matrix, int_at_least, non_negative, positive
from ..errors import FeaturelabError
from .dataset import Dataset


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _shallow_relu(rng: np.random.Generator, d_out: int, hidden: int):
    """z ↦ W2 ReLU(W1 z + b1) from R² (rows are samples): W1 ~ N(0,1), b1 ~ N(0,0.25), W2 ~ N(0,1/hidden)."""
    W1 = rng.normal(0.0, 1.0, size=(hidden, 2))
    b1 = rng.normal(0.0, 0.5, size=hidden)
    W2 = rng.normal(0.0, np.sqrt(1.0 / hidden), size=(d_out, hidden))
    return lambda z: np.maximum(z @ W1.T + b1, 0.0) @ W2.T


def _unit_mean_sq(A: np.ndarray) -> np.ndarray:
    A = A - A.mean(0)
    return A / np.sqrt((A**2).sum(1).mean())


def bn_rank_two_task(
    d: int = 10, n_train: int = 200, n_test: int = 200, hidden: int = 100, task_seed: int = 0, data_seed: int = 1
) -> Dataset:
    """The BN-rank-2 task of docs/theory/bottleneck-rank.md §4a: z ~ N(0, I₂), x = g(z), y = h(z), with g, h: R² → R^d
    random shallow ReLU nets (width `hidden`, first layer N(0,1), bias N(0,0.25), output N(0,1/hidden)).
    X and Y are centred and scaled to unit mean squared norm (statistics pooled over train and test).
    An injective g makes x ↦ y a BN-rank-2 function. Returns X_train, Y_train (n_train x d) and the test split.
    """
    int_at_least("d", d, 2)
    int_at_least("n_train", n_train, 1)
    int_at_least("n_test", n_test, 0)
    int_at_least("hidden", hidden, 1)
    trng = np.random.default_rng(task_seed)
    g, h = _shallow_relu(trng, d, hidden), _shallow_relu(trng, d, hidden)
    z = np.random.default_rng(data_seed).normal(size=(n_train + n_test, 2))
    X, Y = _unit_mean_sq(g(z)), _unit_mean_sq(h(z))
    return Dataset.split(
        X,
        Y,
        n_train,
        {
            "name": "bn_rank_two_task",
            "d": d,
            "hidden": hidden,
            "bottleneck_rank": 2,
            "task_seed": task_seed,
            "data_seed": data_seed,
        },
    )


# ------------------------------------------------------------------------------- §4b symmetry
def symmetry_gd(W0, u, E, eta: float, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient descent on C(w) = ‖wwᵀ − uuᵀ − E‖²_F (docs/theory/bottleneck-rank.md §4b): w ← w − 2η(R + Rᵀ)w with
    R = wwᵀ − uuᵀ − E, from each starting point.

    W0: ``N x d`` starting points (rows are samples); u: length-d unit vector; E: ``d x d`` symmetric.
    Returns (trajectories ``N x (T+1) x d``, costs ``N x (T+1)``), t = 0..T, float64.
    """
    W = as_matrix("W0", W0)
    u = torch.as_tensor(u, dtype=torch.float64).reshape(-1)
    E = as_matrix("E", E)
    if u.numel() != W.shape[1] or E.shape != (W.shape[1], W.shape[1]):
        raise FeaturelabError(
            f"W0 is N x {W.shape[1]}, so u must have length {W.shape[1]} and E be "
            f"{W.shape[1]} x {W.shape[1]}; got u of length {u.numel()} and E of shape {tuple(E.shape)}"
        )
    positive("eta", eta)
    int_at_least("T", T, 0)
    M = torch.outer(u, u) + E
    traj, costs = [W], []
    for t in range(T + 1):
        R = W[:, :, None] * W[:, None, :] - M  # N x d x d
        costs.append((R**2).sum((1, 2)))
        if t < T:
            W = W - 2 * eta * ((R + R.transpose(1, 2)) @ W[:, :, None])[:, :, 0]
            traj.append(W)
    return torch.stack(traj, 1), torch.stack(costs, 1)


def symmetry_summary(m, r, eta: float, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exact E = 0 recursion of Part 2 §4b for m = uᵀw and r = ‖w − mu‖:
    m ← m(1 − 4η(m² + r² − 1)), r ← r(1 − 4η(m² + r²)), C = (m² + r²)² − 2m² + 1.
    m, r: arrays of N starting values. Returns (m_t, r_t, C_t), each ``N x (T+1)``."""
    m = np.asarray(m, dtype=np.float64).ravel()
    r = np.asarray(r, dtype=np.float64).ravel()
    if m.shape != r.shape:
        raise FeaturelabError(f"m has {m.size} entries but r has {r.size}; give one (m, r) per sample")
    positive("eta", eta)
    int_at_least("T", T, 0)
    ms, rs = [m], [r]
    for _ in range(T):
        q = m**2 + r**2
        m, r = m * (1 - 4 * eta * (q - 1)), r * (1 - 4 * eta * q)
        ms.append(m)
        rs.append(r)
    M, Rr = np.stack(ms, 1), np.stack(rs, 1)
    return M, Rr, (M**2 + Rr**2) ** 2 - 2 * M**2 + 1


def symmetry_task(
    d: int = 10,
    T: int = 10,
    eta: float = 0.05,
    eps: float = 0.01,
    n_train: int = 512,
    n_test: int = 512,
    task_seed: int = 0,
    data_seed: int = 1,
) -> Dataset:
    """Symmetry learning (docs/theory/bottleneck-rank.md §4b, paper Sec. 5): input w₀ ∈ R^d, target the loss curve
    (C(w_1), ..., C(w_T)) of GD on C(w) = ‖wwᵀ − uuᵀ − E‖²_F, divided by its global std.

    u: a random unit vector (task_seed); E = eps·(G + Gᵀ)/√(2d), G iid N(0,1) (task_seed).
    w₀ = m₀u + r₀v, m₀ ~ U[−1.2, 1.2], r₀ ~ U[0.05, 1.2], v uniform on the unit sphere of u^⊥ (data_seed).
    For eps = 0 the target depends only on (|m₀|, r₀): BN-rank 2. X: ``N x d``, Y: ``N x T``.
    meta holds u, E and the target scale, so `symmetry_gd` can replay trajectories.
    """
    int_at_least("d", d, 2)
    int_at_least("T", T, 1)
    positive("eta", eta)
    non_negative("eps", eps)
    int_at_least("n_train", n_train, 1)
    int_at_least("n_test", n_test, 0)
    trng = np.random.default_rng(task_seed)
    u = trng.normal(size=d)
    u /= np.linalg.norm(u)
    G = trng.normal(size=(d, d))
    E = eps * (G + G.T) / np.sqrt(2 * d)
    drng = np.random.default_rng(data_seed)
    n = n_train + n_test
    m0 = drng.uniform(-1.2, 1.2, size=n)
    r0 = drng.uniform(0.05, 1.2, size=n)
    v = drng.normal(size=(n, d))
    v -= np.outer(v @ u, u)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    X = m0[:, None] * u + r0[:, None] * v
    _, C = symmetry_gd(_tensor(X), _tensor(u), _tensor(E), eta, T)
    Y = C[:, 1:].numpy()
    scale = float(Y.std())
    Y = Y / scale
    return Dataset.split(
        X,
        Y,
        n_train,
        {
            "name": "symmetry_task",
            "d": d,
            "T": T,
            "eta": eta,
            "eps": eps,
            "u": u.tolist(),
            "E": E.tolist(),
            "target_scale": scale,
            "task_seed": task_seed,
            "data_seed": data_seed,
        },
    )


# ------------------------------------------------------------- Theorem 3 items 1-3, Prop. 5 (r1-properties)
R1_TASKS = ("id-cp", "id-plane", "linear", "sum-f", "sum-g", "comp-g", "comp-f")


def cp_basis(d: int, k: int, seed: int = 0) -> np.ndarray:
    """A ``d x k`` orthonormal basis with non-negative entries and disjoint supports (docs/theory/bottleneck-rank.md
    §2.5): the coordinates are cut into k consecutive blocks of near-equal size, column i is supported on block i
    with entries U[0.2, 1] (seed), normalised. Every set in the cone it spans is completely positive."""
    int_at_least("k", k, 1)
    int_at_least("d", d, k)
    rng = np.random.default_rng(seed)
    V = np.zeros((d, k))
    for i, block in enumerate(np.array_split(np.arange(d), k)):
        V[block, i] = rng.uniform(0.2, 1.0, size=block.size)
    return V / np.linalg.norm(V, axis=0)


def _orthonormal(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    Q, R = np.linalg.qr(rng.normal(size=(d, k)))
    return Q * np.sign(np.diag(R))


def r1_task(
    name: str,
    d: int = 6,
    n_train: int = 128,
    n_test: int = 128,
    s: tuple[float, float] = (3.0, 1.5),
    inner: tuple[float, float] = (1.5, 2.0),
    radius: float = 2.0,
    task_seed: int = 0,
    data_seed: int = 1,
) -> Dataset:
    """One task of the `r1-properties` experiment (Jacot 2023, arXiv 2305.19008, Theorem 3 items 1-3 and
    Prop. 5; docs/theory/bottleneck-rank.md §2.5, §4c). d_in = d_out = d; rows are samples; float64.

    Ω: x = Vc with c ~ U[0, radius]² and V = `cp_basis(d, 2)` (a completely positive 2-planar set), one draw of c
    (data_seed) shared by every task, so that f, g, f∘g and f+g are compared on the same points. With
    U, U_B random orthonormal ``d x 2`` (task_seed), A = U diag(s) Vᵀ and B = U_B diag(inner) Vᵀ:

    - ``id-cp``: y = x on Ω (R⁽⁰⁾ = 2, R⁽¹⁾ = 0);
    - ``id-plane``: y = x on x = Pc', c' ~ U[−radius, radius]², P random orthonormal: planar, not CP (R⁽¹⁾ > 0);
    - ``linear``: y = Ax on Ω (R⁽¹⁾ = 2 log|A|_+ = 2 Σ log s_i); it is both f∘g and f+g below;
    - ``sum-f``, ``sum-g``: y = s_1 u_1 v_1ᵀx, y = s_2 u_2 v_2ᵀx on Ω (rank 1 each; their sum is ``linear``);
    - ``comp-g``: y = Bx on Ω; ``comp-f``: y = Cz on z ∈ B(Ω) with C = U diag(s/inner) U_Bᵀ (rank 2 each;
      C∘B = A is ``linear``).

    meta: "task", "rank" (R⁽⁰⁾), and for the linear tasks "A" (the map on the inputs, ``d x d``) and "basis"
    (``d x 2``, right singular vectors of A whose coordinates are >= 0 on the inputs), for `cp_linear_cost`.
    """
    if name not in R1_TASKS:
        raise FeaturelabError(f"task {name!r} does not exist; choose one of: {', '.join(R1_TASKS)}")
    int_at_least("d", d, 2)
    int_at_least("n_train", n_train, 1)
    int_at_least("n_test", n_test, 0)
    positive("radius", radius)
    if len(s) != 2 or len(inner) != 2 or min(*s, *inner) <= 0:
        raise FeaturelabError(f"s={s!r} and inner={inner!r} must be pairs of positive singular values")
    trng = np.random.default_rng(task_seed)
    V = cp_basis(d, 2, seed=task_seed)
    U, UB, P = _orthonormal(trng, d, 2), _orthonormal(trng, d, 2), _orthonormal(trng, d, 2)
    S, SB = np.diag(s), np.diag(inner)
    c = np.random.default_rng(data_seed).uniform(0.0, radius, size=(n_train + n_test, 2))
    X = c @ V.T
    rank, A, basis = 2, None, V
    if name == "id-cp":
        A = V @ V.T
    elif name == "id-plane":
        X, basis = (2 * c - radius) @ P.T, None
    elif name == "linear":
        A = U @ S @ V.T
    elif name in ("sum-f", "sum-g"):
        i = 0 if name == "sum-f" else 1
        A, rank = s[i] * np.outer(U[:, i], V[:, i]), 1
    elif name == "comp-g":
        A = UB @ SB @ V.T
    else:  # comp-f: on the image of comp-g
        X = X @ (UB @ SB @ V.T).T
        A, basis = U @ np.diag(np.asarray(s) / np.asarray(inner)) @ UB.T, UB
    Y = X if A is None else X @ A.T
    meta = {"name": "r1_task", "task": name, "d": d, "rank": rank, "s": list(s), "inner": list(inner), "radius": radius}
    meta |= {"task_seed": task_seed, "data_seed": data_seed}
    if A is not None and basis is not None:
        meta |= {"A": A.tolist(), "basis": basis.tolist()}
    return Dataset.split(X, Y, n_train, meta)
