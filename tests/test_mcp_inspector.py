"""A third-party MCP client against `toolreg mcp`: the MCP Inspector's CLI mode, from the npm registry.

It spawns `toolreg mcp` over stdio itself (the TypeScript SDK's client, which negotiates 2025-11-25),
lists the tools and calls one. `npx --yes` fetches the pinned version on first use (about 15 s on
a fresh machine) and reuses npm's cache afterwards. Skipped only where Node.js is not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from discovery.registry import Registry
from support import eventually
from toolservice_base import ConfigClient, DynamicToolService, EmbeddedBroker, Settings
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.joke import JokeService

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
NPX = shutil.which("npx")

pytestmark = pytest.mark.skipif(NPX is None, reason="Node.js (npx) is not installed: the MCP Inspector CLI runs on Node")


@pytest.fixture
async def announced(settings: Settings, registry: Registry, config_client: ConfigClient) -> AsyncIterator[None]:
    services: list[DynamicToolService] = [JokeService(settings=settings), CalculatorService(settings=settings)]
    for service in services:
        await service.start()
    await eventually(lambda: _listed(config_client), timeout=10)
    yield
    for service in services:
        await service.stop()


async def _listed(client: ConfigClient) -> bool:
    return {"calculate", "tell-joke"} <= set(await client.list("tool"))


async def inspector(broker: EmbeddedBroker, data_dir: Path, *method: str, tool_error: bool = False) -> dict:
    """`npx inspector --cli -e ... python -m discovery.cli mcp --method ...`; its JSON answer.

    The Inspector prints an `isError` result like any other and then exits non-zero (5), naming it.
    """
    assert NPX is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    process = await asyncio.create_subprocess_exec(
        NPX, "--yes", INSPECTOR, "--cli",
        # The client gives the server it spawns only the variables named here (and a safe few like PATH).
        "-e", f"PULSAR_URL={broker.url}", "-e", f"TOOLREG_DATA_DIR={data_dir}", "-e", "TOOLREG_LOG_FORMAT=json",
        sys.executable, "-m", "discovery.cli", "mcp", "--method", *method,
        env={**env, "npm_config_update_notifier": "false", "npm_config_fund": "false"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent,
    )
    out, err = await asyncio.wait_for(process.communicate(), 240)
    if tool_error:
        assert process.returncode != 0 and b"isError" in err, (process.returncode, err.decode()[-3000:])
    else:
        assert process.returncode == 0, (out.decode()[-2000:], err.decode()[-3000:])
    result: dict = json.loads(out)
    return result


@pytest.mark.timeout(300)
async def test_the_mcp_inspector_lists_and_calls_tools_over_stdio(broker: EmbeddedBroker, announced: None, tmp_path: Path) -> None:
    listed = await inspector(broker, tmp_path, "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert sorted(tools) == ["calculate", "tell-joke"]
    assert tools["tell-joke"]["inputSchema"]["required"] == ["topic"]

    called = await inspector(broker, tmp_path, "tools/call", "--tool-name", "calculate", "--tool-arg", "expression=6*7")
    assert called["isError"] is False and called["content"] == [{"type": "text", "text": "42"}]

    failed = await inspector(broker, tmp_path, "tools/call", "--tool-name", "calculate", "--tool-arg", "expression=1/0", tool_error=True)
    assert failed["isError"] is True and failed["content"][0]["text"] == "ExpressionError: division by zero"
