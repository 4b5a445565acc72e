"""A tool's JSON Schemas (`input-schema`, `output-schema`): the limits and checks they pass, and the flat `arguments`
derived from an input schema.

A schema is taken as it is (what an MCP server lists travels unchanged, the
same bytes after canonical JSON) once it passes these checks, each refused in
one line naming the limit:

- a JSON object of `"type": "object"` (MCP's rule for both schemas);
- at most `MAX_SCHEMA_BYTES` of canonical JSON and `MAX_SCHEMA_DEPTH` levels of
  nesting, no NaN or infinity: what one tool may cost every registry and agent;
- `$schema`, if given, JSON Schema 2020-12 (MCP's default) or draft-07;
- valid against that dialect's meta-schema (the `jsonschema` library's check);
- only local references (`"$ref": "#/$defs/..."`): nothing that would make a
  validator fetch a document from elsewhere.

The checks are cached by the schema's canonical text, so a registry or agent
that reads the same descriptor again pays a dictionary lookup.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jsonschema import Draft7Validator, Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator

from .base import ARGUMENT_TYPES, MAX_ARGUMENTS, MAX_DESCRIPTION, NAME_PATTERN, printable

MAX_SCHEMA_BYTES = 32 * 1024
"""The largest input or output schema of one tool, as canonical JSON."""
MAX_SCHEMA_DEPTH = 32
"""The deepest nesting of objects and arrays in one schema."""

DIALECTS: dict[str, type[Validator]] = {
    "https://json-schema.org/draft/2020-12/schema": Draft202012Validator,
    "http://json-schema.org/draft-07/schema#": Draft7Validator,
    "http://json-schema.org/draft-07/schema": Draft7Validator,
    "https://json-schema.org/draft-07/schema#": Draft7Validator,
    "https://json-schema.org/draft-07/schema": Draft7Validator,
}
"""`$schema` values accepted, and the validator each means; no `$schema` means 2020-12, as in MCP."""
_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")


def validator_class(schema: Mapping[str, Any]) -> type[Validator]:
    """The validator of a checked schema's dialect."""
    return DIALECTS.get(str(schema.get("$schema", "")), Draft202012Validator)


def schema_text(schema: Any) -> str:
    """Canonical JSON of a schema (sorted keys, no spaces); ValueError for what JSON cannot carry (NaN, infinity)."""
    try:
        return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise ValueError("must be JSON: NaN and infinity are not JSON numbers") from None
    except (TypeError, RecursionError) as exc:
        raise ValueError(f"must be JSON ({printable(str(exc), 80)})") from None


def check_json_schema(schema: Any) -> dict[str, Any]:
    """`schema` if it passes every check above; else ValueError saying which, in one line."""
    if not isinstance(schema, dict):
        raise ValueError(f"must be a JSON Schema object, got {type(schema).__name__}")
    depth = nesting(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"is nested more than {MAX_SCHEMA_DEPTH} levels deep; flatten it or use $defs")
    text = schema_text(schema)
    size = len(text.encode())
    if size > MAX_SCHEMA_BYTES:
        raise ValueError(f"is {size} bytes of JSON; the limit is {MAX_SCHEMA_BYTES}")
    problem = _problem(text)
    if problem is not None:
        raise ValueError(problem)
    return schema


