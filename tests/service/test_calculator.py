"""The calculator example parses arithmetic; it never evaluates Python."""

import pytest

from toolservice_base.examples.calculator import ExpressionError, evaluate


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(2 + 3) * 4 / 2", 10.0),
        ("2 ** 10", 1024),
        ("-3 + +1", -2),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("sqrt(16)", 4.0),
        ("max(1, 5, 2)", 5),
        ("round(pi, 2)", 3.14),
    ],
)
def test_arithmetic(expression: str, value: float) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "open('/etc/passwd')",
        "(1).__class__",
        "[1, 2]",
        "x",
        "lambda: 1",
        "1 if 1 else 2",
        "'a' * 3",
        "2 ** 100000",
        "1 / 0",
        "1 +",
        "True + 1",
    ],
)
def test_anything_else_is_refused(expression: str) -> None:
    with pytest.raises(ExpressionError):
        evaluate(expression)
