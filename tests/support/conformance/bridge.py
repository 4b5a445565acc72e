"""An MCP server's tools on the bus, for tests: the official SDK's client on one side, a `DynamicToolService` on the
other, and nothing between them but the public types a bridge fills (`ToolDescriptor.from_mcp`,
`ToolResult.from_mcp`).

Minimal on purpose: one listing at start, no `list_changed`, no restart. The product's sidecar
(`toolreg announce --mcp -- COMMAND`) is what operators run; a test written against `bridged` switches to
it by starting that command instead.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from toolservice_base import DynamicToolService, Settings
from toolservice_base.errors import ToolError
from toolservice_base.schemas import ToolDescriptor, ToolResult

SDK_SERVER = Path(__file__).with_name("sdk_server.py")
"""The suite's tools as an MCP server on the official SDK (stdio)."""


def sdk_server() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(SDK_SERVER)], cwd=str(SDK_SERVER.parent))


class McpBridge(DynamicToolService):
    """Answers each call by calling the MCP server: its progress notifications stream as chunks, its result comes
    back as the same content blocks, `isError` as a tool error."""

    def __init__(self, client: Client, **options: Any) -> None:
        self.client = client
        super().__init__(**options)

    async def invoke(
        self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = ""
    ) -> AsyncIterator[Any]:
        progress: asyncio.Queue[str] = asyncio.Queue()

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.put_nowait(message or (f"{done:g}/{total:g}" if total else f"{done:g}"))

        call = asyncio.ensure_future(self.client.call_tool(tool, arguments, progress_callback=on_progress))
        try:
            while not call.done():
                waiting = asyncio.ensure_future(progress.get())
                await asyncio.wait({call, waiting}, return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    yield waiting.result() + "\n"
                else:
                    waiting.cancel()
            while not progress.empty():
                yield progress.get_nowait() + "\n"
            result = call.result().model_dump(by_alias=True, mode="json", exclude_none=True)
        finally:
            call.cancel()
        if result.get("isError"):
            raise ToolError("tool-error", ToolResult.from_mcp(result).text)
        yield ToolResult.from_mcp(result)


@asynccontextmanager
async def bridged(server: StdioServerParameters, service_id: str, *, settings: Settings) -> AsyncIterator[McpBridge]:
    """The server's tools announced as service `service_id`, answered through the SDK client, until the exit."""
    async with Client(server, mode="legacy") as client:
        listed = await client.list_tools()
        tools = [
            ToolDescriptor.from_mcp(
                tool.model_dump(by_alias=True, mode="json", exclude_none=True), service=service_id
            ).to_wire()
            for tool in listed.tools
        ]
        kind = type(f"McpBridge_{service_id}", (McpBridge,), {"descriptor": {"id": service_id}, "tools": tools})
        async with kind(client, settings=settings) as service:
            assert isinstance(service, McpBridge)
            yield service
