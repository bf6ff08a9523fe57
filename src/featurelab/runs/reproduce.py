"""Verdicts that hold under other seeds and other rounding, and the whole reproduction in one command.

`run_robustness` runs one preset of an experiment under each of several seeds and once in float64 (seed
``seeds[0]``, ``dtype=float64``, where the config has a ``dtype`` field and the preset is not float64
already), each in its own run folder ``OUT/seed-<s>`` and ``OUT/float64`` (resumable: a finished folder is
only read). It then writes ``OUT/robustness.json`` and ``OUT/robustness.html``: per claim, every verdict
and margin, and whether it is *reproduced*: an empirical claim passes under every variant. A claim of kind
"identity" (a check of the code, true for any parameters) is listed apart and never counted as reproduced.

`reproduce` does this for every experiment that needs no local files, one folder each, and writes
``OUT/index.json`` and ``OUT/index.html`` (every claim of the five papers, linking each report);
`update_markdown` regenerates the tables of a Markdown file (docs/reproduction.md) from ``index.json``
between the markers `BEGIN` and `END`, leaving the hand-written text around them.

Both follow their units with `featurelab.progress.UnitsProgress`: units done and time left per experiment and
in all, on a bar in a terminal, one line per finished run in a log (docs/experiments.md, "Time left of
`featurelab reproduce`").
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..claims import TIERS, fmt_error_bar, fmt_margin, has_tier, tier_verdict, verdict
from ..errors import FeaturelabError
from ..io import read_json, write_json, write_text
from ..progress import UnitsProgress
from .report import page_head
from .runner import finished_record, resolve_config, run_experiment

FLOAT64 = "float64"
NEEDS_LOCAL_FILES = ("saddle-mnist",)  # MNIST is read from disk, never downloaded: not part of `reproduce`
BEGIN = "<!-- featurelab reproduce --markdown: generated tables begin -->"
END = "<!-- featurelab reproduce --markdown: generated tables end -->"


@dataclass(frozen=True)
class Variant:
    """One run of a robustness check: its folder name, master seed, config overrides and number of units."""

    label: str
    seed: int
    overrides: dict
    units: int = 0


def variants(name: str, preset: str, seeds: Sequence[int], overrides: dict | None = None) -> list[Variant]:
    """One `Variant` per seed, plus a float64 one at ``seeds[0]`` where experiment `name`'s config has a
    ``dtype`` field that the preset (with `overrides`) does not already set to float64, each with the number
    of units its run has. Checked up front:
    the seeds (distinct integers >= 0, at least one) and every variant's config (one-line errors)."""
    seeds = list(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise FeaturelabError(f"seeds={seeds!r} is not allowed: give one or more integers >= 0, e.g. 0,1,2")
    if len(set(seeds)) != len(seeds):
        raise FeaturelabError(f"seeds={seeds!r} is not allowed: the seeds must be distinct")
    base = dict(overrides or {})
    out = [Variant(f"seed-{s}", s, base) for s in seeds]
    _, cfg = resolve_config(name, preset, base, seeds[0])
    if "dtype" in type(cfg).model_fields and cfg.model_dump().get("dtype") != FLOAT64:
        out.append(Variant(FLOAT64, seeds[0], {**base, "dtype": FLOAT64}))
    return [replace(v, units=_unit_count(name, preset, v)) for v in out]


def _unit_count(name: str, preset: str, v: Variant) -> int:
    """The number of units of variant `v`'s run, its config checked (one-line errors)."""
    exp, cfg = resolve_config(name, preset, v.overrides, v.seed)
    return len(exp.units(cfg))


def _units_found(folder: Path, units: int) -> int:
    """How many of a run's `units` its `folder` holds finished: all in a finished run, else its units' results."""
    if (folder / "results.json").is_file():
        return units
    return min(units, sum(1 for _ in folder.glob("units/*/result.json")))


def run_robustness(
    name: str,
    preset: str = "quick",
    seeds: Sequence[int] = (0, 1, 2),
    overrides: dict | None = None,
    out: str | Path | None = None,
    echo=print,
    collect: bool = False,
    meter: UnitsProgress | None = None,
    **run_kwargs,
) -> dict:
    """Run `name` at `preset` under each variant (`variants`) in ``out/<label>`` (default
    ``runs/<name>-<preset>-seeds``), resuming what exists, and write ``robustness.json`` and
    ``robustness.html`` in `out`; returns the robustness record (`robustness_table`). A variant that ends
    in an error is recorded with it (its claims count as not reproduced) and the others go on.
    collect: run nothing; read the variants that finished (runs made elsewhere, e.g. in parallel on a
    bigger machine) and record the others as not run.
    meter: the progress that each finished variant advances (default: one of this experiment's alone, shown
    as ``run_kwargs["progress"]`` says; none when collecting).
    run_kwargs: passed to `featurelab.runs.run_experiment` (workers, threads, device, progress, ...)."""
    todo = variants(name, preset, list(seeds), overrides)
    root = Path(out) if out is not None else Path("runs") / f"{name}-{preset}-seeds"
    own = meter is None
    if meter is None:
        progress = False if collect else run_kwargs.get("progress")
        meter = UnitsProgress({name: sum(v.units for v in todo)}, progress, echo, desc=name)
    try:
        runs = [_run_variant(name, preset, v, root / v.label, meter, collect, run_kwargs) for v in todo]
        table = robustness_table(name, preset, runs)
        write_json(root / "robustness.json", table)
        page = page_head(f"{name} robustness") + robustness_html(table) + "</body></html>"
        write_text(root / "robustness.html", page)
        meter.say(f"robustness: {(root / 'robustness.html').resolve()}")
    finally:
        if own:
            meter.close()
    return table


def _run_variant(name: str, preset: str, v: Variant, folder: Path, meter, collect: bool, run_kwargs: dict) -> dict:
    """Variant `v` of `name` run in `folder` (or its finished run read, `collect`), timed by `meter`: its run
    dict for `robustness_table`, with the error that ended it, if any."""
    meter.say(f"{name} {preset} {v.label}: {folder}")
    found, ran = _units_found(folder, v.units), 0
    meter.begin(name, v.label)
    try:
        if collect and not (folder / "results.json").exists():
            raise FeaturelabError(f"not run: no finished run in {v.label}/")
        record = (
            finished_record(folder)
            if collect
            else run_experiment(name, preset, v.overrides, out=folder, seed=v.seed, resume=True, **run_kwargs)
        )
        ran = 0 if collect else v.units - found
        run = {"claims": record.claims, "problems": record.problems, "error": ""}
    except FeaturelabError as exc:
        run = {"claims": [], "problems": "", "error": str(exc)}
        meter.say(f"  error: {exc}")
    meter.end(name, v.label, v.units, ran)
    return {"label": v.label, "seed": v.seed, "dir": v.label, **run}


def robustness_table(name: str, preset: str, runs: list[dict]) -> dict:
    """The robustness record of experiment `name` from its variant runs (dicts with ``label``, ``seed``,
    ``dir``, ``claims`` (the claim dicts), ``problems`` and ``error``): per claim (matched by id) its
    statement, reference, kind and, per variant, verdict, margin and reason; ``reproduced`` is true for
    an empirical claim that passes under every variant (a variant that lacks it counts as not passing)."""
    labels = [r["label"] for r in runs]
    rows: dict[str, dict] = {}
    for r in runs:
        for c in r["claims"]:
            key = c.get("id") or c["statement"]
            row = rows.setdefault(
                key,
                {
                    "id": key,
                    "statement": c["statement"],
                    "reference": c["reference"],
                    "expected": c["expected"],
                    "kind": c.get("kind", "empirical"),
                    "verdicts": {},
                    "margins": {},
                    "headrooms": {},
                    "measured": {},
                    "reasons": {},
                    **{k: {} for k in CERTIFIED_KEYS},
                },
            )
            _record(row, r["label"], c)
    for row in rows.values():
        passes = [row["verdicts"].get(label) == "PASS" for label in labels]
        row["reproduced"] = row["kind"] == "empirical" and bool(passes) and all(passes)
        certified = [row["certified_verdicts"].get(label) == "PASS" for label in labels]
        row["certified_reproduced"] = row["kind"] == "empirical" and bool(certified) and all(certified)
        finite = [m for m in row["margins"].values() if isinstance(m, (int, float))]
        row["min_margin"] = min(finite) if finite else None
    claims = list(rows.values())
    empirical = [c for c in claims if c["kind"] == "empirical"]
    return {
        "experiment": name,
        "preset": preset,
        "variants": [
            {k: r[k] for k in ("label", "seed", "dir", "problems", "error")} | {"report": f"{r['dir']}/report.html"}
            for r in runs
        ],
        "claims": claims,
        "reproduced": sum(c["reproduced"] for c in empirical),
        "empirical": len(empirical),
        "identity": len(claims) - len(empirical),
        "certified_reproduced": sum(c["certified_reproduced"] for c in empirical),
        "certified": sum(bool(c["certified_verdicts"]) for c in empirical),
    }


CERTIFIED_KEYS = ("certified_verdicts", "certified_margins", "error_bars", "certified_reasons", "stationarity")


def _record(row: dict, label: str, c: dict) -> None:
    """Variant `label`'s claim `c` into the robustness `row`: both tiers' verdicts, margins, reasons (tier
    "certified" only where the claim has it, `has_tier`)."""
    row["verdicts"][label] = verdict(c["passed"])
    row["margins"][label] = c.get("margin")
    if c.get("headroom") is not None:
        row["headrooms"][label] = c["headroom"]
    row["measured"][label] = c["measured"]
    if c.get("reason"):
        row["reasons"][label] = c["reason"]
    if c.get("stationarity") is not None:
        row["stationarity"][label] = c["stationarity"]
    if not has_tier(c):
        return
    row["certified_verdicts"][label] = tier_verdict(c)
    row["certified_margins"][label] = c.get("certified_margin")
    row["error_bars"][label] = c.get("error_bar")
    if c.get("certified_reason"):
        row["certified_reasons"][label] = c["certified_reason"]


def margin_text(row: dict, label: str, key: str = "margins") -> str:
    """Variant `label`'s margin in the robustness `row` (``key``: "margins" or "certified_margins"), of its
    headroom where the claim has one ("+0.9% of +1%", `featurelab.claims.fmt_margin`)."""
    return fmt_margin(row[key].get(label), row.get("headrooms", {}).get(label))


def tier_text(row: dict, label: str) -> str:
    """Tier "certified"'s cell text of variant `label` ("cert PASS +12% ±0.1%"; "" without that tier)."""
    v = row.get("certified_verdicts", {}).get(label)
    if not v:
        return ""
    bar = fmt_error_bar(row.get("error_bars", {}).get(label))
    return " ".join(x for x in ("cert", v, margin_text(row, label, "certified_margins"), bar) if x)


def _esc(x) -> str:
    return html.escape(str(x))


def _cell(row: dict, label: str) -> str:
    v = row["verdicts"].get(label, "")
    cls = {"PASS": "pass", "FAIL": "fail"}.get(v, "unmeasured")
    why = row["reasons"].get(label, "")
    title = f" title='{_esc(why)}'" if why else ""
    measured = _esc(row["measured"].get(label, ""))
    margin = _esc(margin_text(row, label))
    cert = tier_text(row, label)
    why_cert = row.get("certified_reasons", {}).get(label, "")
    tier = f"<br><span title='{_esc(why_cert)}'>{_esc(cert)}</span>" if cert else ""
    return f"<td class='{cls}'{title}><b>{_esc(v or 'absent')}</b> {margin}{tier}<br><small>{measured}</small></td>"


def _claims_html(table: dict, kind: str, prefix: str = "") -> str:
    rows = [c for c in table["claims"] if c["kind"] == kind]
    if not rows:
        return ""
    labels = [v["label"] for v in table["variants"]]
    head = "".join(f"<th><a href='{_esc(prefix + v['report'])}'>{_esc(v['label'])}</a></th>" for v in table["variants"])
    tiers = kind == "empirical" and any(c.get("certified_verdicts") for c in rows)
    last = "<th>reproduced</th>" if kind == "empirical" else ""
    last += "<th>certified reproduced</th>" if tiers else ""
    body = []
    for c in rows:
        rep = ""
        if kind == "empirical":
            rep = _yes_no(c["reproduced"]) + (_yes_no(c["certified_reproduced"]) if tiers else "")
        body.append(
            f"<tr><td><code>{_esc(c['id'])}</code><br>{_esc(c['statement'])}<br><small>{_esc(c['reference'])}; "
            f"expected {_esc(c['expected'])}</small></td>"
            + "".join(_cell(c, label) for label in labels)
            + rep
            + "</tr>"
        )
    return f"<table><tr><th>claim</th>{head}{last}</tr>{''.join(body)}</table>"


def _yes_no(ok: bool) -> str:
    return f"<td class='{'pass' if ok else 'fail'}'><b>{'yes' if ok else 'no'}</b></td>"


def robustness_html(table: dict, prefix: str = "", level: int = 1) -> str:
    """The body of a robustness page: headline (empirical claims only), the empirical claims' table
    (verdict and margin per variant, linked to its report), the identity claims apart, variant errors."""
    h, h2 = f"h{level}", f"h{level + 1}"
    parts = [
        f"<{h}>{_esc(table['experiment'])} <small>({_esc(table['preset'])})</small></{h}>",
        f"<p class='summary'><b>{table['reproduced']} of {table['empirical']} claims reproduced</b> (passed under "
        f"every one of {', '.join(v['label'] for v in table['variants'])}); margins are the signed distance to "
        f"each claim's threshold, relative to it; +0.9% of +1% is a margin of its headroom, the margin a "
        f"measurement at the quantity's ceiling would have, where it has one.{_certified_line(table)}</p>",
        _claims_html(table, "empirical", prefix),
    ]
    identity = _claims_html(table, "identity", prefix)
    if identity:
        parts += [
            f"<{h2}>Checks of the code and the run (hold for any parameters; never counted as reproduced)</{h2}>",
            identity,
        ]
    for v in table["variants"]:
        if v["error"] or v["problems"]:
            parts.append(f"<p><b>{_esc(v['label'])}</b>: {_esc(v['error'] or v['problems'])}</p>")
    return "\n".join(parts)


def _certified_line(table: dict) -> str:
    """ " Certified: 3 of 5 claims reproduced ..." ("" where the experiment certifies no unit)."""
    if not table.get("certified"):
        return ""
    return (
        f" <b>Certified: {table['certified_reproduced']} of {table['certified']} reproduced</b> ("
        + "; ".join(TIERS.values())
        + ")."
    )


def reproduce(
    preset: str = "quick",
    seeds: Sequence[int] = (0, 1, 2),
    out: str | Path = "runs/reproduce",
    only: list[str] | None = None,
    echo=print,
    collect: bool = False,
    **run_kwargs,
) -> dict:
    """`run_robustness` for every registered experiment that needs no local files and has `preset` (or
    those named in `only`), each in ``out/<name>``; then writes ``out/index.json`` and ``out/index.html``.
    Resumable: run it again to finish what an interruption left. collect: run nothing, index the variants
    that finished (`run_robustness`). Progress: units done and time left per experiment and in all
    (`featurelab.progress.UnitsProgress`, as ``run_kwargs["progress"]`` says). Returns the index."""
    from ..experiments import EXPERIMENTS, get_experiment

    names = [e.name for e in EXPERIMENTS if e.name not in NEEDS_LOCAL_FILES and preset in e.presets]
    if only is not None:
        names = [n for n in only if preset in get_experiment(n).presets]
    if not names:
        raise FeaturelabError(f"preset={preset!r}: no experiment that needs no local files has it")
    root = Path(out)
    units = {n: sum(v.units for v in variants(n, preset, list(seeds))) for n in names}  # every config checked first
    meter = UnitsProgress(units, False if collect else run_kwargs.get("progress"), echo, desc="reproduce")
    try:
        tables = [
            run_robustness(n, preset, seeds, out=root / n, echo=echo, collect=collect, meter=meter, **run_kwargs)
            for n in names
        ]
    finally:
        meter.close()
    index = {
        "preset": preset,
        "seeds": list(seeds),
        "experiments": [
            {"name": t["experiment"], "reference": get_experiment(t["experiment"]).reference, "dir": t["experiment"]}
            for t in tables
        ],
        "tables": tables,
        "reproduced": sum(t["reproduced"] for t in tables),
        "empirical": sum(t["empirical"] for t in tables),
        "identity": sum(t["identity"] for t in tables),
        "certified_reproduced": sum(t.get("certified_reproduced", 0) for t in tables),
        "certified": sum(t.get("certified", 0) for t in tables),
    }
    write_json(root / "index.json", index)
    write_text(root / "index.html", index_html(index))
    return index


def index_html(index: dict) -> str:
    """The reproduction's index page: headline, then each experiment's robustness tables (linked)."""
    parts = [
        page_head("reproduction"),
        f"<h1>Reproduction <small>(preset {_esc(index['preset'])}, seeds "
        f"{', '.join(map(str, index['seeds']))} and float64)</small></h1>",
        f"<p class='summary'><b>{index['reproduced']} of {index['empirical']} empirical claims reproduced</b> "
        f"(passed under every seed and in float64); {index['identity']} checks of the code listed apart.</p><ul>",
    ]
    parts += [
        f"<li><a href='#{_esc(t['experiment'])}'>{_esc(t['experiment'])}</a>: {t['reproduced']}/{t['empirical']}</li>"
        for t in index["tables"]
    ]
    parts.append("</ul>")
    for t in index["tables"]:
        parts.append(f"<section id='{_esc(t['experiment'])}'>")
        parts.append(robustness_html(t, prefix=f"{t['experiment']}/", level=2))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _md(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def markdown_tables(index: dict) -> str:
    """The Markdown tables of `index`: per experiment, claims x variants (verdict and margin), reproduced
    or not; identity claims in a table of their own."""
    out = [
        f"Generated by `featurelab reproduce --preset {index['preset']} --seeds "
        f"{','.join(map(str, index['seeds']))}`: **{index['reproduced']} of {index['empirical']} empirical "
        f"claims reproduced** (pass under every variant); {index['identity']} checks of the code listed apart."
        + (
            f" Certified tier: **{index['certified_reproduced']} of {index['certified']} reproduced** (cells: "
            "`as the paper did · cert <verdict> <margin> ±<error bar>`)."
            if index.get("certified")
            else ""
        ),
        "",
    ]
    for t in index["tables"]:
        labels = [v["label"] for v in t["variants"]]
        out += [f"### `{t['experiment']}` ({t['reproduced']}/{t['empirical']} reproduced)", ""]
        for kind, title in (("empirical", "reproduced"), ("identity", "kind")):
            rows = [c for c in t["claims"] if c["kind"] == kind]
            if not rows:
                continue
            if kind == "identity":
                out += ["Checks of the code (they hold for any parameters; never counted as reproduced):", ""]
            out.append("| claim | " + " | ".join(labels) + f" | {title} |")
            out.append("|---" * (len(labels) + 2) + "|")
            for c in rows:
                cells = [
                    " · ".join(
                        x
                        for x in (
                            f"{c['verdicts'].get(label, 'absent')} {margin_text(c, label)}".strip(),
                            tier_text(c, label),
                        )
                        if x
                    )
                    for label in labels
                ]
                last = ("yes" if c["reproduced"] else "**no**") if kind == "empirical" else "identity"
                if c.get("certified_verdicts"):
                    last += f" (certified: {'yes' if c.get('certified_reproduced') else '**no**'})"
                out.append(f"| `{_md(c['id'])}` | " + " | ".join(_md(x) for x in cells) + f" | {last} |")
            out.append("")
        for v in t["variants"]:
            if v["error"] or v["problems"]:
                out += [f"{v['label']}: {_md(v['error'] or v['problems'])}", ""]
    return "\n".join(out)


def update_markdown(path: str | Path, index_path: str | Path) -> None:
    """Replace what lies between `BEGIN` and `END` in the Markdown file `path` with `markdown_tables` of
    the index at `index_path` (written by `reproduce`); the rest of the file is kept as it is."""
    path = Path(path)
    if not path.is_file():
        raise FeaturelabError(f"'{path}' is not a file; give an existing Markdown file with the markers")
    text = path.read_text(encoding="utf-8")
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise FeaturelabError(f"'{path}' must hold the marker lines {BEGIN} and {END} once each, in that order")
    index = read_json(index_path, kind=dict, fix="run `featurelab reproduce` first")
    for key in ("preset", "seeds", "tables", "reproduced", "empirical", "identity"):
        if key not in index:
            raise FeaturelabError(f"'{index_path}' lacks {key!r}: it is not an index written by `featurelab reproduce`")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    write_text(path, f"{head}{BEGIN}\n{markdown_tables(index)}\n{END}{tail}")
