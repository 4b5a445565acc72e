"""From raw `tool` + `tool-service` items to a set of built tools, reusing what did not change.

A tool is rebuilt only when its *signature* changed: the stored text of its own
item plus that of the service it names. Comparing text first means an unchanged
tool is not even parsed again, which keeps a reload of 1,000 tools with one
change cheap. Everything else is carried over as the same objects, and so are
the clients of unchanged services. Tools that failed before are tried again on
every build: a service that appeared or a factory registered since may fix them.

Given what changed (`touched`: the keys the store's change feed named), a
build looks at those tools only, plus the tools of a changed service and the
ones that failed before: its cost follows the change, not the set's size.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache, partial

import immutables

from toolservice_base.logs import get_logger
from toolservice_base.rpc import CallLimits
from toolservice_base.schemas import (
    ToolDescriptor,
    ToolServiceDescriptor,
    validate_config_item,
)
from toolservice_base.transport import Transport

from .arguments import ArgumentCheck
from .client import ToolServiceClient
from .impls import CallsForUser, PartsForUser, StreamsForUser, Tool, ToolContext, ToolFactory

log = get_logger("agent_bridge.build")

Items = Mapping[str, Mapping[str, str]]
"""Raw config items by type, then key: what the store's `config` returns (a set following deltas holds each type in
an `immutables.Map`)."""

TYPES = ("tool-service", "tool")

Signature = tuple[str, str | None]
"""(text of the tool item, text of its service's item or None)."""
Touched = Mapping[str, Collection[str]]
"""Keys that changed, by type: what a build given them looks at."""


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

    @cached_property
    def parts_for_user(self) -> PartsForUser | None:
        """The implementation if it answers with rich results (`PartsForUser`), else None: asked once, as
        `calls_for_user` is (on every `ToolSet.parts` it was 0.5 % of the MCP front's loop)."""
        return self.impl if isinstance(self.impl, PartsForUser) else None

    @cached_property
    def streams_for_user(self) -> StreamsForUser | None:
        """The implementation if it streams and is told who calls (`StreamsForUser`), else None: asked once."""
        return self.impl if isinstance(self.impl, StreamsForUser) else None


@dataclass(frozen=True)
class Built:
    entries: immutables.Map[str, Entry] = field(default_factory=immutables.Map)
    """The built tools, in a persistent map: the next build shares every entry it does not touch, at no copy."""
    problems: dict[str, str] = field(default_factory=dict)
    clients: dict[str, ToolServiceClient] = field(default_factory=dict)
    service_problems: dict[str, str] = field(default_factory=dict)
    services: dict[str, ToolServiceDescriptor] = field(default_factory=dict)
    users: Counter[str] = field(default_factory=Counter)
    """Tools using each service's client, by service id: a client no tool uses is closed."""
    examined: frozenset[str] | None = None
    """The tools this build looked at (any other is the previous set's own entry); None: every one."""


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
    previous: Built,
    factories: Mapping[str, ToolFactory],
    *,
    connection: Transport,
    workspace: str,
    user: str,
    limits: CallLimits,
    warm_up: float,
    touched: Touched | None = None,
) -> Built:
    """Build the tools of `items`, reusing what `previous` built; with `touched`, looking only at what it names (and
    the tools of its services, and the tools that failed before). On any failure of the build itself, close what it
    created."""
    raw_services = items.get("tool-service", {})
    if touched is None:
        services, service_problems = parse_services(raw_services)
        names: Collection[str] = items.get("tool", {}).keys()
        users: Counter[str] = Counter()
        kept = immutables.Map[str, Entry]().mutate()
    else:
        services, service_problems = _reparse_services(raw_services, previous, touched.get("tool-service", ()))
        names = _to_rebuild(previous, touched)
        users = previous.users.copy()
        kept = previous.entries.mutate()
        for name in names:
            _forget(kept, users, name)
    pool = _ClientPool(connection, previous.clients)
    if touched is not None:
        for service_id, client in previous.clients.items():
            if users[service_id] > 0 and service_id not in touched.get("tool-service", ()):
                pool.adopt(client)
    entries, problems, pending = _carry_over(items.get("tool", {}), names, raw_services, previous.entries, pool)
    context = ToolContext(workspace, user, limits, connection, services, service_problems, pool.get)
    try:
        await _make_pending(pending, factories, pool, context, entries, problems)
        for name, entry in entries.items():
            users.update(c.service.id for c in entry.clients)
            kept[name] = entry
        in_use = await _settle_clients(previous.clients, users, pool, warm_up)
    except BaseException:
        for client in pool.created:
            await client.close()
        raise
    examined = None if touched is None else frozenset(names)
    return Built(kept.finish(), problems, in_use, service_problems, services, users, examined)


