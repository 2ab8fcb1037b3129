"""No two kasper_py modules import each other, directly or round a longer circle: a
lower layer never reaches up (STYLE.md), and a circle dodged with a function-level
import is still a circle, so imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import kasper_py

PACKAGE = Path(kasper_py.__file__).parent


def module_name(path: Path) -> str:
    """``kasper_py/reprocess/_cli.py`` -> ``kasper_py.reprocess._cli`` (a package's
    ``__init__.py`` is the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Every module one import statement may load; ``from pkg import name`` counts as
    ``pkg.name`` too, since ``name`` may be a submodule."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parent = module.split(".")[: len(module.split(".")) - node.level + is_package]
        base = ".".join([*parent, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph() -> dict[str, set[str]]:
    """Module -> the kasper_py modules it imports anywhere in its source, leaving out its
    own parent packages (importing a submodule runs them first anyway)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = {t for node in ast.walk(tree)
                   for t in imported(node, name, path.name == "__init__.py")}
        graph[name] = {t for t in targets & modules
                       if t != name and not name.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while (member := stack.pop()) != module:
                group.append(member)
            if group:
                found.append(sorted([module, *group]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_modules_import_each_other() -> None:
    """The kasper_py import graph, function-level imports included, has no circle."""
    assert circles(import_graph()) == []


def test_the_check_sees_a_circle_dodged_inside_a_function() -> None:
    """A circle closed only by an import inside a function is found, relative imports
    and ``from pkg import module`` included."""
    source = "def f():\n    from . import b\n"
    tree = ast.parse(source)
    names = [t for node in ast.walk(tree) for t in imported(node, "kasper_py.a", False)]
    assert "kasper_py.b" in names
    assert circles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
    assert circles({"x": {"y"}, "y": set()}) == []


def private_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a private module (a name part starting with ``_``, dunders aside)
    from outside the package it belongs to: ``kasper_py.a._x`` may be imported by
    ``kasper_py.a`` and what lies inside it, by no one else."""
    crossings = []
    for importer, targets in graph.items():
        for target in sorted(targets):
            parts = target.split(".")
            for depth, part in enumerate(parts):
                owner = ".".join(parts[:depth])
                private = part.startswith("_") and not part.startswith("__")
                if private and importer != owner and not importer.startswith(owner + "."):
                    crossings.append(f"{importer} imports {target} (private to {owner})")
                    break
    return crossings


def test_no_package_imports_another_packages_private_module() -> None:
    """A module named ``_x`` is private to its package (STYLE.md): no other package
    imports it."""
    assert private_crossings(import_graph()) == []


def test_the_private_check_sees_a_crossing() -> None:
    """``kasper_py.b`` importing ``kasper_py.a._x`` is a crossing; ``kasper_py.a.y`` and
    ``kasper_py.a`` importing it, or anyone importing ``kasper_py._support.names``
    (private to ``kasper_py``, which holds everything), are not."""
    graph = {"kasper_py.b": {"kasper_py.a._x"}, "kasper_py.a.y": {"kasper_py.a._x"},
             "kasper_py.a": {"kasper_py.a._x"}, "kasper_py.c.d": {"kasper_py._support.names"}}
    assert private_crossings(graph) == [
        "kasper_py.b imports kasper_py.a._x (private to kasper_py.a)"]
