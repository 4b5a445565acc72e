"""`ToolSet`: load from the config store, call, describe, follow changes, skip bad tools."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from support import eventually, static_items

import agent_bridge.impls
from agent_bridge import (
    ToolContext,
    ToolError,
    ToolSet,
    UnknownToolError,
    register_tool_type,
)
from toolservice_base import (
    ConfigClient,
    DynamicToolService,
    Settings,
    ToolDescriptor,
    Transport,
)
from toolservice_base.names import OPENAI_NAME

pytestmark = pytest.mark.contract


def toolset(connection: Transport, settings: Settings, **options: Any) -> ToolSet:
    return ToolSet(connection=connection, settings=settings, **{"poll_interval": 60.0, **options})


async def test_put_config_then_invoke_joke_and_calculator(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    version = await config_client.put(static_items(running["joke-service"], running["calculator"]))
    async with toolset(connection, settings) as tools:
        assert tools.names() == ["calculate", "tell-joke"]
        assert tools.version == version and tools.source == "store" and tools.problems == {}
        assert (
            await tools.invoke("tell-joke", {"topic": "Pulsar"})
            == "I would tell you a joke about Pulsar, but it would be too punny."
        )
        assert await tools.invoke("calculate", {"expression": "2 ** 10"}) == "1024"
        with pytest.raises(ToolError, match="division by zero"):
            await tools.invoke("calculate", {"expression": "1 % 0"})
        assert await tools.invoke("calculate", {"expression": "sqrt(81)"}) == "9"


async def test_100_concurrent_invocations_through_the_toolset_each_get_their_own_answer(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put(static_items(running["echo"], running["calculator"], running["joke-service"]))
    async with toolset(connection, settings) as tools:
        calls = [
            tools.invoke("echo", {"text": f"echo {i}"})
            if i % 3 == 0
            else tools.invoke("calculate", {"expression": f"{i} * 3"})
            if i % 3 == 1
            else tools.invoke("tell-joke", {"topic": f"topic {i}"})
            for i in range(100)
        ]
        expected = [
            f"echo {i}"
            if i % 3 == 0
            else str(i * 3)
            if i % 3 == 1
            else f"I would tell you a joke about topic {i}, but it would be too punny."
            for i in range(100)
        ]
        assert await asyncio.gather(*calls) == expected


async def test_stream_through_the_toolset_and_unknown_names(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put(static_items(running["countdown"], running["echo"]))
    async with toolset(connection, settings) as tools:
        assert [c async for c in tools.stream("countdown", {"start": 5})] == ["5\n", "4\n", "3\n", "2\n", "1\n", "0\n"]
        with pytest.raises(
            UnknownToolError, match=r"no tool named 'tell-joke' in workspace 'default'; available: countdown, echo"
        ):
            await tools.invoke("tell-joke", {"topic": "x"})
        with pytest.raises(UnknownToolError):
            tools.stream("nope", {})


async def test_describe_openai_and_mcp_shapes(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put(static_items(running["joke-service"], running["countdown"]))
    async with toolset(connection, settings) as tools:
        joke_schema = {
            "type": "object",
            "properties": {"topic": {"type": "string", "description": "The topic"}},
            "required": ["topic"],
            "additionalProperties": False,
        }
        described = tools.describe()
        assert [d["name"] for d in described] == ["countdown", "tell-joke"]
        digest = described[1].pop("digest")
        assert described[1] == {
            "name": "tell-joke",
            "description": "Tell a joke on a given topic",
            "parameters": joke_schema,
        }
        assert (
            isinstance(digest, str) and len(digest) == 64
        )  # the definition's digest, as pinned definitions compare it
        assert described[0]["parameters"]["properties"]["start"]["type"] == "integer"
        openai = tools.as_openai_tools()
        assert openai[1] == {
            "type": "function",
            "function": {"name": "tell-joke", "description": "Tell a joke on a given topic", "parameters": joke_schema},
        }
        mcp = tools.as_mcp_tools()
        assert mcp[1] == {
            "name": "tell-joke",
            "description": "Tell a joke on a given topic",
            "inputSchema": joke_schema,
        }
        assert json.loads(json.dumps(openai)) == openai  # plain JSON, ready to send


async def test_openai_gets_names_it_accepts_and_invoke_takes_them_back(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    class Namespaced(DynamicToolService):
        descriptor = {"id": "acme"}
        tools = [
            {
                "name": "acme.search.v2",
                "description": "Search",
                "arguments": [{"name": "q", "type": "string", "description": "q"}],
            },
            {"name": "acme." + "long" * 20, "description": "A long name"},
        ]

        async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
            return f"found {arguments.get('q', 'all')}"

    service = Namespaced(settings=settings, announce=False)
    await service.start()
    try:
        await config_client.put(static_items(service))
        async with toolset(connection, settings) as tools:
            names = [f["function"]["name"] for f in tools.as_openai_tools()]
            assert "acme_search_v2" in names and all(OPENAI_NAME.match(n) for n in names)
            assert await tools.invoke("acme_search_v2", {"q": "cats"}) == "found cats"
            assert await tools.invoke("acme.search.v2", {"q": "dogs"}) == "found dogs"
            long_name = next(n for n in names if n != "acme_search_v2")
            assert await tools.invoke(long_name) == "found all"
            assert [d["name"] for d in tools.describe()] == sorted(["acme.search.v2", "acme." + "long" * 20])
    finally:
        await service.stop()


async def test_the_per_call_user_overrides_the_toolset_user(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    class WhoAmI(DynamicToolService):
        descriptor = {"id": "whoami"}
        tools = [{"name": "whoami", "description": "Say who is asking"}]

        async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
            return user

    service = WhoAmI(settings=settings, announce=False)
    await service.start()
    await config_client.put(static_items(service))
    async with toolset(connection, settings, user="agent-1") as tools:
        assert await tools.invoke("whoami", {}) == "agent-1"
        assert await tools.invoke("whoami", {}, user="alice") == "alice"
    await service.stop()


async def test_a_live_toolset_sees_a_tool_put_after_start_and_loses_it_after_delete(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put(static_items(running["joke-service"]))
    changes: list[tuple[list[str], list[str], list[str], int]] = []
    async_changes: list[int] = []
    async with toolset(connection, settings) as tools:
        tools.on_change(lambda added, removed, changed, version: changes.append((added, removed, changed, version)))

        async def async_callback(added: list[str], removed: list[str], changed: list[str], version: int) -> None:
            async_changes.append(version)

        tools.on_change(async_callback)
        assert tools.names() == ["tell-joke"]
        v_added = await config_client.put(static_items(running["calculator"]))
        await tools.wait_for(lambda t: "calculate" in t.names(), timeout=3)
        assert await tools.invoke("calculate", {"expression": "1 + 1"}) == "2"
        v_removed = await config_client.delete([("tool", "calculate"), ("tool-service", "calculator")])
        await tools.wait_for(lambda t: "calculate" not in t.names(), timeout=3)
        with pytest.raises(UnknownToolError, match="available: tell-joke"):
            await tools.invoke("calculate", {"expression": "1 + 1"})
        assert tools.version == v_removed
        # Callbacks run just after the swap that wait_for wakes on.
        await eventually(lambda: len(async_changes) == 2)
        assert changes == [(["calculate"], [], [], v_added), ([], ["calculate"], [], v_removed)]
        assert async_changes == [v_added, v_removed]


async def test_wait_for_times_out_with_a_message_naming_the_state(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put(static_items(running["echo"]))
    async with toolset(connection, settings) as tools:
        with pytest.raises(TimeoutError, match=r"not met within 0.2s \(version 1, source store, tools: echo\)"):
            await tools.wait_for(lambda t: "missing" in t.names(), timeout=0.2)


async def test_bad_tools_are_skipped_and_reported_while_good_ones_work(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    orphan = {
        "type": "tool-service",
        "name": "orphan",
        "description": "Its service is missing",
        "service": "missing-service",
        "arguments": [{"name": "text", "type": "string", "description": "Echoed"}],
    }
    searcher = {"type": "web-search", "name": "searcher", "description": "A type nobody built"}
    await config_client.put(
        static_items(running["joke-service"], running["calculator"])
        + [("tool", "orphan", json.dumps(orphan)), ("tool", "searcher", json.dumps(searcher))]
    )
    async with toolset(connection, settings) as tools:
        assert tools.names() == ["calculate", "tell-joke"]
        assert set(tools.problems) == {"orphan", "searcher"}
        assert "service 'missing-service' is not in the config" in tools.problems["orphan"]
        assert "no factory for tool type 'web-search'" in tools.problems["searcher"]
        assert all("\n" not in reason for reason in tools.problems.values())
        with pytest.raises(UnknownToolError, match="tool 'orphan' was skipped: service 'missing-service'"):
            await tools.invoke("orphan", {"text": "lost"})
        assert await tools.invoke("calculate", {"expression": "3 * 3"}) == "9"

        # The missing service appears (pointing at the echo queues): the orphan is tried again and works.
        echo = running["echo"].service_descriptor.to_wire()
        await config_client.put([("tool-service", "missing-service", json.dumps({**echo, "id": "missing-service"}))])
        await tools.wait_for(lambda t: "orphan" in t.names(), timeout=3)
        assert await tools.invoke("orphan", {"text": "found"}) == "found"
        assert set(tools.problems) == {"searcher"}


class KnowledgeQuery:
    """A custom tool type: answers from its `collection` config value, no tool service involved."""

    def __init__(self, tool: ToolDescriptor, ctx: ToolContext) -> None:
        self.collection = tool.config_values["collection"]
        self.workspace = ctx.workspace

    async def invoke(self, **arguments: Any) -> str:
        return f"[{self.workspace}/{self.collection}] {arguments['question']}"


def knowledge_tool(collection: str) -> str:
    return json.dumps(
        {
            "type": "knowledge-query",
            "name": "ask-docs",
            "description": "Ask the documentation",
            "collection": collection,
            "arguments": [{"name": "question", "type": "string", "description": "The question"}],
        }
    )


async def test_a_custom_tool_type_is_built_by_its_factory_and_survives_reloads(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    built: list[str] = []

    def factory(tool: ToolDescriptor, ctx: ToolContext) -> KnowledgeQuery:
        built.append(tool.config_values["collection"])
        return KnowledgeQuery(tool, ctx)

    await config_client.put(static_items(running["joke-service"]) + [("tool", "ask-docs", knowledge_tool("manuals"))])
    async with toolset(connection, settings, factories={"knowledge-query": factory}) as tools:
        assert await tools.invoke("ask-docs", {"question": "how?"}) == "[default/manuals] how?"
        impl = tools.get("ask-docs")
        # Reloads that do not touch it keep the very same object.
        for style in ("dad", "dry"):
            joke = {**json.loads(running["joke-service"].tool_descriptors[0].to_json()), "style": style}
            version = await config_client.put([("tool", "tell-joke", json.dumps(joke))])
            await tools.wait_for(lambda t, v=version: t.version == v, timeout=3)
        assert tools.get("ask-docs") is impl and built == ["manuals"]
        assert await tools.invoke("tell-joke", {"topic": "dogs"}) == "dogs. That's the joke."
        # A change to it rebuilds it through the same factory.
        await config_client.put([("tool", "ask-docs", knowledge_tool("faq"))])
        await tools.wait_for(lambda t: t.get("ask-docs") is not impl, timeout=3)
        assert await tools.invoke("ask-docs", {"question": "why?"}) == "[default/faq] why?"
        assert built == ["manuals", "faq"]
        assert tools.describe()[0]["parameters"]["required"] == ["question"]


async def test_a_type_registered_after_start_is_used_from_the_next_reload(
    connection: Transport,
    settings: Settings,
    config_client: ConfigClient,
    running: dict[str, DynamicToolService],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        agent_bridge.impls, "_FACTORIES", dict(agent_bridge.impls._FACTORIES)
    )  # keep the registry per test
    await config_client.put(static_items(running["echo"]) + [("tool", "ask-docs", knowledge_tool("manuals"))])
    async with toolset(connection, settings) as tools:
        assert "no factory for tool type 'knowledge-query'" in tools.problems["ask-docs"]
        register_tool_type("knowledge-query", KnowledgeQuery)
        await config_client.put(static_items(running["calculator"]))  # any change of tools reloads
        await tools.wait_for(lambda t: "ask-docs" in t.names(), timeout=3)
        assert await tools.invoke("ask-docs", {"question": "now?"}) == "[default/manuals] now?"
        assert tools.problems == {}
    with pytest.raises(ValueError, match="tool type"):
        register_tool_type("bad type!", KnowledgeQuery)


async def test_a_factory_that_fails_is_one_skipped_tool(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    def broken(tool: ToolDescriptor, ctx: ToolContext) -> Any:
        raise RuntimeError("index not found\nwith a traceback-ish second line")

    await config_client.put(static_items(running["echo"]) + [("tool", "ask-docs", knowledge_tool("manuals"))])
    async with toolset(connection, settings, factories={"knowledge-query": broken}) as tools:
        assert tools.names() == ["echo"]
        assert tools.problems == {"ask-docs": "index not found"}
        assert await tools.invoke("echo", {"text": "still here"}) == "still here"


async def test_workspaces_are_separate(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put(static_items(running["echo"]), workspace="alpha")
    await config_client.put(static_items(running["joke-service"]))
    async with toolset(connection, settings, workspace="alpha") as tools:
        assert tools.names() == ["echo"]
        await config_client.put(static_items(running["calculator"]))  # default workspace: not ours
        await config_client.put(static_items(running["countdown"]), workspace="alpha")
        await tools.wait_for(lambda t: "countdown" in t.names(), timeout=3)
        assert tools.names() == ["countdown", "echo"]
