"""Every function of featurelab reads on one screen: at most 80 lines, its docstring included (the layout the
README's map promises). A function that grows past it is split into steps that read top to bottom."""

from __future__ import annotations

import ast
from pathlib import Path

import featurelab

MAX_LINES = 80
SOURCE = Path(featurelab.__file__).parent


def long_functions(root: Path, limit: int) -> list[str]:
    """``"path:line name (n lines)"`` for every function or method under `root` longer than `limit` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_no_function_is_longer_than_80_lines():
    assert long_functions(SOURCE, MAX_LINES) == []


def test_the_count_sees_a_long_function_and_a_long_method(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n\n\nclass C:\n    def g(self):\n        return 1\n")
    (tmp_path / "n.py").write_text(f"class D:\n    def h(self):\n{body.replace('    ', '        ')}\n")
    assert long_functions(tmp_path, MAX_LINES) == ["m.py:1 f (81 lines)", "n.py:2 h (81 lines)"]
