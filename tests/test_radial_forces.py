"""The forces along each neuron's ray (`radial_forces`, `radial_imbalance`; Jacot, Golikov, Hongler, Gabriel 2022,
arXiv 2205.15809, §3.1): the derivative of L^rep along a neuron's rescaling, and their balance at exact optima."""

import pytest
import torch

from featurelab import MLP
from featurelab.data.constructions import bipartite, onehot_identity
from featurelab.measurements.representations import (
    layer_forces,
    radial_forces,
    radial_imbalance,
    representation_loss,
)

D = torch.float64


def rescaled(model, layer: int, neuron: int, c: float) -> MLP:
    """The same net with neuron `neuron` of hidden layer `layer` (1-based) scaled: incoming row ×c, outgoing
    column ×1/c (its function is unchanged for a positively homogeneous σ)."""
    out = MLP(model.dims[0], model.dims[-1], list(model.dims[1:-1]), len(model.weights), bias=model.bias, dtype=D)
    with torch.no_grad():
        for p, W in zip(out.weights, model.weights):
            p.copy_(W)
        out.weights[layer - 1][neuron] *= c
        out.weights[layer][:, neuron] /= c
    return out


@pytest.mark.parametrize("bias", [0.0, 1.0])
def test_radial_forces_are_minus_the_derivative_of_lrep_along_the_neuron_rescaling(bias):
    """d/dc L^rep(Z(θ_c)) at c = 1, by central differences of `representation_loss` (the projection form, no
    forces involved), equals -(attraction_i + repulsion_i), and the two sides are -2λ‖w_i^min‖² and 2λ‖v_i^min‖²
    of the min-norm weights. N = 6 samples against widths 9 and 7: rank-deficient Grams, where the full forces
    do not balance. A sign slip, Z in place of σ(Z), or the wrong layer's weights fail it."""
    gen = torch.Generator().manual_seed(3)
    model = MLP(4, 2, [9, 7], 3, bias=bias, dtype=D, seed=5)
    X = torch.randn(6, 4, generator=gen, dtype=D)
    Y = torch.randn(6, 2, generator=gen, dtype=D)
    lam, eps = 0.3, 1e-5
    forces = layer_forces(model, X, Y, lam)
    mins = representation_loss(model, X, Y, lam).weights
    for layer in (1, 2):
        r = radial_forces(forces[layer - 1])
        alive = r.alive.nonzero().flatten().tolist()
        assert alive
        for i in alive[:4]:
            up = representation_loss(rescaled(model, layer, i, 1 + eps), X, Y, lam).loss
            down = representation_loss(rescaled(model, layer, i, 1 - eps), X, Y, lam).loss
            slope = (up - down) / (2 * eps)
            total = float(r.attraction[i] + r.repulsion[i])
            assert -total == pytest.approx(slope, rel=1e-6, abs=1e-9 * float(r.attraction[i].abs()))
            w, v = mins[layer - 1][i], mins[layer][:, i]
            assert float(r.attraction[i]) == pytest.approx(-2 * lam * float(w @ w), rel=1e-9)
            assert float(r.repulsion[i]) == pytest.approx(2 * lam * float(v @ v), rel=1e-9)


def test_exact_optima_balance_and_a_rescaled_neuron_has_the_closed_form_imbalance():
    """bipartite(6) (9 neurons, rows and columns of B with two ones each) and onehot_identity([3, 5, 2]) (neuron c
    with ‖w_c‖² = ‖v_c‖² = √N_c) minimise ‖θ‖²: every neuron's radial forces cancel (to 1e-12). Scaling neuron 0
    of onehot_identity (σ(Z_1) of full column rank, so its weights stay min-norm) by c (w → cw, v → v/c) moves
    its radial sum to 2λ(‖v‖²/c² − c²‖w‖²), so the imbalance is (c² − c⁻²)‖w_0‖² / (Σ_{j≠0}‖w_j‖² + c²‖w_0‖²)."""
    lam, c = 0.1, 1.5
    for con, norms in ((bipartite(6), [2.0] * 9), (onehot_identity([3, 5, 2]), [3**0.5, 5**0.5, 2**0.5])):
        (hidden, _) = layer_forces(con.model, con.data.X_train, con.data.Y_train, lam)
        assert radial_imbalance(hidden) <= 1e-12
        r = radial_forces(hidden)
        assert torch.allclose(-r.attraction, 2 * lam * torch.tensor(norms, dtype=D), rtol=1e-12)
        assert torch.allclose(r.repulsion, 2 * lam * torch.tensor(norms, dtype=D), rtol=1e-12)
    moved = rescaled(con.model, 1, 0, c)
    (hidden, _) = layer_forces(moved, con.data.X_train, con.data.Y_train, lam)
    expected = (c**2 - c**-2) * norms[0] / (sum(norms[1:]) + c**2 * norms[0])
    assert radial_imbalance(hidden) == pytest.approx(expected, rel=1e-10)


def test_dead_neurons_are_left_out_and_a_layer_without_alive_neurons_is_nan():
    """A neuron whose σ(Z) vanishes on every sample has no repulsion; it is not alive, and an all-dead layer has
    no imbalance to report (NaN)."""
    model = MLP(3, 1, [4], 2, bias=1.0, dtype=D, seed=1)
    X = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=D)
    with torch.no_grad():
        model.weights[0][1] = torch.tensor([0.0, 0.0, 0.0, -1.0], dtype=D)  # bias only, negative: dead
    (hidden, _) = layer_forces(model, X, torch.randn(5, 1, dtype=D), 0.1)
    r = radial_forces(hidden)
    assert not bool(r.alive[1]) and float(r.repulsion[1]) == 0.0
    with torch.no_grad():
        model.weights[0][:, -1] = -100.0
    (hidden, _) = layer_forces(model, X, torch.randn(5, 1, dtype=D), 0.1)
    assert radial_imbalance(hidden) != radial_imbalance(hidden)
