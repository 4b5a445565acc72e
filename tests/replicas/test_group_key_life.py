"""The group key's life cycle on a real group: a rotation keeps every replica serving, a stranger's key stops only it.

Real `toolreg up --store pulsar` processes on the run's Apache Pulsar, each
under the store's role (authorization on, a role per kind of process), with
a group key file, while a client writes. What an operator would check: no
replica exits, every acknowledged write reads back, the version never goes
back, one active all along; a replica started with another key, or none,
exits 1 in one line naming the mismatch, and the group's term does not move.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import atoolreg, eventually, toolreg_background
from support.replicas import Cluster

from discovery.replicas import GroupKey
from discovery.replicas.markers import lock_holder
from toolservice_base import ConfigClient, Settings, open_transport
from toolservice_base.errors import ConfigError, RequestTimeout

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(420)]

REPLICAS = ("a", "b")


@dataclass
class Writer:
    """A client writing all along; what it was told."""

    acknowledged: dict[str, int] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, client: ConfigClient) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                self.acknowledged[f"w{n}"] = await client.put([("note", f"w{n}", "x")])
                n += 1
            except (RequestTimeout, ConfigError):
                pass  # not acknowledged: tried again
            await asyncio.sleep(0.05)


@asynccontextmanager
async def keyed_group(
    apache: ApachePulsar, tenant: str, root: Path
) -> AsyncIterator[tuple[Cluster, Path, Writer, ConfigClient]]:
    """Two replicas under the store's role with a group key, and a client writing through them."""
    suffix = uuid.uuid4().hex[:6]
    tokens = apache.grant_kinds(tenant, {kind: f"{kind}-{suffix}" for kind in ("store", "service", "agent")})
    key = GroupKey.generate().save(root / "group.key", new=True)
    cluster = Cluster(apache, tenant, root)
    cluster.extra_env["cli"] = {"TOOLREG_GROUP_KEY": str(key)}
    writer = Writer()
    try:
        for name in REPLICAS:
            cluster.extra_env[name] = {"PULSAR_AUTH_TOKEN": tokens["store"], "TOOLREG_GROUP_KEY": str(key)}
            await cluster.start(name)
        await cluster.active()
        agent = Settings(
            data_dir=root / "agent",
            pulsar_url=apache.url,
            broker="apache-pulsar",
            topicspace=tenant,
            auth_token=tokens["agent"],
        )
        async with AsyncExitStack() as stack:
            connection = await stack.enter_async_context(await open_transport(agent))
            client = await stack.enter_async_context(ConfigClient(connection, timeout=2))
            writing = asyncio.ensure_future(writer.run(client))
            stack.push_async_callback(lambda: asyncio.wait({writing}))
            stack.callback(writer.stop.set)
            await eventually(lambda: len(writer.acknowledged) > 5, timeout=30)
            yield cluster, key, writer, client
    finally:
        cluster.stop_all()


async def all_read_back(writer: Writer, client: ConfigClient) -> None:
    writer.stop.set()
    await asyncio.sleep(0.2)
    found = await client.get([("note", k) for k in writer.acknowledged])
    missing = sorted(set(writer.acknowledged) - {k for _, k in found})
    assert missing == [], f"{len(missing)} acknowledged writes lost: {missing[:5]}"
    versions = [writer.acknowledged[k] for k in sorted(writer.acknowledged, key=lambda k: int(k[1:]))]
    assert versions == sorted(versions), "the version went back"


async def test_the_documented_rotation_keeps_every_replica_serving_and_every_write_readable_with_a_writer_running(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path
) -> None:
    async with keyed_group(apache_pulsar, tenant, tmp_path) as (cluster, key, writer, client):
        for step in (1, 2, 3):
            done = await atoolreg("group-key", "rotate", str(key), env=cluster.env("cli"), timeout=60)
            assert done.returncode == 0 and f"step {step} of 3" in done.stdout + done.stderr, done.stderr
            for name in REPLICAS:  # a rolling restart, one at a time
                before = len(writer.acknowledged)
                assert await cluster.stop(name) == 0, cluster.output(name)[-3000:]
                await cluster.start(name)
                await eventually(lambda before=before: len(writer.acknowledged) > before + 3, timeout=60)
        final = GroupKey.load(key)
        assert len(final.secrets) == 1, "the rotation ended with the new key alone"
        for name in REPLICAS:
            assert cluster.processes[name].poll() is None, cluster.output(name)[-3000:]
            assert "group key mismatch" not in cluster.output(name)
        await all_read_back(writer, client)


async def test_a_replica_with_another_key_or_none_stops_in_one_line_and_the_group_does_not_move(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path
) -> None:
    async with keyed_group(apache_pulsar, tenant, tmp_path) as (cluster, key, writer, client):
        settings = cluster.settings()
        async with await open_transport(settings) as connection:
            holder = await lock_holder(connection, connection.topics.state_lock, GroupKey.load(key))
        other = GroupKey.generate().save(tmp_path / "other.key", new=True)
        for name, strange in (("wrong-key", {"TOOLREG_GROUP_KEY": str(other)}), ("unkeyed", {})):
            env = {**cluster.env(name), **strange}
            env["PULSAR_AUTH_TOKEN"] = cluster.extra_env["a"]["PULSAR_AUTH_TOKEN"]
            (tmp_path / name).mkdir()
            process = toolreg_background("up", "--metrics-port", "0", env=env, log=cluster.log(name))
            try:
                code = await asyncio.wait_for(asyncio.to_thread(process.wait), 30)
            except TimeoutError:
                process.kill()
                raise AssertionError(f"{name} still running 30 s on: {cluster.output(name)[-2000:]}") from None
            said = [line for line in cluster.output(name).splitlines() if line.startswith("toolreg: ")]
            assert code == 1 and len(said) == 1 and "group key mismatch" in said[0], cluster.output(name)[-3000:]
            assert ("has no group key" in said[0]) == (name == "unkeyed"), said[0]
        await asyncio.sleep(1)
        async with await open_transport(settings) as connection:
            assert await lock_holder(connection, connection.topics.state_lock, GroupKey.load(key)) == holder
        for name in REPLICAS:
            assert cluster.processes[name].poll() is None, cluster.output(name)[-3000:]
        await all_read_back(writer, client)
