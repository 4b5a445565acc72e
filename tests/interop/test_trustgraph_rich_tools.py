"""A stock TrustGraph 2.11 processor meets tools that say more than the spec (a title, MCP's annotations, a full
input schema) and answer with more than text (an image, structured content): it loads them from the flat
`arguments` derived for it, calls them with its own `ToolServiceClient`, and reads the text rendering in
`response`; the keys it does not know change nothing for it. What it cannot check (an enum it never saw), the
service checks."""

from __future__ import annotations

from typing import Any

import pytest
from support import eventually
from support.trustgraph import tool_watcher, trustgraph_tool_client

from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import DynamicToolService, Settings
from toolservice_base.schemas import ImageContent, TextContent, ToolResult

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


class AtlasService(DynamicToolService):
    descriptor = {"id": "atlas"}
    tools = [
        {
            "name": "route",
            "title": "Route planner",
            "description": "A route between two places",
            "annotations": {"readOnlyHint": True, "openWorldHint": False},
            "input-schema": {
                "type": "object",
                "properties": {
                    "start": {"type": "string", "description": "Where from"},
                    "end": {"type": "string", "description": "Where to"},
                    "mode": {"enum": ["walk", "bike", "car"], "description": "How"},
                    "via": {"type": "array", "items": {"type": "string"}, "description": "Stops"},
                },
                "required": ["start", "end"],
                "additionalProperties": False,
            },
            "output-schema": {
                "type": "object",
                "properties": {"km": {"type": "number"}},
                "required": ["km"],
            },
        },
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        return {"km": 12.5 if arguments.get("mode") == "bike" else 10.0}


class MapService(DynamicToolService):
    descriptor = {"id": "maps"}
    tools = [
        {
            "name": "map",
            "description": "A map of a place",
            "arguments": [{"name": "place", "type": "string", "description": "Where"}],
        }
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(content=(TextContent(text=f"Map of {arguments['place']}"), ImageContent.of(PNG, "image/png")))


async def test_a_trustgraph_processor_loads_and_calls_tools_that_say_and_return_more(
    broker: EmbeddedBroker, settings: Settings, config_store: ConfigStoreService, registry: Registry
) -> None:
    async with AtlasService(settings=settings), MapService(settings=settings), tool_watcher(broker.url) as agent:
        await eventually(lambda: {"route", "map"} <= agent.names(), timeout=10)
        assert agent.failures == []
        route = agent.tools["default"]["route"]
        # What TrustGraph's agent builds its prompt from: the flat arguments, each a name, type and description.
        assert route["arguments"] == [
            {"name": "end", "type": "string", "description": "Where to"},
            {"name": "mode", "type": "string", "description": "How"},
            {"name": "start", "type": "string", "description": "Where from"},
            {"name": "via", "type": "array", "description": "Stops"},
        ]
        assert route["title"] == "Route planner" and route["annotations"]["readOnlyHint"] is True

        atlas, maps = (agent.services["default"][name] for name in ("atlas", "maps"))
        routes = await trustgraph_tool_client(agent, atlas["request-queue"], atlas["response-queue"])
        pictures = await trustgraph_tool_client(agent, maps["request-queue"], maps["response-queue"])
        try:
            answer = await routes.call(
                config={}, arguments={"start": "Oslo", "end": "Bergen", "mode": "bike"}, timeout=10
            )
            assert answer == '{"km": 12.5}', "structured content, as the text TrustGraph reads"
            # It reads only the flat arguments, so it cannot know `mode` is an enum: the service refuses.
            with pytest.raises(Exception, match=r"arguments at \$\.mode: .plane. is not one of"):
                await routes.call(config={}, arguments={"start": "Oslo", "end": "Bergen", "mode": "plane"}, timeout=10)
            pictured = await pictures.call(config={}, arguments={"place": "Oslo"}, timeout=10)
            assert pictured == f"Map of Oslo\n[image: image/png, {len(PNG)} bytes]"
        finally:
            await routes.close()
            await pictures.close()
