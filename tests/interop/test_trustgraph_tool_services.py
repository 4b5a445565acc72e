"""Tool calls across the two products, both ways, with TrustGraph 2.11's own code on one side.

- TrustGraph's `ToolServiceClient` (wired as a TrustGraph flow wires it)
  calls a service built on our `DynamicToolService`, found through discovery,
  including a streaming one.
- Our `ToolSet` calls a stock TrustGraph `DynamicToolService`, wired by hand
  and, separately, announced by the `toolreg announce` sidecar.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from support import eventually, toolreg_background, toolreg_env
from support.trustgraph import shout_service, tool_watcher, trustgraph_tool_client

from agent_bridge import ToolSet
from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry, RegistryOptions
from discovery.registry.trust import TrustPolicy, trusted_key
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, Transport, topics
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.joke import JokeService
from toolservice_base.signing import Ed25519PrivateKey, public_key_text


def shout_descriptor(topic: str) -> dict[str, object]:
    """What a stock TrustGraph `DynamicToolService` with `--topic TOPIC` listens on, as a tool-service item."""
    return {
        "id": "shout",
        "request-queue": topics.DEFAULT.request_queue(topic),
        "response-queue": topics.DEFAULT.response_queue(topic),
        "config-params": [{"name": "suffix", "required": False}],
    }


SHOUT_TOOL = {
    "name": "shout",
    "description": "Say it louder",
    "suffix": "?!",
    "arguments": [{"name": "text", "type": "string", "description": "What to shout"}],
}


async def test_trustgraphs_tool_service_client_calls_announced_services_including_a_streaming_one(
    broker: EmbeddedBroker, settings: Settings, config_store: ConfigStoreService, registry: Registry
) -> None:
    async with JokeService(settings=settings), CountdownService(settings=settings):
        async with tool_watcher(broker.url) as agent:
            await eventually(lambda: {"tell-joke", "countdown"} <= agent.names(), timeout=10)
            clients = []
            try:
                joke = agent.services["default"]["joke-service"]
                client = await trustgraph_tool_client(agent, joke["request-queue"], joke["response-queue"])
                clients.append(client)
                tool = agent.tools["default"]["tell-joke"]
                answer = await client.call(
                    config={"style": tool.get("style", "pun")}, arguments={"topic": "penguins"}, timeout=10
                )
                assert "penguins" in answer

                countdown = agent.services["default"]["countdown"]
                streaming = await trustgraph_tool_client(agent, countdown["request-queue"], countdown["response-queue"])
                clients.append(streaming)
                chunks: list[str] = []

                async def on_chunk(chunk: str) -> None:
                    chunks.append(chunk)

                whole = await streaming.call_streaming(
                    config={"delay": 0}, arguments={"start": 3}, callback=on_chunk, timeout=10
                )
                assert chunks == ["3\n", "2\n", "1\n", "0\n"] and whole == "3\n2\n1\n0\n"
            finally:
                for client in clients:
                    await client.close()


async def test_our_toolset_calls_a_stock_trustgraph_tool_service_wired_by_hand(
    broker: EmbeddedBroker, settings: Settings, connection: Transport, config_client: ConfigClient
) -> None:
    async with shout_service(broker.url, topic="shout-by-hand"):
        await config_client.put(
            [
                ("tool-service", "shout", json.dumps(shout_descriptor("shout-by-hand"))),
                ("tool", "shout", json.dumps({"type": "tool-service", "service": "shout", **SHOUT_TOOL})),
            ]
        )
        async with ToolSet(settings=settings, connection=connection) as tools:
            assert await tools.invoke("shout", {"text": "hello"}) == "HELLO?!"


async def test_toolreg_announce_makes_a_stock_trustgraph_service_discoverable_and_withdraws_it_on_sigterm(
    broker: EmbeddedBroker, settings: Settings, connection: Transport, registry: Registry, tmp_path: Path
) -> None:
    service_file, tools_file = tmp_path / "svc.json", tmp_path / "tools.json"
    service_file.write_text(json.dumps(shout_descriptor("shout-announced")))
    tools_file.write_text(json.dumps([SHOUT_TOOL]))
    log = tmp_path / "announce.log"
    async with (
        shout_service(broker.url, topic="shout-announced"),
        ToolSet(settings=settings, connection=connection) as tools,
    ):
        sidecar = toolreg_background(
            "announce",
            "--service",
            str(service_file),
            "--tools",
            str(tools_file),
            "--ttl",
            "30",
            env=toolreg_env(broker.url, tmp_path / "sidecar"),
            log=log,
        )
        try:
            await tools.wait_for(lambda t: "shout" in t.names(), timeout=15)
            assert await tools.invoke("shout", {"text": "found you"}) == "FOUND YOU?!"
            statuses = await registry.list_tools()
            assert [(s.name, s.service, s.source, s.instances) for s in statuses] == [
                ("shout", "shout", "announced", 1)
            ]
            sidecar.send_signal(signal.SIGTERM)
            # Withdrawn, not expired: gone long before its 30 s lease would run out.
            await tools.wait_for(lambda t: "shout" not in t.names(), timeout=5)
            assert await asyncio.to_thread(sidecar.wait, 10) == 0
        finally:
            if sidecar.poll() is None:
                sidecar.kill()
                sidecar.wait()
    output = log.read_text()
    assert "announcing shout (shout) in workspace 'default'" in output and "withdrawn shout" in output


async def test_a_service_whose_answers_are_signed_is_called_by_trustgraph_as_before_and_checked_by_our_toolset(
    broker: EmbeddedBroker, settings: Settings, connection: Transport, config_store: ConfigStoreService
) -> None:
    """Its item carries `answer-key` and each answer an `answer-signature` property: TrustGraph's agent loads the
    item and takes the answers as before; our `ToolSet` checks them and takes them."""
    key = Ed25519PrivateKey.generate()
    policy = TrustPolicy()
    policy.add(trusted_key("jokes", public_key_text(key.public_key()), ["joke-*"], ["tell-*"]))
    async with (
        Registry(connection, options=RegistryOptions(sweep_interval=0.1, trust=policy)),
        JokeService(settings=settings, signing_key=key),
        tool_watcher(broker.url) as agent,
    ):
        await eventually(lambda: "tell-joke" in agent.names(), timeout=10)
        joke = agent.services["default"]["joke-service"]
        assert joke["answer-key"] == public_key_text(key.public_key())
        client = await trustgraph_tool_client(agent, joke["request-queue"], joke["response-queue"])
        try:
            answer = await client.call(config={"style": "pun"}, arguments={"topic": "penguins"}, timeout=10)
        finally:
            await client.close()
        assert "penguins" in answer
        async with ToolSet(settings=settings, connection=connection) as tools:
            await tools.wait_for(lambda t: "tell-joke" in t.names(), timeout=10)
            assert "otters" in await tools.invoke("tell-joke", {"topic": "otters"})
