"""The text of a bad-arguments result speaks JSON, the language the model wrote its arguments in."""

from __future__ import annotations

import pytest

from discovery.mcp.server import json_literals


@pytest.mark.parametrize(("python", "json"), [
    ("tool 'countdown': argument 'start': None is not of type 'integer'", "tool 'countdown': argument 'start': null is not of type 'integer'"),
    ("argument 'mode': None is not one of ['fast', None, True, False]", "argument 'mode': null is not one of ['fast', null, true, false]"),
    ("argument 'opts': {'a': None} is not of type 'string'", "argument 'opts': {'a': null} is not of type 'string'"),
    ("argument 'x': 'None' is not of type 'integer'", "argument 'x': 'None' is not of type 'integer'"),  # the string the model sent
    ("argument 'x': \"it's None\" is too long", "argument 'x': \"it's None\" is too long"),
    ("the tool's schema refuses None", "the tool's schema refuses null"),  # an apostrophe opens no string
    ("NoneType and None_x are words of their own", "NoneType and None_x are words of their own"),
])
def test_python_literals_outside_quoted_strings_are_spelled_as_json(python: str, json: str) -> None:
    assert json_literals(python) == json
