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
from featurelab.progress import TimeLeft, UnitsProgress, fmt_duration
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


PAIR = Experiment(
    name="test-reproduce-pair",
    summary="test-only: two units, one claim that always passes",
    reference="tests",
    config=SeedsConfig,
    presets={"quick": {}},
    units=lambda cfg: [{"id": "a"}, {"id": "b"}],
    analyze=lambda cfg, results, ctx: Analysis([threshold_claim("two units", "test", len(results), 2, ">=", id="n")]),
    run_unit=lambda cfg, unit, ctx: {"seed": cfg.seed},
)
REGISTRY[PAIR.name] = PAIR


def test_time_left_is_the_mean_seconds_per_unit_run_times_the_units_left():
    now = [0.0]
    t = TimeLeft({"a": 4, "b": 6, "c": 2}, clock=lambda: now[0])
    assert t.left() is None and t.left("a") is None and t.status("a").endswith("all 0/12 units, time left unknown")
    now[0] = 10.0
    assert t.add("a", 2, 2) == 10.0  # 2 units in 10 s: 5 s a unit, for a and, before they run, for b and c
    assert (t.left("a"), t.left("b"), t.left("c"), t.left()) == (2 * 5, 6 * 5, 2 * 5, 10 * 5)
    t.start()
    now[0] = 10.5
    t.add("a", 2, 0)  # found finished: done, the half second not counted
    assert t.left("a") == 0 and t.per_unit("a") == 5
    t.start()
    now[0] = 40.5
    t.add("b", 3, 3)  # 3 units in 30 s: 10 s a unit for b; c takes the mean over all, (10 + 30) / (2 + 3)
    assert (t.left("b"), t.per_unit(), t.left("c"), t.left()) == (3 * 10, 8, 2 * 8, 30 + 16)
    assert t.status("b") == "b 3/6 units, ~30s left; all 7/12 units, ~46s left"
    t.start()
    now[0] = 40.5 + 3 * 3600
    t.add("c", 2, 2)
    assert t.status("c") == "c 2/2 units, done; all 9/12 units, ~30s left"  # b keeps its own 10 s a unit
    assert t.per_unit() == pytest.approx((10 + 30 + 3 * 3600) / (2 + 3 + 2))


@pytest.mark.parametrize(
    "seconds, text", [(0, "0s"), (59.4, "59s"), (59.6, "1m 00s"), (185, "3m 05s"), (3599.6, "1h 00m"), (7620, "2h 07m")]
)
def test_durations_for_a_person(seconds, text):
    assert fmt_duration(seconds) == text


def fake_clock(monkeypatch, step: float = 5.0):
    """`featurelab.progress`'s clock advanced by `step` seconds at each reading: every run lasts `step` s."""
    ticks = iter(range(10**6))
    monkeypatch.setattr("featurelab.progress.monotonic", lambda: step * next(ticks))


def test_reproduce_logs_units_done_and_time_left_per_experiment_and_in_all(tmp_path, monkeypatch, capsys):
    """In a log (no terminal): one line per finished run. seeds (1 unit a run) runs first at 5 s a unit; pair
    (2 units a run) is estimated at that rate until its first run takes 5 s for 2 units."""
    fake_clock(monkeypatch)
    out = tmp_path / "all"
    argv = ["reproduce", "--only", f"{SEEDS.name},{PAIR.name}", "--seeds", "0", "--workers", "1", "--out", str(out)]
    assert main(argv) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("progress: ")]
    s, p = SEEDS.name, PAIR.name
    assert lines == [
        f"progress: {s} seed-0: 1 of 1 units run in 5s; {s} 1/2 units, ~5s left; all 1/6 units, ~25s left",
        f"progress: {s} float64: 1 of 1 units run in 5s; {s} 2/2 units, done; all 2/6 units, ~20s left",
        f"progress: {p} seed-0: 2 of 2 units run in 5s; {p} 2/4 units, ~5s left; all 4/6 units, ~5s left",
        f"progress: {p} float64: 2 of 2 units run in 5s; {p} 4/4 units, done; all 6/6 units, done",
    ]
    (out / PAIR.name / "float64" / "results.json").unlink()  # an interrupted run: its units are found finished
    assert main(argv + ["--quiet"]) == 0
    assert "progress" not in capsys.readouterr().out  # quiet: no progress at all
    assert main(argv) == 0
    assert f"progress: {p} float64: 0 of 2 units run in 5s; {p} 4/4 units, done" in capsys.readouterr().out


def test_reproduce_in_a_terminal_draws_one_bar_with_the_time_left(tmp_path, monkeypatch, capsys):
    fake_clock(monkeypatch)
    index = reproduce("quick", [0], tmp_path / "all", only=[SEEDS.name, PAIR.name], workers=1, progress=True)
    assert index["reproduced"] == 3
    out, err = capsys.readouterr()
    assert "progress:" not in out and f"{SEEDS.name} quick seed-0: " in out  # the runs' folders still listed
    assert "\r" in err and "6/6 units" in err and "all 6/6 units, done" in err
    assert f"{SEEDS.name} seed-0: 1/6 units" in err and "all 1/6 units, ~25s left" in err
    assert f"{PAIR.name} seed-0: 2/6 units" in err and f"{PAIR.name} 0/4 units, ~20s left" in err  # as it starts


def test_the_bar_is_redrawn_while_a_long_run_goes_on(monkeypatch, capsys):
    """Its elapsed time runs on between finished runs: a thread redraws it every TICK seconds, until closed."""
    import threading
    import time

    monkeypatch.setattr(UnitsProgress, "TICK", 0.05)
    meter = UnitsProgress({"slow": 1}, progress=True)
    meter.begin("slow", "seed-0")
    time.sleep(0.5)
    meter.end("slow", "seed-0", 1, 1)
    meter.close()
    assert capsys.readouterr().err.count("slow seed-0: 0/1 units") >= 5  # drawn at start, then ~10 ticks
    time.sleep(0.2)
    assert not any(t.name == "featurelab-progress" for t in threading.enumerate())
