"""A third-party MCP client against `toolreg mcp`: the MCP Inspector's CLI mode, from the npm registry.

It spawns `toolreg mcp` over stdio itself (the TypeScript SDK's client; `--protocol-era legacy`
negotiates 2025-11-25, `modern` 2026-07-28), lists the tools and calls them; and it reads the
MCP guide's client configurations (docs/guide/mcp.md) as a user would paste them. `npx --yes` fetches the pinned
version on first use (about 15 s on a fresh machine) and reuses npm's cache afterwards.
Skipped only where Node.js is not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import eventually, toolreg_env
from support.mcp import ERAS, VERSION, Era

from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry
from toolservice_base import ConfigClient, DynamicToolService, Settings
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.joke import JokeService

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
NPX = shutil.which("npx")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(NPX is None, reason="Node.js (npx) is not installed: the MCP Inspector CLI runs on Node"),
    pytest.mark.timeout(300),  # the first run on a machine downloads the Inspector
]


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


async def inspector(*args: str, tool_error: bool = False) -> tuple[dict, str]:
    """`npx --yes <inspector> --cli ARGS`; its JSON answer, and its stderr (where the server's logs go too).

    The Inspector prints an `isError` result like any other, then exits non-zero (5) naming it.
    """
    assert NPX is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    process = await asyncio.create_subprocess_exec(
        NPX,
        "--yes",
        INSPECTOR,
        "--cli",
        *args,
        env={**env, "npm_config_update_notifier": "false", "npm_config_fund": "false"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(process.communicate(), 240)
    if tool_error:
        assert process.returncode != 0 and b"isError" in err, (process.returncode, err.decode()[-3000:])
    else:
        assert process.returncode == 0, (out.decode()[-2000:], err.decode()[-3000:])
    result: dict = json.loads(out)
    return result, err.decode(errors="replace")


def spawn_toolreg(broker: EmbeddedBroker, data_dir: Path, era: Era) -> list[str]:
    """The Inspector's arguments for spawning `toolreg mcp` over stdio in `era`."""
    # The client gives the server it spawns only the variables named here (and a safe few like PATH).
    return [
        "--protocol-era",
        era,
        "-e",
        f"PULSAR_URL={broker.url}",
        "-e",
        f"TOOLREG_DATA_DIR={data_dir}",
        "-e",
        "TOOLREG_LOG_LEVEL=debug",
        "-e",
        "TOOLREG_LOG_FORMAT=json",
        sys.executable,
        "-m",
        "discovery.cli",
        "mcp",
    ]


@pytest.mark.parametrize("era", ERAS)
async def test_the_mcp_inspector_lists_and_calls_tools_over_stdio(
    era: Era, broker: EmbeddedBroker, announced: None, tmp_path: Path
) -> None:
    server = spawn_toolreg(broker, tmp_path, era)
    listed, log = await inspector(
        "--strict", *server, "--method", "tools/list"
    )  # --strict: exit 6 on unportable schemas
    assert f'"protocol": "{VERSION[era]}"' in log  # the server's debug log names the version negotiated
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert sorted(tools) == ["calculate", "tell-joke"]
    assert tools["tell-joke"]["inputSchema"]["required"] == ["topic"]

    called, _ = await inspector(
        *server, "--method", "tools/call", "--tool-name", "calculate", "--tool-arg", "expression=6*7"
    )
    assert called["isError"] is False and called["content"] == [{"type": "text", "text": "42"}]

    failed, _ = await inspector(
        *server, "--method", "tools/call", "--tool-name", "calculate", "--tool-arg", "expression=1/0", tool_error=True
    )
    assert failed["isError"] is True and failed["content"][0]["text"] == "ExpressionError: division by zero"


def guide_section() -> str:
    """The MCP guide's section on clients, whose configurations and commands these tests run."""
    text = (ROOT / "docs" / "guide" / "mcp.md").read_text()
    start = text.index("## Use it from an MCP client")
    return text[start : text.index("\n## ", start + 1)]


async def test_the_guides_client_configurations_work_as_written(
    broker: EmbeddedBroker, announced: None, tmp_path: Path
) -> None:
    section = guide_section()
    stdio_config, http_config = (json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S))

    # stdio: only the install path and the broker's address differ from what the guide says.
    server = stdio_config["mcpServers"]["toolreg"]
    assert server["command"].endswith("/bin/toolreg") and server["env"] == {"PULSAR_URL": "pulsar://127.0.0.1:6650"}
    server["command"] = str(Path(sys.executable).parent / "toolreg")
    server["env"]["PULSAR_URL"] = broker.url
    (tmp_path / "stdio.json").write_text(json.dumps(stdio_config))
    called, _ = await inspector(
        "--config",
        str(tmp_path / "stdio.json"),
        "--server",
        "toolreg",
        "--method",
        "tools/call",
        "--tool-name",
        "tell-joke",
        "--tool-arg",
        "topic=configs",
    )
    assert "configs" in called["content"][0]["text"]

    # HTTP: the guide's command line, on a free port instead of 8765.
    token, address = re.search(r"TOOLREG_MCP_TOKEN=(\S+) toolreg mcp --http (\S+)", section).groups()  # type: ignore[union-attr]
    assert http_config["mcpServers"]["toolreg"]["url"] == f"http://{address}/mcp"
    assert http_config["mcpServers"]["toolreg"]["headers"] == {"Authorization": f"Bearer {token}"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "discovery.cli",
        "mcp",
        "--http",
        "127.0.0.1:0",
        env=toolreg_env(broker.url, tmp_path / "http", TOOLREG_MCP_TOKEN=token),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    try:
        endpoint = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().split()[1]
        http_config["mcpServers"]["toolreg"]["url"] = endpoint
        (tmp_path / "http.json").write_text(json.dumps(http_config))
        listed, _ = await inspector(
            "--config", str(tmp_path / "http.json"), "--server", "toolreg", "--method", "tools/list"
        )
        assert sorted(tool["name"] for tool in listed["tools"]) == ["calculate", "tell-joke"]
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 15)


