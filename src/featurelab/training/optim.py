"""Optimizer steps on stacked ``M x ...`` parameters: Adam and SGD (with momentum, or plain) with
torch.optim's update formulas, per-member learning rates and per-member step counts (a member restarted
by the loss guard gets a fresh optimizer); the relative trust region of plain SGD; the conversion of a
member's state to and from the torch optimizer its checkpoint records; L-BFGS (torch's own, one run at a
time).
"""

from __future__ import annotations

import torch

from .phases import Phase
from .stack import Stack

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults
# a step count past which Adam's bias corrections are exactly 1 in float64 (from 36,314 on)
ADAM_FULL_CORRECTION = 40_000
LBFGS_LINE_SEARCH = 25  # function evaluations one L-BFGS line search may spend (torch's max_ls default)
LBFGS_TOLERANCE = 1e-15  # stop when g·d or a loss change falls below it (torch's 1e-9 stops float64 early)


def trust_region(lr, max_step: float, theta_norm: torch.Tensor, grad_norm: torch.Tensor):
    """Phase.max_step: the step's lr cut to ``max_step·‖θ‖/‖g‖`` where ``lr·‖g‖`` would exceed
    ``max_step·‖θ‖``. Works per member on ``(M,)`` norms. Returns ``(lr, cut)``, `cut` a bool tensor
    (inf/NaN caps never cut)."""
    cap = max_step * theta_norm / grad_norm
    cut = cap < lr
    return torch.where(cut, cap, lr), cut


def update(phase: Phase, stack: Stack, state: dict, lr: torch.Tensor, host: bool = False) -> None:
    """One optimizer step on the stacked parameters `Stack.flat` from the gathered gradients `Stack.grad`
    (``M x P``) with torch.optim's formulas, per-member lr ``(M,)``, and per-member step counts
    ``state["count"]`` (0: the member's optimizer starts afresh, as after the guard; ``state["fresh"]`` says
    whether any may). The optimizer's buffers are ``M x P`` like `Stack.flat`; every state tensor is
    updated in place (a captured CUDA graph replays on the same memory). host: lr and the counts may be
    read on the host (the CPU, outside a captured step), where members of one lr and one count take
    the fused kernel of torch.optim.Adam(fused=True) (`_adam`)."""
    count = state["count"].add_(1)
    fresh = (count == 1)[:, None] if state.get("fresh", True) else None
    state["fresh"] = False
    if phase.optimizer == "adam":
        _adam(stack, state, count, lr, fresh, phase.steps, host)
    else:
        _sgd(stack, state, lr, phase.momentum, fresh)


def _buffer(state: dict, key: str, like: torch.Tensor) -> torch.Tensor:
    if key not in state:
        state[key] = torch.zeros_like(like)
    return state[key]


def adam_corrections(steps: int, device: torch.device) -> torch.Tensor:
    """Adam's bias corrections by step count c = 0..min(steps, `ADAM_FULL_CORRECTION`), float64 rows
    ``[1/(1 - β₁ᶜ), √(1 - β₂ᶜ)]`` (row 0 unused): a step looks its members' up in one op."""
    b1, b2 = ADAM_BETAS
    c = torch.arange(min(steps, ADAM_FULL_CORRECTION) + 1, dtype=torch.float64, device=device)
    return torch.stack([1 / (1 - b1**c), (1 - b2**c) ** 0.5], 1)


def _adam(
    stack: Stack, state: dict, count: torch.Tensor, lr: torch.Tensor, fresh: torch.Tensor | None, steps: int, host: bool
) -> None:
    """torch.optim.Adam's update: where `host` and the members share lr and step count, the fused kernel that
    ``torch.optim.Adam(fused=True)`` runs (``torch._fused_adam_``, one pass over the buffers); else the
    arithmetic of torch.optim.adam._single_tensor_adam with each member's bias corrections looked up in
    `adam_corrections` by its step count (the denominator ``√v/√(1 - β₂ᶜ) + ε`` then in one pass, addcdiv)."""
    b1, b2 = ADAM_BETAS
    p, g = stack.flat, stack.grad
    m, v = _buffer(state, "exp_avg", p), _buffer(state, "exp_avg_sq", p)
    if fresh is not None:
        m.masked_fill_(fresh, 0.0)
        v.masked_fill_(fresh, 0.0)
    counts, rates = (count.tolist(), lr.tolist()) if host else ([], [])
    if len(set(counts)) == len(set(rates)) == 1:  # torch.optim.Adam(fused=True)'s kernel: one pass over p, g, m, v
        step = torch.full((), float(counts[0]))
        kw = {"amsgrad": False, "maximize": False, "weight_decay": 0.0, "eps": ADAM_EPS}
        torch.ops.aten._fused_adam_([p], [g], [m], [v], [], [step], lr=rates[0], beta1=b1, beta2=b2, **kw)
        return
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    if "corrections" not in state:
        state["corrections"] = adam_corrections(steps, p.device)
    table = state["corrections"]
    rows = table[count if len(table) > steps else count.clamp(max=len(table) - 1)]  # (M, 2)
    rows[:, 0] *= lr  # step size lr/(1 - β₁ᶜ)
    step_size, bc2_sqrt = rows.to(p.dtype).unsqueeze(-1).unbind(1)
    denom = v.sqrt()
    torch.addcdiv(p.new_full((), ADAM_EPS), denom, bc2_sqrt, out=denom)
    p.addcdiv_(step_size * m, denom, value=-1)


