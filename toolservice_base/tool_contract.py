"""What a tool promises, checked on each call: its arguments against its input schema, its structured result
against its output schema.

The same check runs before a call leaves an agent (`agent_bridge`) and again
at the service (`DynamicToolService`), so a caller that skipped it (a
TrustGraph agent reads only the flat `arguments`) cannot reach `invoke` with
arguments the tool never accepted. A refusal names the JSON path of the first
violation (`$.address.city`), in one line a model can act on.

Each schema is compiled twice. jsonschema-rs answers "valid" in a fraction of
a microsecond (0.23 us against the jsonschema library's 11.8 for an echo
tool's arguments: 11 to 14 % of a caller's and of the MCP sidecar's loop at 32
calls in flight, bench/PROFILE.md). Whatever it does not call valid goes to
the jsonschema library, which has the last word and names the violation. So an
instance is accepted when either says valid: they differ only where a pattern's
regular expression reads differently in ECMA 262 (the standard's) and Python.
The fast one is asked only of plain JSON values (exact `dict`, `list`, `str`,
numbers, booleans, `None`) at most `FAST_DEPTH` levels deep: it would treat a
tuple as an array where the library does not, refuses what JSON cannot carry,
and recurses on the C stack, which a deep enough Python value overflows.

`schema_of` turns what an author declares into a schema: a dict as it is, a
pydantic model, a dataclass or TypedDict, or a function's type hints.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import jsonschema_rs
from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator
from pydantic import BaseModel, TypeAdapter, create_model
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

from .errors import BadArguments, ServiceDefinitionError, ToolError
from .schemas import ToolDescriptor, json_literals, printable
from .schemas.json_schema import validator_class

MAX_DETAIL = 200
"""Characters of the validator's own message kept in a refusal (it quotes the value, which may be long)."""
FAST_DEPTH = 64
"""The deepest plain JSON value the compiled validator is asked about; a deeper one goes to the jsonschema library
(jsonschema-rs recurses on the C stack: a list nested 40,000 deep crashed the process where 20,000 did not)."""
_SCALARS = frozenset((str, int, float, bool, type(None)))


def schema_of(source: Any, what: str = "schema") -> dict[str, Any]:
    """The JSON Schema an author means: a dict as given; a pydantic model, dataclass or TypedDict; or a function,
    whose parameters (after `self`) and their type hints are the tool's arguments."""
    if isinstance(source, Mapping):
        return dict(source)
    try:
        if isinstance(source, type) and issubclass(source, BaseModel):
            return source.model_json_schema()
        if isinstance(source, type):
            return TypeAdapter(source).json_schema()
        if callable(source):
            return _function_model(source).model_json_schema()
    except Exception as exc:  # pydantic's errors for a type it cannot describe
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ServiceDefinitionError(f"{what}: cannot derive a JSON Schema from {source!r}: {reason}") from None
    raise ServiceDefinitionError(
        f"{what} must be a JSON Schema dict, a pydantic model, a dataclass, a TypedDict or a function, got {source!r}"
    )


def _function_model(function: Any) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name in ("self", "cls") or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = Any if parameter.annotation is parameter.empty else parameter.annotation
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (annotation, default)
    return create_model(getattr(function, "__name__", "arguments"), **fields)


class SchemaCheck:
    """One schema, compiled for both validators; built once per schema, used by every instance."""

    __slots__ = ("validator", "_fast")

    def __init__(self, schema: Mapping[str, Any]) -> None:
        kind = validator_class(schema)
        self.validator: Validator = kind(schema, registry=_OFFLINE)
        self._fast = _compiled(schema, kind)

    def is_valid(self, instance: Any) -> bool:
        fast = self._fast
        if fast is not None and _plain(instance):
            try:
                if fast(instance):
                    return True
            except Exception:  # what it cannot read, whatever it raises: the library decides
                pass
        try:
            return bool(self.validator.is_valid(instance))
        except Exception:  # a reference the library cannot follow: `violation` says so
            return False

    def violation(self, instance: Any) -> ValidationError | None:
        """The error to report of `instance` (jsonschema's `best_match`), or None if it is valid."""
        if self.is_valid(instance):
            return None
        try:
            found: ValidationError | None = best_match(self.validator.iter_errors(instance))
            return found
        except Exception as exc:  # a reference the validator cannot follow: the schema, not the instance, is at fault
            return ValidationError(f"the schema cannot be applied ({printable(str(exc), 120)})")


