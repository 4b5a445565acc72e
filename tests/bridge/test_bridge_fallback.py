"""Starting without a config store: the last-known-good snapshot, then static files, then a clear error."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import eventually, static_items

from agent_bridge import BridgeUnavailable, StaticDirError, ToolSet, load_static_dir
from discovery.store.service import ConfigStoreService
from discovery.store.sqlite import ConfigStore
from toolservice_base import ConfigClient, DynamicToolService, Settings, Transport
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.joke import JokeService

pytestmark = pytest.mark.contract

JOKE_ANSWER = "I would tell you a joke about cats, but it would be too punny."


@pytest.fixture
async def running(settings: Settings) -> AsyncIterator[dict[str, DynamicToolService]]:
    services = [cls(settings=settings, announce=False) for cls in (JokeService, CalculatorService)]
    for service in services:
        await service.start()
    yield {s.id: s for s in services}
    for service in services:
        await service.stop()


async def test_store_down_at_start_uses_the_snapshot_then_the_store_once_it_is_back(
    connection: Transport, settings: Settings, tmp_path: Path, running: dict[str, DynamicToolService]
) -> None:
    store_dir = tmp_path / "store"
    store = ConfigStoreService.in_data_dir(connection, store_dir)
    await store.start()
    client = ConfigClient(connection, timeout=5)
    await client.put(static_items(running["joke-service"]))
    async with ToolSet(connection=connection, settings=settings) as tools:
        snapshot_version = tools.version
    snapshot = tools.snapshot_path
    assert snapshot.parent == settings.data_dir and snapshot.name.startswith("bridge-snapshot-default.")
    assert json.loads(snapshot.read_text())["version"] == snapshot_version
    await client.close()
    await store.stop()

    # While the store is down, its content changes (the joke goes, the calculator comes).
    offline = ConfigStore(store_dir / "config.sqlite")
    offline.apply(
        "default",
        puts=static_items(running["calculator"]),
        deletes=[("tool", "tell-joke"), ("tool-service", "joke-service")],
    )
    offline.close()

    async with ToolSet(connection=connection, settings=settings, store_timeout=0.3, poll_interval=0.2) as tools:
        assert tools.source == "snapshot" and tools.version == snapshot_version
        assert tools.names() == ["tell-joke"]
        assert await tools.invoke("tell-joke", {"topic": "cats"}) == JOKE_ANSWER  # the services are up

        restarted = ConfigStoreService.in_data_dir(connection, store_dir)
        await restarted.start()
        try:
            await tools.wait_for(lambda t: t.source == "store", timeout=5)
            assert tools.names() == ["calculate"]
            assert await tools.invoke("calculate", {"expression": "2 + 2"}) == "4"
            # ... and the snapshot, written just after the swap, now holds the store's content.
            await eventually(lambda: set(json.loads(snapshot.read_text())["items"]["tool"]) == {"calculate"})
        finally:
            await restarted.stop()


def write_static(root: Path, *services: DynamicToolService) -> None:
    for item_type, key, value in static_items(*services):
        (root / item_type).mkdir(parents=True, exist_ok=True)
        (root / item_type / f"{key}.json").write_text(value)


async def test_static_directory_when_there_is_no_store_and_no_snapshot(
    connection: Transport, settings: Settings, tmp_path: Path, running: dict[str, DynamicToolService]
) -> None:
    static = tmp_path / "static"
    write_static(static, running["joke-service"], running["calculator"])
    (static / "tool" / "broken.json").write_text("{not json")
    bad_service = {
        "id": "bad-service",
        "request-queue": "http://nope",
        "response-queue": "non-persistent://tg/response/x",
    }
    (static / "tool-service" / "bad-service.json").write_text(json.dumps(bad_service))
    (static / "tool" / "uses-bad.json").write_text(
        json.dumps({"name": "uses-bad", "description": "x", "service": "bad-service"})
    )
    tools = ToolSet(connection=connection, settings=settings, static_dir=static, store_timeout=0.3)
    snapshot = tools.snapshot_path
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.write_text("{half a snapsh")  # an unusable snapshot is passed over, not fatal
    async with tools:
        assert tools.source == "static" and tools.version == 0
        assert tools.names() == ["calculate", "tell-joke"]
        assert "not JSON" in tools.problems["broken"]
        assert (
            "its service 'bad-service' is invalid: tool-service/bad-service: request-queue"
            in tools.problems["uses-bad"]
        )
        assert await tools.invoke("tell-joke", {"topic": "cats"}) == JOKE_ANSWER
    assert snapshot.read_text() == "{half a snapsh"  # static content is never written as a snapshot


async def test_neither_store_nor_fallback_is_a_one_line_error_saying_what_to_do(
    connection: Transport, settings: Settings, tmp_path: Path
) -> None:
    with pytest.raises(BridgeUnavailable) as caught:
        await ToolSet(connection=connection, settings=settings, store_timeout=0.2).start()
    message = str(caught.value)
    assert "\n" not in message
    assert "no snapshot of workspace 'default'" in message and "toolreg up" in message and "static_dir=" in message

    with pytest.raises(BridgeUnavailable, match="static directory .* does not exist"):
        await ToolSet(
            connection=connection, settings=settings, static_dir=tmp_path / "nowhere", store_timeout=0.2
        ).start()


async def test_a_first_read_that_times_out_while_start_falls_back_leaves_no_unread_error(
    connection: Transport, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's silence ends the first read just as start gives up on it: its error must still be read,
    or asyncio prints it later as a traceback ("Task exception was never retrieved") on the user's terminal."""
    unread: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unread.append(context))
    real = connection.unreachable

    async def slow_unreachable(timeout: float = 1.0) -> str | None:
        await asyncio.sleep(0.3)  # meanwhile the first read's own store timeout runs out
        return await real(timeout)

    monkeypatch.setattr(connection, "unreachable", slow_unreachable)
    try:
        with pytest.raises(BridgeUnavailable):
            await ToolSet(connection=connection, settings=settings, store_timeout=0.2).start()
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert [context["message"] for context in unread] == []


