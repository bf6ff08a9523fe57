"""Optimizer steps on stacked ``M x ...`` parameters: Adam and SGD (with momentum, or plain) with
torch.optim's update formulas, per-member learning rates and per-member step counts (a member restarted
by the loss guard gets a fresh optimizer); the relative trust region of plain SGD; the conversion of a
member's state to and from the torch optimizer its checkpoint records; L-BFGS (torch's own, one run at a
time).
"""

from __future__ import annotations

import torch
from torch import nn

from .phases import Phase
from .stack import Stack

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults
LBFGS_LINE_SEARCH = 25  # function evaluations one L-BFGS line search may spend (torch's max_ls default)
LBFGS_TOLERANCE = 1e-15  # stop when g·d or a loss change falls below it (torch's 1e-9 stops float64 early)


def _per_member(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-member (M,) tensor in `like`'s dtype, shaped to broadcast against the stacked `like`."""
    return values.to(like.dtype).reshape(-1, *([1] * (like.dim() - 1)))


def trust_region(lr, max_step: float, theta_norm: torch.Tensor, grad_norm: torch.Tensor):
    """Phase.max_step: the step's lr cut to ``max_step·‖θ‖/‖g‖`` where ``lr·‖g‖`` would exceed
    ``max_step·‖θ‖``. Works per member on ``(M,)`` norms. Returns ``(lr, cut)``, `cut` a bool tensor
    (inf/NaN caps never cut)."""
    cap = max_step * theta_norm / grad_norm
    cut = cap < lr
    return torch.where(cut, cap, lr), cut


def update(phase: Phase, stack: Stack, state: dict, lr: torch.Tensor) -> None:
    """One optimizer step on the stacked parameters with torch.optim's formulas, per-member lr, and
    per-member step counts ``state["count"]`` (0: the member's optimizer starts afresh, as after the guard;
    ``state["fresh"]`` says whether any may). Every state tensor is updated in place (a captured CUDA
    graph replays on the same memory)."""
    count = state["count"].add_(1)
    fresh = (count == 1) if state.get("fresh", True) else None
    state["fresh"] = False
    if phase.optimizer == "adam":  # torch.optim.adam._single_tensor_adam, bias corrections per member
        b1, b2 = ADAM_BETAS
        c = count.double()
        step_size, bc2_sqrt = (lr / (1 - b1**c)).to(stack.dtype), ((1 - b2**c) ** 0.5).to(stack.dtype)
    for (name, p), g in zip(stack.params.items(), stack.grads().values()):
        st = state.setdefault(name, {})
        shape = (-1, *([1] * (p.dim() - 1)))
        mask = fresh.reshape(shape) if fresh is not None else None
        if phase.optimizer == "adam":
            m_, v_ = (st.setdefault(k, torch.zeros_like(p)) for k in ("exp_avg", "exp_avg_sq"))
            if mask is not None:
                m_.masked_fill_(mask, 0.0)
                v_.masked_fill_(mask, 0.0)
            m_.lerp_(g, 1 - b1)
            v_.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v_.sqrt() / bc2_sqrt.reshape(shape)).add_(ADAM_EPS)
            p.addcdiv_(step_size.reshape(shape) * m_, denom, value=-1)
        else:  # torch.optim.sgd._single_tensor_sgd (no dampening, no nesterov)
            if phase.momentum:
                if "momentum_buffer" not in st:
                    st["momentum_buffer"] = g.clone()
                else:
                    buf = st["momentum_buffer"].mul_(phase.momentum).add_(g)
                    if mask is not None:
                        buf.copy_(torch.where(mask, g, buf))
                g = st["momentum_buffer"]
            p.add_(-_per_member(lr, p) * g)


def torch_optimizer(phase: Phase, model: nn.Module, state: dict, i: int):
    """Member i's optimizer state as the torch optimizer of its phase would hold it (for its checkpoint)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if phase.optimizer == "adam":
        opt = torch.optim.Adam(params, lr=phase.lr)
    else:
        opt = torch.optim.SGD(params, lr=phase.lr, momentum=phase.momentum)
    count = int(state["count"][i])
    if count == 0:
        return opt
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    for name, p in zip(names, params):
        st = state.get(name, {})
        if phase.optimizer == "adam":
            opt.state[p] = {
                "step": torch.tensor(float(count)),
                "exp_avg": st["exp_avg"][i].clone(),
                "exp_avg_sq": st["exp_avg_sq"][i].clone(),
            }
        elif "momentum_buffer" in st:
            opt.state[p] = {"momentum_buffer": st["momentum_buffer"][i].clone()}
    return opt


def restore_state(phase: Phase, stack: Stack, state: dict, i: int, tensors: dict) -> None:
    """Member i's optimizer state from its checkpoint's tensors (the inverse of `torch_optimizer`)."""
    for j, (name, p) in enumerate(stack.params.items()):
        st = state.setdefault(name, {})
        keys = ("exp_avg", "exp_avg_sq") if phase.optimizer == "adam" else ("momentum_buffer",)
        for key in keys:
            saved = tensors.get(f"optim.{j}.{key}")
            if saved is not None:
                st.setdefault(key, torch.zeros_like(p))[i] = saved.to(p)
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
