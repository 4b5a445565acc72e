"""`toolreg announce --mcp` against MCP servers nobody here wrote, on pulsar-lite and on Apache Pulsar.

- `@modelcontextprotocol/server-everything` (npm, Node.js, the handshake protocol, stdio): its tools reach a `ToolSet`
  and `toolreg mcp` with their titles and annotations, calls and the server's errors come back, a progress-reporting
  tool streams, killing the server withdraws its tools within the ttl and the sidecar's restart brings them back.
- The official Python SDK's `subscriptions` story (2026-07-28, streamable HTTP): a tool it registers at run time
  reaches an agent through the server's change notice; the server gone, its tools go; served again on the same
  port, they come back.

Cost: about 10 s per broker for server-everything (most of it the lease running out and the restart), 8 s for the
story; the npm package and the SDK's examples are fetched once per machine (about 16 s) by `scripts/mcp_servers.py`.
"""

from __future__ import annotations

import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from support.mcp_sidecar import ROOT, env_of, everything, free_port, http_story, kill, sidecar, story

from agent_bridge import ToolSet
from discovery.registry.service import Registry
from toolservice_base import Settings, ToolError

pytestmark = pytest.mark.brokers

TTL = 3.0


def _has(*names: str):  # type: ignore[no-untyped-def]
    return lambda tools: set(names) <= set(tools.names())


def _lacks(*names: str):  # type: ignore[no-untyped-def]
    return lambda tools: not set(names) & set(tools.names())


async def test_server_everything_joins_answers_streams_leaves_and_comes_back(
    settings: Settings, registry: Registry, tmp_path: Path
) -> None:
    server = everything().command("stdio")
    async with sidecar(settings, tmp_path / "sidecar.log", "--mcp", "--", *server, ttl=TTL) as car:
        assert "mcp-servers-everything (echo, " in car.said  # the service id from serverInfo.name
        async with ToolSet(settings=settings, data_dir=tmp_path / "agent") as tools:
            await tools.wait_for(_has("echo", "get-sum", "trigger-long-running-operation"), timeout=15)
            described = {spec["name"]: spec for spec in tools.describe()}
            assert described["echo"]["title"] == "Echo Tool"
            assert described["echo"]["annotations"] == {
                "readOnlyHint": True,
                "destructiveHint": False,
                "idempotentHint": True,
                "openWorldHint": False,
            }
            assert described["get-structured-content"]["output_schema"]["properties"].keys() >= {"temperature"}

            assert await tools.invoke("echo", {"message": "hi"}) == "Echo: hi"
            weather = await tools.call("get-structured-content", {"location": "Chicago"})
            assert weather.structured is not None and {"temperature", "humidity"} <= weather.structured.keys()
            with pytest.raises(ToolError) as caught:  # fits the schema (a number); the server refuses 1.5 itself
                await tools.invoke("get-resource-reference", {"resourceType": "Text", "resourceId": 1.5})
            assert caught.value.type == "tool-error" and "Must be a finite positive integer" in caught.value.message

            chunks = [c async for c in tools.stream("trigger-long-running-operation", {"duration": 0.3, "steps": 3})]
            assert chunks[:3] == ["1/3\n", "2/3\n", "3/3\n"]
            assert chunks[3].startswith("Long running operation completed")

            await _through_the_mcp_front(settings, tmp_path)

            killed = time.monotonic()
            kill(car.server_pids())
            await tools.wait_for(_lacks("echo"), timeout=TTL + 5)
            assert time.monotonic() - killed < TTL, "withdrawn within the lease, not left to run out"
            await tools.wait_for(_has("echo"), timeout=20)  # the sidecar started the command again
            assert await tools.invoke("get-sum", {"a": 2, "b": 3}) == "The sum of 2 and 3 is 5."
    log = car.log_text()
    assert '"event": "mcp.server_lost"' in log and '"event": "mcp.server_stderr"' in log


async def _through_the_mcp_front(settings: Settings, tmp_path: Path) -> None:
    """`toolreg mcp`, as an MCP client spawns it: the server's tools with their hints, and a call."""
    front = StdioServerParameters(
        command=sys.executable,
        args=["-m", "discovery.cli", "mcp"],
        env=env_of(settings, TOOLREG_DATA_DIR=str(tmp_path / "front")),
        cwd=str(ROOT),
    )
    with open(tmp_path / "front.log", "a") as errors:
        async with Client(front, mode="legacy", cache=None) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert listed["echo"].title == "Echo Tool"
            assert listed["echo"].annotations is not None and listed["echo"].annotations.read_only_hint is True
            result = await client.call_tool("echo", {"message": "via mcp"})
            assert not result.is_error and result.content[0].text == "Echo: via mcp"  # type: ignore[union-attr]
        del errors


async def test_a_tool_the_server_adds_reaches_an_agent_and_an_http_server_comes_back(
    settings: Settings, registry: Registry, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    async with AsyncExitStack() as stack:
        story = await stack.enter_async_context(http_story("subscriptions", port, tmp_path / "story.log"))
        car = await stack.enter_async_context(sidecar(settings, tmp_path / "sidecar.log", "--mcp-url", url, ttl=TTL))
        assert car.said.startswith("announcing subscriptions-example (edit_note, enable_search) ")
        tools = await stack.enter_async_context(ToolSet(settings=settings, data_dir=tmp_path / "agent"))
        await tools.wait_for(_has("edit_note", "enable_search"), timeout=15)
        assert "search" not in tools.names()
        assert await tools.invoke("enable_search", {}) == "search is live"
        await tools.wait_for(_has("search"), timeout=10)  # the server's change notice, through the bus
        assert await tools.invoke("search", {"query": "milk"}) == "todo"

        gone = time.monotonic()
        story.kill()
        await tools.wait_for(_lacks("edit_note"), timeout=TTL + 5)
        assert time.monotonic() - gone < TTL, "withdrawn as the server went, not left to run out"
        async with http_story("subscriptions", port, tmp_path / "story-again.log"):
            await tools.wait_for(_has("edit_note", "enable_search"), timeout=20)  # reconnected
            assert "search" not in tools.names()  # what the restarted server offers, not what it offered


async def test_a_command_server_that_exits_is_said_to_have_exited(
    settings: Settings, registry: Registry, tmp_path: Path
) -> None:
    """A modern server run by command (the SDK's subscriptions story over stdio): its process killed, the sidecar's
    log says the process exited, not that a server "dropped its subscriptions/listen stream"."""
    async with sidecar(settings, tmp_path / "sidecar.log", "--mcp", "--", *story("subscriptions"), ttl=TTL) as car:
        async with ToolSet(settings=settings, data_dir=tmp_path / "agent") as tools:
            await tools.wait_for(_has("edit_note"), timeout=15)
            kill(car.server_pids())
            await tools.wait_for(_lacks("edit_note"), timeout=TTL + 5)
    log = car.log_text()
    assert '"event": "mcp.server_lost"' in log and "exited: its output closed" in log, log[-2000:]
    assert "dropped its subscriptions/listen stream" not in log
