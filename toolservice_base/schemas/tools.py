"""The tool-service protocol's descriptors (DESIGN section 3): a service's queues and params, its tools and their
arguments."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from .base import (
    MAX_ARGUMENTS,
    MAX_CONFIG_PARAMS,
    MAX_CONFIG_VALUE_BYTES,
    MAX_DESCRIPTION,
    NAME_PATTERN,
    WireModel,
    canonical_json,
    check_name,
    check_queue,
    kebab,
)

# --- tool-service protocol (spec section 3) --------------------------------


class ConfigParam(WireModel):
    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    required: bool = False


class ToolServiceDescriptor(WireModel):
    """`tool-service/<id>`: where a service listens and which config it takes."""

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, frozen=True, extra="forbid")

    id: str = Field(pattern=NAME_PATTERN)
    request_queue: str
    response_queue: str
    config_params: list[ConfigParam] = Field(default_factory=list, max_length=MAX_CONFIG_PARAMS)

    @field_validator("request_queue", "response_queue")
    @classmethod
    def _queue(cls, value: str) -> str:
        return check_queue(value)

    @field_validator("config_params")
    @classmethod
    def _unique_params(cls, value: list[ConfigParam]) -> list[ConfigParam]:
        names = [p.name for p in value]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"config param named twice: {', '.join(dupes)}")
        return value


class Argument(WireModel):
    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, frozen=True, extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    type: Literal["string", "number", "integer", "boolean", "object", "array"]
    description: str = Field(max_length=MAX_DESCRIPTION)


class ToolDescriptor(WireModel):
    """`tool/<name>`: what the LLM sees, plus values for the service's config params.

    Keys other than the fixed ones are config values; pydantic keeps them as
    extra fields so a descriptor round-trips unchanged.
    """

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, frozen=True, extra="allow")

    type: str = Field(default="tool-service", pattern=NAME_PATTERN)
    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(max_length=MAX_DESCRIPTION)
    service: str | None = Field(default=None, pattern=NAME_PATTERN)
    arguments: list[Argument] = Field(default_factory=list, max_length=MAX_ARGUMENTS)

    @model_validator(mode="after")
    def _check(self) -> "ToolDescriptor":
        if self.type == "tool-service" and not self.service:
            raise ValueError("a tool of type 'tool-service' needs 'service'")
        names = [a.name for a in self.arguments]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"argument named twice: {', '.join(dupes)}")
        for key, value in self.config_values.items():
            check_name(key, "config key")
            if len(canonical_json(value).encode()) > MAX_CONFIG_VALUE_BYTES:
                raise ValueError(f"config value {key!r} is larger than {MAX_CONFIG_VALUE_BYTES} bytes")
        return self

    @property
    def config_values(self) -> dict[str, Any]:
        return dict(self.__pydantic_extra__ or {})


def check_tool_against_service(tool: ToolDescriptor, service: ToolServiceDescriptor) -> None:
    """Raise ValueError unless `tool`'s config values fit `service`'s params."""
    params = {p.name: p for p in service.config_params}
    values = tool.config_values
    unknown = sorted(set(values) - set(params))
    if unknown:
        known = ", ".join(sorted(params)) or "none"
        raise ValueError(
            f"tool {tool.name!r}: {', '.join(unknown)} is not a config param of service {service.id!r} (params:"
            f" {known})"
        )
    missing = sorted(name for name, p in params.items() if p.required and name not in values)
    if missing:
        raise ValueError(
            f"tool {tool.name!r}: required config param {', '.join(missing)} of service {service.id!r} is missing"
        )


def tool_definition(tool: ToolDescriptor, service: ToolServiceDescriptor | None) -> dict[str, Any]:
    """What an agent is told about a tool and where its calls go: the part a pinned definition covers.

    The tool's description, arguments and config values, and its service's
    queues and config params (`service` None: a tool of another type, or one
    whose service is not known). Not its name (a pin is per name) nor its
    service's id (the queues say where calls go).
    """
    return {
        "description": tool.description,
        "arguments": [argument.to_wire() for argument in tool.arguments],
        "config": tool.config_values,
        "service": None if service is None else service_definition(service),
    }


def service_definition(service: ToolServiceDescriptor) -> dict[str, Any]:
    """The part of a tool's definition its service gives: where calls go and which config it takes."""
    return {
        "request-queue": service.request_queue,
        "response-queue": service.response_queue,
        "config-params": [param.to_wire() for param in service.config_params],
    }


def definition_digest(tool: ToolDescriptor, service: ToolServiceDescriptor | None) -> str:
    """sha256 (hex) of the canonical JSON of `tool_definition`: the registry pins it, `ToolSet.describe()` and
    `toolreg tools` show it, the MCP front puts it in each tool's `_meta`. Equal digests, equal definitions."""
    return hashlib.sha256(canonical_json(tool_definition(tool, service)).encode()).hexdigest()
