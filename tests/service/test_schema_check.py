"""A schema's check decides what the jsonschema library decides, however it gets there.

`SchemaCheck` asks a compiled validator (jsonschema-rs) first and the library
about anything it does not call valid. For schemas made of the keywords tools
use and for any Python value, the verdict is the library's; a value the
compiled validator must not see (a tuple, a subclass, a value nested deeper
than `FAST_DEPTH`) is judged by the library alone; a schema it cannot compile
is checked by the library alone; and nothing a schema names is ever fetched.
"""

from __future__ import annotations

import socket
import threading
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft7Validator, Draft202012Validator

from toolservice_base.tool_contract import FAST_DEPTH, SchemaCheck

DIALECTS = {
    "https://json-schema.org/draft/2020-12/schema": Draft202012Validator,
    "http://json-schema.org/draft-07/schema#": Draft7Validator,
}

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=4)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abcd"), inner, max_size=3),
    max_leaves=8,
)


class _Text(str):
    pass


python_values = st.recursive(
    scalars | st.builds(_Text, st.text(max_size=2)) | st.just(1.0) | st.just(2**80),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)
        | st.builds(OrderedDict, st.dictionaries(st.sampled_from("ab"), inner, max_size=2))
    ),
    max_leaves=8,
)

TYPES = ("string", "integer", "number", "boolean", "object", "array", "null")


def _subschemas(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.fixed_dictionaries(
            {"properties": st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)},
            optional={
                "type": st.just("object"),
                "required": st.lists(st.sampled_from("abcd"), unique=True, max_size=3),
                "additionalProperties": st.booleans() | inner,
                "minProperties": st.integers(0, 3),
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("array")},
            optional={"items": inner, "minItems": st.integers(0, 2), "uniqueItems": st.booleans()},
        ),
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"oneOf": st.lists(inner, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"not": inner}),
    )


schemas = st.recursive(
    st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), min_size=1)}),
        st.fixed_dictionaries(
            {"type": st.just("string")},
            optional={
                "minLength": st.integers(0, 3),
                "maxLength": st.integers(0, 3),
                "pattern": st.sampled_from(["^a", "b$", "[0-9]+", "^[a-c]*$"]),
                "format": st.sampled_from(["email", "date-time", "uri"]),
            },
        ),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["integer", "number"])},
            optional={
                "minimum": st.integers(-3, 3),
                "exclusiveMaximum": st.integers(-3, 3),
                "multipleOf": st.sampled_from([1, 2, 0.5]),
            },
        ),
        st.fixed_dictionaries({"enum": st.lists(json_values, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"const": json_values}),
        st.just({}),
    ),
    _subschemas,
    max_leaves=6,
)


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    schema = {"type": "object", **draw(_subschemas(schemas))}
    schema["type"] = "object"
    schema["$schema"] = draw(st.sampled_from(sorted(DIALECTS)))
    if draw(st.booleans()):  # a local reference, as pydantic's schemas make
        schema["$defs"] = {"thing": draw(schemas)}
        schema.setdefault("properties", {})["ref"] = {"$ref": "#/$defs/thing"}
    return schema


@settings(max_examples=600, deadline=None)
@given(documents(), json_values | python_values)
def test_a_verdict_is_the_librarys(schema: dict[str, Any], instance: Any) -> None:
    library = DIALECTS[schema["$schema"]](schema)
    check = SchemaCheck(schema)
    assert check.is_valid(instance) == library.is_valid(instance), (schema, instance)
    assert (check.violation(instance) is None) == library.is_valid(instance)


@settings(max_examples=300, deadline=None)
@given(documents(), json_values)
def test_a_refusal_names_what_the_library_names(schema: dict[str, Any], instance: Any) -> None:
    library = DIALECTS[schema["$schema"]](schema)
    error = SchemaCheck(schema).violation(instance)
    if error is None:
        return
    from jsonschema.exceptions import best_match

    expected = best_match(library.iter_errors(instance))
    assert expected is not None
    assert (error.json_path, error.message) == (expected.json_path, expected.message)


LIST_OF_LISTS = {
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/nest"}},
    "$defs": {"nest": {"type": "array", "items": {"$ref": "#/$defs/nest"}}},
}


def _nested(depth: int) -> list[Any]:
    top: list[Any] = []
    inner = top
    for _ in range(depth - 1):
        deeper: list[Any] = []
        inner.append(deeper)
        inner = deeper
    return top


def test_a_value_deeper_than_the_compiled_validator_may_see_goes_to_the_library() -> None:
    check = SchemaCheck(LIST_OF_LISTS)
    assert check.is_valid({"a": _nested(FAST_DEPTH - 2)})
    assert check.is_valid({"a": _nested(FAST_DEPTH + 10)})
    # 100,000 levels: the compiled validator would overflow the C stack and end the process; the library runs
    # out of Python recursion instead, which the check reports as a schema it cannot apply, and the process lives.
    error = SchemaCheck(LIST_OF_LISTS).violation({"a": _nested(100_000)})
    assert error is not None and "cannot be applied" in error.message


def test_values_json_does_not_give_are_judged_by_the_library() -> None:
    check = SchemaCheck({"type": "object", "properties": {"a": {"type": "array"}, "s": {"type": "string"}}})
    assert not check.is_valid({"a": (1, 2)})  # the compiled validator reads a tuple as an array
    assert check.is_valid({"s": _Text("x")})  # ... and cannot read a subclass of str at all
    assert not check.is_valid({1: "x", "a": "not an array"})


def test_a_schema_only_pythons_re_reads_is_checked_by_the_library_alone() -> None:
    check = SchemaCheck({"type": "object", "properties": {"p": {"type": "string", "pattern": "^(?P<word>a+)$"}}})
    assert check.is_valid({"p": "aaa"})
    error = check.violation({"p": "b"})
    assert error is not None and error.json_path == "$.p"


def test_nothing_a_schema_refers_to_is_fetched() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(2.0)
    accepted: list[socket.socket] = []

    def accept() -> None:
        try:
            accepted.append(listener.accept()[0])
        except OSError:
            pass

    waiter = threading.Thread(target=accept)
    waiter.start()
    address = f"http://127.0.0.1:{listener.getsockname()[1]}/schema.json"
    try:
        check = SchemaCheck({"type": "object", "properties": {"p": {"$ref": address}}})
        assert check.violation({"p": 1}) is not None
    finally:
        waiter.join()
        listener.close()
    assert accepted == []


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_formats_are_annotations_in_both_dialects(dialect: str) -> None:
    check = SchemaCheck({"$schema": dialect, "type": "object", "properties": {"e": {"format": "email"}}})
    assert check.is_valid({"e": "not an address"})
