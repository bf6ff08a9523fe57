"""Exact width reduction of trained networks (docs/theory/sparsity.md §5a-§5c, §3 Prop. 6-8; Jacot et al. 2022).

Rows are samples: X is ``N x d_in``; a hidden layer's representation ``Z_l`` is ``N x n_l``, so neuron i
is column i of ``Z_l`` (the papers' row i of ``Z_ℓ``) and its σ-vector ``σ(Z_l)[:, i]`` is the paper's ``a_i``.
Neuron i's incoming weights are row i of ``W_l`` (bias column included), its outgoing weights column i
of ``W_{l+1}``. Every function returns a new float64 `MLP` (the input is untouched) and a per-layer
report (a DataFrame). All need a positively homogeneous activation (leaky-ReLU family).
"""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd
import torch
from torch import nn

from ..checks import int_at_least, nonempty, positive, renamed
from ..errors import FeaturelabError
from ..models.convert import as_mlp
from ..models.mlp import MLP, mlp_with_weights
from .ranks import min_norm_lstsq
from .representations import RTOL, check_inputs, layers, row_basis

NULL_RTOL = 1e-10


def _output_error(model: MLP, X: torch.Tensor, weights: list[torch.Tensor], reference: torch.Tensor) -> float:
    """max |f'(X) - f(X)| / max |f(X)| over the training set."""
    out = layers(model, X, weights).pre[-1]
    return float((out - reference).abs().max() / reference.abs().max().clamp_min(1e-300))


def _sq_norm(weights: list[torch.Tensor]) -> float:
    return float(sum((W**2).sum() for W in weights))


def _replace_layer(weights, l: int, W_in: torch.Tensor, W_out: torch.Tensor, bias: bool):
    """Put new incoming weights of hidden layer l (rows) and outgoing weights (columns) into a copy."""
    new = list(weights)
    if W_in.shape[0] == 0:  # keep one zero neuron: a width-0 layer does not exist
        W_in = weights[l - 1].new_zeros(1, weights[l - 1].shape[1])
        W_out = weights[l].new_zeros(weights[l].shape[0], 1)
    bias_col = weights[l][:, -1:] if bias else weights[l][:, :0]
    new[l - 1] = W_in
    new[l] = torch.cat([W_out, bias_col], dim=1)
    return new


