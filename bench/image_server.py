"""A tool that answers with a 1 MiB image, served two ways, each as its own process:
`python -m bench.image_server --bus` (a `DynamicToolService` on the broker `PULSAR_URL` names) and
`python -m bench.image_server --mcp` (an MCP server on the official SDK, over stdio).

The same bytes either way (seeded), base64 in an MCP `image` block.
"""

from __future__ import annotations

import argparse
import base64
import random
from typing import Any

IMAGE_BYTES = 1024 * 1024
TOOL = "bench-image"


def image() -> bytes:
    return random.Random(41).randbytes(IMAGE_BYTES)


async def bus() -> None:
    from toolservice_base import DynamicToolService
    from toolservice_base.schemas import ImageContent

    picture = ImageContent.of(image(), "image/png")

    class ImageService(DynamicToolService):
        descriptor = {"id": TOOL}
        tools = [{"name": TOOL, "description": "A 1 MiB image", "input-schema": {"type": "object"}}]
        version = "bench"

        async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> ImageContent:
            return picture

    await ImageService().run()


async def mcp() -> None:
    import mcp_types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel.server import Server
    from mcp.server.stdio import stdio_server

    data = base64.b64encode(image()).decode("ascii")

    async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[types.Tool(name=TOOL, description="A 1 MiB image", input_schema={"type": "object"})]
        )

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.ImageContent(type="image", data=data, mime_type="image/png")])

    server: Server[Any] = Server("bench-image", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    import anyio

    from toolservice_base import configure_logging

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    way = parser.add_mutually_exclusive_group(required=True)
    way.add_argument("--bus", action="store_true")
    way.add_argument("--mcp", action="store_true")
    args = parser.parse_args()
    configure_logging("warning", json=True)
    anyio.run(bus if args.bus else mcp)
