"""Every Python block of README.md and docs/ runs as written: the blocks of one page run top to bottom in one
fresh namespace, in a scratch folder. A line ``EXPR  # -> VALUE`` checks what it shows: EXPR must equal the
literal VALUE (a float to the digits shown). A block whose first line is ``# not run by the docs test: WHY``
is skipped, for a reason a reader can see (it needs Ray, a GPU or local MNIST files). No page may use a
deprecated featurelab name, and the CHANGELOG's top entry is the package's one version."""

import ast
import importlib.util
import re
import warnings
from pathlib import Path

import pytest

import featurelab

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SKIP = re.compile(r"^# not run by the docs test: \S")
CHECK = re.compile(r"^(?P<expr>\S.*?)\s+# -> (?P<value>.+)$")


def blocks(page: Path) -> list[tuple[int, str]]:
    """(first line number, code) of each ```python block of `page`."""
    text = page.read_text()
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in BLOCK.finditer(text)]


def same(actual, expected, shown: str) -> bool:
    if hasattr(actual, "tolist"):
        actual = actual.tolist()
    if isinstance(expected, float):
        digits = len(shown.split(".")[1]) if "." in shown and "e" not in shown.lower() else 12
        return abs(float(actual) - expected) <= 0.5 * 10.0**-digits * (1 + 1e-9)
    return actual == expected


def with_checks(code: str) -> str:
    """`code` with each ``EXPR  # -> VALUE`` line turned into a check of EXPR against VALUE."""
    lines = []
    for line in code.splitlines():
        m = CHECK.match(line)
        if m:
            value = m["value"].strip()
            ast.literal_eval(value)  # the shown value must be a literal
            line = f"__check({m['expr']}, {value}, {value!r}, {m['expr']!r})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def check(actual, expected, shown, expr):
    assert same(actual, expected, shown), f"{expr} gives {actual!r}, the docs show {shown}"


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_page_runs_as_written(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace = {"__name__": "__docs__", "__check": check}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=DeprecationWarning, module="__docs__")  # warned at a docs line
        for line, code in blocks(page):
            if SKIP.match(code):
                continue
            exec(compile(with_checks(code), f"{page.relative_to(ROOT)}:{line}", "exec"), namespace)


def test_no_deprecated_top_level_name():
    """Code and prose name only the curated top level, a module, or a name in its namespace: ``fl.NAME``,
    ``featurelab.NAME`` and ``from featurelab import NAME``."""
    allowed = set(featurelab.__all__)
    for page in PAGES:
        text = page.read_text()
        used = re.findall(r"(?<![\w.])(?:fl|featurelab)\.(\w+)", text)
        for m in re.finditer(r"from featurelab import (?:\(([^)]*)\)|([\w ,]+))", text):
            used += [n.strip() for n in (m.group(1) or m.group(2)).split(",") if n.strip()]
        bad = sorted(n for n in set(used) - allowed if importlib.util.find_spec(f"featurelab.{n}") is None)
        assert not bad, f"{page.relative_to(ROOT)} uses {bad}; use their namespace (docs/api.md)"


def test_the_checks_can_fail():
    assert same(4, 4, "4") and same(0.1234, 0.123, "0.123") and not same(0.1236, 0.123, "0.123")
    assert "__check(x, 3, '3', 'x')" in with_checks("x  # -> 3")
    with pytest.raises(AssertionError, match="x gives 4, the docs show 3"):
        check(4, 3, "3", "x")


def test_one_version():
    """The CHANGELOG's top entry is the package's version, which pyproject.toml reads from the package."""
    import tomllib

    top = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert top and top.group(1) == featurelab.__version__
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "featurelab._version.__version__"}
