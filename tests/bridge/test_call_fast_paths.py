"""The call path's shortcuts decide exactly what the long way decides.

A call checks flat arguments with a compiled validator before asking
jsonschema (`toolservice_base.tool_contract.SchemaCheck`), and builds its
request's bytes without the pydantic model; a service answers text with bytes
built the same way, and reads a plain request with the json module alone, as
the caller reads a plain text answer. For any
arguments, the shortcut accepts exactly what jsonschema accepts (and a
refusal's text still comes from jsonschema), the bytes are the models', and
what is read is what the model reads (or refuses).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from agent_bridge import BadArguments, ToolError
from agent_bridge.arguments import ArgumentCheck
from toolservice_base.schemas import (
    ARGUMENT_TYPES,
    ToolDescriptor,
    ToolServiceRequest,
    ToolServiceResponse,
    parse_response,
    plain_text,
    request_bytes,
    request_fields,
    text_response_bytes,
)
from toolservice_base.transport import encode

NAMES = ("text", "count", "flag", "items", "options", "ratio")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


class _Text(str):
    pass


class _Number(int):
    pass


# Values JSON would not give too: tuples, sets, bytes, a float equal to an integer, subclasses of what it gives (the
# compiled validator is asked only of the exact types, and jsonschema of the rest).
python_values = (
    json_values
    | st.tuples(st.integers())
    | st.just(1.0)
    | st.just(b"x")
    | st.just(frozenset())
    | st.builds(_Text, st.text(max_size=3))
    | st.builds(_Number, st.integers())
    | st.builds(OrderedDict, st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
)


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
def test_the_flat_arguments_check_accepts_exactly_what_jsonschema_accepts(
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


# Strings as JSON can spell them: lone surrogates included (a `\\ud800` escape), which the model refuses.
any_text = st.text(alphabet=st.characters(), max_size=6) | st.sampled_from(["\ud800", "a\udfff", "\U0001f600", ""])
field_values = any_text | json_values


@st.composite
def request_documents(draw: st.DrawFn) -> bytes:
    keys = draw(st.lists(st.sampled_from(("user", "config", "arguments", "other")), unique=True, max_size=4))
    text = json.dumps({key: draw(field_values) for key in keys}, ensure_ascii=draw(st.booleans()))
    data = text.encode("utf-8", "surrogatepass")
    # What else arrives: a byte order mark, UTF-16, a value that is no object, a cut-off document.
    return draw(
        st.sampled_from(
            (
                data,
                b"\xef\xbb\xbf" + data,
                text.encode("utf-16-le", "surrogatepass"),
                data[: len(data) // 2],
                b"[" + data + b"]",
                data + b" ",
            )
        )
    )


@settings(max_examples=400, deadline=None)
@given(request_documents())
def test_a_request_is_read_as_the_model_reads_it(data: bytes) -> None:
    try:
        model = ToolServiceRequest.model_validate_json(data)
        expected: tuple[str, str, str] | None = (model.user, model.config, model.arguments)
    except ValidationError:
        expected = None
    try:
        read: tuple[str, str, str] | None = request_fields(data)
    except ValidationError:
        read = None
    assert read == expected, data


@st.composite
def response_bodies(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(("response", "end_of_stream", "error", "content", "x")), unique=True))
    body = {key: draw(field_values) for key in keys}
    if draw(st.booleans()):  # most answers: text, and whether it is the last
        body.update(response=draw(any_text), end_of_stream=draw(st.booleans()))
    return body


@settings(max_examples=400, deadline=None)
@given(response_bodies())
def test_a_plain_text_answer_is_read_as_the_model_reads_it(body: dict[str, Any]) -> None:
    text = plain_text(body)
    if text is None:
        return  # read by parse_response itself
    response = parse_response(body, "s")
    assert (text, response.content, response.structured, response.error) == (response.response, None, None, None)


def test_what_is_not_plain_text_is_left_to_the_model() -> None:
    assert plain_text({"response": "hi", "end_of_stream": 1}) is None  # the model coerces it
    assert plain_text({"response": "hi", "error": None}) is None
    assert plain_text({"error": {"type": "x", "message": "y"}}) is None
    with pytest.raises(ToolError):
        parse_response({"error": {"type": "x", "message": "y"}}, "s")
    assert plain_text({}) == "" == parse_response({}, "s").response
