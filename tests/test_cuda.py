"""CUDA against CPU: every experiment's smallest preset and every public measurement give, on a GPU, what
they give on the CPU. Skipped without a GPU; run by ``make test-gpu``.

Tolerances. Measurements run in float64 on both devices, so their numbers agree to float64 rounding of
differently ordered sums: ``rtol = 1e-8`` (a singular value or a solve amplifies rounding by at most the
condition numbers of these small, well-conditioned inputs). Experiments run their smallest preset trained
in float64 (``dtype=float64`` wherever an experiment offers float32; the others train in float64 already):
the GPU's reductions sum in another order than the CPU's, and training amplifies that rounding
difference, so their headline numbers (wall-clock fields excluded) are compared at ``rtol = 1e-6`` (looser
where a one-ulp change of the initial weights is measured to move them more: `EXPERIMENT_RTOL_CHAOTIC`) and
their claims' verdicts must be equal. In float32 the same runs differ by about 1 % after training, enough
to flip a claim that sits at its threshold, which is why the comparison is made in float64.
"""

from __future__ import annotations

import dataclasses
import math
from typing import overload

import numpy as np
import pandas as pd
import pytest
import torch

import featurelab.measurements as fm
from featurelab.experiments import REGISTRY
from featurelab.models import MLP, Conv, Dense, Flatten, HomogeneousNet, LeakyResNet, ResBlock
from featurelab.runs import run_experiment

_NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def on_cuda(test):
    """Mark a test `cuda` (run by ``make test-gpu``) and skip it without a GPU."""
    return pytest.mark.cuda(_NEEDS_GPU(test))


MEASURE_RTOL = 1e-8
EXPERIMENT_RTOL = 1e-6
# Experiments whose training amplifies rounding beyond that, measured on the CPU alone: bn-rank-depth's tiny
# preset (1500 Adam steps at lr 1e-2 of L = 4, 6, 8 nets, float64) started from initial weights moved by one
# ulp on a random half of their entries ends with its summary moved by up to 2.9e-3 (relative; the loss by
# 1.5e-5, the largest weight change 2.9e-3 of the largest weight at L = 6), its verdicts unchanged. A
# CPU-against-CUDA difference of that order is rounding, not a device bug; an H100 gave 1.9e-5.
EXPERIMENT_RTOL_CHAOTIC = {"bn-rank-depth": 1e-2}
D = torch.float64
NEEDS_LOCAL_FILES = {"saddle-mnist"}  # MNIST is read from disk, never downloaded
# featurelab's own experiments (other test modules register toy experiments into the same registry)
OWN = {name for name, e in REGISTRY.items() if e.units.__module__.startswith("featurelab.")}


@pytest.fixture(autouse=True)
def _true_float32():
    """No TF32: float32 matmuls and convolutions on the GPU round as float32 does on the CPU."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# ------------------------------------------------------------------------------- comparison
def _numbers(x):
    """Every number in `x` (tensors, frames, dataclasses, named tuples, dicts, lists), as a flat list of
    float64 arrays, and the structure's shape signature."""
    if isinstance(x, torch.Tensor):
        return [x.detach().cpu().double().numpy().ravel()]
    if isinstance(x, pd.DataFrame):
        num = x.select_dtypes("number")
        return [num.to_numpy(dtype=float).ravel()] + _numbers(x.attrs.get("summary", {}))
    if isinstance(x, torch.nn.Module):
        return [p.detach().cpu().double().numpy().ravel() for p in x.state_dict().values()]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _numbers([getattr(x, f.name) for f in dataclasses.fields(x)])
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return _numbers(list(x))
    if isinstance(x, dict):
        return _numbers([x[k] for k in sorted(x, key=str)])
    if isinstance(x, (list, tuple)):
        return [a for item in x for a in _numbers(item)]
    if isinstance(x, (bool, int, float, np.floating, np.integer)):
        return [np.array([float(x)])]
    return []


