"""The stacked MLP's one-node forward with its hand-written backward (`featurelab.training._kernels.mlp`), as the
training core calls it (`_kernels.forward`), against plain autograd of a straightforward per-member reference:
outputs and gradients with respect to every stacked weight and the input, float64, to 1e-12."""

import pytest
import torch
from torch.func import functional_call

from featurelab.models import MLP
from featurelab.training import _kernels, data_cost


class _Core(torch.nn.Module):
    """`model`'s forward as the training core takes it (`_kernels.forward`: the kernel where it applies)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return _kernels.forward(self.model, X)


def through_kernels(model: MLP, weights: dict[str, torch.Tensor], X: torch.Tensor) -> torch.Tensor:
    """`_kernels.forward` of `model` holding `weights` (by parameter name, e.g. stacked ``M x ...``)."""
    return functional_call(_Core(model), {f"model.{k}": v for k, v in weights.items()}, (X,))


def reference(Ws: list[torch.Tensor], X: torch.Tensor, beta: float, slopes: list[float]) -> torch.Tensor:
    """``M x N x d_out``: member by member, layer by layer, ``z = [a, β·1] @ W[i]ᵀ``, then
    ``where(z > 0, z, s·z)`` with the hidden layer's slope s (1 inside a linear tail)."""
    outs = []
    for i in range(Ws[0].shape[0]):
        a = X[i] if X.dim() == 3 else X
        for l, W in enumerate(Ws):
            if beta > 0:
                a = torch.cat([a, torch.full((a.shape[0], 1), beta, dtype=a.dtype)], 1)
            a = a @ W[i].T
            if l < len(Ws) - 1:
                a = torch.where(a > 0, a, slopes[l] * a)
        outs.append(a)
    return torch.stack(outs)


