"""The config store replicated on the broker: one active replica serves, standbys follow the log and take over.

In process, each replica with a client of its own, on Apache Pulsar (a fresh
tenant per test) and on the in-memory transport, which must behave the same.
What a client sees is the promise: an acknowledged write survives a failover,
a batch is seen whole, and the version never goes back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from support import eventually
from support.replicas import REPLICATED_KINDS, Group, replicated_settings, unlike_written, write_every_kind

from agent_bridge import ToolSet
from discovery.errors import ReplicationError
from discovery.replicas import GroupKey
from discovery.store.replicated import ReplicatedStore
from toolservice_base import ConfigClient, Settings, open_transport
from toolservice_base.errors import BrokerUnsupported, ConfigError, RequestTimeout
from toolservice_base.schemas import ConfigRequest

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(params=REPLICATED_KINDS)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """conftest's `settings`, on the brokers that can keep replicated state only."""
    return replicated_settings(request, tmp_path)


@pytest.fixture
async def group(settings: Settings) -> AsyncIterator[Group]:
    async with AsyncExitStack() as stack:
        yield Group(settings, stack)


def held(tools: ToolSet) -> dict[str, dict[str, str]]:
    """The raw items the set was built from, as plain dicts (it keeps them in persistent maps)."""
    return {t: dict(items) for t, items in tools._reload.state.items.items()}


async def put_until_acknowledged(client: ConfigClient, key: str, value: str, timeout: float = 30.0) -> int:
    """What an operator's retrying client does across a failover: the write is acknowledged once, with its version."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await client.put([("note", key, value)])
            except (RequestTimeout, ConfigError):
                await asyncio.sleep(0.1)


async def test_one_replica_serves_the_other_follows_with_the_same_items_and_version(group: Group) -> None:
    first = await group.start("first")
    await eventually(lambda: first.role == "active" and first.service is not None, timeout=15)
    second = await group.start("second")
    assert second.role == "standby" and second.service is None
    client = ConfigClient(await group.connection(), timeout=5)
    await client.start()
    try:
        version = await client.put([("note", "a", "1"), ("note", "b", "2"), ("note", "c", "3")])
        await eventually(lambda: second.version == version, timeout=10)
        assert second.store is not None and first.store is not None
        assert second.store.dump() == first.store.dump()
        assert [status.role for status in sorted(first.replicas(), key=lambda s: s.id)] == ["active", "standby"]
    finally:
        await client.close()


async def test_a_batch_reaches_a_standby_whole_or_not_at_all(group: Group) -> None:
    active = await group.start("active")
    await eventually(lambda: active.service is not None, timeout=15)
    standby = await group.start("standby")
    client = ConfigClient(await group.connection(), timeout=5)
    await client.start()
    seen: list[tuple[int, int]] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            if standby.store is not None:
                version, rows = standby.store.dump()
                seen.append((version, len(rows)))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    try:
        for round_ in range(20):
            await client.put([("note", f"r{round_}-{i}", "x") for i in range(10)])
        await eventually(lambda: standby.version == active.version, timeout=10)
    finally:
        stop.set()
        await watcher
        await client.close()
    assert seen and all(items % 10 == 0 for _, items in seen), sorted({items for _, items in seen if items % 10})
    assert [v for v, _ in seen] == sorted(v for v, _ in seen), "the version went back at a standby"


async def test_the_standby_takes_over_when_the_active_goes_and_no_acknowledged_write_is_lost(group: Group) -> None:
    first = await group.start("first")
    await eventually(lambda: first.service is not None, timeout=15)
    second = await group.start("second")
    client = ConfigClient(await group.connection(), timeout=2)
    await client.start()
    acknowledged: dict[str, int] = {}
    try:
        for i in range(30):
            acknowledged[f"before-{i}"] = await put_until_acknowledged(client, f"before-{i}", str(i))
        await group.stop(first)  # the active goes; the broker hands the lock to the standby
        for i in range(30):
            acknowledged[f"after-{i}"] = await put_until_acknowledged(client, f"after-{i}", str(i))
        assert group.active() is second
        found = await client.get([("note", key) for key in acknowledged])
        assert sorted(key for _, key in found) == sorted(acknowledged)
        versions = list(acknowledged.values())
        assert versions == sorted(versions) and len(set(versions)) == len(versions), "a version went back or was reused"
    finally:
        await client.close()


async def test_every_acknowledged_write_survives_a_failover_announced_or_not_and_the_version_never_goes_back(
    group: Group,
) -> None:
    """Acknowledged means in the log, whatever the write: a reserved workspace's item, the registry's own records, a
    declared workspace, a delete. Each reads back on the next active, at a version no lower than the last answered."""
    first = await group.start("first")
    await eventually(lambda: first.service is not None, timeout=15)
    second = await group.start("second")
    client = ConfigClient(await group.connection(), timeout=2)
    await client.start()
    try:
        expected = await write_every_kind(client, "a")
        answered = first.version
        await group.stop(first)
        await eventually(lambda: second.service is not None, timeout=15)
        assert await unlike_written(client, expected) == []
        assert second.version >= answered, f"the version went back from {answered} to {second.version}"
        expected |= await write_every_kind(client, "b")
        assert await unlike_written(client, expected) == []
    finally:
        await client.close()


async def test_a_write_delivered_again_to_the_next_active_is_answered_as_made_not_made_twice(group: Group) -> None:
    """The broker hands a request to the next active when the one that made it was cut off before acknowledging the
    message: by its id, the log says it was made, so a conditional write does not fail its own condition."""
    first = await group.start("first")
    await eventually(lambda: first.service is not None, timeout=15)
    second = await group.start("second")
    write = ConfigRequest(
        operation="put",
        workspace="default",
        values=[{"type": "note", "key": "k", "value": "mine"}],
        expect=[{"type": "note", "key": "k", "value": None}],
    )
    assert first.service is not None
    made = await first.service.answer(write, request_id="request-1")
    assert made.error is None and made.version
    await eventually(lambda: second.version == made.version, timeout=10)
    await group.stop(first)
    await eventually(lambda: second.service is not None, timeout=15)
    assert second.service is not None
    again = await second.service.answer(write, request_id="request-1")
    assert again.error is None and again.version == made.version
    assert second.version == made.version, "made twice"
    another = await second.service.answer(write, request_id="request-2")  # the same content, another request
    assert another.error is not None and another.error.type == "conflict"


async def test_a_replica_that_comes_back_is_a_standby_and_catches_up(group: Group) -> None:
    first = await group.start("first")
    await eventually(lambda: first.service is not None, timeout=15)
    second = await group.start("second")
    client = ConfigClient(await group.connection(), timeout=2)
    await client.start()
    try:
        await put_until_acknowledged(client, "one", "1")
        await group.stop(first)
        await eventually(lambda: second.service is not None, timeout=15)
        version = await put_until_acknowledged(client, "two", "2")
        back = await group.start("first-again")
        await eventually(lambda: back.version == version, timeout=10)
        assert back.role == "standby" and group.active() is second
        assert back.store is not None and back.store.get("default", [("note", "one"), ("note", "two")]) == [
            ("note", "one", "1"),
            ("note", "two", "2"),
        ]
    finally:
        await client.close()


async def test_a_replica_with_other_group_settings_than_the_active_one_refuses_to_join_in_one_line(
    group: Group,
) -> None:
    """With a group key the active's status is its own word: another digest there refuses the join, naming what
    differs."""
    key = GroupKey.generate()
    first = await group.start("first", shared={"trust": "keys-a", "max_instances": 10_000}, key=key)
    await eventually(lambda: first.service is not None, timeout=15)
    with pytest.raises(ReplicationError, match="other group settings") as caught:
        await group.start("stranger", shared={"trust": "keys-a", "max_instances": 20_000}, key=key)
    assert "\n" not in str(caught.value) and "active replica first" in str(caught.value)
    assert "they differ in max_instances:" in str(caught.value)  # which setting, not only that one does
    alike = await group.start("alike", shared={"trust": "keys-a", "max_instances": 10_000}, key=key)
    assert alike.role == "standby" and group.active() is first


async def test_without_a_group_key_other_settings_in_a_status_are_logged_and_the_replica_joins(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a key a status is a hint anyone allowed on the members topic could have written: no reason to stop."""
    first = await group.start("first", shared={"trust": "keys-a"})
    await eventually(lambda: first.service is not None, timeout=15)
    stranger = await group.start("stranger", shared={"trust": "keys-b"})
    assert stranger.role == "standby" and group.active() is first
    assert "config.replica_settings_differ" in caplog.text