async def test_the_guides_inspector_commands_name_the_tested_version_and_work_as_written(
    broker: EmbeddedBroker, announced: None, tmp_path: Path
) -> None:
    section = guide_section()
    commands = re.findall(r"^npx (\S+) --cli (.*)$", section, re.M)
    assert [package for package, _ in commands] == [INSPECTOR, INSPECTOR]  # the version these tests pin, not a bare npx
    (stdio, http) = (command.split() for _, command in commands)

    # stdio: only the install path and the broker's address differ from what the guide says.
    assert stdio[:3] == ["-e", "PULSAR_URL=pulsar://127.0.0.1:6650", "toolreg"]  # the installed one, on PATH
    stdio[1:3] = [
        f"PULSAR_URL={broker.url}",
        "-e",
        f"TOOLREG_DATA_DIR={tmp_path / 'stdio'}",
        str(Path(sys.executable).parent / "toolreg"),
    ]
    listed, _ = await inspector(*stdio)
    assert sorted(tool["name"] for tool in listed["tools"]) == ["calculate", "tell-joke"]

    # HTTP with the guide's token, passed as a header: on a free port instead of 8765.
    token = re.search(r"TOOLREG_MCP_TOKEN=(\S+) toolreg mcp --http", section).group(1)  # type: ignore[union-attr]
    assert http[0] == "http://127.0.0.1:8765/mcp" and f'--header "Authorization: Bearer {token}"' in commands[1][1], (
        commands[1]
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "discovery.cli",
        "mcp",
        "--http",
        "127.0.0.1:0",
        env=toolreg_env(broker.url, tmp_path / "http", TOOLREG_MCP_TOKEN=token),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdout is not None
    try:
        endpoint = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().split()[1]
        listed, _ = await inspector(endpoint, "--header", f"Authorization: Bearer {token}", "--method", "tools/list")
        assert sorted(tool["name"] for tool in listed["tools"]) == ["calculate", "tell-joke"]
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 15)
