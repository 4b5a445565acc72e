"""A `ToolSet` follows the store by what changed: the same set a full read gives, whatever happened in between."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from agent_bridge import ToolSet
from agent_bridge.snapshot import Deployment, append_change, journal_path, read_snapshot, write_snapshot
from discovery.store.changes import ChangeWindow
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, Transport

pytestmark = pytest.mark.contract

SERVICES = ("alpha", "beta", "gamma")


def service(settings: Settings, sid: str, revision: int = 0) -> tuple[str, str, str]:
    body = {
        "id": sid,
        "request-queue": f"non-persistent://{settings.topicspace}/request/delta-{sid}-{revision}",
        "response-queue": f"non-persistent://{settings.topicspace}/response/delta-{sid}",
    }
    return ("tool-service", sid, json.dumps(body))


def tool(name: str, sid: str, revision: int = 0) -> tuple[str, str, str]:
    body = {
        "type": "tool-service",
        "name": name,
        "service": sid,
        "description": f"{name} on {sid}, revision {revision}",
        "arguments": [{"name": "q", "type": "string", "description": "what to ask"}],
    }
    return ("tool", name, json.dumps(body))


def held(tools: ToolSet) -> dict[str, dict[str, str]]:
    """The raw items the set was built from, as plain dicts (it keeps them in persistent maps)."""
    return {t: dict(items) for t, items in tools._reload.state.items.items()}


def definitions(tools: ToolSet) -> dict[str, Any]:
    """What an agent sees: each tool's definition and its service, and what was skipped."""
    return {
        "tools": {s["name"]: (s, tools.get(s["name"]).tool.service) for s in tools.describe()},  # type: ignore[union-attr]
        "skipped": tools.problems,
    }


async def store_items(config: ConfigClient, workspace: str = "default") -> tuple[int, dict[str, dict[str, str]]]:
    return await config.read_types(("tool-service", "tool"), workspace=workspace)


async def caught_up(tools: ToolSet, config: ConfigClient, version: int | None = None) -> None:
    """Until the set has applied `version` (default: the store's now). A change to another workspace or to other
    types does not move a set's version (it is not read: nothing of the set changed), so a caller that made one
    last names the version of its last change the set follows."""
    if version is None:
        version = await config.version()
    await tools.wait_for(lambda t: t.version >= version, timeout=10)


