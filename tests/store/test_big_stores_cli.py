"""Big stores end to end: 20,000 tools, and 10 MB of unrelated items, through a `ToolSet` and `toolreg`."""

from __future__ import annotations

import json
import time
from pathlib import Path

from support import atoolreg, toolreg_env
from support.big_store import put_blobs, put_tools, tool

from agent_bridge import ToolSet
from discovery.registry.service import Registry
from toolservice_base import ConfigClient, Settings, Transport
from toolservice_base.transport import MESSAGE_LIMIT

TOOLS = 20_000


async def test_20000_tools_load_into_a_toolset_and_toolreg_tools_lists_them(
    tmp_path: Path, connection: Transport, settings: Settings, config_client: ConfigClient, registry: Registry
) -> None:
    version = await put_tools(config_client, TOOLS)
    assert (
        sum(len(json.dumps(tool(n))) for n in range(TOOLS)) > MESSAGE_LIMIT
    )  # as one answer: more than one message carries
    started = time.monotonic()
    async with ToolSet(connection=connection, settings=settings, poll_interval=60.0) as tools:
        loaded = time.monotonic() - started
        assert len(tools.names()) == TOOLS and tools.version == version and tools.problems == {}
    print(f"ToolSet loaded {TOOLS} tools in {loaded:.2f}s")
    started = time.monotonic()
    result = await atoolreg("tools", "--json", env=toolreg_env(settings.pulsar_url or "", tmp_path), timeout=120)
    print(f"toolreg tools listed {TOOLS} tools in {time.monotonic() - started:.2f}s")
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    assert [t["name"] for t in listed] == [f"t-{n:05d}" for n in range(TOOLS)]


async def test_10_mb_of_unrelated_items_leave_toolreg_tools_working(
    tmp_path: Path, config_client: ConfigClient, registry: Registry, settings: Settings
) -> None:
    await put_tools(config_client, 2)
    await put_blobs(config_client, 3)
    result = await atoolreg("tools", env=toolreg_env(settings.pulsar_url or "", tmp_path))
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == ["t-00000", "t-00001"]


async def test_config_put_of_an_oversize_item_is_refused_in_one_line(
    tmp_path: Path, config_client: ConfigClient, settings: Settings
) -> None:
    value = tmp_path / "big.txt"
    value.write_text("x" * 5_000_000)
    env = toolreg_env(settings.pulsar_url or "", tmp_path)
    result = await atoolreg("config", "put", "blob/big", env=env, input=value.read_text())
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "blob/big is 5000002 bytes" in result.stderr and "store it in parts" in result.stderr
    assert await config_client.list("blob") == []