def _sgd(stack: Stack, state: dict, lr: torch.Tensor, momentum: float, fresh: torch.Tensor | None) -> None:
    """torch.optim.sgd._single_tensor_sgd (no dampening, no nesterov)."""
    p, g = stack.flat, stack.grad
    if momentum:
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = g.clone()
        else:
            buf = state["momentum_buffer"].mul_(momentum).add_(g)
            if fresh is not None:
                buf.copy_(torch.where(fresh, g, buf))
        g = state["momentum_buffer"]
    p.addcmul_(g, lr.to(p.dtype)[:, None], value=-1)


def torch_optimizer(phase: Phase, stack: Stack, state: dict, i: int):
    """Member i's optimizer state as the torch optimizer of its phase would hold it (for its checkpoint)."""
    model = stack.models[i]
    params = [p for p in model.parameters() if p.requires_grad]
    if phase.optimizer == "adam":
        opt = torch.optim.Adam(params, lr=phase.lr)
    else:
        opt = torch.optim.SGD(params, lr=phase.lr, momentum=phase.momentum)
    count = int(state["count"][i])
    if count == 0:
        return opt
    keys = ("exp_avg", "exp_avg_sq") if phase.optimizer == "adam" else ("momentum_buffer",)
    views = {key: stack.split(state[key]) for key in keys if key in state}
    for name, p in zip(stack.shapes, params):
        if phase.optimizer == "adam":
            opt.state[p] = {"step": torch.tensor(float(count)), **{k: v[name][i].clone() for k, v in views.items()}}
        elif views:
            opt.state[p] = {"momentum_buffer": views["momentum_buffer"][name][i].clone()}
    return opt


def restore_state(phase: Phase, stack: Stack, state: dict, i: int, tensors: dict) -> None:
    """Member i's optimizer state from its checkpoint's tensors (the inverse of `torch_optimizer`)."""
    keys = ("exp_avg", "exp_avg_sq") if phase.optimizer == "adam" else ("momentum_buffer",)
    for j, name in enumerate(stack.shapes):
        for key in keys:
            saved = tensors.get(f"optim.{j}.{key}")
            if saved is not None:
                stack.split(_buffer(state, key, stack.flat))[name][i] = saved.to(stack.flat)
        step = tensors.get(f"optim.{j}.step")
        if step is not None or f"optim.{j}.momentum_buffer" in tensors:
            state["count"][i] = int(step) if step is not None else 1


def lbfgs_closure(stack: Stack, losses, X, Y, idx) -> torch.Tensor:
    stack.zero_grad()
    loss = sum(losses(X, Y, idx)).sum()
    loss.backward()
    return loss


def lbfgs(phase: Phase, stack: Stack) -> torch.optim.LBFGS:
    """One L-BFGS iteration per training step, with a strong-Wolfe line search of up to 25 evaluations.

    ``max_eval`` must be given: torch's default, ``max_iter * 5 // 4``, is 1 here, which leaves the line search
    no evaluation beyond its first trial, so a step whose unit trial fails Armijo is never taken and L-BFGS
    stalls for good."""
    return torch.optim.LBFGS(
        list(stack.leaves.values()),
        lr=phase.lr,
        max_iter=1,
        max_eval=LBFGS_LINE_SEARCH + 1,
        tolerance_grad=0.0,
        tolerance_change=LBFGS_TOLERANCE,
        history_size=50,
        line_search_fn="strong_wolfe",
    )
