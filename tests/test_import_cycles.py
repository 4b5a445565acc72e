"""No import circle in the product: each module can be read, and loaded, after the modules it imports.

A circle is kept alive only by an import moved into a function or under
`TYPE_CHECKING`, which hides from the reader which module builds on which.
So every import counts here, wherever it stands. `from package import name`
is an edge to the submodule when `name` is one, else to the package itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("toolservice_base", "discovery", "agent_bridge")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> set[str]:
    """The product modules one import statement loads by name (relative imports resolved)."""
    if isinstance(node, ast.Import):
        named = {alias.name for alias in node.names}
    else:
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        origin = ".".join([*base[: len(base) - node.level + 1], *([node.module] if node.module else [])])
        if not node.level:
            origin = node.module or ""
        named = {f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin for alias in node.names}
    found: set[str] = set()
    for name in named:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(module, path, node, modules)
        graph[module] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_product_has_no_import_circle() -> None:
    assert circles(import_graph()) == []


@pytest.mark.parametrize(
    "source",
    [
        # a function-local import closes the circle as surely as one at the top
        {"p.a": "from p.b import x\n", "p.b": "def f():\n    from p.a import y\n"},
        # so does one only the type checker sees
        {
            "p.a": "from p import b\n",
            "p.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\n",
        },
    ],
)
def test_the_check_sees_a_circle_however_the_import_hides(tmp_path: Path, source: dict[str, str]) -> None:
    modules = {name: tmp_path / f"{name.replace('.', '_')}.py" for name in source}
    for name, text in source.items():
        modules[name].write_text(text)
    modules["p"] = tmp_path / "__init__.py"
    modules["p"].write_text("")
    graph = {
        name: set().union(
            *(
                _imported(name, path, node, modules)
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, (ast.Import, ast.ImportFrom))
            )
        )
        for name, path in modules.items()
    }
    assert circles(graph) == [["p.a", "p.b"]]