async def test_on_pulsar_lite_the_replicated_store_says_it_needs_apache_pulsar(tmp_path: Path) -> None:
    from discovery.broker import EmbeddedBroker

    broker = EmbeddedBroker(tmp_path / "lite")
    url = broker.start()
    try:
        connection = await open_transport(Settings(data_dir=tmp_path / "data", pulsar_url=url, broker="pulsar-lite"))
        try:
            with pytest.raises(BrokerUnsupported, match="needs Apache Pulsar") as caught:
                async with ReplicatedStore(connection):
                    pass
            assert "\n" not in str(caught.value)
        finally:
            await connection.close()
    finally:
        broker.stop()


async def test_an_agent_follows_the_store_across_a_failover_by_what_changed(group: Group, settings: Settings) -> None:
    """The new active replica's change feed holds what it replayed: the agent asks it what changed since its version
    and never reads everything again."""
    first = await group.start("first")
    await eventually(lambda: first.service is not None, timeout=15)
    await group.start("second")
    connection = await group.connection()
    client = ConfigClient(connection, timeout=2)
    await client.start()
    queue = f"non-persistent://{settings.topicspace}/response/failover"
    service = json.dumps({"id": "s", "request-queue": queue.replace("response", "request"), "response-queue": queue})

    def tool(name: str) -> tuple[str, str, str]:
        return ("tool", name, json.dumps({"type": "tool-service", "name": name, "service": "s", "description": name}))

    async def write(**change: Any) -> int:
        async with asyncio.timeout(30):
            while True:
                try:
                    return await client.apply(**change)
                except (RequestTimeout, ConfigError):
                    await asyncio.sleep(0.1)

    try:
        await write(puts=[("tool-service", "s", service), tool("a")])
        async with ToolSet(connection=connection, settings=settings, poll_interval=0.5) as tools:
            version = await write(puts=[tool("b")])
            await tools.wait_for(lambda t: t.version == version, timeout=15)
            await group.stop(first)
            await write(puts=[tool("c")])
            version = await write(deletes=[("tool", "a")])
            await tools.wait_for(lambda t: t.version == version, timeout=15)
            assert tools.names() == ["b", "c"]
            assert held(tools) == (await client.read_types(("tool-service", "tool")))[1]
            assert tools._reload.full_reads == 1 and tools._reload.delta_reads >= 2
    finally:
        await client.close()
