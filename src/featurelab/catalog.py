"""The experiments' names, presets and one-line descriptions, readable without importing any of them.

The command line's ``list`` and ``--help`` read this table, so they answer without importing torch;
`featurelab.experiments.REGISTRY` is the source of truth and ``tests/test_cli.py`` checks that the two
agree (names in order, presets).
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    name: str
    presets: tuple[str, ...]
    what: str  # paper and figure, then what it checks


CATALOG: tuple[Entry, ...] = (
    Entry("leaky-bottleneck", ("quick", "tiny", "paper"), "Jacot & Kaiser Fig. 1: a k*-dim bottleneck in the middle"),
    Entry("leaky-hamiltonian", ("quick", "tiny", "paper"), "Jacot & Kaiser Figs. 1, 3: Hamiltonian, cost of identity"),
    Entry("leaky-discretization", ("quick", "tiny", "paper"), "Jacot & Kaiser Fig. 2: equidistant/adaptive steps"),
    Entry("bn-rank-depth", ("quick", "tiny", "paper"), "Jacot 2023 Fig. 1: ‖θ‖² slope = rank; Theorem 3"),
    Entry("r1-properties", ("quick", "tiny", "paper"), "Jacot 2023 Theorem 3, Prop. 5: R(1) of trained nets"),
    Entry("symmetry-learning", ("quick", "tiny", "paper"), "Jacot 2023 Fig. 2: a 2-D bottleneck learns symmetries"),
    Entry("forces", ("quick", "tiny", "paper"), "Jacot et al. 2022 Fig. 1: attraction/repulsion, rays"),
    Entry("width-plateau", ("quick", "tiny", "paper"), "Jacot et al. 2022 Fig. 2: the loss plateaus in the width"),
    Entry("cp-rank", ("quick", "tiny", "paper"), "Jacot et al. 2022 Props. 13-14: N²/4 neurons"),
    Entry("escape-circle", ("quick", "tiny", "paper"), "Bantzis et al. Example 1: escape speeds √2-1 and 1/2"),
    Entry("saddle-digits", ("quick", "tiny", "paper"), "Bantzis et al. Fig. 1: plateaus at ln 10 and beyond"),
    Entry("saddle-mnist", ("quick", "paper", "depth4"), "Bantzis et al. Fig. 1 on local MNIST files"),
    Entry("invariances", ("quick", "tiny", "paper"), "Le & Jegelka §3: conserved quantities drift as O(η)"),
    Entry("alignment", ("quick", "tiny", "paper"), "Le & Jegelka Thm. 2: the linear tail aligns, rank one"),
    Entry("relu-noninvariance", ("quick", "tiny", "paper"), "Le & Jegelka Lemma 4: ReLU Gram differences move"),
)


def presets() -> list[str]:
    """Every preset name, in first-seen order."""
    return list(dict.fromkeys(p for e in CATALOG for p in e.presets))
