"""`toolreg up --store pulsar` replicas as real processes, and the load a group serves while a test breaks it.

A `Cluster` is one replica group: processes on the test run's Apache Pulsar,
each with its own data directory and log, on one topicspace (a tenant). A
`Load` is what users do meanwhile, through `running_load`: a client writing,
a service heartbeating and an agent calling its tool every 20 ms; `check`
asserts what they would see afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from apache_pulsar import ApachePulsar

from agent_bridge import ToolSet
from discovery.replicas import GroupKey
from discovery.store.replicated import ReplicatedStore
from discovery.store.write_policy import ConfigWriteGuard
from toolservice_base import ConfigClient, MemoryBroker, Settings, Transport, open_transport
from toolservice_base.errors import ConfigError, RequestTimeout
from toolservice_base.examples.echo import EchoService

from . import atoolreg, eventually, toolreg_background

TAKEOVER_AFTER = 3.0
"""Seconds a frozen active may be silent before a standby fences it (10 by default)."""


@dataclass
class Cluster:
    """One replica group: `toolreg up --store pulsar` processes on `tenant`, by name, each logging to
    `root/<name>.log`."""

    apache: ApachePulsar
    tenant: str
    root: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _log_from: dict[str, int] = field(default_factory=dict)
    """Where in its log each process's latest start began (a name started again appends to the same log)."""
    urls: dict[str, str] = field(default_factory=dict)
    """The broker's address as a process of that name reaches it (a fault-injecting proxy), if not the broker's own."""
    extra_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """More environment for a process of that name (a skewed clock, say)."""
    program: tuple[str, ...] = (sys.executable, "-m", "discovery.cli")
    """How `toolreg` is run (a variant with a fault built in, for the checker to catch)."""

    def env(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
        env.update(
            PULSAR_URL=self.urls.get(name, self.apache.url),
            PULSAR_AUTH_TOKEN=self.apache.token or "",
            TOOLREG_TOPICSPACE=self.tenant,
            TOOLREG_DATA_DIR=str(self.root / name),
            TOOLREG_LOG_FORMAT="json",
            TOOLREG_LOG_LEVEL="info",
            PYTHONUNBUFFERED="1",
            TOOLREG_STORE="pulsar",
        )
        env.update(self.extra_env.get(name, {}))
        return env

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def output(self, name: str) -> str:
        """What the latest start of `name` printed (and logged)."""
        log = self.log(name)
        if not log.exists():
            return ""
        with open(log, "rb") as handle:
            handle.seek(self._log_from.get(name, 0))
            return handle.read().decode(errors="replace")

    async def start(self, name: str, *args: str) -> None:
        """Start (or start again, on its own data directory) `toolreg up` as `name`; return once it printed `ready
        in`."""
        self.root.joinpath(name).mkdir(parents=True, exist_ok=True)
        log = self.log(name)
        self._log_from[name] = log.stat().st_size if log.exists() else 0
        process = toolreg_background(
            "up",
            "--takeover-after",
            str(TAKEOVER_AFTER),
            "--metrics-port",
            "0",
            *args,
            env=self.env(name),
            log=log,
            program=self.program,
        )
        self.processes[name] = process
        await eventually(lambda: self._ready(name), timeout=90, explain=lambda: self.output(name)[-3000:])

    def _ready(self, name: str) -> bool:
        assert self.processes[name].poll() is None, self.output(name)[-3000:]
        return "ready in" in self.output(name)

    async def stop(self, name: str, timeout: float = 30) -> int:
        """SIGTERM `name`, as an operator (or Kubernetes) stops it; its exit code."""
        process = self.processes[name]
        process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(asyncio.to_thread(process.wait), timeout)
        except TimeoutError:
            raise AssertionError(
                f"{name} still running {timeout:g}s after SIGTERM: {self.output(name)[-3000:]}"
            ) from None

    def readyz(self, name: str) -> tuple[int, dict[str, Any]]:
        """`/readyz` of a replica's process, read off the URL its latest start printed."""
        line = next(line for line in self.output(name).splitlines() if line.startswith("metrics "))
        url = line.split()[1].replace("/metrics", "/readyz")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    async def replicas(self, group: str | None = "config-store") -> list[dict[str, object]]:
        """`toolreg replicas --json` on this topicspace: the rows of `group` (every row with None)."""
        done = await atoolreg("replicas", "--json", "--listen", "1.5", env=self.env("cli"), timeout=60)
        assert done.returncode == 0, done.stderr
        return [r for r in json.loads(done.stdout) if group is None or r["group"] == group]

    async def active(self, timeout: float = 60) -> str:
        """The name of the process whose replica is active, once exactly one is."""

        async def one() -> str | None:
            actives = [r for r in await self.replicas() if r["role"] == "active"]
            if len(actives) != 1:
                return None
            pid = actives[0]["pid"]
            return next((name for name, p in self.processes.items() if p.pid == pid and p.poll() is None), None)

        found: str = await eventually(one, timeout=timeout)
        return found

    def settings(self) -> Settings:
        return Settings(
            data_dir=self.root / "agent",
            pulsar_url=self.apache.url,
            broker="apache-pulsar",
            topicspace=self.tenant,
            auth_token=self.apache.token,
        )

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Load:
    """A client writing, and an agent calling a tool, for as long as the test runs; what each saw."""

    acknowledged: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    failed_calls: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    tool_missing: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    unacknowledged: tuple[type[BaseException], ...] = (RequestTimeout, ConfigError)
    """What a write may fail with and be tried again (anything else fails the test)."""
    tools: ToolSet | None = None
    """The agent's tool set (`running_load` fills it in)."""
    must_stay: set[str] = field(default_factory=set)
    """More tools (a heartbeating fleet's) the agent must never lose; `gone` counts each time one was missing."""
    gone: dict[str, int] = field(default_factory=dict)

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    @property
    def last_version(self) -> int:
        return max(self.acknowledged.values(), default=0)

    async def write(self, client: ConfigClient, per_second: float = 100.0) -> None:
        i = 0
        while not self.stop.is_set():
            key = f"w{i:05d}"
            try:
                self.acknowledged[key] = await client.put([("note", key, str(i))])
                i += 1
            except self.unacknowledged:
                pass  # not acknowledged: the same write is tried again, as an operator's client would
            await asyncio.sleep(1 / per_second)

    async def call(self, tools: ToolSet, every: float = 0.02) -> None:
        while not self.stop.is_set():
            if tools.version:
                self.versions.append(tools.version)
            names = set(tools.names())
            for name in self.must_stay - names:
                self.gone[name] = self.gone.get(name, 0) + 1
            if "echo" not in names:
                self.tool_missing += 1
            else:
                self.calls += 1
                try:
                    await tools.invoke("echo", {"text": "hi"})
                except Exception as exc:
                    self.failed_calls.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(every)


@asynccontextmanager
async def running_load(cluster: Cluster, work: Load | None = None) -> AsyncIterator[tuple[Load, ConfigClient]]:
    """A service heartbeating, an agent calling its tool every 20 ms and a client writing 100 times a second, against
    the group."""
    settings = cluster.settings()
    service = EchoService(settings=settings, ttl=3)
    await service.start()
    tools = ToolSet(settings=settings, store_timeout=5)
    connection = await open_transport(settings)
    client = ConfigClient(connection, timeout=2)
    await client.start()
    work = work or Load()
    work.tools = tools
    try:
        await tools.start()
        await eventually(lambda: "echo" in tools.names(), timeout=30)
        work.tasks = [asyncio.create_task(work.write(client)), asyncio.create_task(work.call(tools))]
        yield work, client
    finally:
        await work.finish()
        await client.close()
        await connection.close()
        await tools.close()
        await service.stop()


async def lost_writes(work: Load, client: ConfigClient) -> list[str]:
    """The acknowledged writes the store no longer has (after `work.finish()`)."""
    found = await client.get([("note", key) for key in work.acknowledged])
    return sorted(set(work.acknowledged) - {key for _, key in found})


async def check(work: Load, client: ConfigClient) -> None:
    await work.finish()
    missing = await lost_writes(work, client)
    assert missing == [], f"{len(missing)} acknowledged writes lost: {missing[:10]}"
    versions = list(work.acknowledged.values())
    assert versions == sorted(versions) and len(set(versions)) == len(versions), (
        "an acknowledged version went back or was reused"
    )
    assert work.versions == sorted(work.versions), "the agent saw the config version go back"
    assert work.failed_calls == [], work.failed_calls[:5]
    assert work.tool_missing == 0, "the tool left the agent's set during the failover (a false expiry)"
    assert work.gone == {}, (
        f"{len(work.gone)} of the fleet's tools left the agent's set (false expiries): {sorted(work.gone)[:10]}"
    )


REPLICATED_KINDS = [pytest.param("apache-pulsar", marks=pytest.mark.apache_pulsar), "memory"]
"""The brokers that can keep replicated state (`Capabilities.replicated_state`): in-process tests run on both."""


def replicated_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """conftest's `settings`, for `REPLICATED_KINDS`: a fresh tenant on the run's Apache Pulsar, or an in-memory
    broker."""
    if request.param == "memory":
        memory: MemoryBroker = request.getfixturevalue("memory_broker")
        return Settings(data_dir=tmp_path / "data", pulsar_url=memory.url)
    apache: ApachePulsar = request.getfixturevalue("apache_pulsar")
    space: str = request.getfixturevalue("tenant")
    return Settings(
        data_dir=tmp_path / "data",
        pulsar_url=apache.url,
        broker="apache-pulsar",
        topicspace=space,
        auth_token=apache.token,
        operation_timeout=3,
    )


class Group:
    """Replicas of one store, each on a connection of its own, as separate processes would be."""

    def __init__(self, settings: Settings, stack: AsyncExitStack) -> None:
        self.settings = settings
        self.stack = stack
        self.replicas: list[ReplicatedStore] = []
        self.exits: dict[int, AsyncExitStack] = {}

    async def connection(self) -> Transport:
        connection = await open_transport(self.settings)
        self.stack.push_async_callback(connection.close)
        return connection

    async def start(
        self,
        name: str,
        takeover_after: float = 2.0,
        shared: dict[str, str] | None = None,
        key: GroupKey | None = None,
        write_guard: ConfigWriteGuard | None = None,
    ) -> ReplicatedStore:
        """Start replica `name`; `shared`: the settings every replica of a group must share (the trust policy's digest,
        say); `key`: the group's key; `write_guard`: this replica's (`"config-writes": "signed"`)."""
        own = AsyncExitStack()
        self.stack.push_async_callback(own.aclose)
        connection = await open_transport(self.settings)
        own.push_async_callback(connection.close)
        replica = await own.enter_async_context(
            ReplicatedStore(
                connection,
                replica_id=name,
                takeover_after=takeover_after,
                settings=shared,
                key=key,
                write_guard=write_guard,
            )
        )
        self.replicas.append(replica)
        self.exits[id(replica)] = own
        return replica

    async def stop(self, replica: ReplicatedStore) -> None:
        await self.exits.pop(id(replica)).aclose()
        self.replicas.remove(replica)

    def active(self) -> ReplicatedStore:
        actives = [r for r in self.replicas if r.role == "active" and r.service is not None]
        assert len(actives) == 1, [(r.replica_id, r.role) for r in self.replicas]
        return actives[0]


@asynccontextmanager
async def fencing_producer(settings: Settings, topic: str) -> AsyncIterator[Callable[..., Awaitable[bytes]]]:
    """What a forger allowed to produce on `topic` can do: take it over by fencing and hold it; yields its `send`.

    On Apache Pulsar a raw pulsar-client producer in ExclusiveWithFencing mode,
    held (the product's own `fence` mode lets go of that mode at once); on the
    in-memory broker the transport's `fence`, which holds the same way.
    """
    if settings.broker != "apache-pulsar":
        transport = await open_transport(settings)
        publisher = await transport.exclusive_publisher(topic, "fence")
        try:
            yield publisher.send
        finally:
            await transport.close()
        return
    import pulsar
    import pulsar.asyncio as pulsar_asyncio

    client = pulsar_asyncio.Client(
        settings.pulsar_url or "",
        authentication=pulsar.AuthenticationToken(settings.auth_token or ""),
        logger=pulsar.FileLogger(pulsar.LoggerLevel.Error, os.devnull),
    )
    producer = await client.create_producer(
        topic, batching_enabled=False, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing
    )

    async def send(data: bytes | dict[str, Any], properties: dict[str, str] | None = None) -> bytes:
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        return bytes((await producer.send(raw, properties=properties)).serialize())

    try:
        yield send
    finally:
        await producer.close()
        await client.close()


ItemKey = tuple[str, str, str]
"""(workspace, type, key) of one config item."""


async def write_every_kind(client: ConfigClient, tag: str) -> dict[ItemKey, str | None]:
    """One write to each kind of item and workspace the store takes, acknowledged; what each item must read back as
    (None: deleted).

    Ordinary and reserved workspaces (`__template__`, the registry's
    `_toolreg`), a workspace declared in `__workspaces__`, a tool and its
    service, a delete in a reserved workspace and a put that changes nothing:
    a store that logged only what it announces lost the reserved ones at a
    failover, and its version went back.
    """
    service = {
        "id": f"svc-{tag}",
        "request-queue": f"non-persistent://tg/request/svc-{tag}",
        "response-queue": f"non-persistent://tg/response/svc-{tag}",
    }
    tool = {"name": f"tool-{tag}", "description": "a tool", "type": "tool-service", "service": f"svc-{tag}"}
    expected: dict[ItemKey, str | None] = {}
    for workspace, item_type, key, value in [
        ("default", "note", f"plain-{tag}", "p"),
        ("default", "tool-service", f"svc-{tag}", json.dumps(service)),
        ("default", "tool", f"tool-{tag}", json.dumps(tool)),
        ("__template__", "note", f"template-{tag}", "t"),
        ("_toolreg", "discovery-record", f"record-{tag}", "r"),
        ("_toolreg", "discovery-record", f"doomed-{tag}", "d"),
        ("__workspaces__", "workspace", f"team-{tag}", "{}"),
        (f"team-{tag}", "note", f"team-{tag}", "w"),
    ]:
        await client.put([(item_type, key, value)], workspace=workspace)
        expected[(workspace, item_type, key)] = value
    await client.delete([("discovery-record", f"doomed-{tag}")], workspace="_toolreg")
    expected[("_toolreg", "discovery-record", f"doomed-{tag}")] = None
    await client.put([("note", f"template-{tag}", "t")], workspace="__template__")  # no change: no new version
    return expected


async def unlike_written(client: ConfigClient, expected: dict[ItemKey, str | None]) -> list[str]:
    """The items that do not read back as `write_every_kind` left them, each as `workspace/type/key: what was read`."""
    wrong = []
    for (workspace, item_type, key), value in expected.items():
        found = await client.get([(item_type, key)], workspace=workspace)
        if found.get((item_type, key)) != value:
            wrong.append(f"{workspace}/{item_type}/{key}: {found.get((item_type, key))!r}, not {value!r}")
    return wrong