def assert_same(cpu, gpu, rtol, what):
    a, b = _numbers(cpu), _numbers(gpu)
    assert [x.shape for x in a] == [y.shape for y in b], what
    for x, y in zip(a, b):
        scale = max(1.0, float(np.nanmax(np.abs(x), initial=0.0)) if np.isfinite(x).any() else 1.0)
        np.testing.assert_allclose(y, x, rtol=rtol, atol=rtol * scale, equal_nan=True, err_msg=what)


# -------------------------------------------------------------------------------- measurements
def _mlp(bias=1.0, leak=0.0, d_in=3, d_out=2, widths=(5, 4), seed=0):
    return MLP(d_in, d_out, list(widths), len(widths) + 1, leak=leak, bias=bias, seed=seed, dtype=D)


def _homogeneous():
    g = torch.Generator().manual_seed(0)
    return HomogeneousNet(
        [
            Dense(3, 4, 0.0, generator=g),
            ResBlock("free", 4, 3, 4, sigma_in="relu", sigma_out="relu", generator=g),
            ResBlock("identity", 4, 3, sigma_in="linear", generator=g),
            Dense(4, 1, 1.0, generator=g),
        ]
    )


def _dense():
    g = torch.Generator().manual_seed(0)
    return HomogeneousNet([Dense(3, 4, 0.0, generator=g), Dense(4, 4, 0.0, generator=g), Dense(4, 1, 1.0, generator=g)])


def _conv():
    g = torch.Generator().manual_seed(0)
    return HomogeneousNet(
        [Conv(1, 2, 2, stride=2, padding=1, generator=g), Flatten(), Dense(8, 1, 1.0, generator=g)],
        input_shape=(1, 3, 3),
    )


def _leaky():
    return LeakyResNet(3, 2, 5, depth=6, effective_depth=2.0, seed=0, dtype=D)


def _x(n, d, seed=0, positive=False):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=D)
    return x.abs() if positive else x


def _cp_plane():
    """A = diag(3, 1.5)Vᵀ and V = [e_1, e_2] in R³: V's columns are right singular vectors of A, and
    the samples XV Vᵀ with X >= 0 lie in the completely positive cone of V."""
    V = torch.eye(3, 2, dtype=D)
    return torch.diag(torch.tensor([3.0, 1.5], dtype=D)) @ V.T, V


