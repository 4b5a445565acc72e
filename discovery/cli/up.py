"""`toolreg up` and `toolreg registry`: the long-running processes, each started on one exit stack.

`toolreg up` runs a broker (embedded pulsar-lite unless `PULSAR_URL`), the
config store and the registry. The store is a SQLite file in the data
directory (`--store sqlite`, the default) or replicated on Apache Pulsar
(`--store pulsar`): then any number of `toolreg up` processes on one cluster
and topicspace form one group, the broker elects the one that serves the
store and runs the registry, and the others follow the log, ready to take
over (`discovery.store.replicated`; the registry's side is
`discovery.registry.replicated`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from discovery.broker import BrokerSupervisor, EmbeddedBroker
from discovery.disk_access import of_os_error, probe
from discovery.registry import RegistryOptions
from discovery.registry.replicated import ActiveRegistry
from discovery.registry.trust import TrustPolicy
from discovery.replicas import Election, GroupKey, Membership, group_key_from
from discovery.replicas.groupkey import protection_line
from discovery.replicas.settings import ReplicaSettings
from discovery.store import STORE_FILE, ChangeWindow, ConfigStore, ConfigStoreService
from discovery.store.local import LocalRequests
from discovery.store.presence import StorePresence
from discovery.store.replicated import ReplicatedStore, new_replica_id
from discovery.store.settings import StoreSettings
from discovery.web import HealthServer
from discovery.web.settings import HttpSettings
from toolservice_base import Settings, Transport, open_transport

from . import registry as cli_registry
from .common import CommandError, UpLock, settings_of, store_choice, wait_for_signal
from .http_surface import show_registry_page, start_health

REGISTRY_GROUP = "registry"
"""The replica group of `toolreg registry` processes (`toolreg replicas` shows it)."""


def shared_options(options: RegistryOptions) -> dict[str, object]:
    """What every replica of a group must run with alike: the trusted keys and what each may do (their content, so the
    digest is the same in every process), and the registry's limits."""
    trust = options.trust
    return {
        "trust": trust.content() if isinstance(trust, TrustPolicy) else None,
        "max_clock_skew": options.max_clock_skew,
        "pin_definitions": options.pin_definitions,
        "allowed_namespaces": sorted(options.allowed_namespaces or []),
        "max_instances": options.max_instances,
    }


def store_backend(args: argparse.Namespace) -> str:
    """`--store`, else TOOLREG_STORE, else sqlite (`common.store_choice`); for `up`, also a usable
    `--takeover-after`."""
    chosen = store_choice(args)
    if chosen == "pulsar" and not args.takeover_after > 0:
        raise CommandError(f"--takeover-after must be a positive number of seconds, got {args.takeover_after:g}")
    return chosen


async def cmd_up(args: argparse.Namespace) -> int:
    """Broker, store, registry: each step's undo goes on the exit stack as it succeeds.

    A failure at any step (or Ctrl-C) unwinds exactly the steps before it, in
    reverse: no broker, connection or task is left behind, and the error
    reaches `run` as one line.
    """
    settings = settings_of(args)
    options = cli_registry.registry_options(args)
    backend = store_backend(args)
    key = group_key_from(ReplicaSettings.from_env().group_key_file)
    window, http = StoreSettings.from_env().window, HttpSettings.from_env()  # a bad value stops it before it starts
    started = time.perf_counter()
    up = False
    async with AsyncExitStack() as stack:
        _lock(stack, settings.data_dir, backend)
        config: ConfigStore | None = None
        if backend == "sqlite":
            # checked before anything starts: a damaged store stops us here
            config = ConfigStore(settings.data_dir / STORE_FILE, window=window)
            stack.callback(config.close)
        health = await start_health(stack, args.metrics_port, http)
        if health is not None:
            health.add_check("startup", lambda: None if up else "starting")
            print(f"metrics       {health.url}/metrics (and /healthz, /readyz)")
        watched: list[asyncio.Future[Any]] = []
        url = await _broker(stack, settings, args, health, watched)
        connection = await open_transport(settings, url=url)
        stack.push_async_callback(connection.close)
        print(
            f"workarounds   {', '.join(connection.capabilities.enabled()) or 'none'} (for {settings.broker_kind(url)})"
        )
        if config is not None:
            # Another store on this topicspace: one line, before serving (none can be on a broker we just started).
            presence = StorePresence(
                connection, version=lambda: config.version, key=key, look=bool(settings.pulsar_url)
            )
            await stack.enter_async_context(presence)
            registry_group = await _sqlite_store(stack, connection, config, args, options, health, key)
            if health is not None:
                health.add_check("one-store", presence.readiness)
            if registry_group is not None:
                watched.append(registry_group)
        else:
            watched.append(await _replicated_store(stack, connection, args, options, health, key, window))
        up = True
        print(f"ready in {(time.perf_counter() - started) * 1000:.0f} ms; Ctrl-C to stop", flush=True)
        await wait_for_signal(*watched)
        up = False
        print("stopping", flush=True)
    return 0


