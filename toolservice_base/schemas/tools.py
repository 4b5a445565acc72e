"""The tool-service protocol's descriptors (DESIGN section 3): a service's queues and params, its tools and their
arguments, and what MCP says of a tool beyond them (title, annotations, input and output schemas)."""

from __future__ import annotations

import base64
import hashlib
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

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
from .json_schema import arguments_schema, check_json_schema, derived_arguments

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
    answer_key: str | None = None
    """Beyond the spec: the Ed25519 public key (base64 of its 32 bytes) the service signs its answers with. The
    registry writes it, from the key it accepted the service's announcement with; a caller that finds it drops
    answers the key did not sign. Left off, answers are taken unsigned (a static item, an unsigned service)."""

    @field_validator("answer_key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                raw = base64.b64decode(value, validate=True)
            except ValueError:
                raw = b""
            if len(raw) != 32:
                raise ValueError("answer-key must be an Ed25519 public key: base64 of its 32 bytes")
        return value

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


MAX_TITLE = 1024
MAX_ANNOTATIONS_BYTES = 2048
MCP_NAMES = {
    "title": "title",
    "annotations": "annotations",
    "input-schema": "inputSchema",
    "output-schema": "outputSchema",
}
"""What MCP says of a tool beyond the spec: each key as our wire spells it (kebab-case, as every descriptor field),
and as MCP's `Tool` does (camelCase). The one table of these names: a descriptor read from MCP, and a tool listed to
an MCP client, are translated by it."""
MCP_FIELDS = tuple(MCP_NAMES)
"""The keys beyond the spec, as our wire spells them: left off a descriptor that has none of them."""


class ToolAnnotations(BaseModel):
    """MCP's hints about a tool, spelled as MCP spells them (`readOnlyHint`, ...). Hints, not guarantees: a client
    may ask before calling a tool that is not read-only. Hints a newer MCP revision adds are kept as they come."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra="allow")

    title: str | None = Field(default=None, max_length=MAX_TITLE)
    read_only_hint: bool | None = None
    destructive_hint: bool | None = None
    idempotent_hint: bool | None = None
    open_world_hint: bool | None = None

    @model_validator(mode="after")
    def _bounded(self) -> "ToolAnnotations":
        if len(canonical_json(self.to_wire()).encode()) > MAX_ANNOTATIONS_BYTES:
            raise ValueError(f"annotations are larger than {MAX_ANNOTATIONS_BYTES} bytes")
        return self

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    @property
    def destructive(self) -> bool:
        """Whether a client should take the tool as one that may destroy something: MCP's defaults, read-only
        tools never."""
        return not self.read_only_hint and self.destructive_hint is not False

    @property
    def open_world(self) -> bool:
        return self.open_world_hint is not False


class ToolDescriptor(WireModel):
    """`tool/<name>`: what the LLM sees, plus values for the service's config params.

    Keys other than the fixed ones are config values; pydantic keeps them as
    extra fields so a descriptor round-trips unchanged.

    `input_schema` (`input-schema`) is the tool's full JSON Schema, when it has
    one; `arguments` is then derived from it (given both, they must agree), for
    readers that know only the flat list. Without one, the schema is derived
    from `arguments` (`parameters`). `title`, `annotations` and `output_schema`
    are what MCP says of a tool. All four are left off the wire when absent, so
    a tool without them is the bytes (and digests) it always was.
    """

    model_config = ConfigDict(alias_generator=kebab, populate_by_name=True, frozen=True, extra="allow")

    type: str = Field(default="tool-service", pattern=NAME_PATTERN)
    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field(max_length=MAX_DESCRIPTION)
    service: str | None = Field(default=None, pattern=NAME_PATTERN)
    arguments: list[Argument] = Field(default_factory=list, max_length=MAX_ARGUMENTS)
    title: str | None = Field(default=None, max_length=MAX_TITLE)
    annotations: ToolAnnotations | None = None
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _derive_arguments(cls, data: Any) -> Any:
        """Fill `arguments` from `input-schema` when only the schema is given (checked in full after)."""
        if not isinstance(data, dict):
            return data
        schema = data.get("input-schema", data.get("input_schema"))
        if isinstance(schema, dict) and not data.get("arguments"):
            try:
                return {**data, "arguments": derived_arguments(schema)}
            except ValueError:
                return data  # too many properties: the check of input-schema says so
        return data

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else check_json_schema(value)

    @model_validator(mode="after")
    def _check(self) -> "ToolDescriptor":
        if self.type == "tool-service" and not self.service:
            raise ValueError("a tool of type 'tool-service' needs 'service'")
        names = [a.name for a in self.arguments]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"argument named twice: {', '.join(dupes)}")
        if self.input_schema is not None:
            derived = derived_arguments(self.input_schema)
            if [a.to_wire() for a in self.arguments] != derived:
                raise ValueError(
                    "arguments do not match input-schema; give input-schema alone and arguments are derived from it"
                )
        for key, value in self.config_values.items():
            check_name(key, "config key")
            if len(canonical_json(value).encode()) > MAX_CONFIG_VALUE_BYTES:
                raise ValueError(f"config value {key!r} is larger than {MAX_CONFIG_VALUE_BYTES} bytes")
        return self

    @property
    def config_values(self) -> dict[str, Any]:
        return dict(self.__pydantic_extra__ or {})

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema a model is given and a call's arguments are checked against: `input_schema` as it came,
        or the one derived from `arguments`."""
        if self.input_schema is not None:
            return self.input_schema
        return arguments_schema([a.to_wire() for a in self.arguments])

    def mcp_fields(self) -> dict[str, Any]:
        """`title`, `annotations`, `input-schema`, `output-schema`, as on the wire, those it has."""
        wire = self.to_wire()
        return {key: wire[key] for key in MCP_FIELDS if key in wire}

    @classmethod
    def from_mcp(cls, tool: Any, *, service: str, **config_values: Any) -> "ToolDescriptor":
        """From an MCP `Tool` as JSON (`tool.model_dump(by_alias=True, mode="json", exclude_none=True)`): its name,
        title, description, annotations and schemas, served by `service`. ValueError (pydantic's) when it does not
        fit: a name that is not valid here, a schema over the limits."""
        return cls.model_validate(
            {
                "type": "tool-service",
                "name": tool.get("name"),
                "description": tool.get("description") or tool.get("title") or tool.get("name") or "",
                "service": service,
                **{key: tool[mcp] for key, mcp in MCP_NAMES.items() if tool.get(mcp) is not None},
                **config_values,
            }
        )


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

    The tool's description, arguments and config values, its title,
    annotations and input and output schemas when it has them, and its
    service's queues and config params (`service` None: a tool of another
    type, or one whose service is not known). Not its name (a pin is per
    name) nor its service's id (the queues say where calls go).
    """
    return {
        "description": tool.description,
        "arguments": [argument.to_wire() for argument in tool.arguments],
        "config": tool.config_values,
        "service": None if service is None else service_definition(service),
        **tool.mcp_fields(),  # only those it has: a tool without them keeps the digest it always had
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
