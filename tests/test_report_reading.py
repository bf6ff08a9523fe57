"""What a reader of a report needs: numbers printed with the digits their tolerance needs, a legend that says
what margins, tiers and "not measured" mean, a not-measured row that says why, the summary as a table, wide
tables that scroll inside their box, and legends beside the panels, off the curves."""

import json
import math

import numpy as np
import pytest

from featurelab.claims import Check, claim, claim_from_check, digits, threshold_claim
from featurelab.figures import legends_outside, plt, save_figure
from featurelab.runs.report import flat_summary, render_report

SQRT2_M1 = math.sqrt(2) - 1  # 0.41421356...


def _number(text: str) -> float:
    return float(text.split()[-1])


def test_a_difference_in_the_fifth_digit_prints_differently_at_atol_1e_6():
    """0.41420588 against √2−1 = 0.41421356 (they agree to 4 significant digits, 0.4142) with atol 1e-6: the
    texts differ, and each is its value rounded no coarser than the tolerance."""
    measured = 0.41420588466192254
    c = threshold_claim("speed", "ref", measured, SQRT2_M1, "==", atol=1e-6)
    assert f"{measured:.4g}" == f"{SQRT2_M1:.4g}"  # the premise: 4 digits hide the difference
    assert c.passed is False and c.expected.startswith("== ")
    assert _number(c.measured) != _number(c.expected)
    assert _number(c.measured) == pytest.approx(measured, abs=5e-7)
    assert _number(c.expected) == pytest.approx(SQRT2_M1, abs=5e-7)
    check = Check(passed=False, measured=measured, bound=SQRT2_M1, relation="==", atol=1e-6)
    from_check = claim_from_check("speed", "ref", check)
    assert (from_check.expected, from_check.measured) == (c.expected, c.measured)


@pytest.mark.parametrize(
    "measured,bound,allowed",
    [(0.41420588, SQRT2_M1, 1e-6), (10.0 + 3e-9, 10.0, 0.0), (123.456, 123.4, 1e-3), (2.5e-7, 1e-7, 1e-9)],
)
def test_digits_separate_values_that_differ_by_more_than_the_tolerance(measured, bound, allowed):
    """Rounded to `digits` significant digits, two values further apart than the tolerance print differently
    and each stays within half a unit of its last digit (numpy's own rounding, independent of `fmt`)."""
    d = digits(measured, bound, allowed)
    shown = [
        float(np.format_float_positional(v, precision=d, unique=False, fractional=False)) for v in (measured, bound)
    ]
    assert shown[0] != shown[1]
    ulp = 10.0 ** (math.floor(math.log10(max(abs(measured), abs(bound)))) - d + 1)
    assert abs(shown[0] - measured) <= ulp / 2 + 1e-15 and abs(shown[1] - bound) <= ulp / 2 + 1e-15


def test_far_apart_values_keep_four_digits():
    c = threshold_claim("gap", "ref", 24.1234567, 10.0, ">=", atol=1e-12)
    assert (c.measured, c.expected) == ("24.12", ">= 10")
    assert digits(math.nan, 1.0, 0.1) == 4 and digits(0.0, 0.0) == 4


def _folder(tmp_path, claims: list[dict]):
    (tmp_path / "claims.json").write_text(json.dumps(claims))
    (tmp_path / "config.yaml").write_text("seed: 0\n")
    return tmp_path


def _claim(statement, passed, margin, reason=""):
    d = claim(statement, "ref", ">= 1", 2.0, bool(passed), margin=margin).to_dict()
    return d | {"passed": passed, "reason": reason}


def test_not_measured_row_says_why_in_place_of_its_margin(tmp_path):
    claims = [_claim("measured one", True, 0.25), _claim("sick one", None, 0.75, "unit unhealthy: a: collapsed")]
    run = _folder(tmp_path, claims)
    page = render_report(run, {"experiment": "x", "preset": "tiny"}).read_text()
    rows = page.split("<tr class=")
    (sick,) = [r for r in rows if "sick one" in r]
    assert "not measured: unit unhealthy: a: collapsed" in sick and "+75%" not in sick
    (fine,) = [r for r in rows if "measured one" in r]
    assert "<td>+25%</td>" in fine
    legend = page.split("<h2>Claims</h2>")[1].split("<table")[0]
    assert "NOT MEASURED" in legend and "Margin" in legend and "tolerance" in legend