def reference_cost(objective: str, out: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``(M,)``: (1/N)‖Y - f‖²_F, or the mean of -log softmax(f)_y."""
    if objective == "mse":
        return ((out - Y) ** 2).sum((1, 2)) / out.shape[1]
    logp = out - out.logsumexp(-1, keepdim=True)
    return -logp.gather(-1, Y.expand(out.shape[0], -1)[..., None]).squeeze(-1).mean(1)


def weights_and_data(M: int, beta: float, per_member: bool, objective: str, seed: int):
    """Stacked ``M x n_l x (n_{l-1}+1)`` weights (dims 5 -> 7 -> 4 -> 3), inputs with an all-zero row (so
    bias-free first layers hit σ's kink at 0 exactly), and targets."""
    gen = torch.Generator().manual_seed(seed)
    dims, extra = [5, 7, 4, 3], int(beta > 0)
    Ws = [torch.randn(M, o, i + extra, generator=gen, dtype=torch.float64) for i, o in zip(dims, dims[1:])]
    X = torch.randn(*((M,) if per_member else ()), 9, 5, generator=gen, dtype=torch.float64)
    X[..., 0, :] = 0.0
    if objective == "mse":
        Y = torch.randn(9, 3, generator=gen, dtype=torch.float64)
    else:
        Y = torch.randint(0, 3, (9,), generator=gen)
    return Ws, X, Y


@pytest.mark.parametrize("objective", ["mse", "cross_entropy"])
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("beta", [0.0, 0.7])
@pytest.mark.parametrize("leak", [0.0, 0.2, -0.4])
@pytest.mark.parametrize("linear_tail", [0, 2])
@pytest.mark.parametrize("per_member", [False, True])
def test_fused_forward_and_gradients_match_plain_autograd(objective, M, beta, leak, linear_tail, per_member):
    model = MLP(5, 3, [7, 4], 3, leak=leak, bias=beta, linear_tail=linear_tail, dtype=torch.float64)
    Ws, X, Y = weights_and_data(M, beta, per_member, objective, seed=M + 10 * linear_tail)
    slopes = [leak if l <= 3 - linear_tail else 1.0 for l in (1, 2)]  # σ after hidden layer l

    leaves = [W.clone().requires_grad_() for W in Ws]
    Xf = X.clone().requires_grad_()
    out = through_kernels(model, {f"weights.{l}": W for l, W in enumerate(leaves)}, Xf)
    assert type(out.grad_fn).__name__ == "StackedForwardBackward"  # the one-node path was taken
    probe = torch.linspace(0.5, 1.5, M, dtype=torch.float64)  # members weighted apart
    (probe * data_cost(objective, out, Y)).sum().backward()

    ref_leaves = [W.clone().requires_grad_() for W in Ws]
    Xr = X.clone().requires_grad_()
    ref = reference(ref_leaves, Xr, beta, slopes)
    (probe * reference_cost(objective, ref, Y)).sum().backward()

    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for W, Wr in zip(leaves, ref_leaves):
        assert W.grad is not None and Wr.grad is not None
        torch.testing.assert_close(W.grad, Wr.grad, rtol=0, atol=1e-12)
    assert Xf.grad is not None and Xr.grad is not None
    torch.testing.assert_close(Xf.grad, Xr.grad, rtol=0, atol=1e-12)
    if beta == 0 and leak != 0:  # the zero row sits on the kink: σ'(0) = a, as in the reference
        assert Xr.grad[..., 0, :].abs().max() > 0


@pytest.mark.parametrize("depth", [1, 2])
def test_shallow_stacks_match_plain_autograd(depth):
    """Depth 1 (the shared-input product is also the output) and depth 2, with the bias column."""
    model = MLP(5, 3, 6, depth, leak=0.1, bias=1.0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(depth)
    Ws = [torch.randn(2, *W.shape, generator=gen, dtype=torch.float64) for W in model.weights]
    X = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    G = torch.randn(2, 8, 3, generator=gen, dtype=torch.float64)
    fused = [W.clone().requires_grad_() for W in Ws]
    out = through_kernels(model, {f"weights.{l}": W for l, W in enumerate(fused)}, X)
    assert type(out.grad_fn).__name__ == "StackedForwardBackward"
    (out * G).sum().backward()
    plain = [W.clone().requires_grad_() for W in Ws]
    ref = reference(plain, X, 1.0, [0.1] * (depth - 1))
    (ref * G).sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for W, Wr in zip(fused, plain):
        torch.testing.assert_close(W.grad, Wr.grad, rtol=0, atol=1e-12)


def test_float32_matches_float64_to_float32_rounding():
    model = MLP(5, 3, [7, 4], 3, bias=1.0)
    Ws, X, Y = weights_and_data(3, 1.0, False, "cross_entropy", seed=0)
    fused = [W.float().requires_grad_() for W in Ws]
    out = through_kernels(model, {f"weights.{l}": W for l, W in enumerate(fused)}, X.float())
    assert out.dtype == torch.float32 and type(out.grad_fn).__name__ == "StackedForwardBackward"
    data_cost("cross_entropy", out, Y).sum().backward()
    plain = [W.clone().requires_grad_() for W in Ws]
    reference_cost("cross_entropy", reference(plain, X, 1.0, [0.0, 0.0]), Y).sum().backward()
    for W, Wr in zip(fused, plain):
        assert W.grad is not None and Wr.grad is not None
        torch.testing.assert_close(W.grad.double(), Wr.grad, rtol=1e-4, atol=1e-5)


def test_unusual_calls_take_the_plain_path_and_a_double_backward_raises():
    """No gradient, tanh, one member's own 2-d weights and torch.func transforms run the plain forward (the model
    called itself always does);
    the one-node backward is first order only, so a second derivative raises instead of being wrong."""
    Ws, X, _ = weights_and_data(2, 1.0, False, "mse", seed=1)
    stacked = {f"weights.{l}": W.clone().requires_grad_() for l, W in enumerate(Ws)}
    model = MLP(5, 3, [7, 4], 3, bias=1.0, dtype=torch.float64)
    with torch.no_grad():
        assert through_kernels(model, stacked, X).grad_fn is None
    tanh = MLP(5, 3, [7, 4], 3, bias=1.0, activation="tanh", dtype=torch.float64)
    assert type(through_kernels(tanh, stacked, X).grad_fn).__name__ != "StackedForwardBackward"
    assert type(functional_call(model, stacked, (X,)).grad_fn).__name__ != "StackedForwardBackward"  # the formula
    assert type(model(X).grad_fn).__name__ == "AddmmBackward0"

    def one(W0, W1, W2):
        return functional_call(model, {"weights.0": W0, "weights.1": W1, "weights.2": W2}, (X,)).sum()

    per_member = torch.func.vmap(torch.func.grad(one, argnums=(0, 1, 2)))(*[W[:, None] for W in Ws])  # 1 x ...
    fused = torch.autograd.grad(through_kernels(model, stacked, X).sum(), list(stacked.values()))
    for g_vmapped, g in zip(per_member, fused):
        torch.testing.assert_close(g_vmapped[:, 0], g, rtol=0, atol=1e-12)

    out = through_kernels(model, stacked, X)
    (g,) = torch.autograd.grad(out.pow(2).sum(), stacked["weights.1"], create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()
