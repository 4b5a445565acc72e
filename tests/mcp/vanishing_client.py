"""An MCP client in a process of its own, for the tests that kill it in the middle of a call.

    python vanishing_client.py URL ERA TOOL

Opens a session on the streamable-HTTP endpoint URL with the official SDK's
client, in ERA (`legacy`: the initialize handshake; `modern`: 2026-07-28's
server/discover), prints `calling` and calls TOOL with no arguments. The test
kills it with SIGKILL while the call is in flight: the client vanishes
without a word, as a crashed agent or a dropped network does.
"""

from __future__ import annotations

import asyncio
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def main(url: str, era: str, tool: str) -> None:
    async with (
        create_mcp_http_client() as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, read_timeout_seconds=60) as session,
    ):
        if era == "legacy":
            await session.initialize()
        else:
            await session.discover()
        print("calling", flush=True)
        result = await session.call_tool(tool, {})
        print("answered", result.model_dump_json(), flush=True)  # not expected: it is killed before


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
