"""From raw `tool` + `tool-service` items to a set of built tools, reusing what did not change.

A tool is rebuilt only when its *signature* changed: the stored text of its own
item plus that of the service it names. Comparing text first means an unchanged
tool is not even parsed again, which keeps a reload of 1,000 tools with one
change cheap. Everything else is carried over as the same objects, and so are
the clients of unchanged services. Tools that failed before are tried again on
every build: a service that appeared or a factory registered since may fix them.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache, partial

from toolservice_base.logs import get_logger
from toolservice_base.schemas import (
    ToolDescriptor,
    ToolServiceDescriptor,
    validate_config_item,
)
from toolservice_base.transport import Transport

from .arguments import ArgumentCheck
from .client import ToolServiceClient
from .impls import CallsForUser, Tool, ToolContext, ToolFactory
from .limits import CallLimits

log = get_logger("agent_bridge.build")

Items = dict[str, dict[str, str]]
"""Raw config items by type, then key: exactly what the store's `config` returns."""

TYPES = ("tool-service", "tool")

Signature = tuple[str, str | None]
"""(text of the tool item, text of its service's item or None)."""


@dataclass(frozen=True)
class Entry:
    """One working tool: its descriptor, implementation and the clients it uses."""

    tool: ToolDescriptor
    impl: Tool
    signature: Signature
    clients: tuple[ToolServiceClient, ...]

    @cached_property
    def arguments(self) -> ArgumentCheck:
        """The check of a call's arguments against the tool's advertised schema, compiled on the first call."""
        return ArgumentCheck(self.tool)

    @cached_property
    def calls_for_user(self) -> CallsForUser | None:
        """The implementation if it is told who calls (`CallsForUser`), else None: asked once, not on every call (a
        runtime Protocol check walks the protocol's members each time: 4 % of a caller's loop at 64 in flight)."""
        return self.impl if isinstance(self.impl, CallsForUser) else None


@dataclass(frozen=True)
class Built:
    entries: dict[str, Entry]
    problems: dict[str, str]
    clients: dict[str, ToolServiceClient]
    service_problems: dict[str, str]


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _same_queues(client: ToolServiceClient, service: ToolServiceDescriptor) -> bool:
    return (client.service.request_queue, client.service.response_queue) == (
        service.request_queue,
        service.response_queue,
    )


class _ClientPool:
    """One client per service id: the old one while its queues are unchanged, else a new one.

    A client depends on nothing but the service's queues, so a descriptor
    change that keeps them (new config params, say) keeps the client. That
    also spares the broker a subscription closed and opened on the response
    topic: on pulsar-lite, such churn drops messages for the topic's other
    subscribers (measured: 259 of 20,000 lost across 1,167 subscribe/close
    cycles, 0 without), which showed up as lost answers during reloads.
    """

    def __init__(self, connection: Transport, previous: Mapping[str, ToolServiceClient]) -> None:
        self._connection = connection
        self._previous = previous
        self.clients: dict[str, ToolServiceClient] = {}
        self.created: list[ToolServiceClient] = []

    def adopt(self, client: ToolServiceClient) -> None:
        self.clients.setdefault(client.service.id, client)

    def get(self, service: ToolServiceDescriptor) -> ToolServiceClient:
        client = self.clients.get(service.id)
        if client is not None and _same_queues(client, service):
            return client
        old = self._previous.get(service.id)
        if old is not None and _same_queues(old, service) and not old.closed:
            client = old
            client.service = service  # same id and queues: only what error messages quote changes
        else:
            client = ToolServiceClient(self._connection, service)
            self.created.append(client)
        self.clients[service.id] = client
        return client


_warming: set[asyncio.Task[ToolServiceClient]] = set()


async def _warm_up(clients: list[ToolServiceClient], timeout: float) -> None:
    """Start new clients, waiting at most `timeout`: a slow broker must not hold up the swap.

    Starts still running go on in the background (they are never cancelled:
    a cancelled subscribe may still create its consumer); one that fails is
    not fatal, the client starts again on its first call.
    """
    if not clients:
        return
    tasks = [asyncio.create_task(c.start(), name=f"warm-up:{c.service.id}") for c in clients]
    for client, task in zip(clients, tasks):
        _warming.add(task)
        task.add_done_callback(partial(_warmed, client))
    await asyncio.wait(tasks, timeout=timeout)


def _warmed(client: ToolServiceClient, task: asyncio.Task[ToolServiceClient]) -> None:
    _warming.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("client.start_failed", service=client.service.id, error=one_line(task.exception()))  # type: ignore[arg-type]