def test_load_static_dir_reads_items_by_type_and_stem(tmp_path: Path) -> None:
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "a.json").write_text('{"x": 1}')
    (tmp_path / "tool" / "notes.txt").write_text("ignored")
    assert load_static_dir(tmp_path) == {"tool-service": {}, "tool": {"a": '{"x": 1}'}}
    with pytest.raises(StaticDirError, match="holds no tool"):
        load_static_dir(tmp_path / "tool")


async def test_a_toolset_opens_and_closes_its_own_connection(
    settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService], tmp_path: Path
) -> None:
    await config_client.put(static_items(running["joke-service"]))
    tools = ToolSet(settings=dataclasses.replace(settings, data_dir=tmp_path / "agent"))  # no connection given: its own
    async with tools:
        assert await tools.invoke("tell-joke", {"topic": "cats"}) == JOKE_ANSWER
    assert tools.snapshot_path.parent == tmp_path / "agent" and tools.snapshot_path.exists()
    with pytest.raises(RuntimeError, match="closed"):
        await tools.invoke("tell-joke", {"topic": "cats"})


async def test_an_unreachable_broker_falls_back_within_the_store_timeout(tmp_path: Path) -> None:
    from agent_bridge.snapshot import Deployment, snapshot_path, write_snapshot
    from discovery.broker.embedded import reserve_port

    joke = JokeService(settings=Settings(pulsar_url="pulsar://unused:1"), announce=False)
    raw: dict[str, dict[str, str]] = {"tool-service": {}, "tool": {}}
    for item_type, key, value in static_items(joke):
        raw[item_type][key] = value
    with reserve_port() as nothing_listens:
        port = nothing_listens.getsockname()[1]
    deployment = Deployment.of(f"pulsar://127.0.0.1:{port}", "tg")
    write_snapshot(snapshot_path(tmp_path, "default", deployment), deployment, "default", 7, raw)
    started = asyncio.get_running_loop().time()
    async with ToolSet(f"pulsar://127.0.0.1:{port}", data_dir=tmp_path, store_timeout=0.3) as tools:
        assert asyncio.get_running_loop().time() - started < 2  # not the client's 10 s operation timeout
        assert tools.source == "snapshot" and tools.version == 7 and tools.names() == ["tell-joke"]
