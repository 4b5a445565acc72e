"""`toolreg up --store pulsar` as an operator runs it: several processes, one active, and what a failure costs.

Each replica is a real process on the test run's Apache Pulsar (its own data
directory, the test's tenant as topicspace, token authentication on). The
test kills (-9) or freezes (SIGSTOP) the active one while a client writes,
a service heartbeats and an agent calls its tool, and checks what users
would: no acknowledged write lost, the version never back, no call failed,
no tool gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from apache_pulsar import ApachePulsar
from support import atoolreg, eventually, toolreg_background

from agent_bridge import ToolSet
from toolservice_base import ConfigClient, Settings, open_transport
from toolservice_base.errors import ConfigError, RequestTimeout
from toolservice_base.examples.echo import EchoService

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(300)]

TAKEOVER_AFTER = 3.0
"""Seconds a frozen active may be silent before a standby fences it (10 by default)."""


@dataclass
class Cluster:
    apache: ApachePulsar
    tenant: str
    root: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def env(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
        env.update(
            PULSAR_URL=self.apache.url, PULSAR_AUTH_TOKEN=self.apache.token or "", TOOLREG_TOPICSPACE=self.tenant,
            TOOLREG_DATA_DIR=str(self.root / name), TOOLREG_LOG_FORMAT="json", TOOLREG_LOG_LEVEL="info", PYTHONUNBUFFERED="1",
            TOOLREG_STORE="pulsar",
        )
        return env

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    async def start(self, name: str) -> None:
        self.root.joinpath(name).mkdir(parents=True, exist_ok=True)
        process = toolreg_background("up", "--takeover-after", str(TAKEOVER_AFTER), "--metrics-port", "0", env=self.env(name), log=self.log(name))
        self.processes[name] = process
        await eventually(lambda: self._ready(name), timeout=90, explain=lambda: self.log(name).read_text(errors="replace")[-3000:])

    def _ready(self, name: str) -> bool:
        assert self.processes[name].poll() is None, self.log(name).read_text(errors="replace")[-3000:]
        return "ready in" in self.log(name).read_text(errors="replace")

    def readyz(self, name: str) -> tuple[int, dict[str, Any]]:
        """`/readyz` of a replica's process, read off the URL it printed."""
        line = next(line for line in self.log(name).read_text().splitlines() if line.startswith("metrics "))
        url = line.split()[1].replace("/metrics", "/readyz")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    async def replicas(self) -> list[dict[str, object]]:
        done = await atoolreg("replicas", "--json", "--listen", "1.5", env=self.env("cli"), timeout=60)
        assert done.returncode == 0, done.stderr
        return [r for r in json.loads(done.stdout) if r["group"] == "config-store"]

    async def active(self) -> str:
        """The name of the process whose replica is active, once exactly one is."""
        async def one() -> str | None:
            actives = [r for r in await self.replicas() if r["role"] == "active"]
            if len(actives) != 1:
                return None
            pid = actives[0]["pid"]
            return next((name for name, p in self.processes.items() if p.pid == pid), None)

        found: str = await eventually(one, timeout=60)
        return found

    def settings(self) -> Settings:
        return Settings(data_dir=self.root / "agent", pulsar_url=self.apache.url, broker="apache-pulsar", topicspace=self.tenant,
                        auth_token=self.apache.token)

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


@pytest.fixture
def cluster(apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path) -> Iterator[Cluster]:
    group = Cluster(apache_pulsar, tenant, tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


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

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    async def write(self, client: ConfigClient, per_second: float = 100.0) -> None:
        i = 0
        while not self.stop.is_set():
            key = f"w{i:05d}"
            try:
                self.acknowledged[key] = await client.put([("note", key, str(i))])
                i += 1
            except (RequestTimeout, ConfigError):
                pass  # not acknowledged: the same write is tried again, as an operator's client would
            await asyncio.sleep(1 / per_second)

    async def call(self, tools: ToolSet, every: float = 0.02) -> None:
        while not self.stop.is_set():
            if tools.version:
                self.versions.append(tools.version)
            if "echo" not in tools.names():
                self.tool_missing += 1
            else:
                self.calls += 1
                try:
                    await tools.invoke("echo", {"text": "hi"})
                except Exception as exc:
                    self.failed_calls.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(every)


@asynccontextmanager
async def running_load(cluster: Cluster) -> AsyncIterator[tuple[Load, ConfigClient]]:
    """A service heartbeating, an agent calling its tool every 20 ms and a client writing 100 times a second, against the group."""
    settings = cluster.settings()
    service = EchoService(settings=settings, ttl=3)
    await service.start()
    tools = ToolSet(settings=settings, store_timeout=5)
    connection = await open_transport(settings)
    client = ConfigClient(connection, timeout=2)
    await client.start()
    work = Load()
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


async def check(work: Load, client: ConfigClient) -> None:
    await work.finish()
    found = await client.get([("note", key) for key in work.acknowledged])
    missing = sorted(set(work.acknowledged) - {key for _, key in found})
    assert missing == [], f"{len(missing)} acknowledged writes lost: {missing[:10]}"
    versions = list(work.acknowledged.values())
    assert versions == sorted(versions) and len(set(versions)) == len(versions), "an acknowledged version went back or was reused"
    assert work.versions == sorted(work.versions), "the agent saw the config version go back"
    assert work.failed_calls == [], work.failed_calls[:5]
    assert work.tool_missing == 0, "the tool left the agent's set during the failover (a false expiry)"


async def test_kill_9_of_the_active_under_load_loses_no_acknowledged_write_and_fails_no_call(cluster: Cluster) -> None:
    await cluster.start("a")
    await cluster.start("b")
    standby = "b" if await cluster.active() == "a" else "a"
    status, body = cluster.readyz(standby)
    assert status == 200 and body["replica"]["role"] == "standby", body  # a standby is ready, and says what it is
    async with running_load(cluster) as (work, client):
        active = await cluster.active()
        await asyncio.sleep(2)
        before = len(work.acknowledged)
        killed_at = time.monotonic()
        cluster.processes[active].kill()
        survivor = await cluster.active()
        assert survivor != active
        await eventually(lambda: len(work.acknowledged) > before + 50, timeout=60)
        status, body = cluster.readyz(survivor)
        assert status == 200 and body["replica"]["role"] == "active", body
        took_over = time.monotonic() - killed_at
        await asyncio.sleep(2)
        await check(work, client)
    assert took_over < 30, took_over


async def test_a_frozen_active_is_replaced_and_once_resumed_never_writes_again(cluster: Cluster) -> None:
    await cluster.start("a")
    await cluster.start("b")
    async with running_load(cluster) as (work, client):
        frozen = await cluster.active()
        os.kill(cluster.processes[frozen].pid, signal.SIGSTOP)
        try:
            survivor = await cluster.active()
            assert survivor != frozen
            before = len(work.acknowledged)
            await eventually(lambda: len(work.acknowledged) > before + 50, timeout=60)
        finally:
            os.kill(cluster.processes[frozen].pid, signal.SIGCONT)
        # Resumed, it learns it was deposed and follows as a standby; the group keeps one active.
        await eventually(lambda: "config.replica_restarting" in cluster.log(frozen).read_text(errors="replace"), timeout=60)
        await asyncio.sleep(3)
        roles = {r["pid"]: r["role"] for r in await cluster.replicas()}
        assert roles[cluster.processes[frozen].pid] == "standby" and list(roles.values()).count("active") == 1
        await check(work, client)
