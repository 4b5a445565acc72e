"""The call path's shortcuts decide exactly what the long way decides.

A call checks flat arguments by their schema's fixed shape before asking
jsonschema, and builds its request's bytes without the pydantic model; a
service answers text with bytes built the same way. For any arguments, the
shortcut accepts exactly what jsonschema accepts (and a refusal's text still
comes from jsonschema), and the bytes are the models'.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from agent_bridge import BadArguments
from agent_bridge.arguments import ArgumentCheck
from toolservice_base.schemas import (
    ARGUMENT_TYPES,
    ToolDescriptor,
    ToolServiceRequest,
    ToolServiceResponse,
    request_bytes,
    text_response_bytes,
)
from toolservice_base.transport import encode

NAMES = ("text", "count", "flag", "items", "options", "ratio")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
# Values JSON would not give too: tuples, sets, bytes, a float equal to an integer.
python_values = json_values | st.tuples(st.integers()) | st.just(1.0) | st.just(b"x") | st.just(frozenset())


@st.composite
def tools_and_arguments(draw: st.DrawFn) -> tuple[ToolDescriptor, dict[str, Any]]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=4))
    arguments = [{"name": n, "type": draw(st.sampled_from(ARGUMENT_TYPES)), "description": n} for n in names]
    tool = ToolDescriptor.model_validate(
        {"type": "tool-service", "name": "t", "description": "d", "service": "s", "arguments": arguments}
    )
    keys = draw(st.lists(st.sampled_from((*names, "other")), unique=True, max_size=5))
    return tool, {key: draw(python_values) for key in keys}


@settings(max_examples=400, deadline=None)
@given(tools_and_arguments())
def test_the_flat_arguments_shortcut_accepts_exactly_what_jsonschema_accepts(
    case: tuple[ToolDescriptor, dict[str, Any]],
) -> None:
    tool, arguments = case
    check = ArgumentCheck(tool)
    accepted = Draft202012Validator(tool.parameters).is_valid(arguments)
    try:
        check.check(arguments)
        refused = None
    except BadArguments as exc:
        refused = exc
    assert (refused is None) == accepted, (tool.parameters, arguments, refused)


@settings(max_examples=300, deadline=None)
@given(
    st.text(),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3),
)
def test_a_requests_bytes_are_the_models(user: str, config: dict[str, Any], arguments: dict[str, Any]) -> None:
    try:
        model = ToolServiceRequest(user=user, config=json.dumps(config), arguments=json.dumps(arguments))
        expected = encode(model)
    except (ValueError, UnicodeError):  # a lone surrogate: neither way can send it
        try:
            request_bytes(user, config, arguments)
        except (TypeError, ValueError):
            return
        raise AssertionError("request_bytes sent what the model could not") from None
    assert request_bytes(user, config, arguments) == expected


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_a_text_answers_bytes_are_the_models(text: str) -> None:
    try:
        expected = encode(ToolServiceResponse(response=text))
    except (ValueError, UnicodeError):  # a lone surrogate: neither way can send it
        try:
            text_response_bytes(text)
        except ValueError:
            return
        raise AssertionError("text_response_bytes sent what the model could not") from None
    assert text_response_bytes(text) == expected
