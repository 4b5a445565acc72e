"""`toolreg call`'s `key=value` arguments, each read by the kind the tool's schema gives it, `$ref`s resolved.

A schema written by pydantic or the MCP SDK reaches a nested object through
`{"$ref": "#/$defs/Location"}`, and an optional one through `anyOf` with
`null`: the property itself has no `type`. Reading only `type` took such an
argument for a string, so `location={"city":"Oslo"}` was sent as text and
refused for being what the user wrote. Here the kinds come from the resolved
schema, so the value is parsed as the tool will check it, and the usage hint
of a refusal (`it takes: location=<object> ...`) says the same kinds.

A value for a string is taken as typed (`note=3` is the text "3"); any other
kind is JSON (`days=3`, `hourly=true`, `location={"city":"Oslo"}`); a value
that may be a string or something else is JSON when it parses as one of the
other kinds, else the text. The check of the values against the schema is the
agent bridge's (`agent_bridge.arguments`), which names the path at fault.
"""

from __future__ import annotations

import json
from typing import Any

from toolservice_base.schemas.json_schema import json_type

from .common import CommandError

KINDS = ("object", "array", "string", "integer", "number", "boolean", "null")
"""JSON Schema's types, in the order a hint lists them."""
ARTICLES = {"object": "an object", "array": "an array", "integer": "an integer"}


def _pointer(root: dict[str, Any], ref: str) -> Any:
    """The part of `root` a local `$ref` (`#/$defs/Location`) points at, or None for one it cannot follow."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _kinds_of(root: dict[str, Any], schema: Any, seen: frozenset[str] = frozenset()) -> set[str]:
    """The JSON types a (sub)schema admits, following `$ref`, `anyOf`/`oneOf`/`allOf`, `enum` and `const`."""
    if not isinstance(schema, dict):
        return set()
    found: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        found.add(declared)
    elif isinstance(declared, list):
        found.update(t for t in declared if isinstance(t, str))
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref not in seen:
        found |= _kinds_of(root, _pointer(root, ref), seen | {ref})
    for key in ("anyOf", "oneOf", "allOf"):
        for member in schema.get(key) or []:
            found |= _kinds_of(root, member, seen)
    values = [*schema.get("enum", []), *([schema["const"]] if "const" in schema else [])]
    found.update(json_type(value) for value in values)
    if not found and "properties" in schema:
        found.add("object")
    if not found and "items" in schema:
        found.add("array")
    return found


def argument_kinds(schema: dict[str, Any]) -> dict[str, list[str]]:
    """Each argument of a tool's schema and the JSON types it takes, in `KINDS` order (empty: the schema does not
    say)."""
    properties = schema.get("properties") or {}
    return {
        name: [kind for kind in KINDS if kind in _kinds_of(schema, prop)]
        for name, prop in properties.items()
        if isinstance(name, str)
    }


def usage(kinds: dict[str, list[str]]) -> str:
    """The hint of a refusal: `location=<object> days=<integer> fallback=<object|null>`."""
    return " ".join(f"{name}=<{'|'.join(kind) or 'any'}>" for name, kind in kinds.items()) or "no arguments"


def _fits(value: Any, kinds: list[str]) -> bool:
    kind = json_type(value)
    return kind in kinds or (kind == "integer" and "number" in kinds)


def read_value(name: str, raw: str, kinds: list[str]) -> Any:
    """One argument's value: the text for a string (or an argument the schema does not type), else JSON."""
    if not kinds or kinds == ["string"]:
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        if "string" in kinds:
            return raw
        wanted = " or ".join(ARTICLES.get(kind, f"a {kind}") for kind in kinds)
        example = f' (e.g. {name}=\'{{"key": "value"}}\')' if "object" in kinds else ""
        raise CommandError(
            f"argument at $.{name} takes {wanted}, written as JSON, but {raw!r} is not JSON{example}"
        ) from None
    if "string" in kinds and not _fits(value, kinds):
        return raw  # it may be a string, and JSON of no other kind it takes: the text as typed
    return value


def read_arguments(pairs: list[str], schema: dict[str, Any]) -> dict[str, Any]:
    """`key=value` pairs read by the tool's schema; an argument it does not name is kept as text (the check says
    it is unknown)."""
    kinds = argument_kinds(schema)
    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"arguments are key=value, got {pair!r}")
        result[key] = read_value(key, raw, kinds.get(key, []))
    return result
