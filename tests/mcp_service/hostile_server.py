"""MCP servers that offer what cannot be announced, for `toolreg announce --mcp` to refuse (stdio; run as a script).

    python hostile_server.py silent          # reads its stdin and never answers, not even `initialize`
    python hostile_server.py many N [PAD]    # lists N tools (descriptions PAD characters long)
    python hostile_server.py big-schema N    # one tool whose input schema is N bytes of JSON
    python hostile_server.py names A B ...   # tools with these names (echoing their name and arguments when called)

The official SDK's low-level `Server`, so the listing is exactly what is asked for.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server


def _tools(mode: str, args: list[str]) -> list[types.Tool]:
    plain = {"type": "object", "properties": {"text": {"type": "string", "description": "Some text"}}}
    if mode == "many":
        pad = "." * int(args[1]) if len(args) > 1 else ""
        return [
            types.Tool(name=f"tool_{i}", description=f"Tool {i}{pad}", input_schema=plain) for i in range(int(args[0]))
        ]
    if mode == "big-schema":
        size = int(args[0])
        big = {"type": "object", "properties": {"text": {"type": "string", "description": "x" * size}}}
        return [types.Tool(name="small", description="A small one", input_schema=plain)] + [
            types.Tool(name="big", description="A schema of many bytes", input_schema=big)
        ]
    return [types.Tool(name=name, description=f"Called {name}", input_schema=plain) for name in args]


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "silent":
        for _ in sys.stdin:
            pass
        return
    tools = _tools(mode, args)

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        text = f"{params.name} {params.arguments or {}}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    async def serve() -> None:
        server: Server[Any] = Server("hostile", version="1", on_list_tools=list_tools, on_call_tool=call_tool)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(serve)


if __name__ == "__main__":
    main()
