"""A calculator: arithmetic through a whitelist over Python's AST, never `eval`."""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from toolservice_base import DynamicToolService

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max}
_CONSTANTS = {"pi": math.pi, "e": math.e}
MAX_EXPRESSION = 500
MAX_EXPONENT = 1000


class ExpressionError(ValueError):
    """The expression is not plain arithmetic."""


def evaluate(expression: str) -> float | int:
    """Evaluate `+ - * / // % **`, parentheses, numbers and a few functions."""
    if len(expression) > MAX_EXPRESSION:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"not an arithmetic expression: {exc.msg}") from None
    result: float | int = _eval(tree.body)
    return result


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ExpressionError(f"exponent larger than {MAX_EXPONENT}")
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ExpressionError("division by zero") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*(_eval(arg) for arg in node.args))
    raise ExpressionError(
        f"unsupported element {type(node).__name__!r}: only numbers, + - * / // % **, parentheses and"
        f" {', '.join(_FUNCTIONS)}"
    )


class CalculatorService(DynamicToolService):
    descriptor = {"id": "calculator"}
    tools = [
        {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression such as (2 + 3) * 4 / 2",
            "arguments": [{"name": "expression", "type": "string", "description": "The arithmetic expression"}],
        }
    ]
    version = "1.0"

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            raise ExpressionError("argument 'expression' must be a string")
        result = evaluate(expression)
        if isinstance(result, float) and result.is_integer() and abs(result) < 1e15:
            result = int(result)
        return str(result)
