"""Input Jacobians Jf(x) and the NTK trace Tr Θ(x, x) of a network.

docs/theory/bottleneck-rank.md §2.3-§2.4, §3.3, §3.8.

Rows are samples: inputs are ``N x d_in`` (or one sample, a 1-D tensor of length d_in). Everything is
computed in float64 on a float64 copy of the stored parameters, with `torch.func` (`jacrev`, `vmap`,
`functional_call`); the model itself is not modified.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call, jacrev, vmap

from ..checks import as_matrix, non_negative, renamed
from ..errors import FeaturelabError
from ..models.mlp import MLP
from ..runtime import float64_copy
from .ranks import numerical_rank

TRAIN_MODE_LAYERS = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._BatchNorm)


def _float64_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {k: v.detach().to(torch.float64) for k, v in model.named_parameters()}
    state.update({k: v.to(torch.float64) if v.is_floating_point() else v for k, v in model.named_buffers()})
    return state


def check_eval_mode(model: torch.nn.Module) -> None:
    """One-line error when a Dropout or BatchNorm layer is in train mode (random or batch-coupled outputs
    have no per-sample Jacobian): call ``model.eval()`` first."""
    for name, m in model.named_modules():
        if m.training and isinstance(m, TRAIN_MODE_LAYERS):
            raise FeaturelabError(
                f"layer {name!r} ({type(m).__name__}) is in train mode, where a per-sample Jacobian is not defined; "
                "call model.eval() first (featurelab.analyze does this on a copy)"
            )


def _inputs(x, model: torch.nn.Module) -> tuple[torch.Tensor, bool]:
    """x as float64 samples on the model's device (rows are samples: ``N x d_in``, or ``N x c x ...`` images
    for conv nets), and whether it was a single 1-D sample."""
    check_eval_mode(model)
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    single = isinstance(x, torch.Tensor) and x.ndim == 1
    if isinstance(x, torch.Tensor) and x.ndim > 2:
        X = x.to(torch.float64)
        if not torch.isfinite(X).all():
            raise FeaturelabError("x contains NaN or inf; all entries must be finite")
    else:
        X = as_matrix("x", x[None] if single else x)
        dims = getattr(model, "dims", None)
        d_in = dims[0] if dims is not None else getattr(model, "d_in", X.shape[1])
        if X.shape[1] != d_in:
            raise FeaturelabError(
                f"x has {X.shape[1]} columns but the model takes d_in={d_in} inputs (rows are samples)"
            )
    device = next(model.parameters()).device
    return X.to(device), single


def _per_sample(model: torch.nn.Module, state: dict, xi: torch.Tensor) -> torch.Tensor:
    """f(x_i) as a vector (length d_out): the model applied to a batch of one sample, flattened, so a
    scalar-output net (``N`` outputs for ``N`` samples) gives length 1."""
    out = functional_call(model, state, (xi[None],))
    if not isinstance(out, torch.Tensor):
        raise FeaturelabError(
            f"the model returned a {type(out).__name__}; Jacobians need one output tensor (wrap the model to return it)"
        )
    return out.reshape(-1)


def jacobian(model: torch.nn.Module, x) -> torch.Tensor:
    """Jf(x) = ∂f(x)/∂x for each sample (Part 2 §3.3), via `torch.func.jacrev` + `vmap`, float64.

    x: ``N x d_in`` (rows are samples) -> ``N x d_out x d_in``; a 1-D x (one sample) -> ``d_out x d_in``.
    Image inputs ``N x c x ...`` (conv nets) give ``N x d_out x (c·...)`` (the input flattened per sample).
    A scalar-output net (``f(X)`` of shape ``N`` or ``N x 1``) has d_out = 1.
    """
    X, single = _inputs(x, model)
    state = _float64_state(model)
    J = vmap(jacrev(lambda xi: _per_sample(model, state, xi)))(X)
    J = J.reshape(J.shape[0], J.shape[1], -1)
    return J[0] if single else J


@renamed(tol="rtol")
def jacobian_ranks(model: torch.nn.Module, x, *, rtol: float = 1e-3) -> torch.Tensor:
    """Numerical rank #{i: s_i(Jf(x)) > rtol·s_1} at each sample (Part 2 §3.2, relative for Jacobians).

    x: ``N x d_in`` (or ``N x c x ...`` images) -> int64 tensor of length N (a 1-D x -> a 0-d tensor); each
    rank is at most min(d_out, d_in). Rank_J(f; Ω) is its maximum.
    """
    non_negative("rtol", rtol)
    J = jacobian(model, x)
    ranks = [numerical_rank(Ji, rtol=rtol) for Ji in (J[None] if J.ndim == 2 else J)]
    out = torch.tensor(ranks, dtype=torch.int64, device=J.device)
    return out[0] if J.ndim == 2 else out


def ntk_trace(model: torch.nn.Module, x, include_frozen: bool = False) -> torch.Tensor:
    """Tr Θ(x, x) = Σ_o ‖∇_θ f_o(x)‖² for each sample (Part 2 §2.4, §3.8), by autograd over the
    parameters (`jacrev` of `functional_call`), float64. θ is the trainable parameters (requires_grad),
    biases included; ``include_frozen=True`` counts the frozen ones too, and so does a model with no trainable
    parameter at all (a frozen diagnostic copy, as `featurelab.runtime.float64_copy` makes).

    x: ``N x d_in`` (or ``N x c x ...`` images) -> length-N tensor; a 1-D x -> a 0-d tensor. Tr Θ / L = O(1)
    is the 'normal' scale; much larger values mean a narrow minimum. Cost: one reverse pass per output per
    sample, and d_out·P floats per sample (P parameters).
    """
    X, single = _inputs(x, model)
    state = _float64_state(model)
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    if include_frozen or not names:
        names = [k for k, _ in model.named_parameters()]
    params = {k: state[k] for k in names}
    rest = {k: v for k, v in state.items() if k not in params}

    def trace(xi):
        grads = jacrev(lambda p: _per_sample(model, {**p, **rest}, xi))(params)
        return torch.stack([(g**2).sum() for g in grads.values()]).sum()

    t = vmap(trace)(X)
    return t[0] if single else t


def ntk_trace_closed_form(model, x) -> torch.Tensor:
    """Tr Θ(x, x) = Σ_ℓ (‖α_{ℓ-1}(x)‖² + β²)·‖∂f(x)/∂α̃_ℓ‖²_F for an `MLP` (Part 2 §2.4; β = the bias
    amount, so +1 for the usual W α + b and +0 bias-free). The backward factors are built explicitly:
    ∂f/∂α̃_L = I, ∂f/∂α̃_ℓ = ∂f/∂α̃_{ℓ+1} W_{ℓ+1} diag(σ'(α̃_ℓ)) with σ'_a(z) = 1 (z > 0), a (z <= 0).

    x: ``N x d_in`` -> length-N tensor (a 1-D x -> 0-d). An independent cross-check of `ntk_trace`.
    """
    if not isinstance(model, MLP):
        raise FeaturelabError(f"ntk_trace_closed_form needs a featurelab MLP, got {type(model).__name__}")
    X, single = _inputs(x, model)
    net = float64_copy(model).to(X.device)
    Ws = net.weight_matrices()
    fwd = net(X, return_layers=True)
    pre, act = fwd.pre, fwd.act
    L = model.depth
    d_out = Ws[-1].shape[0]
    G = torch.eye(d_out, dtype=torch.float64, device=X.device).expand(X.shape[0], d_out, d_out)  # ∂f/∂α̃_L
    total = ((act[L - 1] ** 2).sum(1) + net.bias**2) * (G**2).sum((1, 2))
    for l in range(L - 1, 0, -1):  # hidden layer l: ∂f/∂α̃_l = ∂f/∂α̃_{l+1} W_{l+1} diag(σ'(α̃_l))
        z = pre[l - 1]
        if model.activation == "tanh" and l <= L - model.linear_tail:
            slope = 1 - torch.tanh(z) ** 2
        elif l > L - model.linear_tail:
            slope = torch.ones_like(z)
        else:
            slope = torch.where(z > 0, torch.ones_like(z), torch.full_like(z, model.leak))
        G = (G @ Ws[l]) * slope[:, None, :]
        total = total + ((act[l - 1] ** 2).sum(1) + net.bias**2) * (G**2).sum((1, 2))
    return total[0] if single else total
