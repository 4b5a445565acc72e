"""`toolreg up --store pulsar` through what operators do to a group: restart the broker, roll the replicas, share a
cluster.

Each replica is a real process on the test run's Apache Pulsar (the shared
`apache_pulsar` of the run, token authentication on, a fresh tenant as the
topicspace). The checks are what users see: `toolreg replicas`, writes
acknowledged and kept, the version never back, tool calls answered, and for
bad input one line and exit code 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from apache_pulsar import PRODUCT_NAMESPACES, ApachePulsar, port_is_free
from support import atoolreg, eventually
from support.replicas import Cluster, Load, check, lost_writes, running_load

from toolservice_base import ConfigClient
from toolservice_base.errors import ToolDiscoveryError

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(240)]


async def roles(cluster: Cluster) -> dict[str, str]:
    """Each running process's role as `toolreg replicas --json` lists it, by name (a process not listed: missing)."""
    by_pid = {row["pid"]: str(row["role"]) for row in await cluster.replicas()}
    return {name: by_pid.get(p.pid, "missing") for name, p in cluster.processes.items() if p.poll() is None}


async def one_active(cluster: Cluster, timeout: float = 60) -> dict[str, str]:
    """Every running process listed, exactly one of them active: the roles, once so."""

    async def settled() -> dict[str, str] | None:
        seen = await roles(cluster)
        return seen if sorted(seen.values()) == ["active", *["standby"] * (len(seen) - 1)] else None

    found: dict[str, str] = await eventually(settled, timeout=timeout, interval=0.2)
    return found


async def caught_up_standby(cluster: Cluster, name: str, version: int, timeout: float = 30) -> None:
    """`name`'s /readyz says: ready, a standby, at `version` or later."""

    async def ready() -> bool:
        status, body = await asyncio.to_thread(cluster.readyz, name)
        return status == 200 and body["replica"]["role"] == "standby" and body["replica"]["version"] >= version

    await eventually(ready, timeout=timeout, interval=0.1, explain=lambda: cluster.readyz(name))


# --- a broker restart ---------------------------------------------------------------------------------


async def test_after_a_broker_restart_under_3_replicas_one_is_active_and_no_acknowledged_write_is_lost(
    cluster: Cluster,
    apache_pulsar: ApachePulsar,
) -> None:
    await asyncio.gather(*(cluster.start(name) for name in "abc"))
    await one_active(cluster)
    work = Load(
        unacknowledged=(ToolDiscoveryError,)
    )  # while the broker is away a write may fail any way: it is not acknowledged
    seen_by_client: list[int] = []

    async def read_versions(client: ConfigClient) -> None:
        while not work.stop.is_set():
            try:
                seen_by_client.append(await client.version(timeout=2))
            except ToolDiscoveryError:
                pass
            await asyncio.sleep(0.05)

    async with running_load(cluster, work) as (work, client):
        work.tasks.append(asyncio.create_task(read_versions(client)))
        await eventually(lambda: len(work.acknowledged) > 50, timeout=30)
        away = await asyncio.to_thread(apache_pulsar.restart)  # same ports, same data; the replicas keep running
        back = time.monotonic()
        after, answered = len(work.acknowledged), work.calls - len(work.failed_calls)
        await eventually(lambda: len(work.acknowledged) > after + 50, timeout=60)  # writes are acknowledged again
        writing_again = time.monotonic() - back
        await eventually(
            lambda: work.calls - len(work.failed_calls) > answered + 20, timeout=30
        )  # and the agent's calls answered
        seen = await one_active(cluster)
        assert set(seen) == {"a", "b", "c"}, seen  # no replica died of it
        await work.finish()
        missing = await lost_writes(work, client)
    print(f"broker away {away:.1f}s; writes acknowledged again {writing_again:.1f}s after it was back")
    assert missing == [], f"{len(missing)} acknowledged writes lost: {missing[:10]}"
    versions = list(work.acknowledged.values())
    assert versions == sorted(versions) and len(set(versions)) == len(versions), (
        "an acknowledged version went back or was reused"
    )
    assert seen_by_client == sorted(seen_by_client), "a client saw the config version go back"
    assert work.versions == sorted(work.versions), "the agent saw the config version go back"


# --- a rolling restart --------------------------------------------------------------------------------