@overload
def _on(dev: str, a: torch.Tensor, /) -> torch.Tensor: ...
@overload
def _on(dev: str, a: torch.Tensor, b: torch.Tensor, /) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def _on(
    dev: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, /
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
def _on(dev: str, *xs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """`xs` moved to `dev`: one tensor for one argument, else a tuple of the same length (typed per arity, so
    ``*_on(...)`` spreads into a fixed number of parameters)."""
    out = tuple(x.to(dev) for x in xs)
    return out[0] if len(out) == 1 else out


def _relu_weights(dev):
    return [W.to(dev) for W in _mlp(bias=0.0, widths=(4, 4)).weight_matrices()]


def _descent_G():
    """A G with L0(θ) < 0 for `_relu_weights` on ``_x(6, 3)`` (an escape direction's sign)."""
    G = _x(6, 2, 1)
    return G if float(fm.localized_loss(_relu_weights("cpu"), _x(6, 3), G)) < 0 else -G


def _cp(dev):
    """A completely positive matrix B Bᵀ (B >= 0, 5 x 3)."""
    B = _x(5, 3, positive=True)
    return (B @ B.T).to(dev)


def _tail(dev):
    """A bias-free linear tail [W_k, ..., W_N] (4x3, 4x4, 1x4)."""
    return [_x(4, 3, 2).to(dev), _x(4, 4, 3).to(dev), _x(1, 4, 4).to(dev)]


def _signs(n, seed=1):
    return torch.where(_x(n, 1, seed) > 0, 1.0, -1.0).to(D)


def _flow_derivative(dev):
    net = _dense().to(dev)
    return fm.flow_derivative(
        net, *_on(dev, _x(6, 3), _signs(6)), lambda get: fm.gram_difference(net, 0, get), objective="logistic"
    )


# One call per public measurement: f(dev) builds small valid inputs on `dev` and calls it.
CALLS = {
    "singular_values": lambda d: fm.singular_values(_on(d, _x(5, 4))),
    "stable_rank": lambda d: fm.stable_rank(_on(d, _x(5, 4))),
    "nuclear_rank": lambda d: fm.nuclear_rank(_on(d, _x(5, 4))),
    "effective_rank": lambda d: fm.effective_rank(_on(d, _x(5, 4))),
    "numerical_rank": lambda d: fm.numerical_rank(_on(d, _x(5, 4))),
    "cost_of_identity": lambda d: fm.cost_of_identity(_on(d, _x(8, 3)), True, 1e-3),
    "backward_variables": lambda d: fm.backward_variables(_leaky().to(d), *_on(d, _x(7, 3), _x(7, 2, 1)), 0.1),
    "geodesic_diagnostics": lambda d: fm.geodesic_diagnostics(_leaky().to(d), *_on(d, _x(7, 3), _x(7, 2, 1)), 0.1),
    "balancedness_residual": lambda d: fm.balancedness_residual(_mlp().to(d)),
    "bottleneck_rank": lambda d: fm.bottleneck_rank(_mlp().to(d)),
    "classify_minimum": lambda d: fm.classify_minimum(2, 2, True),
    "layer_proxy": lambda d: fm.layer_proxy(_on(d, _x(4, 4)), 2),
    "rebalance": lambda d: fm.rebalance(_mlp().to(d)),
    "representation_spectra": lambda d: fm.representation_spectra(_mlp().to(d), _on(d, _x(6, 3))),
    "theorem3_check": lambda d: fm.theorem3_check(_mlp().to(d), _on(d, _x(6, 3)), 0.0, 1),
    "theorem6_check": lambda d: fm.theorem6_check(_mlp().to(d), _on(d, _x(1, 3)[0])),
    "corollary8_check": lambda d: fm.corollary8_check(
        _mlp().to(d), _on(d, _x(6, 3)), int(fm.jacobian_ranks(_mlp().to(d), _on(d, _x(6, 3))).max())
    ),
    "theorem7_check": lambda d: fm.theorem7_check(fm.rebalance(_mlp().to(d)), _on(d, _x(1, 3)[0])),
    "jacobian": lambda d: fm.jacobian(_mlp().to(d), _on(d, _x(4, 3))),
    "jacobian_ranks": lambda d: fm.jacobian_ranks(_mlp().to(d), _on(d, _x(4, 3))),
    "ntk_trace": lambda d: fm.ntk_trace(_mlp().to(d), _on(d, _x(4, 3))),
    "ntk_trace_closed_form": lambda d: fm.ntk_trace_closed_form(_mlp().to(d), _on(d, _x(4, 3))),
    "balanced_factorization": lambda d: [W @ W.T for W in fm.balanced_factorization(_on(d, _x(4, 4)), 3)],
    "estimate_representation_cost": lambda d: fm.estimate_representation_cost(
        [2, 3, 4, 5], [fm.linear_representation_cost(_on(d, _x(3, 3)), L) for L in (2, 3, 4, 5)]
    ),
    "linear_expansion": lambda d: fm.linear_expansion(_on(d, _x(4, 4))),
    "linear_representation_cost": lambda d: fm.linear_representation_cost(_on(d, _x(4, 4)), 3),
    "log_pdet": lambda d: fm.log_pdet(_on(d, _x(4, 4))),
    "complete_positivity": lambda d: fm.complete_positivity(
        *_on(d, _x(6, 2, positive=True) @ _cp_plane()[1].T, _cp_plane()[1])
    ),
    "CompletePositivity": lambda d: fm.complete_positivity(*_on(d, _x(6, 2) @ _cp_plane()[1].T, _cp_plane()[1])),
    "cp_linear_representation": lambda d: fm.cp_linear_representation(*_on(d, *_cp_plane()), 3),
    "cp_linear_cost": lambda d: fm.cp_linear_cost(*_on(d, *_cp_plane()), 3),
    "shrinkage_corrected_cost": lambda d: fm.shrinkage_corrected_cost(2.0, 0.1, 0.01),
    "estimate_r1_given_rank": lambda d: fm.estimate_r1_given_rank(
        [4, 6, 8], [fm.cp_linear_cost(*_on(d, *_cp_plane()), L) for L in (4, 6, 8)], 2
    ),
    "KnownRankFit": lambda d: fm.estimate_r1_given_rank([4, 6, 8, 10], [9.1, 13.2, 17.0, 21.3], 2),
    "pdet": lambda d: fm.pdet(_on(d, _x(4, 4))),
    "pseudo_log": lambda d: fm.pseudo_log(_on(d, _x(4, 4) @ _x(4, 4).T)),
    "CovariancePair": lambda d: fm.covariance_pairs(_mlp().to(d), _on(d, _x(6, 3)))[0],
    "covariance_pairs": lambda d: fm.covariance_pairs(_mlp().to(d), _on(d, _x(6, 3))),
    "LayerForces": lambda d: fm.layer_forces(_mlp().to(d), *_on(d, _x(6, 3), _x(6, 2, 1)), 0.01)[0],
    "layer_forces": lambda d: fm.layer_forces(_mlp().to(d), *_on(d, _x(6, 3), _x(6, 2, 1)), 0.01),
    "principal_view": lambda d: [
        M.abs() for M in fm.principal_view(fm.layer_forces(_mlp().to(d), *_on(d, _x(6, 3), _x(6, 2, 1)), 0.01)[0])
    ],
    "project_representations": lambda d: fm.project_representations(
        _mlp().to(d), _on(d, _x(6, 3)), [z.to(d) for z in _mlp()(_x(6, 3), return_layers=True).pre]
    ),
    "projected_gd_step": lambda d: fm.projected_gd_step(
        _mlp().to(d),
        _on(d, _x(6, 3)),
        [z.to(d) for z in _mlp()(_x(6, 3), return_layers=True).pre],
        _on(d, _x(6, 2, 1)),
        0.01,
        0.1,
    ),
    "RepresentationLoss": lambda d: fm.representation_loss(_mlp().to(d), *_on(d, _x(6, 3), _x(6, 2, 1)), 0.01),
    "regularized_loss": lambda d: fm.regularized_loss(_mlp().to(d), *_on(d, _x(6, 3), _x(6, 2, 1)), 0.01),
    "representation_descent": lambda d: fm.representation_descent(
        _mlp().to(d), *_on(d, _x(6, 3), _x(6, 2, 1)), 0.01, 0.1, 3
    ),
    "representation_loss": lambda d: fm.representation_loss(_mlp().to(d), *_on(d, _x(6, 3), _x(6, 2, 1)), 0.01),
    "tikhonov_loss": lambda d: fm.tikhonov_loss(
        _mlp().to(d),
        _on(d, _x(6, 3)),
        [z.to(d) for z in _mlp()(_x(6, 3), return_layers=True).pre],
        _on(d, _x(6, 2, 1)),
        0.01,
    ),
    "weights_from_representations": lambda d: fm.weights_from_representations(
        _mlp().to(d), _on(d, _x(6, 3)), [z.to(d) for z in _mlp()(_x(6, 3), return_layers=True).pre]
    ),
    "caratheodory_reduce": lambda d: fm.caratheodory_reduce(_mlp(widths=(12, 4)).to(d), _on(d, _x(2, 3)))[1],
    "class_separation": lambda d: fm.class_separation(_on(d, _x(6, 3)), _on(d, torch.tensor([0, 1, 0, 1, 0, 1]))),
    "merge_aligned_neurons": lambda d: fm.merge_aligned_neurons(_mlp().to(d), _on(d, _x(6, 3)))[1],
    "pad_width": lambda d: fm.pad_width(_mlp().to(d), 2),
    "pattern_merge": lambda d: fm.pattern_merge(_mlp(d_out=1, widths=(6,)).to(d), _on(d, _x(5, 3)))[1],
    "ray_share": lambda d: fm.ray_share(_on(d, _x(6, 5)), 0.9),
    "EscapeSearch": lambda d: fm.find_escape_directions(*_on(d, _x(6, 3), _x(6, 2, 1)), 3, 4, 4, 20).speeds,
    "blowup_time": lambda d: fm.blowup_time(0.1, 1.0, 3),
    "cross_entropy_gradient": lambda d: fm.cross_entropy_gradient(_on(d, torch.tensor([0, 1, 2, 1])), 3),
    "eig_residual": lambda d: fm.eig_residual(_relu_weights(d), *_on(d, _x(6, 3), _x(6, 2, 1))),
    "escape_norm": lambda d: fm.escape_norm(_on(d, torch.linspace(0, 1, 5, dtype=D)), 0.1, 1.0, 3),
    "escape_speed": lambda d: fm.escape_speed(_relu_weights(d), *_on(d, _x(6, 3), _x(6, 2, 1))),
    "escape_time": lambda d: fm.escape_time(0.1, 1.0, 1.0, 3),
    "extend_depth": lambda d: fm.extend_depth(_relu_weights(d), *_on(d, _x(6, 3, positive=True), -_x(6, 2, 1)), 1),
    "find_escape_directions": lambda d: fm.find_escape_directions(*_on(d, _x(6, 3), _x(6, 2, 1)), 3, 4, 4, 20),
    "layer_diagnostics": lambda d: fm.layer_diagnostics(_relu_weights(d), _on(d, _x(6, 3))),
    "localized_loss": lambda d: fm.localized_loss(_relu_weights(d), *_on(d, _x(6, 3), _x(6, 2, 1))),
    "prop33_check": lambda d: fm.prop33_check(
        fm.rank_one_chain(*_on(d, _x(1, 3, 2, True)[0], _x(1, 6, 3, True)[0], _x(6, 2, 1)), 3, 4),
        *_on(d, _x(1, 6, 3, True)[0][:, None] * _x(1, 3, 2, True), _x(6, 2, 1)),
        *_on(d, _x(1, 3, 2, True)[0], _x(1, 6, 3, True)[0]),
        0.01,
    ),
    "prop34_check": lambda d: fm.prop34_check(_relu_weights(d), *_on(d, _x(6, 3), _descent_G())),
    "rank_one_chain": lambda d: fm.rank_one_chain(
        *_on(d, _x(1, 3, 2, True)[0], _x(1, 6, 3, True)[0], _x(6, 2, 1)), 3, 4
    ),
    "tail_ratio": lambda d: fm.tail_ratio(_on(d, _x(5, 4))),
    "theorem31_bound": lambda d: fm.theorem31_bound(*_on(d, _x(6, 3), _x(6, 2, 1)), 0.5, 3),
    "adjacent_alignment": lambda d: fm.adjacent_alignment(_homogeneous().to(d)),
    "layer_ratios": lambda d: fm.layer_ratios(_homogeneous().to(d)),
    "theorem2_bounds": lambda d: fm.theorem2_bounds(_homogeneous().to(d), fm.theorem2_constants(_homogeneous().to(d))),
    "theorem2_constants": lambda d: fm.theorem2_constants(_homogeneous().to(d)),
    "Invariant": lambda d: [inv.value() for inv in fm.invariants(_homogeneous().to(d)).items],
    "InvariantSet": lambda d: len(fm.invariants(_homogeneous().to(d)).items),
    "InvariantTracker": lambda d: fm.InvariantTracker(_homogeneous().to(d), _on(d, _x(6, 3))).summary(),
    "drift_slope": lambda d: fm.drift_slope([0.1, 0.2, 0.4], [0.01, 0.04, 0.16]),
    "flow_derivative": lambda d: _flow_derivative(d),
    "gram_difference": lambda d: fm.gram_difference(_dense().to(d), 0),
    "identity_block_controls": lambda d: [inv.value() for inv in fm.identity_block_controls(_homogeneous().to(d))],
    "invariants": lambda d: [inv.value() for inv in fm.invariants(_conv().to(d)).items],
    "noninvariance_flow": lambda d: fm.noninvariance_flow(
        _dense().to(d), *_on(d, _x(6, 3), _signs(6)), 0, objective="logistic"
    ),
    "enumerate_paths": lambda d: fm.enumerate_paths(_conv().to(d)).weight_products(),
    "path_enumeration": lambda d: fm.path_enumeration(_conv().to(d), _on(d, _x(5, 9))),
    "CpRankBounds": lambda d: fm.cp_rank_bounds(_cp(d), _on(d, _x(5, 3, positive=True))),
    "cp_rank_bounds": lambda d: fm.cp_rank_bounds(_cp(d), _on(d, _x(5, 3, positive=True))),
    "constant_coi_path": lambda d: fm.constant_coi_path(_on(d, _x(2, 9)), _on(d, torch.linspace(0, 1, 3, dtype=D))),
    "entropy_rank": lambda d: fm.entropy_rank(_on(d, _x(5, 4))),
    "eq6_curve": lambda d: fm.eq6_curve(np.linspace(0.0, np.pi, 7)),
    "rank_one_curve": lambda d: fm.rank_one_curve(np.linspace(0.0, np.pi, 7)),
    "lagrangian_weights": lambda d: fm.lagrangian_weights(*_on(d, _x(7, 4), _x(7, 4, 1)), 2.0),
    "linear_tail_alignment": lambda d: fm.linear_tail_alignment(_tail(d)),
    "linear_tail_bounds": lambda d: fm.linear_tail_bounds(fm.linear_tail_constants(_tail(d)), _tail(d)),
    "linear_tail_constants": lambda d: fm.linear_tail_constants(_tail(d)),
    "output_gram_root": lambda d: fm.output_gram_root(_on(d, _x(6, 2))),
    "second_singular_bound": lambda d: fm.second_singular_bound(0.2),
    "spectrum_ranks": lambda d: fm.spectrum_ranks(fm.singular_values(_on(d, _x(5, 4)))),
    "theorem31_check": lambda d: fm.theorem31_check(_relu_weights(d), *_on(d, _x(6, 3), _x(6, 2, 1)), 0.5),
    "tree_network": lambda d: fm.tree_network(_conv().to(d))(fm.path_enumeration(_conv().to(d), _on(d, _x(5, 9)))),
}


def test_the_table_covers_every_public_measurement():
    """Runs on the CPU too, so the table is complete and callable before any GPU time is spent on it."""
    assert sorted(CALLS) == sorted(fm.__all__)
    for call in CALLS.values():
        call("cpu")  # raises on a stale entry


@pytest.mark.parametrize("name", sorted(CALLS))
@on_cuda
def test_measurement_on_cuda_equals_cpu(name):
    assert_same(CALLS[name]("cpu"), CALLS[name]("cuda"), MEASURE_RTOL, name)


# ------------------------------------------------------------------------------------ capture
@on_cuda
def test_captured_training_equals_eager_on_cuda(monkeypatch):
    """The CUDA-graph path (loss guard rolling members back and adaptive Leaky-ResNet steps between
    replays) gives the eager run on the same GPU, in float64: the same kernels, so agreement to 1e-10."""
    from featurelab.training import capture
    from featurelab.training.ensemble import train_ensemble
    from test_ensemble import DATA, guarded_adaptive_ensemble

    make, configs = guarded_adaptive_ensemble(D)

    def run():
        models = [make(i) for i in range(len(configs))]
        hist = [r.history for r in train_ensemble(models, DATA, configs, device="cuda")]
        return models, hist

    captured, hist = run()
    monkeypatch.setattr(capture, "eager_reason", lambda *a, **k: "a test")
    eager, eager_hist = run()
    for a, b in zip(captured, eager):
        assert_same(b.state_dict(), a.state_dict(), 1e-10, "parameters")
    for h, e in zip(hist, eager_hist):
        np.testing.assert_allclose(h[["loss", "lr"]].to_numpy(), e[["loss", "lr"]].to_numpy(), rtol=1e-10)
    assert float(hist[2]["lr"].iloc[-1]) < configs[2].phases[1].lr  # the guard acted between replays


# ------------------------------------------------------------------------------ ensemble sizing
@on_cuda
def test_member_bytes_matches_the_memory_an_ensemble_member_adds_on_cuda():
    """`runs.sweep.member_bytes`, the per-member estimate that packs GPU ensembles, against what one more
    member adds to the allocator's peak over two logged Adam steps of paper-size Leaky ResNets (L = 50,
    w = 200, N = 1000): (peak with 4 members − peak with 2) / 2, within a factor 2 of the estimate, so a
    packed ensemble neither overflows nor leaves most memory idle. The difference of two ensembles leaves
    out what a process allocates once whatever the ensemble's size (cuBLAS's workspaces for each stream
    that runs a product, 64 MiB measured on an H200); a first, unmeasured ensemble allocates it. Killed by an
    estimate that leaves out the saved activations (about 70 % of it here) or counts them per use."""
    from featurelab.runs.runner import resolve_config
    from featurelab.runs.sweep import member_bytes
    from featurelab.training import Phase
    from featurelab.training.ensemble import train_ensemble

    exp, cfg = resolve_config("leaky-bottleneck", "paper")
    build = exp.build
    assert build is not None  # leaky-bottleneck trains through build and finish
    unit = exp.units(cfg)[0]
    need = member_bytes(build(cfg, unit))

    def peak(members: int) -> int:
        jobs = [build(cfg, unit) for _ in range(members)]
        config = jobs[0].config.model_copy(
            update={"phases": [Phase(optimizer="adam", steps=2, lr=1e-4)], "log_every": 2}
        )
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        train_ensemble([j.model for j in jobs], jobs[0].data, config, device="cuda", progress=False)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    peak(2)  # the streams' workspaces, allocated once per process
    per_member = (peak(4) - peak(2)) / 2
    assert per_member / 2 <= need <= 2 * per_member, (need, per_member)


# ---------------------------------------------------------------------------------- experiments
def _without_timings(x):
    """`x` without its wall-clock fields (keys naming seconds): they measure the machine, not the result."""
    if isinstance(x, dict):
        return {k: _without_timings(v) for k, v in x.items() if "seconds" not in str(k)}
    if isinstance(x, list):
        return [_without_timings(v) for v in x]
    return x


def smallest_preset_float64(name: str) -> tuple[str, dict]:
    """The experiment's `tiny` preset (seconds on a CPU), and the override that trains it in float64 where it
    has a choice."""
    return "tiny", ({"dtype": "float64"} if "dtype" in REGISTRY[name].config.model_fields else {})


def without_certification(name: str) -> dict:
    """The override that skips the certified tier where the experiment has one: certification runs on the CPU
    in float64 from the trained net whatever the training device (tests/test_certify.py checks it), and at
    minutes a unit it would dominate a comparison of what the device computes."""
    return {"certify": None} if "certify" in REGISTRY[name].config.model_fields else {}


@pytest.mark.parametrize("name", sorted(OWN - NEEDS_LOCAL_FILES))
def test_every_tiny_preset_trains_in_float64(name):
    """Runs on the CPU: the comparison below needs a `tiny` preset whose networks train in float64 (checked on
    the first unit of experiments that build their units)."""
    from featurelab.runs.runner import resolve_config

    preset, overrides = smallest_preset_float64(name)
    exp, cfg = resolve_config(name, preset, overrides)
    if exp.build is not None:
        job = exp.build(cfg, exp.units(cfg)[0])
        assert {p.dtype for p in job.model.parameters()} == {torch.float64}


@pytest.mark.parametrize("name", sorted(OWN - NEEDS_LOCAL_FILES))
@on_cuda
def test_smallest_preset_on_cuda_equals_cpu(name, tmp_path):
    preset, overrides = smallest_preset_float64(name)
    overrides = {**overrides, **without_certification(name)}
    runs = {
        dev: run_experiment(name, preset, overrides, out=tmp_path / dev, device=dev, workers=1, progress=False)
        for dev in ("cpu", "cuda")
    }
    cpu, gpu = runs["cpu"], runs["cuda"]
    verdicts = {dev: {c["id"] or c["statement"]: c["passed"] for c in r.claims} for dev, r in runs.items()}
    assert verdicts["cuda"] == verdicts["cpu"], name
    summaries = _without_timings(cpu.summary), _without_timings(gpu.summary)
    rtol = EXPERIMENT_RTOL_CHAOTIC.get(name, EXPERIMENT_RTOL)
    assert_same(*summaries, rtol, f"{name} --preset {preset}: summary")
    assert math.isfinite(sum(float(np.nansum(a)) for a in _numbers(summaries[1])))
