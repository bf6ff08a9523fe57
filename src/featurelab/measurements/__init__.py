"""Measurements of the quantities the papers define, in float64; rows are samples.

Grouped by paper concept; each group's formulas are stated in the page of ``docs/theory/`` named
beside it.
"""

# spectra and ranks of any matrix (docs/theory/bottleneck-rank.md)
# training invariances and alignment (docs/theory/invariances.md)
from .alignment import adjacent_alignment, layer_ratios, theorem2_bounds, theorem2_constants

# bottleneck rank and representation cost (docs/theory/bottleneck-rank.md)
from .bottleneck import (
    balancedness_residual,
    bottleneck_rank,
    classify_minimum,
    layer_proxy,
    rebalance,
    representation_spectra,
    theorem3_check,
    theorem6_check,
    theorem7_check,
)

# Leaky ResNets: Hamiltonian, cost of identity (docs/theory/leaky-resnets.md)
from .cost_of_identity import cost_of_identity

# escape from the origin saddle (docs/theory/saddle-to-saddle.md)
from .escape import (
    EscapeSearch,
    blowup_time,
    cross_entropy_gradient,
    eig_residual,
    eq6_curve,
    escape_norm,
    escape_speed,
    escape_time,
    extend_depth,
    find_escape_directions,
    layer_diagnostics,
    localized_loss,
    prop33_check,
    prop34_check,
    rank_one_chain,
    rank_one_curve,
    tail_ratio,
    theorem31_bound,
)
from .hamiltonian import backward_variables, geodesic_diagnostics
from .invariances import (
    Invariant,
    InvariantSet,
    InvariantTracker,
    drift_slope,
    flow_derivative,
    gram_difference,
    identity_block_controls,
    invariants,
    noninvariance_flow,
)
from .jacobian import jacobian, jacobian_ranks, ntk_trace, ntk_trace_closed_form
from .paths import enumerate_paths, path_enumeration, tree_network
from .ranks import effective_rank, nuclear_rank, numerical_rank, singular_values, stable_rank
from .representation_cost import (
    balanced_factorization,
    estimate_representation_cost,
    linear_expansion,
    linear_representation_cost,
    log_pdet,
    pdet,
    pseudo_log,
)

# attraction/repulsion of representations and width sparsity (docs/theory/sparsity.md)
from .representations import (
    CovariancePair,
    LayerForces,
    RepresentationLoss,
    covariance_pairs,
    layer_forces,
    principal_view,
    project_representations,
    projected_gd_step,
    regularized_loss,
    representation_descent,
    representation_loss,
    tikhonov_loss,
    weights_from_representations,
)
from .sparsity import caratheodory_reduce, class_separation, merge_aligned_neurons, pad_width, pattern_merge, ray_share

__all__ = [
    "singular_values",
    "stable_rank",
    "nuclear_rank",
    "effective_rank",
    "numerical_rank",
    "cost_of_identity",
    "backward_variables",
    "geodesic_diagnostics",
    "balancedness_residual",
    "bottleneck_rank",
    "classify_minimum",
    "layer_proxy",
    "rebalance",
    "representation_spectra",
    "theorem3_check",
    "theorem6_check",
    "theorem7_check",
    "jacobian",
    "jacobian_ranks",
    "ntk_trace",
    "ntk_trace_closed_form",
    "balanced_factorization",
    "estimate_representation_cost",
    "linear_expansion",
    "linear_representation_cost",
    "log_pdet",
    "pdet",
    "pseudo_log",
    "CovariancePair",
    "LayerForces",
    "RepresentationLoss",
    "covariance_pairs",
    "layer_forces",
    "principal_view",
    "project_representations",
    "projected_gd_step",
    "regularized_loss",
    "representation_descent",
    "representation_loss",
    "tikhonov_loss",
    "weights_from_representations",
    "caratheodory_reduce",
    "class_separation",
    "merge_aligned_neurons",
    "pad_width",
    "pattern_merge",
    "ray_share",
    "EscapeSearch",
    "blowup_time",
    "cross_entropy_gradient",
    "eig_residual",
    "eq6_curve",
    "escape_norm",
    "escape_speed",
    "escape_time",
    "extend_depth",
    "find_escape_directions",
    "layer_diagnostics",
    "localized_loss",
    "prop33_check",
    "prop34_check",
    "rank_one_chain",
    "rank_one_curve",
    "tail_ratio",
    "theorem31_bound",
    "adjacent_alignment",
    "layer_ratios",
    "theorem2_bounds",
    "theorem2_constants",
    "Invariant",
    "InvariantSet",
    "InvariantTracker",
    "drift_slope",
    "flow_derivative",
    "gram_difference",
    "identity_block_controls",
    "invariants",
    "noninvariance_flow",
    "enumerate_paths",
    "path_enumeration",
    "tree_network",
]
