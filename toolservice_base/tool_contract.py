"""What a tool promises, checked on each call: its arguments against its input schema, its structured result
against its output schema.

The same check runs before a call leaves an agent (`agent_bridge`) and again
at the service (`DynamicToolService`), so a caller that skipped it (a
TrustGraph agent reads only the flat `arguments`) cannot reach `invoke` with
arguments the tool never accepted. A refusal names the JSON path of the first
violation (`$.address.city`), in one line a model can act on.

`schema_of` turns what an author declares into a schema: a dict as it is, a
pydantic model, a dataclass or TypedDict, or a function's type hints.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator
from pydantic import BaseModel, TypeAdapter, create_model

from .errors import BadArguments, ServiceDefinitionError, ToolError
from .schemas import ToolDescriptor, json_literals, printable
from .schemas.json_schema import validator_class

MAX_DETAIL = 200
"""Characters of the validator's own message kept in a refusal (it quotes the value, which may be long)."""


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


def first_violation(validator: Validator, instance: Any) -> ValidationError | None:
    """The error to report of `instance` against the validator's schema (jsonschema's `best_match`), or None."""
    try:
        if validator.is_valid(instance):
            return None
        found: ValidationError | None = best_match(validator.iter_errors(instance))
        return found
    except Exception as exc:  # a reference the validator cannot follow: the schema, not the instance, is at fault
        return ValidationError(f"the schema cannot be applied ({printable(str(exc), 120)})")


def violation_text(error: ValidationError) -> tuple[str, str]:
    """(the JSON path of the violation, one line saying what is wrong there)."""
    message = json_literals(" ".join(error.message.split()))
    detail = message if len(message) <= MAX_DETAIL else message[: MAX_DETAIL - 3] + "..."
    return error.json_path, detail


class ToolContract:
    """One tool's compiled schemas: built once per tool, used by every call."""

    __slots__ = ("tool", "service", "_input", "_output")

    def __init__(self, tool: ToolDescriptor) -> None:
        self.tool = tool.name
        self.service = tool.service or ""
        self._input = validator_class(tool.parameters)(tool.parameters)
        self._output = (
            validator_class(tool.output_schema)(tool.output_schema) if tool.output_schema is not None else None
        )

    @property
    def has_output_schema(self) -> bool:
        return self._output is not None

    def check_arguments(self, arguments: Mapping[str, Any]) -> None:
        """Return if `arguments` fit the input schema; else `BadArguments` naming the path of the first violation."""
        error = first_violation(self._input, arguments)
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
        error = first_violation(self._output, structured)
        if error is not None:
            path, detail = violation_text(error)
            raise ToolError(
                "bad-result",
                f"tool {self.tool!r}: its structured result does not match its output-schema at {path}: {detail}",
                service=self.service,
            )
