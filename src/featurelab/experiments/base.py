"""What an experiment is: a validated config with presets, a list of independent units of work
(one training run each, say), the function that runs one unit, and the analysis that turns the
units' results into figures, tables and claims.

Units are what the sweep mechanism distributes across worker processes and skips on ``--resume``;
`run_unit` must be a module-level function (it is pickled by name) and returns a JSON-able dict.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..config import ExperimentConfig
from ..runs.claims import Claim


@dataclass(frozen=True)
class UnitContext:
    """Where and how one unit runs: its own folder (checkpoints, history), device, resume flag."""

    dir: Path
    device: str = "cpu"
    resume: bool = False
    progress: bool = False


@dataclass(frozen=True)
class AnalysisContext:
    """The run folder, device, and the ids of units that failed (with their one-line errors)."""

    dir: Path
    device: str = "cpu"
    failed: dict[str, str] = field(default_factory=dict)


@dataclass
class Analysis:
    """What `analyze` returns: claims, matplotlib figures by name, tables (DataFrames) by name, a
    JSON-able summary of the headline numbers, and free-text notes for the report."""

    claims: list[Claim]
    figures: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Experiment:
    """A named, registered experiment (see `featurelab.experiments.REGISTRY`)."""

    name: str
    summary: str
    reference: str
    config: type[ExperimentConfig]
    presets: dict[str, dict]
    units: Callable[[ExperimentConfig], list[dict]]
    run_unit: Callable[[ExperimentConfig, dict, UnitContext], dict]
    analyze: Callable[[ExperimentConfig, dict[str, dict], AnalysisContext], Analysis]