# ------------------------------------------------------------------------------ 5a: merge
@renamed(tol="atol")
def merge_aligned_neurons(model: MLP | nn.Sequential, X, *, atol: float = 1e-9) -> tuple[MLP, pd.DataFrame]:
    """Delete dead neurons and merge neurons with proportional σ-vectors (docs/theory/sparsity.md §5a).

    In each hidden layer (in order), neurons whose σ-vectors ``a_i = σ(Z_l)[:, i]`` have cosine >= 1 - atol
    with a group leader s are merged: ``c_i = ⟨a_i, s⟩/‖s‖²``, ``w = w_r/c_r`` with ``r = argmin ‖w_i‖/c_i``,
    ``u = Σ c_i v_i``, ``t = (‖u‖/‖w‖)^½``, new neuron ``(t w, u/t)``. Because σ is positively homogeneous the
    training outputs are unchanged when the σ-vectors are exactly proportional (atol = 1e-9, "exact mode");
    with atol = 1e-3 ("approximate mode") they change and the report says by how much. The parameter norm
    does not increase: ``2‖w‖‖u‖ <= Σ 2‖w_i‖‖v_i‖ <= Σ(‖w_i‖² + ‖v_i‖²)``.

    X: ``N x d_in`` training inputs. Returns the merged float64 `MLP` and a report with one row per hidden
    layer: width_before, dead, width_after, sq_norm (‖θ‖² after this layer), output_error (max|Δf|/max|f|).
    """
    model = as_mlp(model)
    X, _ = check_inputs(model, X, homogeneous=True)
    positive("atol", atol)
    lay = layers(model, X)
    W, ref = list(lay.weights), lay.pre[-1]
    rows = [
        {
            "layer": 0,
            "width_before": None,
            "dead": None,
            "width_after": None,
            "sq_norm": _sq_norm(W),
            "output_error": 0.0,
        }
    ]
    for l in range(1, model.depth):
        S = model.sigma(layers(model, X, W).pre[l - 1], l)
        norms = S.norm(dim=0)
        alive = torch.nonzero(norms > 0).flatten().tolist()
        unit = S / norms.clamp_min(1e-300)
        cos = unit.T @ unit
        left, W_in, W_out = set(alive), [], []
        for i in alive:
            if i not in left:
                continue
            group = [j for j in alive if j in left and cos[i, j] >= 1 - atol]
            left -= set(group)
            s = S[:, i]
            c = torch.stack([S[:, j] @ s for j in group]) / (s @ s)
            w_rows = W[l - 1][group]
            r = int(torch.argmin(w_rows.norm(dim=1) / c))
            w = w_rows[r] / c[r]
            u = W[l][:, group] @ c
            if u.norm() == 0:  # the group feeds nothing forward
                continue
            t = torch.sqrt(u.norm() / w.norm())
            W_in.append(t * w)
            W_out.append(u / t)
        n_out = W[l].shape[0]
        W = _replace_layer(
            W,
            l,
            torch.stack(W_in) if W_in else W[l - 1].new_zeros(0, W[l - 1].shape[1]),
            torch.stack(W_out, dim=1) if W_out else W[l].new_zeros(n_out, 0),
            model.bias > 0,
        )
        rows.append(
            {
                "layer": l,
                "width_before": S.shape[1],
                "dead": S.shape[1] - len(alive),
                "width_after": W[l - 1].shape[0],
                "sq_norm": _sq_norm(W),
                "output_error": _output_error(model, X, W, ref),
            }
        )
    return mlp_with_weights(model, W), pd.DataFrame(rows[1:])