def _reparse_services(
    raw: Mapping[str, str], previous: Built, changed: Collection[str]
) -> tuple[dict[str, ToolServiceDescriptor], dict[str, str]]:
    """`parse_services` of `raw`, parsing again only the `changed` services."""
    if not changed:
        return previous.services, previous.service_problems
    services, problems = dict(previous.services), dict(previous.service_problems)
    for key in changed:
        services.pop(key, None)
        problems.pop(key, None)
        if key in raw:
            try:
                services[key] = _parse_service(key, raw[key])
            except ValueError as exc:
                problems[key] = one_line(exc)
    return services, problems


def _to_rebuild(previous: Built, touched: Touched) -> set[str]:
    """The tools a build given `touched` looks at: those it names, those of a changed service, and those that failed
    before (a service or factory that came since may fix them)."""
    names = set(touched.get("tool", ())) | set(previous.problems)
    changed_services = set(touched.get("tool-service", ()))
    if changed_services:  # a pass over the set, for a change to a service only
        names |= {
            n
            for n, e in previous.entries.items()
            if e.tool.service in changed_services or any(c.service.id in changed_services for c in e.clients)
        }
    return names


def _forget(entries: immutables.MapMutation[str, Entry], users: Counter[str], name: str) -> None:
    """Take a tool out of `entries`, and its uses of clients out of `users`."""
    entry = entries.pop(name, None)
    if entry is not None:
        users.subtract(c.service.id for c in entry.clients)


def _carry_over(
    tools: Mapping[str, str],
    names: Collection[str],
    raw_services: Mapping[str, str],
    previous: Mapping[str, Entry],
    pool: _ClientPool,
) -> tuple[dict[str, Entry], dict[str, str], list[tuple[ToolDescriptor, Signature]]]:
    """Sort the tool items named: the unchanged (same signature, open clients), kept as they are with their clients
    adopted by `pool`; the invalid, each with its reason; and the rest, parsed, with their signatures, to build."""
    kept: dict[str, Entry] = {}
    problems: dict[str, str] = {}
    pending: list[tuple[ToolDescriptor, Signature]] = []
    for name in sorted(names):
        text = tools.get(name)
        if text is None:
            continue
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


async def _make_pending(
    pending: list[tuple[ToolDescriptor, Signature]],
    factories: Mapping[str, ToolFactory],
    pool: _ClientPool,
    context: ToolContext,
    entries: dict[str, Entry],
    problems: dict[str, str],
) -> None:
    """Make each tool `_carry_over` could not keep, by its type's factory, into `entries`; one that cannot be made is
    a problem of its own (`problems`, with why), never a failure of the build: a bad tool never empties the set."""
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
    previous: Mapping[str, ToolServiceClient], users: Counter[str], pool: _ClientPool, warm_up: float
) -> dict[str, ToolServiceClient]:
    """The clients the built tools use, by service id: the new ones among them warmed up, the new ones none uses
    closed."""
    in_use = {sid: c for sid, c in previous.items() if users[sid] > 0}
    in_use.update((sid, c) for sid, c in pool.clients.items() if users[sid] > 0)
    for sid in [sid for sid, n in users.items() if n <= 0]:
        del users[sid]
    unused = [c for c in pool.created if in_use.get(c.service.id) is not c]
    fresh = [c for c in pool.created if in_use.get(c.service.id) is c]
    await _warm_up(fresh, warm_up)
    for client in unused:
        await client.close()
    return in_use