def _lock(stack: AsyncExitStack, data_dir: Path, backend: str) -> None:
    """Hold the data directory's lock, once the directory is known to take writes: else one line with the cause and the
    fix.

    Everything `toolreg up` keeps (the lock, the store, the broker's data)
    is written there, so a read-only mount or a full disk is said at once,
    as what it is, before SQLite or the broker say it in words that read
    like damage.
    """
    what = "the config store" if backend == "sqlite" else "the data directory"
    problem = probe(data_dir)
    if problem is not None:
        raise CommandError(problem.says(what))
    try:
        lock = UpLock(data_dir)
    except OSError as exc:
        raise CommandError(_refused(exc, data_dir, what)) from None
    stack.callback(_release, lock)
    try:
        lock.acquire()
    except OSError as exc:  # the pid could not be written: the disk filled up since the probe
        raise CommandError(_refused(exc, data_dir, what)) from None


def _refused(exc: OSError, data_dir: Path, what: str) -> str:
    problem = of_os_error(exc, data_dir)
    return problem.says(what) if problem is not None else f"cannot write {what} at {data_dir}: {exc}"


def _release(lock: UpLock) -> None:
    with contextlib.suppress(OSError):  # a pid a full disk could not take is retried at close: nothing to keep
        lock.release()


async def _broker(
    stack: AsyncExitStack,
    settings: Settings,
    args: argparse.Namespace,
    health: HealthServer | None,
    watched: list[asyncio.Future[Any]],
) -> str:
    """The broker's URL: `PULSAR_URL`, or an embedded pulsar-lite started (and supervised) here."""
    if settings.pulsar_url:
        print(f"broker        {settings.pulsar_url} (PULSAR_URL)")
        return settings.pulsar_url
    broker = EmbeddedBroker(settings.data_dir)
    url = broker.start(port=args.port, adopt=True)
    stack.callback(broker.stop)
    supervisor = BrokerSupervisor(broker)
    watched.append(await stack.enter_async_context(supervisor.running()))
    if health is not None:
        health.add_check("broker", supervisor.readiness)
    how = "adopted from a previous `toolreg up`" if broker.adopted else "embedded pulsar-lite, loopback only"
    print(f"broker        {url} ({how}; restarted if it dies; URL in {broker.url_file})")
    if broker.port_note:
        print(f"note          {broker.port_note}")
    return url


async def _sqlite_store(
    stack: AsyncExitStack,
    connection: Transport,
    config: ConfigStore,
    args: argparse.Namespace,
    options: RegistryOptions,
    health: HealthServer | None,
    key: GroupKey | None,
) -> asyncio.Future[Any] | None:
    """The store, then the registry in its group (`_registry_group`); returns what `wait_for_signal` must watch."""
    guard = cli_registry.write_guard(options, key, connection.topics.topicspace)
    store = ConfigStoreService(connection, config, protocol=args.store_protocol, write_guard=guard)
    stack.push_async_callback(store.stop)
    await store.start()
    if health is not None:
        health.add_check("config-store", store.readiness)
    print(f"config store  {store.store.path} (version {store.store.version}; {args.store_protocol} protocol)")
    if args.no_registry:
        return None
    registry = ActiveRegistry(connection, options, requests=LocalRequests(lambda: store))
    stack.push_async_callback(registry.stop)
    watched = await _registry_group(stack, connection, registry, options, key)
    if health is not None:
        health.add_check("registry", registry.readiness)
        print(f"page          {show_registry_page(health, registry)}")
    print(f"registry      listening on {connection.topics.tool_descriptors}")
    print(f"trust         {cli_registry.trust_line(options)}")
    return watched