@lru_cache(maxsize=4096)
def _parse_service(key: str, text: str) -> ToolServiceDescriptor:
    """Parsed once per distinct text: descriptors are frozen, so sharing them is safe."""
    parsed = validate_config_item("tool-service", key, text)
    assert isinstance(parsed, ToolServiceDescriptor)
    return parsed


def parse_services(raw: Mapping[str, str]) -> tuple[dict[str, ToolServiceDescriptor], dict[str, str]]:
    services: dict[str, ToolServiceDescriptor] = {}
    problems: dict[str, str] = {}
    for key, text in raw.items():
        try:
            services[key] = _parse_service(key, text)
        except ValueError as exc:
            problems[key] = one_line(exc)
    return services, problems


async def build(
    items: Items,
    previous: Mapping[str, Entry],
    previous_clients: Mapping[str, ToolServiceClient],
    factories: Mapping[str, ToolFactory],
    *,
    connection: Transport,
    workspace: str,
    user: str,
    limits: CallLimits,
    warm_up: float,
) -> Built:
    """Build the tools of `items`; on any failure of the build itself, close what it created."""
    raw_services = items.get("tool-service", {})
    services, service_problems = parse_services(raw_services)
    pool = _ClientPool(connection, previous_clients)
    entries, problems, pending = _carry_over(items.get("tool", {}), raw_services, previous, pool)
    context = ToolContext(workspace, user, limits, connection, services, service_problems, pool.get)
    try:
        for tool, signature in pending:
            factory = factories.get(tool.type)
            if factory is None:
                problems[tool.name] = (
                    f"no factory for tool type {tool.type!r}; register one with "
                    f"agent_bridge.register_tool_type({tool.type!r}, factory)"
                )
                continue
            try:
                entries[tool.name] = await _make_entry(tool, signature, factory, pool, context)
            except Exception as exc:
                problems[tool.name] = one_line(exc)
        in_use = await _settle_clients(entries, pool, warm_up)
    except BaseException:
        for client in pool.created:
            await client.close()
        raise
    return Built(entries, problems, in_use, service_problems)


def _carry_over(
    tools: Mapping[str, str], raw_services: Mapping[str, str], previous: Mapping[str, Entry], pool: _ClientPool
) -> tuple[dict[str, Entry], dict[str, str], list[tuple[ToolDescriptor, Signature]]]:
    """Sort the tool items: the unchanged (same signature, open clients), kept as they are with their clients
    adopted by `pool`; the invalid, each with its reason; and the rest, parsed, with their signatures, to build."""
    kept: dict[str, Entry] = {}
    problems: dict[str, str] = {}
    pending: list[tuple[ToolDescriptor, Signature]] = []
    for name, text in sorted(tools.items()):
        old = previous.get(name)
        if old is not None and old.signature[0] == text:
            signature = (text, raw_services.get(old.tool.service) if old.tool.service else None)
            if old.signature == signature and all(not c.closed for c in old.clients):
                kept[name] = old
                for client in old.clients:
                    pool.adopt(client)
                continue
        try:
            tool = validate_config_item("tool", name, text)
        except ValueError as exc:
            problems[name] = one_line(exc)
            continue
        assert isinstance(tool, ToolDescriptor)
        pending.append((tool, (text, raw_services.get(tool.service) if tool.service else None)))
    return kept, problems, pending


async def _make_entry(
    tool: ToolDescriptor, signature: Signature, factory: ToolFactory, pool: _ClientPool, context: ToolContext
) -> Entry:
    """One tool made by its factory, with the clients it took from `pool`; raises why the factory could not make it."""
    used: list[ToolServiceClient] = []

    def get_client(service: ToolServiceDescriptor) -> ToolServiceClient:
        client = pool.get(service)
        used.append(client)
        return client

    impl = factory(tool, replace(context, get_client=get_client))
    if inspect.isawaitable(impl):
        impl = await impl
    if not (isinstance(impl, Tool) and callable(impl.invoke)):
        raise TypeError(f"factory returned {type(impl).__name__}, which has no invoke(**arguments)")
    return Entry(tool, impl, signature, tuple(dict.fromkeys(used)))


async def _settle_clients(
    entries: Mapping[str, Entry], pool: _ClientPool, warm_up: float
) -> dict[str, ToolServiceClient]:
    """The clients the built tools use, by service id: the new ones among them warmed up, the new ones none uses
    closed."""
    in_use = {c.service.id: c for entry in entries.values() for c in entry.clients}
    unused = [c for c in pool.created if in_use.get(c.service.id) is not c]
    fresh = [c for c in pool.created if in_use.get(c.service.id) is c]
    await _warm_up(fresh, warm_up)
    for client in unused:
        await client.close()
    return in_use
