"""Verdicts judged across seeds and float64 (`run --seeds`, `reproduce`), the exit status of a run whose
claims do not all pass, the Markdown tables regenerated between their markers, and resumption that trusts
only results carrying their checksum.

`SEEDS` is a test-only experiment of one unit, no training: its claim ``fragile`` fails exactly under the
seed ``fragile_seed``, ``robust`` always passes, ``ident`` is a check of the code.
"""

import json

import pytest

from featurelab import FeaturelabError
from featurelab.claims import threshold_claim
from featurelab.cli import main
from featurelab.config import ExperimentConfig
from featurelab.experiments import REGISTRY
from featurelab.experiments.base import Analysis, Experiment
from featurelab.io import read_json, write_json
from featurelab.runs.reproduce import (
    BEGIN,
    END,
    markdown_tables,
    reproduce,
    robustness_html,
    robustness_table,
    run_robustness,
    tier_text,
    update_markdown,
)
from featurelab.runs.runner import resolve_config
from featurelab.runs.sweep import finished


class SeedsConfig(ExperimentConfig):
    dtype: str = "float32"
    fragile_seed: int = 1


def seeds_analyze(cfg, results, ctx):
    (r,) = results.values()
    return Analysis(
        [
            threshold_claim("always above 1", "test", 2.0, 1.0, ">=", id="robust"),
            threshold_claim(
                "above 1 but under one seed",
                "test",
                0.0 if r["seed"] == cfg.fragile_seed else 2.0,
                1.0,
                ">=",
                id="fragile",
            ),
            threshold_claim("an identity", "test", 1.0, 1.0, "<=", id="ident", kind="identity"),
        ]
    )


SEEDS = Experiment(
    name="test-reproduce-seeds",
    summary="test-only: one unit, a claim that fails under one seed",
    reference="tests",
    config=SeedsConfig,
    presets={"quick": {}},
    units=lambda cfg: [{"id": "u"}],
    analyze=seeds_analyze,
    run_unit=lambda cfg, unit, ctx: {"seed": cfg.seed, "dtype": cfg.dtype},
)
REGISTRY[SEEDS.name] = SEEDS
RUN = {"workers": 1, "progress": False}


def files(folder):
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.suffix != ".lock"}


def test_a_claim_is_reproduced_when_it_passes_under_every_seed_and_float64(tmp_path):
    out = tmp_path / "rob"
    table = run_robustness(SEEDS.name, "quick", [0, 1], out=out, echo=lambda *a: None, **RUN)
    assert [v["label"] for v in table["variants"]] == ["seed-0", "seed-1", "float64"]
    unit = read_json(out / "float64" / "units" / "u" / "result.json", checksum=True)["result"]
    assert unit == {"seed": 0, "dtype": "float64"}  # float64 runs the first seed
    claims = {c["id"]: c for c in table["claims"]}
    assert claims["fragile"]["verdicts"] == {"seed-0": "PASS", "seed-1": "FAIL", "float64": "PASS"}
    assert claims["fragile"]["margins"] == {"seed-0": 1.0, "seed-1": -1.0, "float64": 1.0}
    assert claims["fragile"]["min_margin"] == -1.0 and not claims["fragile"]["reproduced"]
    assert claims["robust"]["reproduced"]
    assert claims["ident"]["kind"] == "identity" and not claims["ident"]["reproduced"]  # never counted
    assert (table["reproduced"], table["empirical"], table["identity"]) == (1, 2, 1)
    assert json.loads((out / "robustness.json").read_text()) == json.loads(json.dumps(table))
    html = (out / "robustness.html").read_text()
    assert "1 of 2 claims reproduced" in html and "href='seed-1/report.html'" in html
    before = files(out)  # resumable: finished variants are read, not run again
    again = run_robustness(SEEDS.name, "quick", [0, 1], out=out, echo=lambda *a: None, **RUN)
    assert again == table and {p: b for p, b in files(out).items() if "robustness" not in p.name} == {
        p: b for p, b in before.items() if "robustness" not in p.name
    }


def test_no_float64_variant_when_the_preset_is_float64_already(tmp_path):
    table = run_robustness(
        SEEDS.name, "quick", [2], {"dtype": "float64"}, out=tmp_path / "r", echo=lambda *a: None, **RUN
    )
    assert [v["label"] for v in table["variants"]] == ["seed-2"] and table["reproduced"] == 2