def _refuse(uri: str) -> Resource[Any]:
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class: its stub hides the field


_OFFLINE: Registry[Any] = Registry(retrieve=_refuse)  # type: ignore[call-arg]  # attrs fields, hidden from mypy
"""What the library may look a reference up in: the schema itself, nothing fetched (it would otherwise fetch an
http(s) `$ref`; the schema's checks refuse those, and this makes sure)."""


def _compiled(schema: Mapping[str, Any], kind: type[Validator]) -> Any:
    """jsonschema-rs's `is_valid` for `schema`, or None where it cannot compile it (a pattern only Python's `re`
    reads): that schema is checked by the library alone. Formats are annotations, as the library treats them by
    default; nothing is fetched (the schema's checks allow only local references, `offline` makes sure)."""
    rust = jsonschema_rs.Draft7Validator if kind is Draft7Validator else jsonschema_rs.Draft202012Validator
    try:
        return rust(dict(schema), validate_formats=False, offline=True).is_valid
    except Exception:  # jsonschema-rs raises its own ValidationError, ValueError or ReferencingError
        return None


def _plain(instance: Any) -> bool:
    """Whether `instance` is made of JSON's own Python types only (no subclass, string keys) and at most
    `FAST_DEPTH` levels deep: what the compiled validator reads exactly as the library does. An object of scalar
    values, a call's usual arguments, is answered in one pass over its values."""
    kind = type(instance)
    if kind is dict:
        for key, value in instance.items():
            if type(key) is not str or type(value) not in _SCALARS:
                break
        else:
            return True
    elif kind in _SCALARS:
        return True
    elif kind is not list:
        return False
    stack: list[tuple[Any, int]] = [(instance, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict:
            if not all(type(key) is str for key in item):
                return False
            children: Any = item.values()
        elif kind is list:
            children = item
        elif kind in _SCALARS:
            continue
        else:
            return False
        if depth >= FAST_DEPTH:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


def violation_text(error: ValidationError) -> tuple[str, str]:
    """(the JSON path of the violation, one line saying what is wrong there)."""
    message = json_literals(" ".join(error.message.split()))
    detail = message if len(message) <= MAX_DETAIL else message[: MAX_DETAIL - 3] + "..."
    return error.json_path, detail


class ToolContract:
    """One tool's compiled schemas: built once per tool, used by every call."""

    __slots__ = ("tool", "service", "arguments", "_output")

    def __init__(self, tool: ToolDescriptor) -> None:
        self.tool = tool.name
        self.service = tool.service or ""
        self.arguments = SchemaCheck(tool.parameters)
        self._output = SchemaCheck(tool.output_schema) if tool.output_schema is not None else None

    @property
    def has_output_schema(self) -> bool:
        return self._output is not None

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Return if `arguments` fit the input schema; else `BadArguments` naming the path of the first violation."""
        error = self.arguments.violation(arguments)
        if error is None:
            return
        path, detail = violation_text(error)
        argument = str(error.absolute_path[0]) if error.absolute_path else ""
        raise BadArguments(self.tool, argument, f"arguments at {path}: {detail}", service=self.service)

    def check_structured(self, structured: Any) -> None:
        """Return if a structured result fits the output schema (or there is none); else `ToolError` of type
        `bad-result`, naming the path: the service broke its own promise."""
        if self._output is None:
            return
        error = self._output.violation(structured)
        if error is not None:
            path, detail = violation_text(error)
            raise ToolError(
                "bad-result",
                f"tool {self.tool!r}: its structured result does not match its output-schema at {path}: {detail}",
                service=self.service,
            )
