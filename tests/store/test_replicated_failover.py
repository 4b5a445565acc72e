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
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import eventually
from support.replicas import Cluster, check, running_load

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(300)]


@pytest.fixture
def cluster(apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path) -> Iterator[Cluster]:
    group = Cluster(apache_pulsar, tenant, tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


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
