"""The reference of benchmark 13 (`front`): a bare streamable-HTTP MCP server of the official SDK with one echo tool,
`python -m bench.front_reference --port N`.

The SDK's low-level `Server` (what `toolreg mcp` builds on, and the cheapest server the SDK offers: no argument
model built per call) answering `echo` from memory, served by uvicorn with the SDK's defaults (sessions, SSE
answers), in a process of its own as the front is, with the garbage collector's settings the front has
(`discovery.cli.common.settle_heap`).
"""

from __future__ import annotations

import argparse
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server

from discovery.cli.common import settle_heap

from .common import run

TOOL = types.Tool(
    name="echo",
    description="Return the text it is given",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


LISTED = types.ListToolsResult(tools=[TOOL])
SCHEMAS = {TOOL.name: TOOL.input_schema}


async def _list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return LISTED


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = str((params.arguments or {}).get("text", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def main(port: int) -> None:
    # `get_tool_input_schema`: the SDK checks each call's `Mcp-Param-*` headers against the tool's input schema;
    # without it, it asks `tools/list` for the schema on every call (30 % of this loop, profiled).
    server: Server[Any] = Server(
        "bench-reference", on_list_tools=_list_tools, on_call_tool=_call_tool, get_tool_input_schema=SCHEMAS.get
    )
    config = uvicorn.Config(
        server.streamable_http_app(host="127.0.0.1"),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    settle_heap()  # the garbage collector's settings `toolreg mcp` serves with: without them, 21 % of this loop
    await uvicorn.Server(config).serve()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    run(main(parser.parse_args().port))