# ------------------------------------------------------------------------- 5b: Carathéodory
def pair_factor(Z: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """A small matrix R with ``RᵀR = G = (ZᵀZ)^∘2 + (SᵀS)^∘2`` (n x n), hence ``null(R) = null([vec P_i])``.

    Z, S: ``N x n`` (neuron i is column i; ``P_i = (z_i z_iᵀ, s_i s_iᵀ)``, Part 3 §5b step 2). With thin QRs
    ``Z = Q_Z R_Z``, ``vec(z_i z_iᵀ) = (Q_Z ⊗ Q_Z)(r_i ⊗ r_i)`` and ``Q_Z ⊗ Q_Z`` is orthonormal, so the
    stacked symmetric Khatri-Rao rows of R_Z and R_S carry the same null space as the N(N+1) x n matrix
    ``[vec P_i]`` without squaring its singular values (G's eigenvalues would). Rows are reduced by a
    streamed QR, so memory stays O(n²) per block.
    """
    blocks = []
    for M in (Z, S):
        R = torch.linalg.qr(M, mode="r").R
        iu = torch.triu_indices(R.shape[0], R.shape[0], device=M.device)
        coef = torch.where(iu[0] == iu[1], 1.0, 2.0**0.5).to(device=M.device, dtype=torch.float64)
        blocks.append((iu, coef, R))
    acc = Z.new_zeros(0, Z.shape[1], dtype=torch.float64)
    step = max(1, 4 * Z.shape[1])
    for iu, coef, R in blocks:
        for k in range(0, iu.shape[1], step):
            i, j = iu[0, k : k + step], iu[1, k : k + step]
            rows = coef[k : k + step, None] * R[i] * R[j]
            acc = torch.linalg.qr(torch.cat([acc, rows]), mode="r").R
    return acc


def null_space(R: torch.Tensor, rtol: float = NULL_RTOL) -> tuple[torch.Tensor, int]:
    """Orthonormal basis (n x k) of ``{φ: ‖Rφ‖ <= rtol·‖R‖_op}`` and the numerical rank n - k."""
    _, s, Vh = torch.linalg.svd(R, full_matrices=True)
    rank = int((s > rtol * s[0]).sum()) if s.numel() and s[0] > 0 else 0
    return Vh[rank:].T, rank


def caratheodory_weights(null: torch.Tensor) -> torch.Tensor:
    """Carathéodory elimination (Part 3 §5b step 4): from a = 1, move along each null vector φ until one
    coordinate hits 0; returns a >= 0 with ``Σ (a_i - 1) P_i = 0`` and at most n - k nonzeros.

    φ is signed so that its pivot, the entry with the largest |φ_i|/a_i, is positive: the step
    t = min_{φ_i>0} a_i/φ_i is then at most a_pivot/|φ_pivot|, which keeps the error of an approximate
    null vector from being amplified (partial pivoting; the paper only asks for some positive entry).
    """
    a = null.new_ones(null.shape[0], dtype=torch.float64)
    Phi = null.clone()
    for j in range(Phi.shape[1]):
        phi = Phi[:, j]
        scale = phi.abs().max()
        if scale < 1e-12:
            continue
        pivot = int(torch.argmax(phi.abs() / a.clamp_min(1e-300)))
        if phi[pivot] < 0:  # step toward the pivot: t <= a_pivot/|φ_pivot|, so errors are not amplified
            phi = -phi
        pos = phi > 1e-12 * scale
        ratio = torch.full_like(a, float("inf"))
        ratio[pos] = a[pos] / phi[pos]
        i = int(torch.argmin(ratio))
        a = (a - ratio[i] * phi).clamp_min(0.0)
        a[i] = 0.0
        Phi[:, j + 1 :] -= torch.outer(phi / phi[i], Phi[i, j + 1 :])
        Phi[i, j + 1 :] = 0.0
    a[a <= 1e-13] = 0.0
    return a


def caratheodory_reduce(model: MLP | nn.Sequential, X, *, rtol: float = NULL_RTOL) -> tuple[MLP, pd.DataFrame]:
    """Exact width reduction keeping every hidden layer's covariance pair (docs/theory/sparsity.md §5b, Lemma 10).

    For each hidden layer l in order: drop dead neurons (zero σ-vector), find the null space of the
    pair vectors ``P_i = (z_i z_iᵀ, σ(z_i)σ(z_i)ᵀ)`` (`pair_factor`, singular values <= rtol·max), and run
    Carathéodory's elimination to weights a >= 0 with ``Σ a_i P_i = Σ P_i`` and at most rank <= N(N+1)
    nonzeros. The layer is rebuilt with ``z'_i = √a_i z_i``: ``W'_l = Z'_l (Z^σ_{l-1})⁺`` (min-norm rows) and
    ``W'_{l+1} = Z_{l+1} (Z'^σ_l)⁺`` (lstsq, rcond = 1e-10). Both Grams are kept, so the column space of
    ``[σ(Z'_l), β1]`` is unchanged and the training outputs are exact; the two rebuilt layers cost their
    old min-norm cost, so ``‖θ'‖² <= ‖θ‖²`` and the regularized loss does not increase. A layer with no
    dead neuron and no null vector is left untouched (a no-op when n_l <= rank).

    X: ``N x d_in`` training inputs. Returns the reduced float64 `MLP` and a report with one row per
    hidden layer: width_before, dead, rank (of the pair matrix, <= N(N+1)), width_after, gram_error
    (relative, of the alive neurons' K and of K^σ), sq_norm (‖θ‖² after this layer), output_error
    (max|Δf|/max|f| on X after this layer).
    """
    model = as_mlp(model)
    X, _ = check_inputs(model, X, homogeneous=True)
    nonempty("X", X)
    positive("rtol", rtol)
    lay = layers(model, X)
    W, ref = list(lay.weights), lay.pre[-1]
    rows = []
    for l in range(1, model.depth):
        cur = layers(model, X, W)
        Z, A_prev, Z_next = cur.pre[l - 1], cur.inputs[l - 1], cur.pre[l]
        S = model.sigma(Z, l)
        alive = torch.nonzero(S.norm(dim=0) > 0).flatten()
        Za, Sa = Z[:, alive], S[:, alive]
        null, rank = null_space(pair_factor(Za, Sa), rtol) if alive.numel() else (Z.new_zeros(0, 0), 0)
        row = {"layer": l, "width_before": Z.shape[1], "dead": Z.shape[1] - alive.numel(), "rank": rank}
        if alive.numel() == Z.shape[1] and null.shape[1] == 0:
            rows.append(
                row
                | {
                    "width_after": Z.shape[1],
                    "gram_error": 0.0,
                    "sq_norm": _sq_norm(W),
                    "output_error": _output_error(model, X, W, ref),
                }
            )
            continue
        a = caratheodory_weights(null) if null.shape[1] else Z.new_ones(alive.numel(), dtype=torch.float64)
        keep = torch.nonzero(a > 0).flatten()
        _, _, Q = row_basis(A_prev, RTOL)
        W_in = (W[l - 1][alive[keep]] @ Q @ Q.T) * a[keep].sqrt()[:, None]
        Zr = A_prev @ W_in.T
        Ar = model.with_bias(model.sigma(Zr, l))
        W_next = min_norm_lstsq(Ar, Z_next, RTOL).T
        n_keep = W_in.shape[0]
        if n_keep:
            W = list(W)
            W[l - 1], W[l] = W_in, W_next.contiguous()
        else:
            W = _replace_layer(W, l, W_in, Z_next.new_zeros(Z_next.shape[1], 0), model.bias > 0)
        K, Kr = Za @ Za.T, Zr @ Zr.T
        Ks, Ksr = Sa @ Sa.T, Ar[:, :n_keep] @ Ar[:, :n_keep].T
        gram = max(
            float((Kr - K).norm() / K.norm().clamp_min(1e-300)), float((Ksr - Ks).norm() / Ks.norm().clamp_min(1e-300))
        )
        rows.append(
            row
            | {
                "width_after": W[l - 1].shape[0],
                "gram_error": gram,
                "sq_norm": _sq_norm(W),
                "output_error": _output_error(model, X, W, ref),
            }
        )
    return mlp_with_weights(model, W), pd.DataFrame(rows)


# ------------------------------------------------------------------------ 5c: pattern merge
def pattern_merge(model: MLP | nn.Sequential, X) -> tuple[MLP, pd.DataFrame]:
    """Merge the neurons of a shallow ReLU net with scalar output that share their training activation
    pattern and the sign of their output weight (docs/theory/sparsity.md §5c, Prop. 15).

    With ``v = Σ |c_i| w_i`` over a group (w_i: incoming row incl. bias, c_i: output weight), the group acts
    on every training point as ``sign(c)·relu(vᵀx̃)``; the new neuron has incoming ``v/√‖v‖`` and outgoing
    ``sign(c)·√‖v‖``, whose norm ``2‖v‖ <= Σ 2|c_i|‖w_i‖`` does not exceed the group's. With scalar inputs
    there are at most 2N-1 patterns, so at most 4N-2 neurons remain. Needs depth 2, ReLU (leak 0) and
    d_out = 1. X: ``N x d_in``. Returns the merged float64 `MLP` and a one-row report.
    """
    model = as_mlp(model)
    X, _ = check_inputs(model, X, homogeneous=True)
    if model.depth != 2 or model.leak != 0.0 or model.dims[-1] != 1 or model.linear_tail:
        raise FeaturelabError(
            f"pattern_merge needs a depth-2 ReLU MLP with d_out=1, got dims={model.dims}, "
            f"leak={model.leak}, linear_tail={model.linear_tail}"
        )
    lay = layers(model, X)
    W1, W2 = lay.weights
    n = W1.shape[0]
    pattern, c = lay.pre[0] > 0, W2[0, :n]
    groups: dict[tuple, list[int]] = {}
    for i in range(n):
        if pattern[:, i].any() and c[i] != 0:
            groups.setdefault((bytes(pattern[:, i].cpu().numpy()), bool(c[i] > 0)), []).append(i)
    W_in, W_out = [], []
    for (_, positive_c), idx in groups.items():
        v = (c[idx].abs()[:, None] * W1[idx]).sum(0)
        root = v.norm().sqrt()
        W_in.append(v / root)
        W_out.append(root if positive_c else -root)
    W = _replace_layer(
        lay.weights,
        1,
        torch.stack(W_in) if W_in else W1.new_zeros(0, W1.shape[1]),
        torch.stack(W_out)[None, :] if W_out else W1.new_zeros(1, 0),
        model.bias > 0,
    )
    report = pd.DataFrame(
        [
            {
                "layer": 1,
                "width_before": n,
                "width_after": W[0].shape[0],
                "sq_norm_before": _sq_norm(lay.weights),
                "sq_norm": _sq_norm(W),
                "output_error": _output_error(model, X, W, lay.pre[-1]),
            }
        ]
    )
    return mlp_with_weights(model, W), report


# --------------------------------------------------------------------------------- padding
def pad_width(model: MLP, extra: int) -> MLP:
    """Append `extra` zero neurons to every hidden layer (Part 3 Prop. 6: wider nets can only do better);
    the zero neurons are dead, so outputs and ‖θ‖² are unchanged. Returns a float64 `MLP`."""
    int_at_least("extra", extra, 0)
    W = [w.detach().to(torch.float64) for w in model.weights]
    for l in range(1, model.depth):
        n_prev = W[l - 1].shape[1]
        W[l - 1] = torch.cat([W[l - 1], W[l - 1].new_zeros(extra, n_prev)])
        n = W[l - 1].shape[0] - extra
        W[l] = torch.cat([W[l][:, :n], W[l].new_zeros(W[l].shape[0], extra), W[l][:, n:]], dim=1)
    return mlp_with_weights(model, W)


def ray_share(Z: torch.Tensor, cosine: float) -> float:
    """Share of alive neurons whose nearest other alive neuron has cosine >= `cosine` (Part 3 §6 Fig. 1).

    Z: ``N x n`` pre-activations (neuron j is column j, the papers' row j). Alive: ‖relu(z_j)‖ > 1e-6 of the
    largest (the L2 penalty shrinks unused neurons toward 0, where their direction is meaningless).
    """
    alive = torch.relu(Z).norm(dim=0)
    keep = alive > 1e-6 * alive.max()
    U = Z[:, keep] / Z[:, keep].norm(dim=0)
    if U.shape[1] < 2:
        return 0.0
    C = U.T @ U
    C.fill_diagonal_(-2.0)
    return float((C.max(dim=1).values >= cosine).double().mean())


def class_separation(Z: torch.Tensor, labels: torch.Tensor) -> float:
    """Nearest-class-mean accuracy of the rows of Z (N x n) on their own labels."""
    classes = labels.unique()
    means = torch.stack([Z[labels == c].mean(0) for c in classes])
    return float((classes[torch.cdist(Z, means).argmin(1)] == labels).double().mean())


# ------------------------------------------------------------------------------- cp-rank
class CpRankBounds(NamedTuple):
    """Bounds on the cp-rank of a completely positive matrix (docs/theory/sparsity.md §4, Prop. 13-14).

    lower: max(rank, clique-cover bound); upper: columns of a verified factor (None without one).
    rank: numerical rank. edges: edges of the support graph. triangle_free: whether that graph has no triangle.
    exact: lower == upper (the cp-rank is then computed).
    """

    lower: int
    upper: int | None
    rank: int
    edges: int
    triangle_free: bool

    @property
    def exact(self) -> bool:
        return self.upper is not None and self.lower == self.upper


def cp_rank_bounds(A, factor=None, rtol: float = 1e-10) -> CpRankBounds:
    """Lower and upper bounds on cp-rank(A) = min{k : A = BBᵀ, B >= 0 with k columns} (Jacot et al. 2022, §4).

    Lower bound: cp-rank >= rank(A), and every term b bᵀ (b >= 0) of a factorization is supported on a clique
    of the support graph G(A) (edge ij where A_ij > 0, i != j), so cp-rank >= the number of cliques needed
    to cover every edge and every vertex with A_ii > 0. When G(A) is triangle-free its cliques are edges
    and single vertices, and that number is |E| plus the vertices with A_ii > 0 and no edge (Prop. 13's
    argument, exact). With triangles only the rank bound is used. Upper bound: the number of nonzero
    columns of `factor` (``N x k``), accepted only if it is entrywise >= 0 and ``factor factorᵀ = A`` to
    `rtol` relative. A: ``N x N`` symmetric, entrywise >= 0 (float64). Entries below rtol·max|A| count as 0.
    """
    A = torch.as_tensor(A, dtype=torch.float64).detach()
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise FeaturelabError(f"A has shape {tuple(A.shape)}; it must be a square N x N matrix")
    positive("rtol", rtol)
    scale = float(A.abs().max())
    if scale == 0:
        return CpRankBounds(0, 0 if factor is not None else None, 0, 0, True)
    if float((A - A.T).abs().max()) > rtol * scale or float(A.min()) < -rtol * scale:
        raise FeaturelabError("A is not allowed: a completely positive matrix is symmetric and entrywise >= 0")
    support = (A > rtol * scale).double()
    adj = support - torch.diag(support.diagonal())
    edges = int(adj.sum().item()) // 2
    triangle_free = bool(torch.trace(adj @ adj @ adj).abs() < 0.5)
    s = torch.linalg.eigvalsh(A).abs()
    rank = int((s > rtol * s.max()).sum())
    lower = rank
    if triangle_free:
        isolated = int(((support.diagonal() > 0) & (adj.sum(1) == 0)).sum())
        lower = max(lower, edges + isolated)
    upper = None
    if factor is not None:
        B = torch.as_tensor(factor, dtype=torch.float64).detach()
        if B.ndim != 2 or B.shape[0] != A.shape[0]:
            raise FeaturelabError(f"factor has shape {tuple(B.shape)}; it must be N x k with N = {A.shape[0]}")
        if float(B.min()) < 0 or float((B @ B.T - A).abs().max()) > rtol * scale:
            raise FeaturelabError("factor is not allowed: it must be entrywise >= 0 with factor·factorᵀ = A")
        upper = int((B.abs().amax(0) > 0).sum())
    return CpRankBounds(lower, upper, rank, edges, triangle_free)


def output_gram_root(Y) -> torch.Tensor:
    """M_Y = (Y Yᵀ)^{1/2} (``N x N``, float64; the papers' (YᵀY)^{1/2} with columns as samples), Prop. 14.

    For depth 2, ReLU, β = 0 and X = I_N, a representation-cost minimizer has K_1 = K^σ_1 = M_Y and R = 2 Tr M_Y
    once the width reaches cp-rank(M_Y); narrower nets cost more (docs/theory/sparsity.md §4, Prop. 14).
    """
    Y = torch.as_tensor(Y, dtype=torch.float64)
    evals, vecs = torch.linalg.eigh(Y @ Y.T)
    floor = evals.abs().max() * Y.shape[0] * torch.finfo(torch.float64).eps  # rounding, whose √ would be large
    return (vecs * torch.where(evals > floor, evals, 0).sqrt()) @ vecs.T
