"""`toolreg announce --mcp-url` reads an HTTP MCP server's messages within a size it states, whatever the server
sends.

A server that answers `tools/list` with a body that does not end (the 300 MB listing that grew a sidecar past a
gigabyte, in small) is refused in one line naming the limit and the server, having read little more than the limit;
one that answers a call so tells the caller the same, and the sidecar goes on serving. The limit is
`TOOLREG_MCP_MAX_MESSAGE`, set small here (64 KiB) so the test stays fast and small; the flood would go to 128 MiB.
The server is the official SDK's, in the test's process (`support.mcp_flood`); the sidecar is the command.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.mcp_flood import flood_calls, flood_server
from support.mcp_sidecar import refused, sidecar

from agent_bridge import ToolError, ToolSet
from discovery.registry.service import Registry
from toolservice_base import ConfigClient, Settings

LIMIT = 64 * 1024
READ_AT_MOST = 32 * 1024 * 1024
"""Bytes the flood may have sent before the sidecar hung up: its limit, plus what loopback sockets buffer."""
ENV = {"TOOLREG_MCP_MAX_MESSAGE": str(LIMIT)}


async def test_a_listing_over_the_limit_is_refused_in_one_line_naming_the_limit_and_the_server(
    settings: Settings, registry: Registry, config_client: ConfigClient, tmp_path: Path
) -> None:
    async with flood_server() as (url, flood):
        code, out, err = await refused(settings, tmp_path / "sidecar.log", "--mcp-url", url, env=ENV, timeout=90)
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert err.startswith(f"toolreg: the MCP server {url} could not list its tools: ")
        assert f"a message larger than {LIMIT} bytes, the sidecar's limit (TOOLREG_MCP_MAX_MESSAGE)" in err, err
        assert flood.flooded >= 1 and flood.sent < READ_AT_MOST, flood.sent
    assert await config_client.list("tool") == []


async def test_a_result_over_the_limit_is_told_to_its_caller_and_the_sidecar_goes_on(
    settings: Settings, registry: Registry, tmp_path: Path
) -> None:
    async with flood_server(flood_calls) as (url, flood):
        async with sidecar(settings, tmp_path / "sidecar.log", "--mcp-url", url, env=ENV):
            async with ToolSet(settings=settings, data_dir=tmp_path / "agent") as tools:
                await tools.wait_for(lambda t: {"echo", "flood"} <= set(t.names()), timeout=15)
                with pytest.raises(ToolError, match=f"a message larger than {LIMIT} bytes, the sidecar's limit"):
                    await tools.invoke("flood", {"text": "x"})
                assert flood.flooded == 1 and flood.sent < READ_AT_MOST, flood.sent
                assert await tools.invoke("echo", {"text": "still here"}) == "still here"
