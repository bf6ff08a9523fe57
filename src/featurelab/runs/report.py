"""The self-contained ``report.html`` of a run: figures inline, claims tables, tables, config,
versions and timings. It is rebuilt from the run folder's files alone (``featurelab report DIR``).

Claims are shown with their kind and margin (`featurelab.claims.Claim`): the empirical claims (what
training found: the reproduced results) in the headline and the first table; the identity claims (true for
any parameters: checks of the code) in a section of their own, never counted in the headline."""

from __future__ import annotations

import html
from pathlib import Path

from ..claims import TIERS, fmt, fmt_error_bar, fmt_margin, has_tier, tally, verdict
from ..errors import FeaturelabError
from ..figures import png_tag
from ..io import read_csv, read_json, read_yaml, write_text

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.9em;margin:.6em 0}
td,th{border:1px solid #ccc;padding:.3em .5em;vertical-align:top}
th{background:#f4f4f4}tr.pass td.verdict{background:#dff5df;color:#145214;font-weight:bold}
tr.fail td.verdict{background:#fbdcdc;color:#8a1010;font-weight:bold}
tr.unmeasured td.verdict{background:#eee;color:#555;font-weight:bold}
td.pass{background:#dff5df}td.fail{background:#fbdcdc}td.unmeasured{background:#eee}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
pre{background:#f7f7f7;padding:.8em;overflow:auto;font-size:.85em}.summary{font-size:1.1em}
"""


def _esc(x) -> str:
    return html.escape(str(x))


def scroll(table: str) -> str:
    """`table` (HTML) in a box that scrolls sideways when it is wider than the page (or notebook cell)."""
    return f"<div class='scroll' style='overflow-x:auto;max-width:100%'>{table}</div>"


def _claims_table(claims: list[dict]) -> str:
    """The claims as an HTML table, each statement with its id; with tier "certified" (`has_tier`) its columns
    beside the paper tier's. A claim without a verdict shows why in place of its margin."""
    tiers = any(has_tier(c) for c in claims)
    cols = ["#", "statement", "reference", "expected", "tolerance", "measured", "margin"]
    cols += (
        ["stationarity", "as the paper did", "certified: measured", "margin", "error bar", "δ", "certified"]
        if tiers
        else ["pass"]
    )
    rows = []
    for i, c in enumerate(claims, 1):
        claim_id = f"<br><small><code>{_esc(c['id'])}</code></small>" if c.get("id") else ""
        row = f"<td>{i}</td><td>{_esc(c['statement'])}{claim_id}</td>"
        row += "".join(f"<td>{_esc(c[k])}</td>" for k in ("reference", "expected", "tolerance", "measured"))
        row += _margin_cell(c.get("passed"), c.get("margin"), c)
        if tiers:
            row += f"<td>{_esc(fmt(c.get('stationarity'), 2) if c.get('stationarity') is not None else '')}</td>"
        row += _verdict_cell(c.get("passed"), c.get("reason", ""))
        if tiers:
            row += _certified_cells(c)
        cls = "unmeasured" if c["passed"] is None else ("pass" if c["passed"] else "fail")
        rows.append(f"<tr class='{cls}'>{row}</tr>")
    head = "<tr>" + "".join(f"<th>{h}</th>" for h in cols) + "</tr>"
    return scroll(f"<table>{head}{''.join(rows)}</table>")


def _margin_cell(passed: bool | None, margin, c: dict, reason_key: str = "reason") -> str:
    """The margin of its headroom where `c` has one ("+0.9% of +1%"), or for a claim without a verdict "not
    measured: <why>" (its reason under `reason_key`)."""
    if passed is None:
        why = c.get(reason_key) or "no verdict"
        return f"<td class='unmeasured'><small>not measured: {_esc(why)}</small></td>"
    return f"<td>{_esc(fmt_margin(margin, c.get('headroom')))}</td>"


def _verdict_cell(passed: bool | None, reason: str) -> str:
    """The verdict; the reason of a claim that has one is beside its margin instead (`_margin_cell`)."""
    cls = "unmeasured" if passed is None else ("pass" if passed else "fail")
    why = f"<br><small>{_esc(reason)}</small>" if reason and passed is not None else ""
    return f"<td class='verdict {cls}'><b>{verdict(passed)}</b>{why}</td>"


def _certified_cells(c: dict) -> str:
    """Tier "certified"'s cells of claim `c`: measured, margin, error bar, δ and verdict (blank: one tier)."""
    if not has_tier(c):
        return "<td></td>" * 4 + "<td>(one tier)</td>"
    delta = c.get("clarke")
    passed = c.get("certified_passed")
    cells = _margin_cell(passed, c.get("certified_margin"), c, "certified_reason")
    cells += "".join(f"<td>{_esc(x)}</td>" for x in (fmt_error_bar(c.get("error_bar")), fmt(delta, 2) if delta else ""))
    return f"<td>{_esc(c.get('certified_measured', ''))}</td>{cells}" + _verdict_cell(
        passed, c.get("certified_reason", "")
    )


LEGEND = (
    "<p><b>Reading the claims.</b> <i>expected</i> is the paper's value or bound and <i>tolerance</i> the slack "
    "it allows; <i>measured</i> and <i>expected</i> are printed with the digits that show their difference down "
    "to the tolerance. <i>Margin</i>: the signed distance of the measurement to its threshold, relative to the "
    "threshold (for ==, the share of the tolerance left); negative: outside. Where the measured quantity has "
    "a ceiling (an R², a cosine or a fraction at most 1), the margin is followed by the one a measurement at "
    "the ceiling would have: <i>+0.9% of +1%</i> uses nearly all the room there is. <b>PASS</b> and <b>FAIL</b> are "
    "the verdicts; <b>NOT MEASURED</b> means no verdict was given, because a unit the claim rests on failed, "
    "is unhealthy, or is not at the critical point the claim presumes: the row says why in place of its "
    "margin, and a value shown under <i>measured</i> is for information, not judged.</p>"
)


def tiers_legend() -> str:
    """One line on what each tier of a verdict means (`featurelab.claims.TIERS`)."""
    return "<p><b>Tiers.</b> " + "; ".join(f"<i>{_esc(t)}</i>" for t in TIERS.values()) + ".</p>"


CLAIM_KEYS = ("statement", "reference", "expected", "measured", "tolerance", "passed")
FIX = "rebuild the run with `featurelab run EXP --out NEWDIR`"


def check_claims(run: Path) -> list[dict]:
    """The claims of run folder `run` (``claims.json``), each checked to have the keys of a `Claim` and a
    verdict (true, false or null); a missing or malformed file is a one-line error naming it."""
    path = run / "claims.json"
    claims = read_json(path, kind=list, fix=FIX)
    for i, c in enumerate(claims):
        missing = [k for k in CLAIM_KEYS if not isinstance(c, dict) or k not in c]
        if missing or c["passed"] not in (True, False, None):
            what = f"lacks {', '.join(missing)}" if missing else f"has passed={c['passed']!r}"
            raise FeaturelabError(f"'{path}': claim {i + 1} {what}; {FIX}")
    return claims


def page_head(title: str) -> str:
    """The opening of a featurelab HTML page (inline style); close it with ``</body></html>``."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>featurelab: {_esc(title)}</title>"
        f"<style>{STYLE}</style></head><body>"
    )


def mapping_table(mapping: dict) -> str:
    """A two-column HTML table of a flat mapping (key, value)."""
    rows = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in mapping.items())
    return scroll(f"<table>{rows}</table>")


def flat_summary(summary, prefix: str = "") -> dict[str, str]:
    """A run's summary (nested dicts and lists of numbers, or of records) as a flat mapping for `mapping_table`:
    nested keys joined by dots (``success_fraction.8``, ``0.rank`` for the first record of a list), numbers
    with 6 significant digits; a list of plain values stays one entry."""
    if isinstance(summary, (list, tuple)) and any(isinstance(v, dict) for v in summary):
        summary = dict(enumerate(summary))
    if not isinstance(summary, dict):
        return {prefix.rstrip(".") or "summary": fmt(summary, 6)}
    out = {}
    for k, v in summary.items():
        if (isinstance(v, dict) and v) or (isinstance(v, (list, tuple)) and any(isinstance(x, dict) for x in v)):
            out |= flat_summary(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = fmt(v, 6)
    return out


def figures_html(folder: Path, level: int = 2) -> list[str]:
    """Every ``folder/figures/*.png`` inline (base64), with a caption naming its SVG twin, under a heading of
    `level`."""
    figs = sorted((folder / "figures").glob("*.png")) if (folder / "figures").exists() else []
    parts = [f"<h{level}>Figures</h{level}>"] if figs else []
    for f in figs:
        parts.append(
            f"<figure>{png_tag(f.read_bytes(), f.stem)}"
            f"<figcaption>{_esc(f.stem)} (also <code>figures/{_esc(f.stem)}.svg</code>)</figcaption></figure>"
        )
    return parts


def tables_html(folder: Path) -> list[str]:
    """Every ``folder/tables/*.csv`` as an HTML table (4 significant digits)."""
    tables = sorted((folder / "tables").glob("*.csv")) if (folder / "tables").exists() else []
    return [f"<h2>Table: {_esc(t.stem)}</h2>" + _table_body(read_csv(t, fix=FIX)) for t in tables]


def _table_body(df) -> str:
    if not len(df.columns):
        return "(empty)"
    return scroll(df.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0))


def render_report(run_dir: str | Path, results: dict | None = None) -> Path:
    """Write ``run_dir/report.html`` from the run's files and return its path; `results` is the run
    record (default: the folder's ``results.json``). Every file read is checked (one-line errors)."""
    run = Path(run_dir)
    results = results if results is not None else read_results(run)
    claims = check_claims(run)
    config_text = yaml_text(run / "config.yaml")
    unhealthy = results.get("unhealthy", {})
    parts = [
        page_head(results["experiment"]),
        f"<h1>{_esc(results['experiment'])} <small>({_esc(results['preset'])})</small></h1>",
        f"<p>{_esc(results.get('summary_text', ''))}</p><p><b>Reference:</b> {_esc(results.get('reference', ''))}</p>",
        headline(results, claims),
        *claims_sections(claims),
    ]
    for title, entries in (("Failed runs", results.get("failed")), ("Unhealthy runs", unhealthy)):
        if entries:
            parts.append(
                f"<h2>{title}</h2><ul>"
                + "".join(f"<li><code>{_esc(k)}</code>: {_esc(v)}</li>" for k, v in entries.items())
                + "</ul>"
            )
    parts += certificates_html(run)
    if results.get("notes"):
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_esc(n)}</li>" for n in results["notes"]) + "</ul>")
    parts += figures_html(run) + tables_html(run)
    if results.get("summary"):
        parts.append("<h2>Summary</h2>" + mapping_table(flat_summary(results["summary"])))
    parts.append("<h2>Config</h2><pre>" + _esc(config_text) + "</pre>")
    if results.get("unit_seconds"):
        parts.append(_timings(results["unit_seconds"], results.get("certify_seconds", {})))
    parts.append("<h2>Versions</h2>" + mapping_table(results.get("versions", {})))
    parts.append("</body></html>")
    path = run / "report.html"
    write_text(path, "\n".join(parts))
    return path


def read_results(run: Path) -> dict:
    """The ``results.json`` of the finished run in `run`, checked to name its experiment and preset."""
    if not (run / "results.json").exists():
        raise FeaturelabError(
            f"run folder '{run}' has no results.json: it is not a finished featurelab run "
            "(finish it with `featurelab run EXP --out DIR --resume`)"
        )
    results = read_json(run / "results.json", kind=dict, fix=FIX)
    for key in ("experiment", "preset"):
        if not isinstance(results.get(key), str):
            raise FeaturelabError(f"'{run / 'results.json'}' lacks {key!r}; {FIX}")
    return results


def headline(results: dict, claims: list[dict]) -> str:
    """The report's headline: how many empirical claims pass (and in tier "certified"), how many checks of the
    code, the device, the runs (failed, unhealthy) and the wall time."""
    counts = tally(claims)
    n_none = counts["claims_not_measured"]
    unmeasured = f" {n_none} not measured." if n_none else ""
    checks = (
        f" Checks of the code: {counts['identity_passed']} of {counts['identity_total']} pass."
        if counts["identity_total"]
        else ""
    )
    return (
        f"<p class='summary'><b>Claims: {counts['claims_passed']} of {counts['claims_total']} pass.{unmeasured}</b>"
        f"{_certified_headline(counts)}{checks} "
        f"Device {_esc(results.get('device'))}; {results.get('n_units', 0)} runs "
        f"({len(results.get('failed', {}))} failed, {len(results.get('unhealthy', {}))} unhealthy); "
        f"wall time {results.get('seconds', 0):.1f} s.</p>"
    )


def claims_sections(claims: list[dict], level: int = 2) -> list[str]:
    """The claims' sections, headed at `level`: the legend (and the tiers' where the run certifies), the
    empirical claims' table, and the identity claims (checks of the code) apart."""
    identity = [c for c in claims if c.get("kind") == "identity"]
    tiers = tiers_legend() if tally(claims)["certified_claims_total"] else ""
    empirical = [c for c in claims if c.get("kind") != "identity"]
    parts = [f"<h{level}>Claims</h{level}>" + LEGEND + tiers, _claims_table(empirical)]
    if identity:
        parts += [
            f"<h{level}>Checks of the code</h{level}><p>Identities that hold for any parameters: they check the "
            "code, not what training found, and are never counted as reproduced results.</p>",
            _claims_table(identity),
        ]
    return parts


NOTEBOOK_STYLE = """<style>
.featurelab-run td,.featurelab-run th{border:1px solid #ccc;padding:.2em .4em;vertical-align:top}
.featurelab-run tr.pass td.verdict{background:#dff5df;color:#145214}
.featurelab-run tr.fail td.verdict{background:#fbdcdc;color:#8a1010}
.featurelab-run td.unmeasured,.featurelab-run tr.unmeasured td.verdict{background:#eee;color:#555}
</style>"""


def record_html(run: Path, claims: list[dict], summary: dict, problems: str = "") -> str:
    """A finished run inline in a notebook (self-contained, escaped): its headline, the claims (both tiers where
    the run has them) with their legend, its failed or unhealthy units (`problems`), the summary as a table and
    the run's figures (PNG, inline), read from the folder `run`."""
    results = read_results(run) if (run / "results.json").exists() else {"experiment": run.name, "preset": ""}
    preset = f" <small>({_esc(results['preset'])})</small>" if results.get("preset") else ""
    parts = [
        NOTEBOOK_STYLE,
        "<div class='featurelab-run'>",
        f"<h3>{_esc(results['experiment'])}{preset}</h3>",
        headline(results, claims),
        f"<p>Folder <code>{_esc(run)}</code>; report <code>{_esc(run / 'report.html')}</code>.</p>",
    ]
    if problems:
        parts.append(f"<p><b>{_esc(problems)}</b></p>")
    parts += claims_sections(claims, level=4)
    if summary:
        parts.append("<h4>Summary</h4>" + mapping_table(flat_summary(summary)))
    parts += figures_html(run, level=4)
    return "\n".join([*parts, "</div>"])


CERTIFICATE_COLUMNS = ("certified", "clarke", "previous_clarke", "stationarity", "kinks", "gap", "jacobian_rank")
CERTIFICATE_COLUMNS += ("slopes_at_bounds", "min_reduced_eigenvalue", "kind", "rule", "seconds")


def certificates_html(folder: Path) -> list[str]:
    """The certificates of the run's certified units (``units/<id>/certificate.json``), one row each: whether
    certified, the Clarke residual δ and the earlier point's, the kink set's size and identification gap, the
    constraint Jacobian's rank, slopes at their bounds, the reduced Hessian's smallest eigenvalue, the kind of
    point, the failed rule and the seconds certification took."""
    paths = sorted((folder / "units").glob("*/certificate.json")) if (folder / "units").exists() else []
    if not paths:
        return []
    rows = []
    for path in paths:
        cert = read_json(path, kind=dict, fix=FIX)
        cells = "".join(
            f"<td>{_esc(fmt(cert.get(k), 3) if cert.get(k) is not None else '')}</td>" for k in CERTIFICATE_COLUMNS
        )
        rows.append(f"<tr><td>{_esc(path.parent.name)}</td>{cells}</tr>")
    head = "".join(f"<th>{_esc(k)}</th>" for k in ("unit", *CERTIFICATE_COLUMNS))
    return [
        "<h2>Certificates</h2><p>Each certified unit's critical point (<code>units/&lt;id&gt;/certified.safetensors"
        "</code>, <code>certificate.json</code>): δ is the Clarke residual; a unit passes when δ meets its "
        "tolerance and no rule failed.</p>",
        scroll(f"<table><tr>{head}</tr>{''.join(rows)}</table>"),
    ]


def _timings(seconds: dict, certify: dict) -> str:
    """The table of each unit's wall time and, where units were certified, the certification's share of it."""
    extra = "<th>of which certification</th>" if certify else ""
    rows = []
    for k, v in seconds.items():
        cert = (f"<td>{certify[k]:.2f}</td>" if k in certify else "<td></td>") if certify else ""
        rows.append(f"<tr><td>{_esc(k)}</td><td>{v:.2f}</td>{cert}</tr>")
    return "<h2>Timings</h2>" + scroll(f"<table><tr><th>run</th><th>seconds</th>{extra}</tr>{''.join(rows)}</table>")


def _certified_headline(counts: dict) -> str:
    """ " Certified: 3 of 5 pass (1 not measured)." from `tally`'s counts ("" where nothing is certified)."""
    if not counts["certified_claims_total"]:
        return ""
    n_none = counts["certified_claims_not_measured"]
    unmeasured = f" ({n_none} not measured)" if n_none else ""
    passed, total = counts["certified_claims_passed"], counts["certified_claims_total"]
    return f" <b>Certified: {passed} of {total} pass{unmeasured}.</b>"


def yaml_text(path: Path) -> str:
    """The text of the run's ``config.yaml`` once it has parsed as a mapping ("" when absent)."""
    if not path.exists():
        return ""
    read_yaml(path, kind=dict, fix=FIX)
    return path.read_text(encoding="utf-8")
