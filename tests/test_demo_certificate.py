"""The demo net's certified critical point, checked apart from featurelab's certificate code.

`featurelab run leaky-bottleneck --preset quick --set certify=1e-8` stores the certified parameters, the slopes s*
and the kink masks in ``units/<id>/certified.safetensors``. Here the Leaky ResNet's loss is written again from its
formula (arXiv 2405.17573 §4: ``A_l = (1 − ρ_l L̃)A_{l−1} + ρ_l [relu(A_{l−1}), 1] W_lᵀ``, ``Ŷ = A_L V_outᵀ``,
``C = (1/N)‖Ŷ − Y‖²_F``, ``R = λ/(2L̃) Σ_l ρ_l‖W_l‖²_F``) with plain torch, the kinks are read off it
(``|a| <= 1e-10`` of each layer's largest input), and the Clarke residual is bounded above by the gradient of the
loss whose ReLU has slope s*_k at kink k (s* in [0, 1]): ``‖∇(C + R)‖/‖∇R‖ <= 1e-6``, with the kinks standing out
of the other inputs by a gap of at least 1e6. Only the data comes from featurelab (its generator is not under
test). Slow: the certification of the demo net takes minutes."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

F64 = torch.float64


def relu_with_slopes(a: torch.Tensor, kinks: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """relu(a), whose derivative is `slopes` (one per True entry of `kinks`, row-major) at the kinks."""
    s = torch.zeros_like(a).masked_scatter(kinks, slopes)
    linear = s * a
    return torch.where(kinks, linear + (torch.relu(a) - linear).detach(), torch.relu(a))


def leaky_resnet_loss(state, X, Y, lam, effective_depth, kinks, slopes):
    """``(C + R, R, [A_0, ..., A_{L−1}])`` from the formula, the ReLU inputs returned for the kink check."""
    W, rho = state["param/W"], state["param/rho"]
    A = X @ state["param/U_in"].T
    inputs, offset = [], 0
    for l in range(W.shape[0]):
        inputs.append(A)
        k = kinks[l]
        n = int(k.sum())
        act = torch.cat([relu_with_slopes(A, k, slopes[offset : offset + n]), torch.ones_like(A[:, :1])], 1)
        offset += n
        A = (1 - rho[l] * effective_depth) * A + rho[l] * act @ W[l].T
    out = A @ state["param/V_out"].T
    cost = ((out - Y) ** 2).sum() / X.shape[0]
    penalty = lam / (2 * effective_depth) * (rho * (W**2).sum((1, 2))).sum()
    return cost + penalty, penalty, inputs


@pytest.mark.slow
def test_the_demo_nets_certified_point_is_clarke_critical(tmp_path):
    from featurelab.experiments import get_experiment
    from featurelab.runs.runner import run_experiment

    run = tmp_path / "demo"
    run_experiment("leaky-bottleneck", "quick", {"certify": 1e-8}, out=run, progress=False)
    exp = get_experiment("leaky-bottleneck")
    cfg = exp.config(**yaml.safe_load((run / "config.yaml").read_text()))
    (unit,) = exp.units(cfg)
    cert = json.loads((run / "units" / unit["id"] / "certificate.json").read_text())
    assert cert["certified"], cert["rule"]
    assert exp.build is not None  # leaky-bottleneck trains through build and finish
    job = exp.build(cfg, unit)
    X, Y = job.data.X_train.to(F64), job.data.Y_train.to(F64)
    stored = load_file(run / "units" / unit["id"] / "certified.safetensors")
    state = {k: v.to(F64) for k, v in stored.items() if k.startswith("param/")}
    assert set(state) == {"param/W", "param/rho", "param/U_in", "param/V_out"}  # all the formula reads
    lam, depth = job.config.lam, job.model.effective_depth
    masks = [stored[f"kinks/{i}"] for i in range(state["param/W"].shape[0])]
    slopes = stored["slopes"].to(F64)
    assert bool(((slopes >= 0) & (slopes <= 1)).all())

    W = state["param/W"].clone().requires_grad_()
    _, _, inputs = leaky_resnet_loss({**state, "param/W": W}, X, Y, lam, depth, masks, slopes)
    largest = [float(a.abs().max()) for a in inputs]
    read = [a.detach().abs() <= 1e-10 * top for a, top in zip(inputs, largest)]
    on = max(float(a.detach().abs()[k].max()) for a, k in zip(inputs, read) if k.any())
    off = min(float(a.detach().abs()[~k].min()) for a, k in zip(inputs, read))
    assert off / max(on, 1e-300) >= 1e6  # the identification gap
    for k, r in zip(masks, read):  # the stored kinks are the ones read off the point
        assert torch.equal(k, r)

    loss, penalty, _ = leaky_resnet_loss({**state, "param/W": W}, X, Y, lam, depth, masks, slopes)
    (g,) = torch.autograd.grad(loss, W, retain_graph=True)
    (gr,) = torch.autograd.grad(penalty, W)
    clarke_bound = float(g.norm() / gr.norm())
    assert clarke_bound <= 1e-6, clarke_bound
    assert float(loss) == pytest.approx(cert["loss_after"], rel=1e-12, abs=0)
    assert cert["kinks"] + cert["detail"]["inert_kinks"] == sum(int(k.sum()) for k in masks)