def test_exit_status_follows_the_claims(tmp_path, capsys):
    base = ["run", SEEDS.name, "--quiet", "--workers", "1"]
    assert main(base + ["--out", str(tmp_path / "a"), "--seed", "1"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("featurelab: not every claim passed")
    assert main(base + ["--out", str(tmp_path / "b"), "--seed", "0"]) == 0
    assert main(base + ["--out", str(tmp_path / "c"), "--seeds", "0,2"]) == 0
    assert "claims reproduced (pass under every variant): 2/2" in capsys.readouterr().out
    assert main(base + ["--out", str(tmp_path / "d"), "--seeds", "0,1"]) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "0,x"], "--seeds='0,x' is not allowed"),
        (["--seeds", "0,0"], "the seeds must be distinct"),
        (["--seeds", "0,-1"], "give one or more integers >= 0"),
        (["--seeds", "0", "--seed", "3"], "--seed and --seeds exclude each other"),
    ],
)
def test_bad_seeds_are_one_line_before_anything_is_written(tmp_path, capsys, args, message):
    assert main(["run", SEEDS.name, "--out", str(tmp_path / "x"), "--quiet"] + args) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_reproduce_writes_an_index_and_regenerates_the_markdown_tables(tmp_path):
    out = tmp_path / "all"
    index = reproduce("quick", [0, 1], out, only=[SEEDS.name], echo=lambda *a: None, **RUN)
    assert (index["reproduced"], index["empirical"], index["identity"]) == (1, 2, 1)
    assert json.loads((out / "index.json").read_text())["tables"][0]["experiment"] == SEEDS.name
    assert f"href='{SEEDS.name}/seed-1/report.html'" in (out / "index.html").read_text()
    doc = tmp_path / "reproduction.md"
    doc.write_text(f"# Prose\n\nhand-written\n\n{BEGIN}\nstale\n{END}\n\nmore prose\n")
    update_markdown(doc, out / "index.json")
    text = doc.read_text()
    assert text.startswith("# Prose\n\nhand-written\n\n") and text.endswith(f"{END}\n\nmore prose\n")
    assert "stale" not in text and "**1 of 2 empirical claims reproduced**" in text
    assert "| `fragile` | PASS +100% | FAIL -100% | PASS +100% | **no** |" in text
    assert "| `ident` | PASS +0% | PASS +0% | PASS +0% | identity |" in text
    update_markdown(doc, out / "index.json")
    assert doc.read_text() == text  # regenerating changes nothing
    doc.write_text("no markers\n")
    with pytest.raises(FeaturelabError, match="must hold the marker lines"):
        update_markdown(doc, out / "index.json")


def test_a_result_without_its_checksum_is_refused(tmp_path):
    """Resumption reads a unit's result only with its sha256: a file whose ``sha256`` key was removed
    (or never written) is a one-line error, not a result."""
    run = tmp_path / "run"
    main(["run", SEEDS.name, "--out", str(run), "--quiet", "--workers", "1"])
    _, cfg = resolve_config(SEEDS.name, "quick")
    path = run / "units" / "u" / "result.json"
    assert finished(run, "u", cfg) == {"seed": 0, "dtype": "float32"}
    record = json.loads(path.read_text())
    del record["sha256"]
    path.write_text(json.dumps(record))
    with pytest.raises(FeaturelabError, match="fails its sha256 checksum"):
        finished(run, "u", cfg)
    write_json(tmp_path / "plain.json", {"a": 1})
    with pytest.raises(FeaturelabError, match="fails its sha256 checksum"):
        read_json(tmp_path / "plain.json", checksum=True)


def test_robustness_tables_show_both_tiers_and_reproduce_each_apart():
    """A claim that passes as the paper did under every seed but not when certified is reproduced in the first
    tier only; the Markdown cell carries both verdicts, the certified one with its error bar."""
    base = {"statement": "s", "reference": "r", "expected": "<= 2", "measured": "1", "kind": "empirical"}
    tiers = {"certified_measured": "1.5", "certified_margin": 0.25, "error_bar": 0.01, "stationarity": 0.1}

    def run(label, certified_passed):
        c = base | {"id": "rank", "passed": True, "margin": 0.5} | tiers | {"certified_passed": certified_passed}
        ident = base | {"id": "sum", "passed": True, "margin": 0.0, "kind": "identity"}
        return {"label": label, "seed": 0, "dir": label, "claims": [c, ident], "problems": "", "error": ""}

    counts = ("reproduced", "empirical", "certified_reproduced", "certified")

    table = robustness_table("x", "quick", [run("seed-0", True), run("seed-1", False)])
    rank = next(c for c in table["claims"] if c["id"] == "rank")
    assert rank["reproduced"] is True and rank["certified_reproduced"] is False
    assert (table["reproduced"], table["certified_reproduced"], table["certified"]) == (1, 0, 1)
    assert tier_text(rank, "seed-0") == "cert PASS +25% ±1%" and tier_text(rank, "seed-1") == "cert FAIL +25% ±1%"
    index = {"preset": "quick", "seeds": [0, 1], "tables": [table], **{k: table[k] for k in counts}, "identity": 1}
    text = markdown_tables(index)
    assert (
        "| `rank` | PASS +50% · cert PASS +25% ±1% | PASS +50% · cert FAIL +25% ±1% | yes (certified: **no**) |" in text
    )
    assert "| `sum` | PASS +0% | PASS +0% | identity |" in text and "Certified tier: **0 of 1 reproduced**" in text
    assert "certified reproduced" in robustness_html(table)
