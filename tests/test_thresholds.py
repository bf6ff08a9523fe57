"""Every claim threshold is the number its documentation states.

Two tables hold the experiments' `Threshold` constants: ``docs/experiments.md`` "Claim thresholds" lists each with
its relation, number and source, and the rows below tie the numbers our theory pages state (the papers' numbers or
ours, with the text that states them) to the constants. A threshold changed in the code, or in the docs, fails
here; a threshold added without a documented source fails here too.
"""

import ast
import importlib
import math
import re
from pathlib import Path

import pytest

from featurelab.claims import Threshold

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "src" / "featurelab" / "experiments"
ROW = re.compile(r"^\| `(\w+)` \| `(\w+)(?:\[(\d)\])?` \| `(<=|>=|==|<|>) ([^`]+)`((?:, \w+ [^,|]+)*) \| (.+) \|$")


def own_thresholds() -> dict[tuple[str, str], Threshold]:
    """``{(module, name): threshold}`` for every `Threshold` (or tuple of them, as ``name[i]``) assigned at the top
    level of an experiment module (read with `ast`, so an imported one counts only where it is defined)."""
    out = {}
    for path in sorted(EXPERIMENTS.glob("[!_]*.py")):
        module = importlib.import_module(f"featurelab.experiments.{path.stem}")
        tree = ast.parse(path.read_text())
        names = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
        for name in names:
            value = getattr(module, name)
            if isinstance(value, Threshold):
                out[path.stem, name] = value
            elif isinstance(value, tuple) and value and all(isinstance(v, Threshold) for v in value):
                out.update({(path.stem, f"{name}[{i}]"): v for i, v in enumerate(value)})
    return out


def documented() -> dict[tuple[str, str], dict]:
    """The rows of docs/experiments.md's "Claim thresholds" table, by (module, name)."""
    text = (ROOT / "docs" / "experiments.md").read_text()
    rows = {}
    for line in text.split("## Claim thresholds", 1)[1].split("\n## ", 1)[0].splitlines():
        m = ROW.match(line)
        if m:
            module, name, index, relation, bound, tols, source = m.groups()
            key = name if index is None else f"{name}[{index}]"
            tol = dict(t.split(" ", 1) for t in tols.strip(", ").split(", ") if t)
            rows[module, key] = {
                "relation": relation,
                "bound": float(bound),
                "rtol": float(tol.get("rtol", 0)),
                "atol": float(tol.get("atol", 0)),
                "source": source,
            }
    return rows


CODE = own_thresholds()


def test_every_threshold_is_documented_and_every_documented_one_exists():
    docs = documented()
    assert len(docs) > 50
    assert sorted(CODE) == sorted(docs)


@pytest.mark.parametrize("key", sorted(CODE), ids=lambda k: f"{k[0]}.{k[1]}")
def test_a_threshold_is_its_documented_number_and_source(key):
    th, row = CODE[key], documented()[key]
    assert th.relation == row["relation"]
    assert math.isclose(th.bound, row["bound"], rel_tol=1e-11, abs_tol=1e-300)
    assert math.isclose(th.rtol, row["rtol"], rel_tol=1e-11) and math.isclose(th.atol, row["atol"], rel_tol=1e-11)
    assert th.source == row["source"]
    assert "ours" in th.source or re.search(r"\b20\d\d\b", th.source), "a source names the paper (year) or says ours"


