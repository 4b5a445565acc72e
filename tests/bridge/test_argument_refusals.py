"""A refused call's message quotes the arguments in JSON, the language they were written in, never as Python reprs."""

from __future__ import annotations

from typing import Any

import pytest

from agent_bridge import BadArguments
from agent_bridge.arguments import ArgumentCheck
from toolservice_base.schemas import ToolDescriptor, json_literals

TOOL = ToolDescriptor.model_validate(
    {
        "name": "countdown",
        "description": "Counts down",
        "service": "countdown",
        "arguments": [
            {"name": "start", "type": "integer", "description": "From"},
            {"name": "label", "type": "string", "description": "Shown"},
            {"name": "options", "type": "object", "description": "More"},
        ],
    }
)
GOOD: dict[str, Any] = {"start": 3, "label": "go", "options": {}}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({**GOOD, "start": None}, "argument 'start': null is not of type 'integer'"),
        ({**GOOD, "start": True}, "argument 'start': true is not of type 'integer'"),
        ({**GOOD, "label": False}, "argument 'label': false is not of type 'string'"),
        ({**GOOD, "label": [None, True]}, "argument 'label': [null, true] is not of type 'string'"),
        (
            {**GOOD, "options": "None"},
            "argument 'options': 'None' is not of type 'object'",
        ),  # the string that was sent stays
    ],
)
def test_a_refusal_spells_null_true_and_false_as_json(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(BadArguments) as refused:
        ArgumentCheck(TOOL).check(arguments)
    assert refused.value.message == f"tool 'countdown': {message}"
    assert refused.value.argument == message.split("'")[1]
    assert refused.value.type == "bad-arguments" and message in str(refused.value)


@pytest.mark.parametrize(
    ("python", "json"),
    [
        (
            "tool 'countdown': argument 'start': None is not of type 'integer'",
            "tool 'countdown': argument 'start': null is not of type 'integer'",
        ),
        (
            "argument 'mode': None is not one of ['fast', None, True, False]",
            "argument 'mode': null is not one of ['fast', null, true, false]",
        ),
        (
            "argument 'x': 'None' is not of type 'integer'",
            "argument 'x': 'None' is not of type 'integer'",
        ),  # the string that was sent
        (
            "argument 'opts': {'a': None} is not of type 'string'",
            "argument 'opts': {'a': null} is not of type 'string'",
        ),
        ("argument 'x': \"it's None\" is too long", "argument 'x': \"it's None\" is too long"),
        ("the tool's schema refuses None", "the tool's schema refuses null"),  # an apostrophe opens no string
        ("NoneType and None_x are words of their own", "NoneType and None_x are words of their own"),
        (
            "null is not of type 'integer'",
            "null is not of type 'integer'",
        ),  # spelled already: a second pass changes nothing
    ],
)
def test_json_literals_rewrites_python_literals_outside_quoted_strings(python: str, json: str) -> None:
    assert json_literals(python) == json
    assert json_literals(json) == json
