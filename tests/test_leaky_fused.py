"""The Leaky ResNet's residual steps as one autograd node (`featurelab.training._kernels.leaky_resnet.ResidualSteps`),
as the training core calls it (`_kernels.forward`), against plain autograd of the model's formula
(`LeakyResNet.representations`): outputs, gradients and Hessian-vector products, float64, one net and stacked
members."""

import pytest
import torch
from torch.func import functional_call

from featurelab.models import LeakyResNet
from featurelab.training import _kernels
from featurelab.training._kernels import leaky_resnet as kernel

D_IN, D_OUT, WIDTH, DEPTH, N = 3, 2, 5, 4, 7
MEMBER_DEPTHS = [2.0, 3.0, 1.5]  # L̃ per member where they differ


class _Core(torch.nn.Module):
    """`model`'s forward as the training core takes it (`_kernels.forward`), or (`plain`) its formula."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, X: torch.Tensor, plain: bool = False) -> torch.Tensor:
        return self.model(X, return_layers=True).output if plain else _kernels.forward(self.model, X)


def call(model, state: dict[str, torch.Tensor], X: torch.Tensor, plain: bool = False) -> torch.Tensor:
    """Ŷ of `model` holding the tensors `state` (by name): through `_kernels.forward`, or (`plain`) the formula."""
    return functional_call(_Core(model), {f"model.{k}": v for k, v in state.items()}, (X,), {"plain": plain})


def fused_nodes(out: torch.Tensor) -> int:
    """How many `ResidualSteps` nodes the graph behind `out` holds."""
    seen, todo, count = set(), [out.grad_fn], 0
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__ == "ResidualStepsBackward"
        todo.extend(f for f, _ in node.next_functions)
    return count


def network(M: int | None, io: str, steps: str, differ: str, seed: int):
    """A float64 net (effective depth 2) and the tensors to call it with: one net (`M` None) or M stacked
    members, whose ρ (``differ`` "rho" or "both") and L̃ ("depth" or "both") differ or not; inputs whose
    first row is 0, so every unit of A_0's first row sits at ReLU's kink."""
    gen = torch.Generator().manual_seed(seed)
    nets = [
        LeakyResNet(D_IN, D_OUT, WIDTH, DEPTH, 2.0, steps=steps, io=io, seed=seed + i, dtype=torch.float64)
        for i in range(M or 1)
    ]
    model = nets[0]
    state = {
        k: torch.stack([dict(n.named_buffers(), **dict(n.named_parameters()))[k].detach() for n in nets])
        for k in ("W", "rho", "U_in", "V_out")
    }
    state["W"] = state["W"] + 0.3 * torch.randn(state["W"].shape, generator=gen, dtype=torch.float64)
    if differ in ("rho", "both"):
        rho = state["rho"] * (1 + 0.4 * torch.rand(state["rho"].shape, generator=gen, dtype=torch.float64))
        state["rho"] = rho / rho.sum(-1, keepdim=True)
    if differ in ("depth", "both"):
        model.effective_depth = torch.tensor(MEMBER_DEPTHS, dtype=torch.float64)
    if M is None:
        state = {k: v[0] for k, v in state.items()}
    X = torch.randn(N, D_IN, generator=gen, dtype=torch.float64)
    X[0] = 0.0
    return model, state, X


def outputs_and_gradients(model, state, X, G, plain: bool, x_grad: bool, w_grad: bool = True):
    """Ŷ and the gradients of ``⟨G, Ŷ⟩`` with respect to X (when `x_grad`), W (when `w_grad`) and the
    learned io maps, by the fused forward or (`plain`) by ``return_layers=True``'s plain path."""
    learned = {"W"} if w_grad else set()
    learned |= {"U_in", "V_out"} if model.io == "learned" else set()
    leaves = {k: v.clone().requires_grad_(k in learned) for k, v in state.items()}
    Xl = X.clone().requires_grad_(x_grad)
    out = call(model, leaves, Xl, plain)
    assert fused_nodes(out) == (0 if plain else 1)
    wanted = {k: v for k, v in {**leaves, "X": Xl}.items() if v.requires_grad}
    grads = torch.autograd.grad((out * G).sum(), list(wanted.values()))
    return out, dict(zip(wanted, grads))


def assert_same(fused, plain, atol=1e-12):
    (out, grads), (ref, ref_grads) = fused, plain
    torch.testing.assert_close(out, ref, rtol=0, atol=atol)
    assert grads.keys() == ref_grads.keys()
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=0, atol=atol, msg=k)


