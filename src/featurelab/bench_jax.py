"""JAX baselines of ``featurelab bench``: the same networks, data, loss and Adam written in JAX (``jit``,
``vmap``, ``lax.scan``), timed in the same process as featurelab. Optional: used when ``import jax``
works, skipped otherwise (`load_jax` returns None). CPU only (a CUDA bench has no JAX peer).

(a) the paper-size Leaky ResNet's full-batch Adam step (docs/theory/leaky-resnets.md §5.2: A_0 = X U_inᵀ,
    A_l = (1 − ρ_l L̃) A_{l−1} + ρ_l [ReLU(A_{l−1}), 1] W_lᵀ, Ŷ = A_L V_outᵀ, loss (1/N)‖Ŷ − Y‖²_F +
    λ/(2L̃) Σ_l ρ_l ‖W_l‖²_F), as `lax.scan` over the layers; seconds per step from scans of S and 2S steps.
(b) M digits MLPs (``[a, 1] Wᵀ`` layers with the bias column, ReLU, mean cross-entropy + λ‖θ‖²) trained
    by Adam as ``jit(vmap(scan of steps))``.
Both start from featurelab's own initial weights, so the final losses agree (a check that the peer does
the same work). Compilation is timed apart and left out of the figure.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

ADAM = (0.9, 0.999, 1e-8)  # torch.optim.Adam's defaults


def load_jax(threads: int):
    """The ``jax`` module on the CPU with `threads` intra-op threads (set before its first import; an
    already imported jax keeps its setting), or None when JAX is not installed."""
    if "jax" not in sys.modules and threads == 1:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    try:
        import jax
    except ImportError:
        return None
    jax.config.update("jax_platforms", "cpu")
    return jax


def _adam(jax, loss, lr: float):
    """One Adam step (torch.optim.Adam's formulas) on a pytree: ``(params, m, v, t) -> same``."""
    b1, b2, eps = ADAM

    def step(carry, _):
        params, m, v, t = carry
        g = jax.grad(loss)(params)
        t = t + 1
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        params = jax.tree.map(
            lambda p, m, v: p - lr / (1 - b1**t) * m / (jax.numpy.sqrt(v / (1 - b2**t)) + eps), params, m, v
        )
        return (params, m, v, t), None

    return step


def _train(jax, loss, lr: float, steps: int):
    """``params -> params`` after `steps` Adam steps (a `lax.scan`)."""

    def train(params):
        zeros = jax.tree.map(jax.numpy.zeros_like, params)
        return jax.lax.scan(_adam(jax, loss, lr), (params, zeros, zeros, 0.0), None, length=steps)[0][0]

    return train


def _timed(fn, *args) -> tuple[float, float, object]:
    """Wall and CPU seconds of ``fn(*args)`` until its result is ready, and the result."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    for leaf in out if isinstance(out, (tuple, list)) else (out,):
        leaf.block_until_ready()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def mlp_ensemble(jax, weights: list[np.ndarray], X: np.ndarray, y: np.ndarray, *, lam, lr, steps, repeat=3) -> dict:
    """(b): `weights` (per layer ``M x n_out x (n_in + 1)``, bias column last) trained as one vmapped Adam
    run on inputs X (``N x d``) and labels y (``N``); median wall/CPU seconds of `repeat` calls after the
    compiling one, and the members' final losses (``(M,)``)."""
    jnp = jax.numpy
    X, y = jnp.asarray(X), jnp.asarray(y)

    def loss(Ws):
        a = X
        for l, W in enumerate(Ws):
            z = a @ W[:, :-1].T + W[:, -1]
            a = jax.nn.relu(z) if l < len(Ws) - 1 else z
        cost = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(a), y[:, None], 1))
        return cost + lam * sum(jnp.sum(W**2) for W in Ws)

    batched = jax.jit(jax.vmap(_train(jax, loss, lr, steps)))
    Ws = tuple(jnp.asarray(W) for W in weights)
    compile_seconds = _timed(batched, Ws)[0]
    runs = [_timed(batched, Ws) for _ in range(repeat)]
    final = jax.vmap(loss)(runs[0][2])
    return {
        "seconds": float(np.median([r[0] for r in runs])),
        "cpu_seconds": float(np.median([r[1] for r in runs])),
        "compile_seconds": compile_seconds,
        "final_losses": np.asarray(final, dtype=np.float64),
    }


def leaky_resnet_step(jax, W, rho, U, V, X, Y, *, effective_depth, lam, lr, steps) -> dict:
    """(a): seconds per full-batch Adam step of the Leaky ResNet with stacked weights W (``L x w x (w+1)``),
    steps ρ (``L``), fixed U_in (``w x d_in``) and V_out (``d_out x w``) on X, Y (``N x d``): (time of 2·steps
    − time of steps) / steps, each compiled first; and the loss after 2·steps steps."""
    jnp = jax.numpy
    X, Y, U, V, rho = (jnp.asarray(a) for a in (X, Y, U, V, rho))
    Lt, N = effective_depth, X.shape[0]

    def loss(W):
        def layer(A, inputs):
            W_l, r = inputs
            s = jnp.concatenate([jax.nn.relu(A), jnp.ones_like(A[:, :1])], 1)
            return (1 - r * Lt) * A + r * (s @ W_l.T), None

        A = jax.lax.scan(layer, X @ U.T, (W, rho))[0]
        return jnp.sum((A @ V.T - Y) ** 2) / N + lam / (2 * Lt) * jnp.sum(rho * jnp.sum(W**2, axis=(1, 2)))

    timings = {}
    for n in (steps, 2 * steps):
        fn = jax.jit(_train(jax, loss, lr, n))
        _timed(fn, jnp.asarray(W))  # compile
        timings[n] = _timed(fn, jnp.asarray(W))
    short, long = timings[steps], timings[2 * steps]
    return {
        "step_seconds": max(long[0] - short[0], 1e-12) / steps,
        "step_cpu_seconds": max(long[1] - short[1], 1e-12) / steps,
        "final_loss": float(loss(long[2])),
    }