async def test_a_rolling_restart_of_every_replica_under_load_fails_no_call_and_loses_no_write(cluster: Cluster) -> None:
    await asyncio.gather(*(cluster.start(name) for name in "abc"))
    await one_active(cluster)
    async with running_load(cluster) as (work, client):
        await eventually(lambda: len(work.acknowledged) > 50, timeout=30)
        handovers = 0
        for name in "abc":  # one at a time, as `kubectl rollout restart` with a PodDisruptionBudget does
            handovers += (await one_active(cluster))[name] == "active"
            calls = work.calls
            assert await cluster.stop(name) == 0, cluster.output(name)[-3000:]
            mark = work.last_version
            await cluster.start(name)
            await caught_up_standby(cluster, name, mark)
            assert (await one_active(cluster))[name] == "standby"
            assert work.calls > calls + 50, "the agent stopped calling while a replica restarted"
        written = len(work.acknowledged)
        await eventually(lambda: len(work.acknowledged) > written + 50, timeout=30)
        await check(work, client)
    assert handovers >= 1  # the active one was among them: the group handed over at least once
    print(f"{handovers} handovers; {work.calls} calls, {len(work.acknowledged)} acknowledged writes")


# --- two groups on one cluster ------------------------------------------------------------------------


async def test_two_groups_in_two_topicspaces_on_one_cluster_never_see_each_other(
    apache_pulsar: ApachePulsar,
    tenant: str,
    tmp_path: Path,
) -> None:
    other = f"t-{uuid.uuid4().hex[:10]}"
    apache_pulsar.create_tenant(other)
    one, two = Cluster(apache_pulsar, tenant, tmp_path / "one"), Cluster(apache_pulsar, other, tmp_path / "two")
    try:
        await asyncio.gather(one.start("a"), one.start("b"), two.start("a"), two.start("b"))
        for group in (one, two):  # each its own active, and `toolreg replicas` lists its own processes only
            await one_active(group)
            listed = {row["pid"] for row in await group.replicas(group=None)}
            assert listed == {p.pid for p in group.processes.values()}, (group.tenant, listed)

        value = json.dumps("only in one")
        put = await atoolreg("config", "put", "note/mine", "--value", value, env=one.env("cli"))
        assert put.returncode == 0, put.stderr[-2000:]
        version = int(re.search(r"config version (\d+)", put.stdout).group(1))  # type: ignore[union-attr]
        got = await atoolreg("config", "get", "note/mine", env=one.env("cli"))
        assert got.returncode == 0 and "only in one" in got.stdout, got.stderr[-2000:]
        elsewhere = await atoolreg("config", "get", "note/mine", env=two.env("cli"))
        assert elsewhere.returncode == 1 and "not found" in elsewhere.stderr, (
            elsewhere.stdout,
            elsewhere.stderr[-2000:],
        )

        async def one_applied_it() -> bool:
            return all(int(row["version"]) >= version for row in await one.replicas())

        await eventually(one_applied_it, timeout=10)  # both of one's replicas applied it...
        assert {int(row["version"]) for row in await two.replicas()} == {0}  # ...and two's store never moved
    finally:
        one.stop_all()
        two.stop_all()
        apache_pulsar.delete_tenant(other)


# --- bad input: one line, exit 1 ----------------------------------------------------------------------


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed `toolreg up` says to its user (its log, JSON lines on stderr, aside); exit code 1."""
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    said = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("{")]
    assert len(said) == 1 and said[0].startswith("toolreg: "), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return said[0]


async def test_a_topicspace_without_its_state_namespace_is_named_with_the_fix_in_one_line(
    apache_pulsar: ApachePulsar,
    tmp_path: Path,
) -> None:
    space = f"t-{uuid.uuid4().hex[:10]}"
    apache_pulsar.create_tenant(space, [n for n in PRODUCT_NAMESPACES if n != "state"])
    try:
        cluster = Cluster(apache_pulsar, space, tmp_path)
        started = time.monotonic()
        done = await atoolreg("up", "--store", "pulsar", "--metrics-port", "0", env=cluster.env("a"), timeout=60)
        line = one_line(done)
        assert f"{space}/state" in line and "deploy/pulsar-init.sh" in line, line
        assert time.monotonic() - started < 30
    finally:
        apache_pulsar.delete_tenant(space)


async def test_on_pulsar_lite_up_with_the_pulsar_store_says_it_needs_apache_pulsar(tmp_path: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))
    }  # no PULSAR_URL: embedded pulsar-lite
    env.update(TOOLREG_DATA_DIR=str(tmp_path / "data"), TOOLREG_LOG_FORMAT="json", PYTHONUNBUFFERED="1")
    done = await atoolreg("up", "--store", "pulsar", "--metrics-port", "0", env=env, timeout=60)
    line = one_line(done)
    assert "needs Apache Pulsar" in line, line
    port = int(re.search(r"^broker\s+pulsar://127\.0\.0\.1:(\d+) \(embedded pulsar-lite", done.stdout, re.M).group(1))  # type: ignore[union-attr]
    assert port_is_free(port), "the embedded broker was left running"


async def test_takeover_after_0_is_refused_in_one_line(cluster: Cluster) -> None:
    done = await atoolreg("up", "--store", "pulsar", "--takeover-after", "0", env=cluster.env("a"), timeout=60)
    line = one_line(done)
    assert "--takeover-after" in line, line