@pytest.mark.parametrize("M", [None, 3])
@pytest.mark.parametrize("io", ["fixed", "learned"])
@pytest.mark.parametrize("steps", ["equidistant", "irregular"])
@pytest.mark.parametrize("x_grad", [False, True])
def test_outputs_and_gradients_match_the_plain_path(M, io, steps, x_grad):
    model, state, X = network(M, io, steps, "same", seed=1)
    G = torch.randn(*((M,) if M else ()), N, D_OUT, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    fused = outputs_and_gradients(model, state, X, G, plain=False, x_grad=x_grad)
    plain = outputs_and_gradients(model, state, X, G, plain=True, x_grad=x_grad)
    assert_same(fused, plain)
    if x_grad:  # X's first row puts A_0's first row at ReLU's kink: ReLU'(0) = 0 there, as in torch
        gX = fused[1]["X"]
        assert gX[..., 0, :].abs().max() > 0


@pytest.mark.parametrize("differ", ["same", "rho", "depth", "both"])
@pytest.mark.parametrize("io", ["fixed", "learned"])
def test_stacked_members_with_their_own_steps_and_depths(differ, io):
    model, state, X = network(3, io, "irregular", differ, seed=2)
    X = torch.stack([X, 2 * X, -X])  # the members' own inputs
    G = torch.randn(3, N, D_OUT, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    fused = outputs_and_gradients(model, state, X, G, plain=False, x_grad=True)
    plain = outputs_and_gradients(model, state, X, G, plain=True, x_grad=True)
    assert_same(fused, plain)


def test_inputs_alone_need_a_gradient():
    """W constant, X a leaf: ∂/∂X through every step, no weight gradient."""
    model, state, X = network(None, "fixed", "equidistant", "same", seed=3)
    G = torch.randn(N, D_OUT, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    fused = outputs_and_gradients(model, state, X, G, plain=False, x_grad=True, w_grad=False)
    plain = outputs_and_gradients(model, state, X, G, plain=True, x_grad=True, w_grad=False)
    assert list(fused[1]) == ["X"]
    assert_same(fused, plain)


@pytest.mark.parametrize("M", [None, 3])
def test_hessian_vector_products_match_the_plain_path(M):
    """``H v`` of ``C = ‖Ŷ − Y‖²/N`` in (W, U_in, V_out) by double backward, as the float64 polish takes it:
    the fused node's backward under ``create_graph`` against the plain path's."""
    differ = "both" if M else "same"
    model, state, X = network(M, "learned", "irregular", differ, seed=4)
    gen = torch.Generator().manual_seed(8)
    Y = torch.randn(N, D_OUT, generator=gen, dtype=torch.float64)
    names = ("W", "U_in", "V_out")
    v = [torch.randn(state[k].shape, generator=gen, dtype=torch.float64) for k in names]

    def hvp(plain: bool) -> list[torch.Tensor]:
        leaves = {k: t.clone().requires_grad_(k in names) for k, t in state.items()}
        out = call(model, leaves, X, plain)
        assert fused_nodes(out) == (0 if plain else 1)
        cost = ((out - Y) ** 2).sum() / N
        grads = torch.autograd.grad(cost, [leaves[k] for k in names], create_graph=True)
        dot = torch.stack([(g * u).sum() for g, u in zip(grads, v)]).sum()
        return list(torch.autograd.grad(dot, [leaves[k] for k in names]))

    for k, hv, ref in zip(names, hvp(False), hvp(True)):
        assert ref.abs().max() > 1e-3
        torch.testing.assert_close(hv, ref, rtol=0, atol=1e-10, msg=k)


def test_float32_matches_float64_to_float32_rounding():
    model, state, X = network(None, "fixed", "irregular", "same", seed=5)
    G = torch.randn(N, D_OUT, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    ref, ref_grads = outputs_and_gradients(model, state, X, G, plain=True, x_grad=True)
    state32 = {k: v if k == "rho" else v.float() for k, v in state.items()}
    out, grads = outputs_and_gradients(model.float(), state32, X.float(), G.float(), plain=False, x_grad=True)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for k in grads:
        torch.testing.assert_close(grads[k].double(), ref_grads[k], rtol=1e-4, atol=1e-5, msg=k)


def test_transforms_step_leaves_and_no_grad_take_the_plain_path(monkeypatch):
    """Under torch.func.grad, with a leaf ρ (∂𝓛/∂ρ) and under no_grad `_kernels.forward` runs the formula
    (`representations`); its values are plain autograd's."""
    model, state, X = network(None, "fixed", "irregular", "same", seed=6)
    W = state["W"].clone().requires_grad_()
    (expected,) = torch.autograd.grad(call(model, {"W": W}, X).sum(), W)

    def fused(*args):
        raise AssertionError("the fused node ran")

    monkeypatch.setattr(kernel.ResidualSteps, "apply", fused)
    by_transform = torch.func.grad(lambda W: call(model, {"W": W}, X).sum())(state["W"])
    torch.testing.assert_close(by_transform, expected, rtol=0, atol=1e-12)
    rho = model.rho.clone().requires_grad_()
    (d_rho,) = torch.autograd.grad(call(model, {"W": W, "rho": rho}, X).sum(), rho)
    assert d_rho.abs().max() > 0
    with torch.no_grad():
        assert call(model, {"W": W}, X).grad_fn is None
