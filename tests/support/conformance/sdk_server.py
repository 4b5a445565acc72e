"""The tools the MCP conformance suite calls, as an MCP server written with the official SDK (stdio).

Run as a script (`python sdk_server.py`): it is what a third party would run, and what the
conformance test brings onto the bus with `toolreg announce --mcp -- python sdk_server.py`. The SDK's
low-level `Server`, so the JSON Schema 2020-12 tool lists its schema exactly as the suite gives it.
"""

from __future__ import annotations

import base64
from typing import Any

import anyio
import mcp_types as types
from data import (  # type: ignore[import-not-found]
    EMBEDDED_TEXT,
    EMBEDDED_URI,
    ERROR_TEXT,
    JSON_SCHEMA_2020_12,
    JSON_SCHEMA_TOOL,
    MIXED_JSON,
    MIXED_TEXT,
    MIXED_URI,
    NO_ARGUMENTS,
    PROGRESS_DELAY,
    PROGRESS_STEPS,
    SIMPLE_TEXT,
    TOOL_DESCRIPTIONS,
    red_pixel_png,
    short_wav,
)
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(
                name=name,
                description=description,
                input_schema=JSON_SCHEMA_2020_12 if name == JSON_SCHEMA_TOOL else NO_ARGUMENTS,
                annotations=types.ToolAnnotations(read_only_hint=True) if name == "test_simple_text" else None,
            )
            for name, description in TOOL_DESCRIPTIONS.items()
        ]
    )


def _content(name: str) -> list[Any]:
    image = types.ImageContent(type="image", data=_b64(red_pixel_png()), mime_type="image/png")
    if name == "test_image_content":
        return [image]
    if name == "test_audio_content":
        return [types.AudioContent(type="audio", data=_b64(short_wav()), mime_type="audio/wav")]
    if name == "test_embedded_resource":
        resource = types.TextResourceContents(uri=EMBEDDED_URI, mime_type="text/plain", text=EMBEDDED_TEXT)
        return [types.EmbeddedResource(type="resource", resource=resource)]
    if name == "test_multiple_content_types":
        resource = types.TextResourceContents(uri=MIXED_URI, mime_type="application/json", text=MIXED_JSON)
        return [
            types.TextContent(type="text", text=MIXED_TEXT),
            image,
            types.EmbeddedResource(type="resource", resource=resource),
        ]
    if name == "test_reconnection":
        return [types.TextContent(type="text", text="Reconnection test completed")]
    return [types.TextContent(type="text", text=SIMPLE_TEXT)]


async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    name = params.name
    if name == "test_error_handling":
        return types.CallToolResult(content=[types.TextContent(type="text", text=ERROR_TEXT)], is_error=True)
    if name == "test_tool_with_progress":
        for step in PROGRESS_STEPS:
            await ctx.session.report_progress(step, 100, f"{step}/100")
            await anyio.sleep(PROGRESS_DELAY)
        return types.CallToolResult(content=[types.TextContent(type="text", text="Progress test completed")])
    if name == "test_reconnection":
        await anyio.sleep(0.2)
    if name == JSON_SCHEMA_TOOL:
        who = (params.arguments or {}).get("name", "nobody")
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"Hello, {who}")])
    return types.CallToolResult(content=_content(name))


async def main() -> None:
    server: Server[Any] = Server("conformance-tools", version="1.0", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
