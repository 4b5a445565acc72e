"""The registry writing into a store that behaves exactly like TrustGraph's (`toolreg up --store-protocol trustgraph`).

TrustGraph's config service does not know our `expect` preconditions and
drops them silently, so the registry must find that out (never by trusting
silence) and fall back to read-compare-write, and must still never
overwrite an item it did not write, except inside the race window it
reports.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator

import pytest
from support import eventually
from support.registry import FAST, announcement

from discovery.registry.service import Registry
from discovery.registry.store_writes import StoreWrites
from discovery.store.service import ConfigStoreService
from toolservice_base import (
    ConfigClient,
    ConfigConflict,
    ConfigPush,
    RequestClient,
    Settings,
    Transport,
    topics,
    watch_config,
)
from toolservice_base.examples.joke import JokeService


@pytest.fixture
async def trustgraph_store(connection: Transport, settings: Settings) -> AsyncIterator[ConfigStoreService]:
    service = ConfigStoreService.in_data_dir(connection, settings.data_dir, protocol="trustgraph")
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def tg_config(connection: Transport, trustgraph_store: ConfigStoreService) -> AsyncIterator[ConfigClient]:
    client = ConfigClient(connection, timeout=5)
    await client.start()
    yield client
    await client.close()


@pytest.fixture
async def tg_registry(connection: Transport, trustgraph_store: ConfigStoreService) -> AsyncIterator[Registry]:
    registry = Registry(connection, options=FAST)
    await registry.start()
    yield registry
    await registry.stop()


def static_tool(name: str, note: str = "written by an operator") -> str:
    return json.dumps({"type": "tool-service", "name": name, "description": note, "service": "static-service"})


async def test_in_trustgraph_mode_the_store_ignores_every_extension_as_trustgraph_does(
    connection: Transport, tg_config: ConfigClient
) -> None:
    pushes: list[ConfigPush] = []

    async def on_push(push: ConfigPush) -> None:
        pushes.append(push)

    await watch_config(connection, on_push)
    assert await tg_config.put([("note", "a", "operator")]) == 0  # TrustGraph answers a write with version 0
    await tg_config.apply(puts=[("note", "a", "registry")], expect=[("note", "a", None)])  # expect dropped: no conflict
    await tg_config.apply(puts=[("note", "b", "1")], deletes=[("note", "a")])  # a put's keys dropped: nothing deleted
    assert await tg_config.get([("note", "a"), ("note", "b")]) == {("note", "a"): "registry", ("note", "b"): "1"}
    await tg_config.put([("note", "b", "1")])  # unchanged, still a new version
    await tg_config.put([("tool", "broken", "{not json")])  # no validation
    assert (await tg_config.config())[0] == 5
    await tg_config.put([("tool-service", "svc", "{}")])
    await eventually(lambda: len(pushes) == 6)
    assert pushes[-1].changes == {"tool-service": ["default"]}  # exactly the written types: no pairing
    raw = RequestClient(connection, topics.DEFAULT.config_request, topics.DEFAULT.config_response)
    try:
        got = await raw.request(
            {"operation": "get", "workspace": "default", "keys": [{"type": "note", "key": "missing"}]}, timeout=5
        )
        assert got["values"] == [{"type": "note", "key": "missing", "value": None, "workspace": ""}]
        nowhere = await raw.request(
            {"operation": "list", "type": "note"}, timeout=5
        )  # TrustGraph has no default workspace
        assert nowhere["error"]["type"] == "bad-request"
    finally:
        await raw.close()


async def test_the_registry_asks_the_store_whether_it_honours_expect_and_leaves_no_trace(
    connection: Transport, settings: Settings, tmp_path
) -> None:
    for protocol, honoured in (("toolreg", True), ("trustgraph", False)):
        store = ConfigStoreService.in_data_dir(connection, tmp_path / protocol, protocol=protocol)
        await store.start()
        registry = Registry(connection, options=FAST)
        try:
            await registry.start()
            assert registry.writer.writes.conditional is honoured
            assert store.store.workspaces() == []  # the probe item is gone (TrustGraph's) or was never written (ours)
            # Ours refused the probe: not even its version moved. TrustGraph's took the probe and its deletion.
            assert store.store.version == (0 if honoured else 2)
        finally:
            await registry.stop()
            await store.stop()


async def test_the_registry_merges_and_removes_announced_tools_in_a_trustgraph_store(
    settings: Settings, tg_config: ConfigClient, tg_registry: Registry
) -> None:
    assert tg_registry.writer.writes.conditional is False
    async with JokeService(settings=settings, ttl=5):
        await eventually(lambda: _value(tg_config, "tool", "tell-joke"))
        assert await _value(tg_config, "tool-service", "joke-service")
    # Withdrawn: TrustGraph's put ignores deletes riding on it, so these came from a delete of their own.
    await eventually(
        lambda: _absent(
            tg_config, ("tool", "tell-joke"), ("tool-service", "joke-service"), ("discovery", "joke-service")
        )
    )


async def test_a_static_item_is_refused_and_an_operator_overwrite_is_kept_after_the_service_goes(
    settings: Settings, tg_config: ConfigClient, tg_registry: Registry
) -> None:
    await tg_config.put([("tool", "tell-joke", static_tool("tell-joke"))])
    async with JokeService(settings=settings, ttl=5):
        await eventually(
            lambda: [c for c in tg_registry.conflicts() if c.tool == "tell-joke" and c.held_by == "static"]
        )
        assert await _value(tg_config, "tool", "tell-joke") == static_tool("tell-joke")
    await tg_config.delete([("tool", "tell-joke")])
    async with JokeService(settings=settings, ttl=5):
        await eventually(lambda: _value(tg_config, "tool", "tell-joke"))
        await tg_config.put([("tool", "tell-joke", static_tool("tell-joke", "taken over by an operator"))])
        await tg_registry.settle()
    await eventually(lambda: _absent(tg_config, ("tool-service", "joke-service")))
    assert await _value(tg_config, "tool", "tell-joke") == static_tool("tell-joke", "taken over by an operator")


class Interleaved(ConfigClient):
    """A real client whose next put lets another writer's put land just before it: the race window, made to happen."""

    def __init__(self, connection: Transport, other: ConfigClient) -> None:
        super().__init__(connection, timeout=5)
        self.other = other
        self.before_next_put: tuple[str, tuple[str, str, str]] | None = None

    async def put(self, items, *, workspace=None):  # type: ignore[no-untyped-def]
        if self.before_next_put is not None:
            where, item = self.before_next_put
            self.before_next_put = None
            await self.other.put([item], workspace=where)
        return await super().put(items, workspace=workspace)


