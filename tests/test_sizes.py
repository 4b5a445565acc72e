"""Modules and functions a reader can hold in their head: no product module over 500 lines of code, no function over 60.

A module does one thing (most stay under ~400 lines); a function longer than
a screen does several, and is split where its steps are. Docstrings,
comments and blank lines do not count: saying why costs nothing here, so an
explanation is never cut to fit.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("toolservice_base", "discovery", "agent_bridge")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from `def` (decorators excluded) to the function's last line, less its docstring."""
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        assert first.end_lineno is not None
        lines -= first.end_lineno - first.lineno + 1
    return lines


def code_lines(source: str) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a docstring (a string alone as a statement)."""
    tree = ast.parse(source)
    prose: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            assert node.end_lineno is not None
            prose.update(range(node.lineno, node.end_lineno + 1))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            code.update(line for line in range(token.start[0], token.end[0] + 1) if line not in prose)
    return len(code)


def oversized(source: str, where: str) -> list[str]:
    found = []
    if (count := code_lines(source)) > MAX_MODULE_LINES:
        found.append(f"{where}: {count} lines of code (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if (lines := function_lines(node)) > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name}(): {lines} lines (at most {MAX_FUNCTION_LINES})")
    return found


def test_no_product_module_or_function_is_too_long() -> None:
    found = [
        problem
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for problem in oversized(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == []


def test_the_check_counts_code_not_docstrings() -> None:
    body = "\n".join(f"    x{n} = {n}" for n in range(MAX_FUNCTION_LINES - 1))  # with its `def`: the most allowed
    explained = f'def f():\n    """Why.\n\n    At length.\n    """\n{body}\n'
    assert oversized(explained, "m.py") == []
    assert oversized(f"def f():\n{body}\n    return x0\n", "m.py") == ["m.py:1 f(): 61 lines (at most 60)"]
    assert oversized("x = 1\n" * (MAX_MODULE_LINES + 1), "m.py") == ["m.py: 501 lines of code (at most 500)"]
    prose = '"""A module.\n\nExplained at length.\n"""\n' + "# why\n\n" * MAX_MODULE_LINES
    assert oversized(prose + "x = 1\n" * MAX_MODULE_LINES, "m.py") == []
