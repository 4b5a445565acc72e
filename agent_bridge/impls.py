"""Tool implementations and the factories that build them, keyed by the tool's `type`.

A factory turns one parsed `tool/<name>` item into an object with
`async invoke(**arguments) -> str`. `tool-service` is built in; other types
(`knowledge-query`, ...) are registered with `register_tool_type` or passed to
`ToolSet(factories=...)`. The registry is read at every reload, so a type
registered after a `ToolSet` started is used from its next reload on.

An implementation may also offer `call(arguments, *, user)` and
`call_stream(arguments, *, user)`: the `ToolSet` then passes each call's
`user` through (multi-tenant services need it) and streams chunk by chunk;
and `call_parts(arguments, *, user)`, which streams rich results (content
blocks, structured content) as `ToolResult`s.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from toolservice_base.rpc import CallLimits
from toolservice_base.schemas import (
    ToolDescriptor,
    ToolResult,
    ToolServiceDescriptor,
    check_name,
    check_tool_against_service,
)
from toolservice_base.transport import Transport

from .client import ToolServiceClient


@runtime_checkable
class Tool(Protocol):
    """What a factory returns: one callable tool."""

    async def invoke(self, **arguments: Any) -> str: ...


@runtime_checkable
class CallsForUser(Protocol):
    """A tool that is told who calls (`ToolServiceImpl` is one): `ToolSet.invoke` calls it so, else `invoke`."""

    async def call(self, arguments: Mapping[str, Any], *, user: str | None = None) -> str: ...


@runtime_checkable
class StreamsForUser(Protocol):
    """A tool that answers chunk by chunk (`ToolServiceImpl` is one): `ToolSet.stream` streams it, else yields its
    whole answer once."""

    def call_stream(self, arguments: Mapping[str, Any], *, user: str | None = None) -> AsyncGenerator[str, None]: ...


@runtime_checkable
class PartsForUser(Protocol):
    """A tool that answers with rich results (`ToolServiceImpl` is one): `ToolSet.call` and `ToolSet.parts` take
    its content blocks and structured content as they came, else its text as text blocks."""

    def call_parts(
        self, arguments: Mapping[str, Any], *, user: str | None = None
    ) -> AsyncGenerator[ToolResult, None]: ...


@dataclass(frozen=True)
class ToolContext:
    """What a factory may use besides the tool's own descriptor.

    `client(service)` hands out the one shared `ToolServiceClient` of a service,
    the same object across reloads while the service's descriptor is unchanged.
    `limits` are the ToolSet's bounds on one call (`CallLimits`, see
    `ToolServiceClient.stream`).
    """

    workspace: str
    user: str
    limits: CallLimits
    connection: Transport
    services: Mapping[str, ToolServiceDescriptor]
    service_problems: Mapping[str, str]
    get_client: Callable[[ToolServiceDescriptor], ToolServiceClient]

    @property
    def timeout(self) -> float:
        """`limits.timeout`: seconds a whole call may take."""
        return self.limits.timeout

    def service(self, service_id: str) -> ToolServiceDescriptor:
        """The service's descriptor, or a ValueError saying why there is none."""
        found = self.services.get(service_id)
        if found is not None:
            return found
        reason = self.service_problems.get(service_id)
        if reason is not None:
            raise ValueError(f"its service {service_id!r} is invalid: {reason}")
        raise ValueError(
            f"service {service_id!r} is not in the config (write tool-service/{service_id} or start the service)"
        )

    def client(self, service: ToolServiceDescriptor) -> ToolServiceClient:
        return self.get_client(service)


ToolFactory = Callable[[ToolDescriptor, ToolContext], Tool | Awaitable[Tool]]


class ToolServiceImpl:
    """A `tool-service` tool: its config values and the caller's arguments, sent to its service."""

    def __init__(
        self,
        tool: ToolDescriptor,
        service: ToolServiceDescriptor,
        client: ToolServiceClient,
        *,
        user: str = "",
        limits: CallLimits = CallLimits(),
    ) -> None:
        self.tool = tool
        self.service = service
        self.client = client
        self.user = user
        self.limits = limits
        self._config = tool.config_values

    def __repr__(self) -> str:
        return f"<ToolServiceImpl {self.tool.name} -> {self.service.id}>"

    @property
    def name(self) -> str:
        return self.tool.name

    async def invoke(self, **arguments: Any) -> str:
        """The observation for the LLM, as the spec's `ToolServiceImpl.invoke` returns it."""
        return await self.call(arguments)

    def stream(self, **arguments: Any) -> AsyncGenerator[str, None]:
        return self.call_stream(arguments)

    async def call(self, arguments: Mapping[str, Any], *, user: str | None = None) -> str:
        return await self.client.call(
            self._user(user),
            self._config,
            arguments,
            self.limits,
            tool=self.tool.name,
        )

    def call_stream(self, arguments: Mapping[str, Any], *, user: str | None = None) -> AsyncGenerator[str, None]:
        return self.client.stream(
            self._user(user),
            self._config,
            arguments,
            self.limits,
            tool=self.tool.name,
        )

    def call_parts(self, arguments: Mapping[str, Any], *, user: str | None = None) -> AsyncGenerator[ToolResult, None]:
        """The answer as `ToolResult`s, one per response: content blocks and structured content as they came."""
        return self.client.parts(self._user(user), self._config, arguments, self.limits, tool=self.tool.name)

    def _user(self, user: str | None) -> str:
        return self.user if user is None else user


def tool_service_factory(tool: ToolDescriptor, ctx: ToolContext) -> ToolServiceImpl:
    """The built-in factory of type `tool-service`."""
    if not tool.service:
        raise ValueError("a tool of type 'tool-service' needs 'service'")
    service = ctx.service(tool.service)
    check_tool_against_service(tool, service)
    return ToolServiceImpl(
        tool,
        service,
        ctx.client(service),
        user=ctx.user,
        limits=ctx.limits,
    )


_FACTORIES: dict[str, ToolFactory] = {"tool-service": tool_service_factory}


def register_tool_type(type_name: str, factory: ToolFactory) -> None:
    """Build tools of `type_name` with `factory(tool, ctx)` in every ToolSet, from its next reload on."""
    check_name(type_name, "tool type")
    if not callable(factory):
        raise TypeError(f"factory for tool type {type_name!r} must be callable, got {type(factory).__name__}")
    _FACTORIES[type_name] = factory


def registered_factories() -> dict[str, ToolFactory]:
    return dict(_FACTORIES)


def arguments_schema(tool: ToolDescriptor) -> dict[str, Any]:
    """JSON Schema of a tool's arguments: its `input-schema` as it came, or, for a tool with only the flat
    `arguments`, one derived from them (types map one to one; every argument is required)."""
    return tool.parameters
