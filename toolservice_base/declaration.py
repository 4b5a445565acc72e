"""A tool service as its author declares it, checked: the descriptors with their defaults filled, and the time limits.

The author writes dicts (`DynamicToolService.descriptor` and `tools`, a
sidecar's JSON for `toolreg announce`, an MCP server's `tools/list` for
`McpToolService`); `build_descriptors` fills what may be left out (the queues,
each tool's `type` and `service`), turns declared schemas into JSON Schema,
and refuses, in one line naming the tool, what the registry would refuse
later: so a mistake fails the author's start, not every announcement. Not
part of `service`: the sidecar and the MCP listing declare tools they do not
serve here, and need these checks without the request path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .errors import ServiceDefinitionError
from .schemas import (
    MAX_MESSAGE_BYTES,
    ToolDescriptor,
    ToolServiceDescriptor,
    canonical_json,
    check_tool_against_service,
    describe_validation_error,
)
from .tool_contract import schema_of
from .topics import DEFAULT as DEFAULT_TOPICS
from .topics import Topics

ANNOUNCE_OVERHEAD = 1024  # the announcement's own fields and signature around the descriptors


def build_descriptors(
    descriptor: dict[str, Any], tools: list[dict[str, Any]], topics: Topics = DEFAULT_TOPICS
) -> tuple[ToolServiceDescriptor, list[ToolDescriptor]]:
    """Fill the defaults an author may leave out and validate everything."""
    if not isinstance(descriptor, dict) or "id" not in descriptor:
        raise ServiceDefinitionError("`descriptor` must be a dict with at least an 'id'")
    service_id = descriptor["id"]
    full = {
        "request-queue": topics.request_queue(str(service_id)),
        "response-queue": topics.response_queue(str(service_id)),
        **descriptor,
    }
    try:
        service = ToolServiceDescriptor.model_validate(full)
    except ValidationError as exc:
        raise ServiceDefinitionError(f"descriptor of {service_id!r}: {describe_validation_error(exc)}") from None
    parsed: list[ToolDescriptor] = []
    for raw in tools:
        item = {"type": "tool-service", "service": service.id, **_declared_schemas(raw)}
        try:
            tool = ToolDescriptor.model_validate(item)
        except ValidationError as exc:
            raise ServiceDefinitionError(f"tool {raw.get('name')!r}: {describe_validation_error(exc)}") from None
        if tool.service != service.id:
            raise ServiceDefinitionError(f"tool {tool.name!r} names service {tool.service!r}, not {service.id!r}")
        try:
            check_tool_against_service(tool, service)
        except ValueError as exc:
            raise ServiceDefinitionError(str(exc)) from None
        parsed.append(tool)
    size = len(canonical_json({"service": service.to_wire(), "tools": [t.to_wire() for t in parsed]}).encode())
    if size > MAX_MESSAGE_BYTES - ANNOUNCE_OVERHEAD:
        raise ServiceDefinitionError(
            f"service {service.id!r}: its announcement would be about {size // 1024} KiB, over the registry's "
            f"{MAX_MESSAGE_BYTES // 1024} KiB limit; shorten descriptions or split it into several services"
        )
    return service, parsed


_SCHEMA_KEYS = {
    "input-schema": "input-schema",
    "input_schema": "input-schema",
    "output-schema": "output-schema",
    "output_schema": "output-schema",
}


def _declared_schemas(raw: dict[str, Any]) -> dict[str, Any]:
    """A tool as declared, its schemas turned into JSON Schema dicts (from a pydantic model, type hints, ...)."""
    if not isinstance(raw, dict):
        raise ServiceDefinitionError(f"a tool must be a dict, got {type(raw).__name__}")
    item = {key: value for key, value in raw.items() if key not in _SCHEMA_KEYS}
    for key, wire in _SCHEMA_KEYS.items():
        if raw.get(key) is not None:
            item[wire] = schema_of(raw[key], f"tool {raw.get('name')!r}: {wire}")
    return item


def call_limits(
    service_id: str, call_timeout: float, tool_timeouts: Mapping[str, float], tools: list[ToolDescriptor]
) -> dict[str, float]:
    """The per-tool limits, checked: positive numbers, for tools the service has."""
    if not (isinstance(call_timeout, (int, float)) and call_timeout > 0):
        raise ServiceDefinitionError(
            f"service {service_id!r}: call_timeout must be a positive number of seconds, got {call_timeout!r}"
        )
    names = {tool.name for tool in tools}
    limits: dict[str, float] = {}
    for name, seconds in tool_timeouts.items():
        if name not in names:
            raise ServiceDefinitionError(
                f"service {service_id!r}: tool_timeouts names {name!r}, which is not one of its tools"
                f" ({', '.join(sorted(names))})"
            )
        if not (isinstance(seconds, (int, float)) and seconds > 0):
            raise ServiceDefinitionError(
                f"service {service_id!r}: tool_timeouts[{name!r}] must be a positive number, got {seconds!r}"
            )
        limits[name] = float(seconds)
    return limits
