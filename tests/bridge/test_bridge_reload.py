"""Hot reload under load: what changes is rebuilt, what stays is untouched, no call is lost."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from support import eventually, static_items

from agent_bridge import ToolServiceImpl, ToolSet
from discovery.store.service import ConfigStoreService
from toolservice_base import (
    ConfigClient,
    ConfigPush,
    DynamicToolService,
    Settings,
    Transport,
    watch_config,
)

pytestmark = pytest.mark.contract

OLD_DEBOUNCE = 0.03
"""The fixed wait every reload used to start with."""


def tool_item(service: DynamicToolService, **changes: Any) -> tuple[str, str, str]:
    tool = {**service.tool_descriptors[0].to_wire(), **changes}
    return ("tool", tool["name"], json.dumps(tool))


def client_of(tools: ToolSet, name: str) -> Any:
    impl = tools.get(name)
    assert isinstance(impl, ToolServiceImpl)
    return impl.client


async def test_100_reloads_while_calls_run_lose_no_call(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    echo, calc = running["echo"], running["calculator"]
    alias = {**echo.service_descriptor.to_wire(), "id": "echo-alias"}
    alias_tool = {**echo.tool_descriptors[0].to_wire(), "name": "echo-alias", "service": "echo-alias"}
    await config_client.put(static_items(echo, calc))
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        echo_impl, echo_client = tools.get("echo"), client_of(tools, "echo")
        reloads: list[int] = []
        tools.on_change(lambda added, removed, changed, version: reloads.append(version))
        stop = asyncio.Event()
        failures: list[str] = []
        answered = 0

        async def caller(k: int) -> None:
            nonlocal answered
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    if k % 2:
                        text = f"caller {k} call {i}"
                        got, want = await tools.invoke("echo", {"text": text}), text
                    else:
                        got, want = (
                            await tools.invoke("calculate", {"expression": f"{k} * 1000 + {i}"}),
                            str(k * 1000 + i),
                        )
                except Exception as exc:  # every failure counts, whatever it is
                    failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                if got != want:
                    failures.append(f"{got!r} != {want!r}")
                answered += 1

        callers = [asyncio.create_task(caller(k)) for k in range(8)]
        for n in range(100):
            step = n % 3
            if step == 0:  # a tool changes, its service stays
                version = await config_client.put([tool_item(calc, description=f"Evaluate arithmetic, revision {n}")])
            elif step == 1:  # a service and its tool appear
                version = await config_client.put(
                    [("tool-service", "echo-alias", json.dumps(alias)), ("tool", "echo-alias", json.dumps(alias_tool))]
                )
            else:  # and go again
                version = await config_client.delete([("tool", "echo-alias"), ("tool-service", "echo-alias")])
            await tools.wait_for(lambda t, v=version: t.version == v, timeout=5)
        stop.set()
        await asyncio.gather(*callers)

        assert failures == []
        assert answered > 200
        await eventually(lambda: len(reloads) == 100)  # one reload per version, callbacks run just after each swap
        assert tools.names() == ["calculate", "echo"]
        assert tools.get("echo") is echo_impl and client_of(tools, "echo") is echo_client and not echo_client.closed


async def test_clients_are_kept_while_a_service_keeps_its_queues_and_replaced_when_they_move(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    joke, calc, echo = running["joke-service"], running["calculator"], running["echo"]
    await config_client.put(static_items(joke, calc, echo))
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        before = {name: tools.get(name) for name in tools.names()}
        clients = {name: client_of(tools, name) for name in tools.names()}

        # Only `tool-service` changes: an unused service appears. Every tool and client stays.
        unused = {**echo.service_descriptor.to_wire(), "id": "unused"}
        version = await config_client.put([("tool-service", "unused", json.dumps(unused))])
        await tools.wait_for(lambda t, v=version: t.version == v, timeout=3)
        assert {name: tools.get(name) for name in tools.names()} == before
        assert all(tools.get(n) is before[n] for n in before)

        # One tool's description changes: that tool is rebuilt on the same client.
        version = await config_client.put([tool_item(joke, description="Jokes, now better")])
        await tools.wait_for(lambda t, v=version: t.version == v, timeout=3)
        assert tools.get("tell-joke") is not before["tell-joke"]
        assert client_of(tools, "tell-joke") is clients["tell-joke"]
        assert tools.describe()[2]["description"] == "Jokes, now better"

        # The joke service's descriptor changes but its queues do not (a new config param):
        # the tool is rebuilt on the same client, which now carries the new descriptor.
        changed_service = {**joke.service_descriptor.to_wire(), "config-params": [{"name": "style"}, {"name": "mood"}]}
        version = await config_client.put([("tool-service", "joke-service", json.dumps(changed_service))])
        await tools.wait_for(lambda t, v=version: t.version == v, timeout=3)
        assert client_of(tools, "tell-joke") is clients["tell-joke"]
        assert [p.name for p in clients["tell-joke"].service.config_params] == ["style", "mood"]
        assert (
            await tools.invoke("tell-joke", {"topic": "owls"})
            == "I would tell you a joke about owls, but it would be too punny."
        )

        # Its queues change: the client is replaced and the old one closed; the other
        # services' clients are the same objects as at start.
        moved = {**changed_service, "response-queue": settings.topics.response_queue("joke-service-v2")}
        version = await config_client.put([("tool-service", "joke-service", json.dumps(moved))])
        await tools.wait_for(lambda t, v=version: t.version == v, timeout=3)
        assert client_of(tools, "tell-joke") is not clients["tell-joke"]
        await eventually(lambda: clients["tell-joke"].closed)
        assert client_of(tools, "calculate") is clients["calculate"] and client_of(tools, "echo") is clients["echo"]
        assert tools.get("calculate") is before["calculate"] and tools.get("echo") is before["echo"]
        assert await tools.invoke("calculate", {"expression": "6 * 7"}) == "42"


async def test_a_call_in_flight_on_a_removed_tool_completes(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    countdown = running["countdown"]
    await config_client.put(static_items(countdown, running["echo"]))
    await config_client.put([tool_item(countdown, delay=0.05)])
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        old_client = client_of(tools, "countdown")
        call = asyncio.create_task(tools.invoke("countdown", {"start": 10}))
        await eventually(lambda: old_client.in_flight == 1)
        await config_client.delete([("tool", "countdown"), ("tool-service", "countdown")])
        await tools.wait_for(lambda t: "countdown" not in t.names(), timeout=3)
        assert not call.done() and not old_client.closed  # removed from the set, still answering
        assert await asyncio.wait_for(call, 5) == "".join(f"{n}\n" for n in range(10, -1, -1))
        await eventually(lambda: old_client.closed)


async def test_a_lost_push_is_recovered_by_the_periodic_version_check(
    connection: Transport,
    settings: Settings,
    config_client: ConfigClient,
    config_store: ConfigStoreService,
    running: dict[str, DynamicToolService],
) -> None:
    pushes: list[ConfigPush] = []

    async def on_push(push: ConfigPush) -> None:
        pushes.append(push)

    await config_client.put(static_items(running["echo"]))
    watcher = await watch_config(connection, on_push)
    async with ToolSet(connection=connection, settings=settings, poll_interval=0.2) as tools:
        assert tools.names() == ["echo"]
        # Write through the store itself, not its service: the version moves and no push is ever sent,
        # which is exactly what a push lost on the non-persistent notify topic looks like.
        version, _ = config_store.store.put("default", static_items(running["calculator"]))
        await tools.wait_for(lambda t: "calculate" in t.names(), timeout=3)
        assert tools.version == version
        assert await tools.invoke("calculate", {"expression": "7 * 6"}) == "42"
        assert pushes == []
    await connection.unsubscribe(watcher)


async def test_a_lone_push_is_reloaded_without_waiting(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    calc = running["calculator"]
    await config_client.put(static_items(calc))
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        reload = tools._reload
        before = len(reload.waits)
        version = await config_client.put([tool_item(calc, description="once")])
        await tools.wait_for(lambda t: t.version == version, timeout=3)
        waits = list(reload.waits)[before:]
        # The reloader's own delay, push noted -> reload started: the old debounce alone was 30 ms.
        assert len(waits) == 1 and waits[0] < OLD_DEBOUNCE / 2, [f"{w * 1000:.1f} ms" for w in waits]


async def test_pushes_during_a_reload_make_one_follow_up_reload(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    calc = running["calculator"]
    await config_client.put(static_items(calc))
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        reload = tools._reload
        gate = asyncio.Event()
        reloads: list[int] = []

        async def held(added: list[str], removed: list[str], changed: list[str], version: int) -> None:
            reloads.append(version)
            if len(reloads) == 1:
                await gate.wait()  # the first reload stays in flight until the test lets it go

        tools.on_change(held)
        runs = reload.runs
        first = await config_client.put([tool_item(calc, description="revision 0")])
        await eventually(lambda: reloads, timeout=3)  # reloaded at once: nothing was in flight
        versions = [await config_client.put([tool_item(calc, description=f"revision {n}")]) for n in range(1, 10)]
        await eventually(lambda: reload.last_push == versions[-1], timeout=3)  # every push has come, mid-reload
        assert reloads == [first] and reload.runs == runs + 1
        gate.set()
        await tools.wait_for(lambda t: t.version == versions[-1], timeout=3)
        await asyncio.sleep(0.1)  # room for a reload too many to show
        assert reloads == [first, versions[-1]] and reload.runs == runs + 2, (reloads, reload.runs - runs)


async def test_a_reload_that_fails_keeps_the_set_and_retries(
    connection: Transport,
    settings: Settings,
    config_client: ConfigClient,
    config_store: ConfigStoreService,
    running: dict[str, DynamicToolService],
) -> None:
    await config_client.put(static_items(running["echo"]))
    async with ToolSet(connection=connection, settings=settings, poll_interval=0.2, store_timeout=0.3) as tools:
        store_path = config_store.store.path
        await config_store.stop()
        with pytest.raises(TimeoutError):
            await tools.refresh()
        await asyncio.sleep(0.5)  # a few failed polls
        assert tools.names() == ["echo"] and tools.source == "store"
        assert await tools.invoke("echo", {"text": "still"}) == "still"

        restarted = ConfigStoreService.in_data_dir(connection, store_path.parent)
        restarted.store.put("default", static_items(running["joke-service"]))
        await restarted.start()
        try:
            await tools.wait_for(lambda t: "tell-joke" in t.names(), timeout=3)
            assert tools.names() == ["echo", "tell-joke"]
        finally:
            await restarted.stop()