# (module, threshold, theory page, the text that states it, what it pins: bound, or (lo, hi) of an "==" window)
SPEC = [
    ("leaky_bottleneck", "F4_GAP", "leaky-resnets.md", "at least 10× larger than the rest", 10.0),
    ("leaky_hamiltonian", "COI_NEAR_K", "leaky-resnets.md", "lies in [k* − 0.5, k* + 1.5] at L̃ = 8", (-0.5, 1.5)),
    ("leaky_hamiltonian", "KAPPA_AT_ENDS", "leaky-resnets.md", "κ at the first layer is ≥ 10× the mid-half", 10.0),
    ("leaky_hamiltonian", "H_FLAT", "leaky-resnets.md", "over layers is ≤ 0.25× that of `COI_γ`", 0.25),
    ("saddle_digits", "DEEP_RANK_ONE", "saddle-to-saddle.md", "`r_W(4), r_W(5) ≤ 0.1`", 0.1),
    ("saddle_digits", "LAST_RANK_ONE", "saddle-to-saddle.md", "`r_W(6) ≤ 0.02`", 0.02),
    ("saddle_digits", "SECOND_SV", "saddle-to-saddle.md", "final max `s_2/s_1` over layers 3–5 ≥ 0.3", 0.3),
    ("saddle_digits", "LN10_PLATEAU", "saddle-to-saddle.md", "The first plateau should sit at", (2.2925851, 2.3125851)),
    ("escape_circle", "HALF_SPEED", "saddle-to-saddle.md", "runs end within 1e-3 of 0.5", (0.499, 0.501)),
    ("invariance_drift", "INSCOPE_DRIFT", "invariances.md", "in-scope `rel_drift ≤ 1e-3` at η = 0.01", 1e-3),
    ("invariance_drift", "DRIFT_SLOPE", "invariances.md", "slope in [0.8, 1.2]", (0.8, 1.2)),
    ("alignment", "CONVERGED", "invariances.md", "Pass: loss < 1e-3 and 100 % accuracy", 1e-3),
    ("alignment", "TAIL_RANK_ONE", "invariances.md", "every tail ratio ≥ 0.88", 0.88),
    ("alignment", "TAIL_GAIN", "invariances.md", "up by at least 0.5 from initialisation", 0.5),
    ("alignment", "TAIL_ALIGNED", "invariances.md", "alignment ≥ 0.99", 0.99),
    ("relu_noninvariance", "EQUAL_DRIFT", "invariances.md", "AA and diagonal ≤ 2e-3", 2e-3),
    ("relu_noninvariance", "HALVES", "invariances.md", "halving with η (factor in [0.4, 0.6])", (0.4, 0.6)),
    ("relu_noninvariance", "MIXED_DRIFT", "invariances.md", "BB and AB ≥ 2e-2", 2e-2),
    ("relu_noninvariance", "ETA_FREE", "invariances.md", "varying by less than 10 % across η", 0.1),
    ("relu_noninvariance", "SEPARATION", "invariances.md", "separation ≥ 30× at η = 0.025", 30.0),
    ("symmetry_learning", "S3_BELOW", "bottleneck-rank.md", "`s₃/s₁ < 0.05` and `s₂/s₁ > 0.05`", 0.05),
    ("symmetry_learning", "S2_ABOVE", "bottleneck-rank.md", "`s₃/s₁ < 0.05` and `s₂/s₁ > 0.05`", 0.05),
    ("symmetry_learning", "R2_ABS_M", "bottleneck-rank.md", "Z → |m| ≥ 0.95", 0.95),
    ("symmetry_learning", "R2_R", "bottleneck-rank.md", "Z → r ≥ 0.9", 0.9),
    ("symmetry_learning", "R2_REVERSE", "bottleneck-rank.md", "(|m|, r) → Z ≥ 0.95", 0.95),
    ("symmetry_learning", "SIGN_FORGOTTEN", "bottleneck-rank.md", "Z → signed m < 0.1", 0.1),
    ("symmetry_learning", "SYMMETRIC_CHANGE", "bottleneck-rank.md", "under `I − 2uuᵀ` is < 0.05", 0.05),
    ("symmetry_learning", "CONTROL_CHANGE", "bottleneck-rank.md", "and > 0.5 for a random orthogonal control", 0.5),
    ("width_plateau", "DIGITS_M4_GAP", "sparsity.md", "`m(4) ≥ 1.4 m_∞`", 1.4),
    ("width_plateau", "DIGITS_START[0]", "sparsity.md", "`n*(5 %) ∈ [8, 16]`", 8),
    ("width_plateau", "DIGITS_START[1]", "sparsity.md", "`n*(5 %) ∈ [8, 16]`", 16),
    ("width_plateau", "DIGITS_NSTAR_1PCT", "sparsity.md", "`n*(1 %) ≤ 48`", 48),
    ("width_plateau", "DIGITS_TEST_ERROR", "sparsity.md", "test error ≤ 5 % for w ≥ 16", 0.05),
    ("width_plateau", "TEACHER_M1_GAP", "sparsity.md", "`m(1) ≥ 5 m_∞`", 5),
    ("width_plateau", "TEACHER_START[0]", "sparsity.md", "`n*(10 %) ∈ [6, 32]`", 6),
    ("width_plateau", "TEACHER_START[1]", "sparsity.md", "`n*(10 %) ∈ [6, 32]`", 32),
    ("width_plateau", "MNIST_START[0]", "sparsity.md", "MNIST paper preset: `n*(5 %) ∈ [8, 20]`", 8),
    ("width_plateau", "MNIST_START[1]", "sparsity.md", "MNIST paper preset: `n*(5 %) ∈ [8, 20]`", 20),
    ("cp_rank", "BALANCED", "sparsity.md", "`‖F^att + F^rep‖ ≤ 1e-10 ‖F^att‖`", 1e-10),
    ("cp_rank", "EXACT", "sparsity.md", "with reconstruction error ≤ 1e-12", 1e-12),
]


@pytest.mark.parametrize("module, name, page, text, pinned", SPEC, ids=[f"{r[0]}.{r[1]}" for r in SPEC])
def test_a_threshold_is_the_number_the_theory_page_states(module, name, page, text, pinned):
    stated = " ".join((ROOT / "docs" / "theory" / page).read_text().split())
    assert text in stated, f"docs/theory/{page} no longer states {text!r}"
    th = CODE[module, name]
    if isinstance(pinned, tuple):  # an "==" window: bound ± atol (+ rtol·|bound|)
        half = th.atol + th.rtol * abs(th.bound)
        assert th.relation == "==" and (th.bound - half, th.bound + half) == pytest.approx(pinned, rel=1e-7)
    else:
        assert th.bound == pytest.approx(pinned, rel=1e-12)


def test_the_ln10_plateau_is_ln_10():
    """The origin saddle's loss is the cross-entropy of a uniform guess over 10 classes (Bantzis et al. 2025 §4)."""
    assert CODE["saddle_digits", "LN10_PLATEAU"].bound == pytest.approx(math.log(10), rel=1e-15)
