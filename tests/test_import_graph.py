"""The package's import graph has no cycle, between modules or between sub-packages, counting imports
inside functions too; the top level stays a short curated list."""

import ast
import graphlib
from pathlib import Path

import featurelab

ROOT = Path(featurelab.__file__).parent


def modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def import_edges() -> dict[str, set[str]]:
    """module -> the featurelab modules it imports (``from .x import y`` counts ``x.y`` when that is a module)."""
    mods = modules()
    edges = {}
    for name, (path, is_pkg) in mods.items():
        package = name if is_pkg else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    targets.add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        edges[name] = {t for t in targets if t in mods and t != name}
    return edges


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_module_cycle():
    graphlib.TopologicalSorter(import_edges()).prepare()  # raises CycleError naming the cycle


def test_no_cycle_between_subpackages():
    graph: dict[str, set[str]] = {}
    for src, targets in import_edges().items():
        for dst in targets:
            # the root package re-exports its sub-packages; a sub-package never imports the root
            if src != "featurelab" and package_of(src) != package_of(dst):
                graph.setdefault(package_of(src), set()).add(package_of(dst))
    assert "featurelab" not in {d for ds in graph.values() for d in ds}
    graphlib.TopologicalSorter(graph).prepare()


def test_the_detector_finds_a_cycle():
    sorter = graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}})
    try:
        sorter.prepare()
    except graphlib.CycleError:
        return
    raise AssertionError("a two-module cycle was not detected")


def test_top_level_is_curated():
    assert len(featurelab.__all__) <= 25
    for name in featurelab.__all__:
        assert hasattr(featurelab, name), name


def test_old_top_level_names_warn_and_resolve():
    import pytest

    with pytest.warns(DeprecationWarning, match="featurelab.measurements.cost_of_identity"):
        f = featurelab.cost_of_identity
    assert f is featurelab.measurements.cost_of_identity
    with pytest.raises(AttributeError):
        _ = featurelab.no_such_name
