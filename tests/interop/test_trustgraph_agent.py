"""A stock TrustGraph 2.11 processor (trustgraph-base from PyPI, its own Pulsar backend) loads and follows our tools.

The processor is `AsyncProcessor` with the config handler TrustGraph's agent
registers (`tool` + `tool-service`); it fetches with `getkeys-all-ws` and
`getvalues` at start, and refetches the types a push names.
"""

from __future__ import annotations

import json

from support import eventually
from support.registry import silence
from support.trustgraph import ToolWatcher, tool_watcher

from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, topics
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.echo import EchoService
from toolservice_base.examples.joke import JokeService

TTL = 1.0


def static_service(service_id: str, **extra: object) -> dict[str, object]:
    return {
        "id": service_id,
        "request-queue": topics.DEFAULT.request_queue(service_id),
        "response-queue": topics.DEFAULT.response_queue(service_id),
        **extra,
    }


def static_tool(name: str, service: str) -> dict[str, object]:
    return {
        "type": "tool-service",
        "name": name,
        "description": f"{name}, written by hand",
        "service": service,
        "arguments": [],
    }


async def put_static(config: ConfigClient, workspace: str, service_id: str, tool: str) -> None:
    await config.put(
        [
            ("tool-service", service_id, json.dumps(static_service(service_id))),
            ("tool", tool, json.dumps(static_tool(tool, service_id))),
        ],
        workspace=workspace,
    )


async def test_a_trustgraph_processor_loads_announced_and_static_tools_in_every_workspace_and_follows_changes(
    broker: EmbeddedBroker,
    settings: Settings,
    config_client: ConfigClient,
    config_store: ConfigStoreService,
    registry: Registry,
) -> None:
    await put_static(config_client, "default", "weather", "forecast")
    await put_static(config_client, "team", "directory", "lookup")
    await put_static(
        config_client, "__template__", "template-service", "template-tool"
    )  # reserved: stored, never loaded
    async with (
        JokeService(settings=settings, ttl=TTL) as joke,
        EchoService(settings=settings, ttl=TTL, workspace="team"),
    ):
        await eventually(lambda: config_client.list("tool"), timeout=5)
        await eventually(lambda: _has(config_client, "default", "tell-joke"))
        await eventually(lambda: _has(config_client, "team", "echo"))

        async with tool_watcher(broker.url) as agent:
            # At start, from getkeys-all-ws + getvalues: every workspace that has tools, reserved ones left out.
            assert agent.names("default") == {"forecast", "tell-joke"}
            assert agent.names("team") == {"lookup", "echo"}
            assert "__template__" not in agent.tools
            assert agent.services["default"]["joke-service"] == joke.service_descriptor.to_wire()

            async with CalculatorService(settings=settings, ttl=TTL):
                await eventually(lambda: agent.names("default") == {"forecast", "tell-joke", "calculate"}, timeout=10)

                silence(joke)  # killed: no heartbeat, no withdraw; its lease runs out
                await eventually(lambda: agent.names("default") == {"forecast", "calculate"}, timeout=10)

                # An operator changes only a tool-service item; the push names `tool` too, so the
                # agent, which rebuilds from only the types a push names, still has every tool.
                calls = len(agent.calls)
                changed = static_service("weather", **{"config-params": [{"name": "units", "required": False}]})
                await config_client.put([("tool-service", "weather", json.dumps(changed))])
                await eventually(lambda: _handed(agent, calls, "default"), timeout=10)
                workspace, config, _ = agent.calls[-1]
                assert set(config) == {"tool", "tool-service"}
                assert agent.names("default") == {"forecast", "calculate"}
                assert agent.services["default"]["weather"]["config-params"] == [{"name": "units", "required": False}]
                assert agent.names("team") == {"lookup", "echo"}
                assert agent.failures == []


async def test_a_trustgraph_processor_sees_the_last_tool_of_a_workspace_go(
    broker: EmbeddedBroker, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    await put_static(config_client, "solo", "weather", "forecast")
    async with tool_watcher(broker.url) as agent:
        assert agent.names("solo") == {"forecast"}
        await config_client.delete([("tool", "forecast"), ("tool-service", "weather")], workspace="solo")
        await eventually(lambda: agent.names("solo") == set(), timeout=10)
        assert agent.failures == []


async def test_a_trustgraph_processor_started_before_the_store_loads_once_it_answers(
    broker: EmbeddedBroker, settings: Settings, connection, tmp_path
) -> None:
    """TrustGraph retries its start-up fetch every 2 s; our store answers the first attempt after it starts."""
    import asyncio

    store = ConfigStoreService.in_data_dir(connection, settings.data_dir)
    store.store.put(
        "default",
        [
            ("tool-service", "weather", json.dumps(static_service("weather"))),
            ("tool", "forecast", json.dumps(static_tool("forecast", "weather"))),
        ],
    )
    agent = ToolWatcher(id="late-store", pulsar_host=broker.url, config_timeout=1)
    starting = asyncio.create_task(agent.start())
    try:
        await asyncio.sleep(1.5)
        assert not starting.done()
        await store.start()
        await asyncio.wait_for(starting, timeout=10)
        assert agent.names("default") == {"forecast"}
    finally:
        starting.cancel()
        await agent.stop()
        await store.stop()


async def _has(config: ConfigClient, workspace: str, tool: str) -> bool:
    return tool in await config.list("tool", workspace=workspace)


def _handed(agent: ToolWatcher, after: int, workspace: str) -> bool:
    return any(call[0] == workspace for call in agent.calls[after:])