async def test_a_change_is_read_as_a_delta_and_only_its_tool_is_rebuilt(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    await config_client.put([service(settings, "alpha")] + [tool(f"t{n}", "alpha") for n in range(20)])
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        before = {name: tools.get(name) for name in tools.names()}
        version = await config_client.put([tool("t3", "alpha", revision=1)])
        await tools.wait_for(lambda t: t.version == version)
        version = await config_client.delete([("tool", "t4")])
        await tools.wait_for(lambda t: t.version == version)
        reload = tools._reload
        assert (reload.full_reads, reload.delta_reads) == (1, 2)
        assert "t4" not in tools and "revision 1" in tools.describe(["t3"])[0]["description"]
        assert tools.get("t3") is not before["t3"]
        assert all(tools.get(n) is before[n] for n in before if n not in ("t3", "t4"))  # the others untouched
        assert held(tools) == (await store_items(config_client))[1]


async def test_deltas_and_full_reads_never_disagree_over_thousands_of_random_changes(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    """Random writes (tools added, changed, moved between services, deleted; services changed, removed and brought
    back; unrelated types and another workspace) while a set follows by deltas: at every quiet point its items equal
    a full read's, and at the end its tools equal those of a set that read everything."""
    rng = random.Random(34)
    await config_client.put([service(settings, sid) for sid in SERVICES])
    names = [f"tool-{n:03d}" for n in range(120)]
    changes = 0
    followed = 0  # the version of the last change to the set's own workspace and types
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        for step in range(160):
            puts: list[tuple[str, str, str]] = []
            deletes: list[tuple[str, str]] = []
            for _ in range(rng.randint(1, 28)):
                roll = rng.random()
                if roll < 0.55:
                    puts.append(tool(rng.choice(names), rng.choice(SERVICES), rng.randint(0, 3)))
                elif roll < 0.8:
                    deletes.append(("tool", rng.choice(names)))
                elif roll < 0.9:
                    puts.append(service(settings, rng.choice(SERVICES), rng.randint(0, 3)))
                elif roll < 0.93:
                    deletes.append(("tool-service", rng.choice(SERVICES)))
                else:
                    puts.append(("note", rng.choice(names), str(step)))
            touched = {(t, k) for t, k, _ in puts}
            deletes = [d for d in dict.fromkeys(deletes) if d not in touched]
            puts = list({(t, k): (t, k, v) for t, k, v in puts}.values())
            changes += len(puts) + len(deletes)
            version = await config_client.apply(puts=puts, deletes=deletes)
            if any(key[0] in ("tool", "tool-service") for key in [*puts, *deletes]):
                followed = version
            if rng.random() < 0.1:
                await config_client.put([tool(rng.choice(names), "alpha")], workspace="elsewhere")
            if step % 40 == 39:
                await caught_up(tools, config_client, followed)
                version, items = await store_items(config_client)
                assert followed <= tools.version <= version and held(tools) == items
        await caught_up(tools, config_client, followed)
        async with ToolSet(connection=connection, settings=settings, poll_interval=60) as fresh:
            assert fresh.version >= tools.version >= followed
            assert definitions(tools) == definitions(fresh)
        assert tools._reload.full_reads == 1 and tools._reload.delta_reads > 0
    assert changes > 2000


async def test_an_agent_that_missed_every_push_converges_on_its_next_version_read(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    await config_client.put([service(settings, "alpha"), service(settings, "beta")] + [tool("a", "alpha")])
    async with ToolSet(connection=connection, settings=settings, poll_interval=0.3) as tools:
        watch = tools._reload._watch
        assert watch is not None
        await connection.unsubscribe(watch)  # deaf from here on: only the periodic version read is left
        tools._reload._watch = None
        await config_client.put([tool("b", "beta"), tool("a", "beta", revision=2)])
        await config_client.delete([("tool-service", "alpha")])
        await config_client.put([tool(f"n{n}", "alpha") for n in range(5)])
        await caught_up(tools, config_client)
        assert held(tools) == (await store_items(config_client))[1]
        assert tools.names() == ["a", "b"] and tools.get("a").tool.service == "beta"  # type: ignore[union-attr]
        assert sorted(tools.problems) == [f"n{n}" for n in range(5)]  # their service is gone
        assert tools._reload.full_reads == 1


async def test_an_agent_restarted_from_its_snapshot_reads_everything_once_then_follows_deltas(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    await config_client.put([service(settings, "alpha"), tool("a", "alpha")])
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        pass
    await config_client.put([tool("b", "alpha")])  # while no agent runs
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        assert tools.names() == ["a", "b"]
        version = await config_client.delete([("tool", "a")])
        await tools.wait_for(lambda t: t.version == version)
        assert tools.names() == ["b"] and (tools._reload.full_reads, tools._reload.delta_reads) == (1, 1)
        path, deployment = tools.snapshot_path, tools.deployment
    snapshot = read_snapshot(path, deployment, "default")
    assert snapshot is not None and snapshot.version == version and sorted(snapshot.items["tool"]) == ["b"]
    assert journal_path(path).exists()  # the delta: one line appended


def test_a_snapshot_journal_cut_short_or_left_from_before_gives_the_last_whole_version(tmp_path: Path) -> None:
    path, deployment = tmp_path / "bridge-snapshot-default.json", Deployment.of("pulsar://broker:6650", "tg")
    write_snapshot(path, deployment, "default", 5, {"tool-service": {}, "tool": {"a": "A", "b": "B"}})
    append_change(path, 5, 6, {"tool": {"a": None, "c": "C"}})
    append_change(path, 6, 7, {"tool": {"b": "B2"}})
    snapshot = read_snapshot(path, deployment, "default")
    assert snapshot is not None and (snapshot.version, snapshot.items["tool"]) == (7, {"b": "B2", "c": "C"})
    text = journal_path(path).read_text()
    journal_path(path).write_text(text[:-7])  # a crash in the middle of the second line
    snapshot = read_snapshot(path, deployment, "default")
    assert snapshot is not None and (snapshot.version, snapshot.items["tool"]) == (6, {"b": "B", "c": "C"})
    journal_path(path).write_text(text.splitlines()[1] + "\n")  # a line that does not follow on from version 5
    snapshot = read_snapshot(path, deployment, "default")
    assert snapshot is not None and (snapshot.version, snapshot.items["tool"]) == (5, {"a": "A", "b": "B"})


async def test_a_workspace_removed_whole_is_followed_by_deltas(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    items = [service(settings, "alpha")] + [tool(f"t{n}", "alpha") for n in range(10)]
    await config_client.put(items, workspace="team")
    async with ToolSet(connection=connection, settings=settings, workspace="team", poll_interval=60) as tools:
        assert len(tools) == 10
        version = await config_client.delete([(t, k) for t, k, _ in items], workspace="team")
        await tools.wait_for(lambda t: t.version == version)
        assert len(tools) == 0 and held(tools) == {"tool-service": {}, "tool": {}}
        assert tools._reload.delta_reads == 1 and tools._reload.state.clients == {}


async def test_a_store_restarted_between_two_changes_is_followed(
    connection: Transport, settings: Settings, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    await config_client.put([service(settings, "alpha"), tool("a", "alpha")])
    async with ToolSet(connection=connection, settings=settings, poll_interval=0.3) as tools:
        version = await config_client.put([tool("b", "alpha")])
        await tools.wait_for(lambda t: t.version == version)
        await config_store.stop()
        async with ConfigStoreService.in_data_dir(connection, settings.data_dir):
            async with ConfigClient(connection, timeout=5) as client:
                version = await client.put([tool("c", "alpha")])
                await tools.wait_for(lambda t: t.version == version)
                assert tools.names() == ["a", "b", "c"]
                assert held(tools) == (await store_items(client))[1]
        assert tools._reload.full_reads == 1  # the restarted store's feed went on where it was


async def test_a_store_without_a_change_feed_still_serves_an_agent_by_full_reads(
    connection: Transport, settings: Settings
) -> None:
    """TrustGraph's store (and a release older than the feed) answers `changes` with `bad-operation`."""
    async with ConfigStoreService.in_data_dir(connection, settings.data_dir, protocol="trustgraph"):
        async with ConfigClient(connection, timeout=5) as client:
            await client.put([service(settings, "alpha"), tool("a", "alpha")])
            async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
                await client.put([tool("b", "alpha")])  # TrustGraph's store answers a write with version 0
                await tools.wait_for(lambda t: t.names() == ["a", "b"])
                await client.put([tool("c", "alpha")])
                await tools.wait_for(lambda t: t.names() == ["a", "b", "c"])
                await client.delete([("tool", "a")])
                await tools.wait_for(lambda t: t.names() == ["b", "c"])
                assert tools._reload.delta_reads == 0 and tools._reload.full_reads == 4
                assert held(tools) == (await store_items(client))[1]


async def test_a_reader_past_the_window_reads_everything_once(
    connection: Transport, settings: Settings, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    config_store.store.feed.window = ChangeWindow(keys=8)
    await config_client.put([service(settings, "alpha"), tool("a", "alpha")])
    async with ToolSet(connection=connection, settings=settings, poll_interval=0.3) as tools:
        watch = tools._reload._watch
        assert watch is not None
        await connection.unsubscribe(watch)
        tools._reload._watch = None
        for n in range(12):  # more keys than the window holds, while the agent hears nothing
            await config_client.put([tool(f"t{n}", "alpha")])
        await caught_up(tools, config_client)
        assert tools._reload.full_reads == 2 and len(tools) == 13
        version = await config_client.put([tool("z", "alpha")])
        await caught_up(tools, config_client)
        assert tools.version == version and tools._reload.full_reads == 2 and tools._reload.delta_reads >= 1