@lru_cache(maxsize=512)  # at most 512 x 32 KiB of schema text held: what a flood of distinct schemas can cost
def _problem(text: str) -> str | None:
    schema = json.loads(text)
    dialect = schema.get("$schema")
    if dialect is not None and dialect not in DIALECTS:
        return f"$schema {printable(str(dialect), 80)!s} is not one this accepts (JSON Schema 2020-12 or draft-07)"
    if schema.get("type") != "object":
        return 'must have "type": "object" at the top, as MCP requires'
    remote = _remote_reference(schema)
    if remote is not None:
        return f"refers to {printable(remote, 80)}, outside itself; only local references (#/$defs/...) are followed"
    try:
        validator_class(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top"
        return f"is not a valid JSON Schema at {printable(where, 80)}: {printable(exc.message, 160)}"
    dangling = _dangling_reference(schema)
    if dangling is not None:
        return f"refers to {printable(dangling, 80)}, which it does not define"
    return None


def nesting(value: Any) -> int:
    """Levels of objects and arrays in `value`, counted without recursion (a hostile document may be deep)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_SCHEMA_DEPTH:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _remote_reference(schema: dict[str, Any]) -> str | None:
    stack: list[Any] = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in _REFERENCES:
                target = item.get(key)
                if isinstance(target, str) and not target.startswith("#"):
                    return target
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def _dangling_reference(schema: dict[str, Any]) -> str | None:
    """A `#/...` reference that points at nothing in the document (anchors, `#name`, are left to the validator)."""
    stack: list[Any] = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            target = item.get("$ref")
            if isinstance(target, str) and target.startswith("#/") and not _resolves(schema, target[2:]):
                return target
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


_MISSING = object()


def _resolves(document: Any, pointer: str) -> bool:
    return _pointer(document, pointer) is not _MISSING


def _pointer(document: Any, pointer: str) -> Any:
    """What JSON pointer `pointer` (without its leading `#/`) names in `document`, or `_MISSING`."""
    from urllib.parse import unquote

    node = document
    for raw in pointer.split("/"):
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


# --- the flat `arguments` a TrustGraph agent reads ---------------------------------------------------------


def derived_arguments(schema: Mapping[str, Any]) -> list[dict[str, str]]:
    """The spec's flat `arguments` for an input schema: one per top-level property whose name is a valid argument
    name, by name (canonical JSON sorts the properties, so their order cannot carry meaning), with the nearest of
    the six types and the property's description (or title).

    For readers that know only `arguments` (a TrustGraph agent): what they lose (nesting, enums, required) the
    service checks again against the full schema.
    """
    import re

    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return []
    if len(properties) > MAX_ARGUMENTS:
        raise ValueError(
            f"input-schema has {len(properties)} top-level properties; at most {MAX_ARGUMENTS} (group some)"
        )
    pattern = re.compile(NAME_PATTERN)
    arguments = []
    for name, prop in sorted(properties.items()):
        if not pattern.match(name):
            continue
        prop = prop if isinstance(prop, dict) else {}
        description = prop.get("description") or prop.get("title") or ""
        arguments.append(
            {
                "name": name,
                "type": _flat_type(prop, schema),
                "description": str(description)[:MAX_DESCRIPTION],
            }
        )
    return arguments


def _flat_type(prop: Mapping[str, Any], root: Mapping[str, Any], hops: int = 0) -> str:
    """The nearest of the six flat types for a property: its `type`, or what a local `$ref`, an `enum`, a `const`
    or the first branch of an `anyOf`/`oneOf` says; "string" when nothing does."""
    declared = prop.get("type")
    kinds = declared if isinstance(declared, list) else [declared]
    for kind in kinds:
        if kind in ARGUMENT_TYPES:
            return str(kind)
    target = prop.get("$ref")
    if isinstance(target, str) and target.startswith("#/") and hops < 8:
        found = _pointer(root, target[2:])
        if isinstance(found, Mapping):
            return _flat_type(found, root, hops + 1)
    enum = prop.get("enum")
    values: list[Any] = enum if isinstance(enum, list) else [prop["const"]] if "const" in prop else []
    for value in values:
        if value is not None:
            return json_type(value)
    for key in ("anyOf", "oneOf"):
        branches = prop.get(key)
        if isinstance(branches, list) and hops < 8:
            for branch in branches:
                if isinstance(branch, Mapping) and branch.get("type") != "null":
                    return _flat_type(branch, root, hops + 1)
    if "properties" in prop or "additionalProperties" in prop:
        return "object"
    if "items" in prop or "prefixItems" in prop:
        return "array"
    return "string"


def json_type(value: Any) -> str:
    """The JSON Schema type a JSON value is (`null` for None; `integer` before `number`, a bool before both)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def arguments_schema(arguments: list[dict[str, str]]) -> dict[str, Any]:
    """The JSON Schema of flat arguments: types map one to one; every argument is required; no others."""
    return {
        "type": "object",
        "properties": {a["name"]: {"type": a["type"], "description": a["description"]} for a in arguments},
        "required": [a["name"] for a in arguments],
        "additionalProperties": False,
    }
