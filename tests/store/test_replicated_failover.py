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
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import datetime

import pytest
from support import eventually
from support.fleet import running_fleet
from support.replicas import TAKEOVER_AFTER, Cluster, check, running_load, unlike_written, write_every_kind

from toolservice_base import ConfigClient, open_transport
from toolservice_base.errors import ConfigError, RequestTimeout

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(300)]

FLEET_TTL = 6.0
"""The fleet's lease: heartbeats every 2 s, so 500 instances send 250 a second."""


async def test_kill_9_of_the_active_under_load_loses_no_write_no_call_no_lease_and_needs_no_grace(
    cluster: Cluster,
) -> None:
    """500 instances heartbeat, a client writes 100 times a second, an agent calls every 20 ms; the active is killed.

    The standby heard every heartbeat, so its registry takes the leases over
    warm: no live instance is expired, and a service that died 4 s before
    the kill goes when its 6 s ttl ends, not a whole ttl after the takeover.
    """
    await cluster.start("a")
    await cluster.start("b")
    standby = "b" if await cluster.active() == "a" else "a"
    status, body = cluster.readyz(standby)
    assert status == 200 and body["replica"]["role"] == "standby", body  # a standby is ready, and says what it is
    settings = cluster.settings()
    async with (
        running_fleet(settings, services=50, instances=10, ttl=FLEET_TTL) as fleet,
        running_load(cluster) as (work, client),
    ):
        tools = work.tools
        assert tools is not None and len(fleet.members) == 500
        await eventually(lambda: fleet.tool_names() <= set(tools.names()), timeout=60)
        active = await cluster.active()
        dead = fleet.silence(0)
        work.must_stay |= fleet.tool_names()
        await asyncio.sleep(FLEET_TTL - 2)
        before = len(work.acknowledged)
        killed_at = time.monotonic()
        cluster.processes[active].kill()
        await eventually(lambda: not dead & set(tools.names()), timeout=60)
        dead_gone_after = time.monotonic() - killed_at
        survivor = await cluster.active()
        assert survivor != active
        await eventually(lambda: len(work.acknowledged) > before + 50, timeout=60)
        status, body = cluster.readyz(survivor)
        assert status == 200 and body["replica"]["role"] == "active", body
        took_over = time.monotonic() - killed_at
        await asyncio.sleep(2)
        await check(work, client)
    assert took_over < 30, took_over
    started = [event for event in log_events(cluster.output(survivor)) if event.get("event") == "registry.started"]
    assert started and started[-1]["warm"] >= len(fleet.members), (
        started
    )  # every lease restored from what the standby heard
    # Its lease ended 2 s after the kill (measured: gone after 2.0 s); with a ttl of grace from the takeover, after 6.2
    # s.
    assert dead_gone_after < FLEET_TTL - 2, (
        f"the dead service went {dead_gone_after:.1f}s after the kill: a ttl of grace, not its own lease's end"
    )


async def test_kill_9_of_the_active_loses_no_acknowledged_write_of_any_kind_and_no_version_goes_back(
    cluster: Cluster,
) -> None:
    """A write to each kind of item and workspace, reserved ones included, each acknowledged; then kill -9 of the
    active. The new active reads every one back, and answers the next write above every version answered before.
    Authorization on: the replicas run as the store's role, the client as the agent's."""
    tokens = cluster.apache.grant_kinds(
        cluster.tenant, {kind: f"{kind}-{cluster.tenant}" for kind in ("store", "agent")}
    )
    for name in ("a", "b"):
        cluster.extra_env[name] = {"PULSAR_AUTH_TOKEN": tokens["store"]}
        await cluster.start(name)
    agent = replace(cluster.settings(), auth_token=tokens["agent"])
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(agent))
        client = await stack.enter_async_context(ConfigClient(connection, timeout=2))
        expected = await write_every_kind(client, "before")
        answered = await client.put([("note", "last-before", "x")])
        cluster.processes[await cluster.active()].kill()
        after = await put_until_acknowledged(client, "first-after")
        assert after > answered, f"the version went back: {answered} answered before the kill, {after} after"
        assert await unlike_written(client, expected) == []


async def test_a_frozen_active_is_replaced_within_takeover_after_plus_2s_and_once_resumed_never_writes_again(
    cluster: Cluster,
) -> None:
    """SIGSTOP the active while a client writes: a standby takes over once it has been silent for --takeover-after,
    and its promotion (store, then registry) asks nothing of the frozen replica, whose consumer of the config queues
    the broker keeps for a minute. Resumed as the new active acknowledges its first write, the deposed one answers
    what it had queued with errors, steps down and writes nothing; the new active's promotion is not disturbed, and
    no acknowledged write is lost."""
    await cluster.start("a")
    await cluster.start("b")
    frozen = await cluster.active()
    survivor = next(name for name in cluster.processes if name != frozen)
    pid = cluster.processes[frozen].pid
    acknowledged: dict[str, tuple[float, int]] = {}
    stop = asyncio.Event()

    async def write(client: ConfigClient) -> None:
        n = 0
        while not stop.is_set():
            try:
                acknowledged[f"w{n}"] = (time.monotonic(), await client.put([("note", f"w{n}", "x")]))
                n += 1
            except (RequestTimeout, ConfigError):
                pass  # not acknowledged: tried again
            await asyncio.sleep(0.05)

    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(cluster.settings()))
        client = await stack.enter_async_context(ConfigClient(connection, timeout=1))
        writing = asyncio.ensure_future(write(client))
        stack.push_async_callback(lambda: asyncio.wait({writing}))
        stack.callback(stop.set)
        await eventually(lambda: len(acknowledged) > 5, timeout=10)
        os.kill(pid, signal.SIGSTOP)
        frozen_at, stopped = time.time(), time.monotonic()
        try:
            await eventually(lambda: any(at > stopped for at, _ in acknowledged.values()), timeout=30)
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.sleep(3)
        stop.set()
        await writing
        started = await eventually(lambda: events(cluster, survivor, "registry.started"), timeout=30)
        # Resumed, it learns it was deposed and follows as a standby; the group keeps one active.
        await eventually(lambda: "config.replica_restarting" in cluster.log(frozen).read_text(errors="replace"), 60)
        found = await client.get([("note", key) for key in acknowledged])
        assert sorted(key for _, key in found) == sorted(acknowledged), "an acknowledged write was lost"
    versions = [version for _, version in sorted(acknowledged.values())]
    assert versions == sorted(versions), "the version went back"
    roles = {r["pid"]: r["role"] for r in await cluster.replicas()}
    assert roles[pid] == "standby" and list(roles.values()).count("active") == 1
    assert events(cluster, survivor, "election.promotion_step_failed") == []
    replaced = at(started[-1]) - frozen_at
    assert replaced < TAKEOVER_AFTER + 2, f"replaced {replaced:.1f}s after the freeze (takeover {TAKEOVER_AFTER:g}s)"


async def put_until_acknowledged(client: ConfigClient, key: str, timeout: float = 30.0) -> int:
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await client.put([("note", key, "x")])
            except (RequestTimeout, ConfigError):
                await asyncio.sleep(0.1)


def events(cluster: Cluster, name: str, event: str) -> list[dict[str, object]]:
    return [e for e in log_events(cluster.output(name)) if e.get("event") == event]


def at(event: dict[str, object]) -> float:
    """When an event was logged (seconds since the epoch)."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def log_events(output: str) -> list[dict[str, object]]:
    """The structured events of a replica's JSON log (its printed lines skipped)."""
    events = []
    for line in output.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events