def test_summary_is_a_table_and_every_table_scrolls_in_its_box(tmp_path):
    run = _folder(tmp_path, [_claim("one", True, 0.25)])
    summary = {"best_speed": 0.41420588466192254, "success_fraction": {"2": 0.0, "8": 0.25}, "widths": [2, 8]}
    page = render_report(run, {"experiment": "x", "preset": "tiny", "summary": summary}).read_text()
    section = page.split("<h2>Summary</h2>")[1].split("<h2>")[0]
    assert "<pre>" not in section and "{" not in section
    for key, value in (("best_speed", "0.414206"), ("success_fraction.8", "0.25"), ("widths", "[2, 8]")):
        assert f"<th>{key}</th><td>{value}</td>" in section
    assert page.count("<table") == page.count("overflow-x:auto;max-width:100%'><table") > 2


def test_a_summary_of_records_is_a_table_too():
    """An experiment may summarise with a list of records (``table.to_dict("records")``): one row per field."""
    summary = [{"curve": "a", "rank": 2}, {"curve": "b", "rank": 3.14159265}]
    assert flat_summary(summary) == {"0.curve": "a", "0.rank": "2", "1.curve": "b", "1.rank": "3.14159"}
    nested = {"fits": summary[:1], "widths": [2, 8]}
    assert flat_summary(nested) == {"fits.0.curve": "a", "fits.0.rank": "2", "widths": "[2, 8]"}
    assert flat_summary(7.0) == {"summary": "7"}


def _covered(ax, box) -> bool:
    """Whether the display-space box `box` crosses any line drawn in `ax`."""
    paths = [line.get_path().transformed(line.get_transform()) for line in ax.lines]
    return any(path.intersects_bbox(box, filled=False) for path in paths)


def test_legends_sit_beside_their_panels_off_the_curves_and_off_the_next_panel():
    x = np.linspace(0, 1, 200)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax in axes:
        for i in range(6):  # curves through the whole panel: any legend inside covers one
            ax.plot(x, np.sin(8 * x + i), label=f"phase {i}")
        ax.legend(loc="center")
    fig.canvas.draw()
    assert all(_covered(ax, ax.get_legend().get_window_extent()) for ax in axes)  # the premise
    legends_outside(fig)
    fig.canvas.draw()
    boxes = [ax.get_legend().get_window_extent() for ax in axes]
    assert not any(_covered(ax, box) for ax, box in zip(axes, boxes))
    assert boxes[0].x0 >= axes[0].get_window_extent().x1
    assert not boxes[0].overlaps(axes[1].get_window_extent())
    plt.close(fig)


def test_a_colorbar_under_another_layout_engine_keeps_every_legend_off_the_other_panels(tmp_path):
    """A colorbar made under the tight layout forbids switching to the constrained one: saving still works, and
    no legend covers another panel (the one beside the colorbar goes back inside its own panel)."""
    fig, axes = plt.subplots(1, 2, figsize=(8, 3), layout="tight")
    fig.colorbar(axes[0].imshow(np.arange(25.0).reshape(5, 5)), ax=axes[0])
    for ax in axes:
        ax.plot([0, 4], [0, 4], label="diagonal")
        ax.legend()
    legends_outside(fig)
    fig.draw_without_rendering()
    boxes = [ax.get_window_extent() for ax in fig.axes]
    for i, ax in enumerate(fig.axes):
        legend = ax.get_legend()
        if legend is not None:
            assert not any(legend.get_window_extent().overlaps(b) for j, b in enumerate(boxes) if j != i)
    assert save_figure(fig, tmp_path, "colorbar")[0].stat().st_size > 0