async def _replicated_store(
    stack: AsyncExitStack,
    connection: Transport,
    args: argparse.Namespace,
    options: RegistryOptions,
    health: HealthServer | None,
    key: GroupKey | None,
    window: ChangeWindow,
) -> asyncio.Future[Any]:
    """Join the group: a standby until the broker elects this replica; the active one also runs the registry, which asks
    the store of its own replica directly (not the queues, where a frozen deposed replica may still listen)."""
    replicated: ReplicatedStore | None = None
    registry = ActiveRegistry(
        connection, options, requests=LocalRequests(lambda: None if replicated is None else replicated.service)
    )
    stack.push_async_callback(registry.stop)
    if not args.no_registry:
        await registry.listen()
    group_settings = {"protocol": args.store_protocol, "registry": not args.no_registry, **shared_options(options)}
    replicated = ReplicatedStore(
        connection,
        protocol=args.store_protocol,
        takeover_after=args.takeover_after,
        settings=group_settings,
        on_active=None if args.no_registry else registry.start,
        on_standby=None if args.no_registry else registry.step_down,
        key=key,
        write_guard=cli_registry.write_guard(options, key, connection.topics.topicspace),
        window=window,
    )
    registry.replicas, registry.hearing = replicated.replicas, replicated.heard_itself_at
    await stack.enter_async_context(replicated)
    if health is not None:
        health.add_check("config-store", replicated.readiness)
        health.add_check("registry", registry.readiness)
        health.add_fact(
            "replica", lambda: {"id": replicated.replica_id, "role": replicated.role, "version": replicated.version}
        )
        if not args.no_registry:
            print(f"page          {show_registry_page(health, registry)}")
    print(f"config store  {replicated.describe()}; {args.store_protocol} protocol")
    print(f"state         {protection_line(key, f'{connection.topics.topicspace}/state')}")
    if not args.no_registry:
        print(f"registry      {registry_line(replicated.role, connection.topics.tool_descriptors)}")
        print(f"trust         {cli_registry.trust_line(options)}")
    return asyncio.ensure_future(replicated.wait_failed())


def registry_line(role: str, topic: str) -> str:
    """Where the registry of a replicated store runs, as this replica's start says it: here (the active replica), or
    on the active one, this one being a standby (it runs here if this replica becomes the active one)."""
    if role == "active":
        return f"runs here (this replica is the active one); listening on {topic}"
    return (
        f"runs on the active replica, not here: this one is a {role} (it runs the registry if it becomes the active"
        f" one); announcements go to {topic}"
    )


async def cmd_registry(args: argparse.Namespace) -> int:
    """Run the registry alone (beside a config store that runs elsewhere, TrustGraph's say) until SIGTERM/SIGINT.

    On a broker that can elect (Apache Pulsar), any number of `toolreg
    registry` processes (and the registry of `toolreg up`) on one topicspace
    form one group: the broker elects the one that runs, the others wait to
    take over. On pulsar-lite the second one refuses (`_sole_registry`).
    """
    options = cli_registry.registry_options(args)
    settings = settings_of(args)
    http = HttpSettings.from_env()  # a value it cannot use stops it before it reaches for the broker
    key = group_key_from(ReplicaSettings.from_env().group_key_file)
    async with AsyncExitStack() as stack:
        connection = await open_transport(settings)
        stack.push_async_callback(connection.close)
        health = await start_health(stack, args.metrics_port, http)
        topicspace = connection.topics.topicspace
        sign = None if key is None else (lambda request: key.sign_config(request, topicspace))  # a guarded store
        registry = ActiveRegistry(connection, options, sign=sign)
        stack.push_async_callback(registry.stop)
        watched = [await _registry_group(stack, connection, registry, options, key)]
        if health is not None:
            health.add_check("registry", registry.readiness)
            print(f"metrics on {health.url}/metrics (and /healthz, /readyz)", flush=True)
            print(f"page: {show_registry_page(health, registry)}", flush=True)
        topics = connection.topics
        print(f"registry listening on {topics.tool_descriptors}; queries on {topics.registry_request}", flush=True)
        print(f"trust: {cli_registry.trust_line(options)}", flush=True)
        await wait_for_signal(*watched)
    return 0