async def test_read_compare_write_refuses_a_changed_item_and_reports_a_write_inside_its_window(
    connection: Transport, tg_config: ConfigClient
) -> None:
    client = await Interleaved(connection, tg_config).start()
    writes = StoreWrites(client)

    async def observe(push: ConfigPush) -> None:
        writes.observe(push)

    await watch_config(connection, observe)
    try:
        assert await writes.detect() is False
        # Changed since the plan was made: refused before anything is written.
        await tg_config.put([("tool", "early", static_tool("early"))])
        with pytest.raises(ConfigConflict, match="tool/early"):
            await writes.apply(
                puts=[("tool", "early", static_tool("early", "registry"))],
                expect=[("tool", "early", None)],
                workspace="default",
            )
        assert await _value(tg_config, "tool", "early") == static_tool("early")
        # Another writer's write elsewhere inside the window: no race.
        client.before_next_put = ("elsewhere", ("tool", "late", static_tool("late")))
        await writes.apply(
            puts=[("tool", "late", static_tool("late", "registry"))],
            expect=[("tool", "late", None)],
            workspace="default",
        )
        assert list(writes.races) == []
        # An operator's write to the same key inside the window: overwritten (the window is real) and reported.
        client.before_next_put = ("default", ("tool", "raced", static_tool("raced")))
        await writes.apply(
            puts=[("tool", "raced", static_tool("raced", "registry"))],
            expect=[("tool", "raced", None)],
            workspace="default",
        )
        assert await _value(tg_config, "tool", "raced") == static_tool("raced", "registry")
        assert [(race.workspace, race.keys, race.foreign_writes) for race in writes.races] == [
            ("default", ("tool/raced",), 1)
        ]
    finally:
        await client.close()


