"""`McpToolService` embedded in an application, on an `AsyncExitStack`, with the official SDK's own example servers.

The FastMCP example `weather_structured.py` (tools whose pydantic, TypedDict and dataclass returns are output
schemas): its structured results reach `ToolSet.call`. The `sampling` story, whose tool asks the client's model:
the sidecar has none, and the caller is told so in the tool's error. A bad `service_id` is refused before
anything starts; a server that cannot be reached leaves nothing running. Cost: about 6 s, pulsar-lite only.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from support.mcp_sidecar import example, examples, story

from agent_bridge import ToolSet
from discovery.registry.service import Registry
from toolservice_base import RequestClient, Settings, ToolError, open_transport
from toolservice_base.errors import McpServerError
from toolservice_base.mcp_service import McpCommand, McpToolService
from toolservice_base.rpc.wire import TOOL
from toolservice_base.schemas import is_last_response, request_bytes


def _command(argv: list[str]) -> McpCommand:
    return McpCommand(argv[0], tuple(argv[1:]), cwd=str(examples()))


async def test_an_embedded_sidecar_serves_structured_results_and_says_it_has_no_model(
    settings: Settings, registry: Registry, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        weather = McpToolService(_command(example("weather_structured")), settings=settings, ttl=3)
        await stack.enter_async_context(weather)
        sampling = McpToolService(_command(story("sampling")), settings=settings, ttl=3)
        await stack.enter_async_context(sampling)
        assert weather.service_id == "weather-service" and weather.offer is not None
        tools = await stack.enter_async_context(ToolSet(settings=settings, data_dir=tmp_path / "agent"))
        await tools.wait_for(lambda t: {"get_weather", "summarize"} <= set(t.names()), timeout=15)
        described = {spec["name"]: spec for spec in tools.describe()}
        assert {"temperature", "humidity", "location"} <= described["get_weather"]["output_schema"]["properties"].keys()

        result = await tools.call("get_weather", {"city": "Oslo"})
        assert result.structured is not None and result.structured["location"] == "Oslo"
        # No progress came before the result: one response, not a result part and an empty last one.
        service = weather.offer.service
        connection = await stack.enter_async_context(await open_transport(settings))
        async with RequestClient(connection, service.request_queue, service.response_queue) as client:
            request = request_bytes("", {}, {"city": "Oslo"})
            asked = client.stream(request, is_last=is_last_response, properties={TOOL: "get_weather"})
            responses = [response async for response in asked]
        assert len(responses) == 1 and responses[0]["end_of_stream"] is True, responses
        assert responses[0]["structured"]["location"] == "Oslo"

        with pytest.raises(ToolError) as caught:
            await tools.invoke("summarize", {"text": "a long text"})
        assert caught.value.type == "mcp-error" and "sampling/createMessage" in caught.value.message
    assert weather.offer is None and sampling.offer is None  # stopped: withdrawn, commands ended


async def test_what_cannot_start_leaves_nothing_running(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="service id"):
        McpToolService(McpCommand("true"), service_id="no spaces", settings=settings)
    before = {task for task in asyncio.all_tasks()}
    with pytest.raises(McpServerError, match="no such command '/nonexistent/server'"):
        await McpToolService(McpCommand("/nonexistent/server"), settings=settings).start()
    assert {task for task in asyncio.all_tasks() if not task.done()} <= before
