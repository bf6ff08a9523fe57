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
# --- Part 2: bottleneck rank, representation cost (issue 4) ---
# --- Part 3: attraction/repulsion, sparsity (issue 5) ---
# --- Part 4: saddle-to-saddle, escape directions (issue 6) ---
# --- Part 5: invariances, alignment (issue 7) ---
# --- Scale: ensembles, backends, bench (issue 8) ---