ROUNDS = 40


async def test_race_the_registry_never_overwrites_an_operators_item_unless_it_reports_the_race(
    connection: Transport, tg_config: ConfigClient, tg_registry: Registry
) -> None:
    """Operators write static items while services announce the same names, at random moments either side of each other.

    Every outcome is allowed but one: a static item silently overwritten or
    deleted. Each round has its workspace, so a write to another round's
    keys is never mistaken for a race in this one.
    """
    rng = random.Random(14)
    publisher = await connection.publisher(topics.DEFAULT.tool_descriptors)
    workspaces = [f"race-{i}" for i in range(ROUNDS)]
    mine = {ws: static_tool(f"tool-{ws}", f"operator's {ws}") for ws in workspaces}

    async def operator(ws: str) -> None:
        await asyncio.sleep(rng.uniform(0, 0.3))
        await tg_config.put([("tool", f"tool-{ws}", mine[ws])], workspace=ws)

    async def service(ws: str) -> None:
        await asyncio.sleep(rng.uniform(0, 0.3))
        await publisher.send(announcement(f"svc-{ws}", (f"tool-{ws}",), workspace=ws, ttl=30).to_json())

    await asyncio.gather(*(task(ws) for ws in workspaces for task in (operator, service)))
    await asyncio.sleep(0.3)
    await tg_registry.settle(timeout=20)
    raced = {(race.workspace, key) for race in tg_registry.writer.writes.races for key in race.keys}
    after_announce = {ws: await _value(tg_config, "tool", f"tool-{ws}", ws) for ws in workspaces}
    overwritten = {ws for ws, value in after_announce.items() if value != mine[ws]}
    assert {(ws, f"tool/tool-{ws}") for ws in overwritten} <= raced, (
        "an operator's item was overwritten without a race report"
    )
    refused = {c.workspace for c in tg_registry.conflicts()}
    registry_first = {
        ws for ws in workspaces if any(t.source == "announced" for t in await tg_registry.list_tools(ws))
    } - overwritten
    # Both orders happened: the operator first (refused as a conflict) and the registry first (the operator overwrote
    # it).
    assert refused and registry_first, f"refused {len(refused)}, registry first {len(registry_first)}: not a race"

    for ws in workspaces:
        await publisher.send(
            announcement(f"svc-{ws}", (f"tool-{ws}",), workspace=ws, kind="withdraw", sequence=2).to_json()
        )
    await eventually(lambda: len(tg_registry.leases) == 0, timeout=20)
    await tg_registry.settle(timeout=20)
    await eventually(lambda: _absent_everywhere(tg_config, workspaces), timeout=20)
    for ws in workspaces:
        value = await _value(tg_config, "tool", f"tool-{ws}", ws)
        assert value == mine[ws] or (ws, f"tool/tool-{ws}") in raced, f"{ws}: the operator's item is gone ({value!r})"
    windows = sorted(w * 1000 for w in tg_registry.writer.writes.windows)
    print(
        f"\nrace: {ROUNDS} rounds, operator first {len(refused)}, registry first {len(registry_first)}, "
        f"reported races {len(raced)}, overwritten {len(overwritten)}; window over {len(windows)} writes: "
        f"p50 {windows[len(windows) // 2]:.2f} ms, max {windows[-1]:.2f} ms"
    )


async def _absent_everywhere(config: ConfigClient, workspaces: list[str]) -> bool:
    """Every announced service's own items are gone (its tool-service item, its ownership record)."""
    for ws in workspaces:
        if await config.get([("tool-service", f"svc-{ws}"), ("discovery", f"svc-{ws}")], workspace=ws):
            return False
    return True


async def _value(config: ConfigClient, item_type: str, key: str, workspace: str = "default") -> str | None:
    return (await config.get([(item_type, key)], workspace=workspace)).get((item_type, key))


async def _absent(config: ConfigClient, *keys: tuple[str, str]) -> bool:
    return not await config.get(list(keys))