async def _registry_group(
    stack: AsyncExitStack,
    connection: Transport,
    registry: ActiveRegistry,
    options: RegistryOptions,
    key: GroupKey | None = None,
) -> asyncio.Future[Any]:
    """Run `registry` as the one registry of the topicspace: elected where the broker can, alone on pulsar-lite.

    Two registries on one store would each merge what they hear and delete
    what the other wrote; so `toolreg registry` beside `toolreg up` either
    waits its turn (an election) or refuses to run.
    """
    if connection.capabilities.replicated_state:
        return await _elect_registry(stack, connection, registry, options, key)
    return await _sole_registry(stack, connection, registry, options, key)


async def _sole_registry(
    stack: AsyncExitStack,
    connection: Transport,
    registry: ActiveRegistry,
    options: RegistryOptions,
    key: GroupKey | None = None,
) -> asyncio.Future[Any]:
    """On a broker that cannot elect (pulsar-lite): run, and refuse in one line if an older registry is heard on the
    topicspace.

    Each registry publishes its status in the registry group every second
    (`toolreg replicas` lists them); the one that started later stops
    within about a second of hearing the other, before its first sweep
    could expire anything the other holds.
    """
    replica_id = new_replica_id()
    members = await stack.enter_async_context(
        Membership(connection, replica_id, REGISTRY_GROUP, settings=shared_options(options), key=key)
    )
    members.set_role("active")
    registry.replicas, registry.hearing = members.replicas, lambda: members.heard_itself_at
    await registry.start()
    return asyncio.ensure_future(_refuse_an_older_registry(members))


async def _refuse_an_older_registry(members: Membership) -> None:
    """Refuse to go on once an older registry is heard; looked at each time another member of the group speaks."""
    own = members.status
    while True:
        older = [
            r
            for r in members.replicas()
            if r.id != own.id and r.role == "active" and (r.since, r.id) < (own.since, own.id)
        ]
        if older:
            other = older[0]
            raise CommandError(
                f"another registry already runs on this topicspace ({other.id}, pid {other.pid} on {other.host}): run"
                " one registry per topicspace (`toolreg up` runs one; use `toolreg up --no-registry` beside `toolreg"
                " registry`)"
            )
        await members.other_heard()


async def _elect_registry(
    stack: AsyncExitStack,
    connection: Transport,
    registry: ActiveRegistry,
    options: RegistryOptions,
    key: GroupKey | None = None,
) -> asyncio.Future[Any]:
    """Join the registry group: run the registry while this process holds the registry lock."""
    replica_id = new_replica_id()
    members = await stack.enter_async_context(
        Membership(connection, replica_id, REGISTRY_GROUP, settings=shared_options(options), key=key)
    )
    election = Election(connection, connection.topics.registry_lock, replica_id, membership=members, key=key)
    registry.replicas, registry.hearing = members.replicas, lambda: members.heard_itself_at
    await registry.listen()

    async def demoted(reason: str) -> None:
        await (registry.stop() if reason == "closing" else registry.step_down())

    election.add_listener(registry.start, demoted)
    await stack.enter_async_context(election)
    print(f"replica       {replica_id} ({election.role}; `toolreg replicas` lists the group)", flush=True)
    print(f"state         {protection_line(key, f'{connection.topics.topicspace}/state')}", flush=True)
    return asyncio.ensure_future(election.wait_stopped())
