"""featurelab: the science of feature learning in deep networks.

Train the networks of five theory papers exactly as they define them, compute every quantity they
define, reproduce their figures and check their claims. Samples are rows (``N x d``) throughout the
public API; THEORY.md writes columns. See README.md and docs/.
"""
__version__ = "0.1.0"

from .data import Dataset, bottleneck_teacher, digits, mnist
from .errors import FeaturelabError
from .measurements import effective_rank, nuclear_rank, numerical_rank, singular_values, stable_rank
from .models import MLP, LeakyResNet, equidistant_steps, irregular_steps, project_steps
from .runs import RunRecord, render_report, run_experiment
from .training import Phase, TrainConfig, load_model, save_model, train

__all__ = [
    # models
    "MLP", "LeakyResNet", "equidistant_steps", "irregular_steps", "project_steps",
    # data
    "Dataset", "bottleneck_teacher", "digits", "mnist",
    # training
    "Phase", "TrainConfig", "train", "save_model", "load_model",
    # measurements
    "singular_values", "stable_rank", "nuclear_rank", "effective_rank", "numerical_rank",
    # runs
    "run_experiment", "render_report", "RunRecord",
    "FeaturelabError",
]

# Each part's public names: one block per part, kept in THEORY.md order.
# --- Part 1: Leaky ResNets, Hamiltonian, cost of identity (issue 3) ---
from .measurements.cost_of_identity import cost_of_identity
from .measurements.hamiltonian import backward_variables, geodesic_diagnostics
__all__ += ["cost_of_identity", "geodesic_diagnostics", "backward_variables"]
# --- Part 2: bottleneck rank, representation cost (issue 4) ---
from .data.bn_tasks import bn_rank_two_task, symmetry_gd, symmetry_summary, symmetry_task
from .measurements.bottleneck import (balancedness_residual, bottleneck_rank, classify_minimum, layer_proxy,
                                      rebalance, representation_spectra, theorem3_check, theorem6_check,
                                      theorem7_check)
from .measurements.jacobian import jacobian, jacobian_ranks, ntk_trace, ntk_trace_closed_form
from .measurements.representation_cost import (balanced_factorization, estimate_representation_cost,
                                               linear_expansion, linear_representation_cost, log_pdet, pdet,
                                               pseudo_log)
__all__ += ["bn_rank_two_task", "symmetry_gd", "symmetry_summary", "symmetry_task",
            "balancedness_residual", "bottleneck_rank", "classify_minimum", "layer_proxy", "rebalance",
            "representation_spectra", "theorem3_check", "theorem6_check", "theorem7_check",
            "jacobian", "jacobian_ranks", "ntk_trace", "ntk_trace_closed_form",
            "balanced_factorization", "estimate_representation_cost", "linear_expansion",
            "linear_representation_cost", "log_pdet", "pdet", "pseudo_log"]
# --- Part 3: attraction/repulsion, sparsity (issue 5) ---
from .data.constructions import (Construction, adjacency_matrix, bipartite, complete_bipartite_edges, cycle_edges,
                                 incidence_matrix, is_triangle_free, oned, onehot_identity, path_edges)
from .measurements.representations import (CovariancePair, LayerForces, RepresentationLoss, covariance_pairs,
                                           layer_forces, principal_view, project_representations, projected_gd_step,
                                           regularized_loss, representation_descent, representation_loss, tikhonov_loss,
                                           weights_from_representations)
from .measurements.sparsity import (caratheodory_reduce, merge_aligned_neurons, mlp_with_weights, pad_width,
                                    pattern_merge)
__all__ += ["Construction", "adjacency_matrix", "bipartite", "complete_bipartite_edges", "cycle_edges",
            "incidence_matrix", "is_triangle_free", "oned", "onehot_identity", "path_edges",
            "CovariancePair", "LayerForces", "RepresentationLoss", "covariance_pairs", "layer_forces",
            "principal_view", "project_representations", "projected_gd_step", "regularized_loss",
            "representation_descent", "representation_loss", "tikhonov_loss", "weights_from_representations",
            "caratheodory_reduce", "merge_aligned_neurons", "mlp_with_weights", "pad_width", "pattern_merge"]
# --- Part 4: saddle-to-saddle, escape directions (issue 6) ---
from .data.circle import circle_dataset
from .measurements.escape import (EscapeSearch, blowup_time, eig_residual, escape_norm, escape_speed, escape_time,
                                  extend_depth, find_escape_directions, layer_diagnostics, localized_loss,
                                  prop33_check, prop34_check, rank_one_chain, tail_ratio, theorem31_bound)
from .training.plateaus import Plateau, detect_plateaus
__all__ += ["circle_dataset", "EscapeSearch", "blowup_time", "eig_residual", "escape_norm", "escape_speed",
            "escape_time", "extend_depth", "find_escape_directions", "layer_diagnostics", "localized_loss",
            "prop33_check", "prop34_check", "rank_one_chain", "tail_ratio", "theorem31_bound", "Plateau",
            "detect_plateaus"]
# --- Part 5: invariances, alignment (issue 7) ---
from .data.separable import separable
from .measurements.alignment import adjacent_alignment, layer_ratios, theorem2_bounds, theorem2_constants
from .measurements.invariances import (Invariant, InvariantSet, InvariantTracker, drift_slope, flow_derivative,
                                       gram_difference, identity_block_controls, invariants, noninvariance_flow)
from .measurements.paths import enumerate_paths, path_enumeration, tree_network
from .models.conv import Conv
from .models.residual import Dense, Flatten, HomogeneousNet, ResBlock, as_homogeneous
__all__ += ["separable", "adjacent_alignment", "layer_ratios", "theorem2_bounds", "theorem2_constants",
            "Invariant", "InvariantSet", "InvariantTracker", "drift_slope", "flow_derivative", "gram_difference",
            "identity_block_controls", "invariants", "noninvariance_flow", "enumerate_paths", "path_enumeration",
            "tree_network", "Conv", "Dense", "Flatten", "HomogeneousNet", "ResBlock", "as_homogeneous"]
# --- Scale: ensembles, backends, bench (issue 8) ---
from .bench import run_bench
from .training.ensemble import ensemble_key, train_ensemble
__all__ += ["train_ensemble", "ensemble_key", "run_bench"]
