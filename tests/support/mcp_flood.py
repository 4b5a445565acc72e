"""An HTTP MCP server that floods: the official SDK's low-level server on uvicorn, in the test's process, behind an
ASGI wrapper that answers chosen requests with a JSON body that does not end (up to `total` bytes), counting what
it managed to send before its reader hung up.

Its tools are `echo` (answers its text) and `flood`; `floods` says which requests get the flood (by default
`tools/list` and calls of `flood`). What a bounded reader took is `sent`: a little more than its limit plus what
the sockets buffer, where an unbounded one takes all of `total`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

CHUNK = 64 * 1024
TOOL = {"type": "object", "properties": {"text": {"type": "string"}}}


def listing_and_flood_calls(request: dict[str, Any]) -> bool:
    params = request.get("params") or {}
    return request.get("method") == "tools/list" or (
        request.get("method") == "tools/call" and params.get("name") == "flood"
    )


def flood_calls(request: dict[str, Any]) -> bool:
    return request.get("method") == "tools/call" and (request.get("params") or {}).get("name") == "flood"


class Flooding:
    """The ASGI wrapper: a POST whose JSON-RPC request `floods` picks is answered with the flood; others pass."""

    def __init__(self, app: ASGIApp, floods: Callable[[dict[str, Any]], bool], total: int) -> None:
        self.app, self.floods, self.total = app, floods, total
        self.sent = 0
        self.flooded = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages, body, more = [], b"", True
        while more:
            message = await receive()
            messages.append(message)
            body, more = body + message.get("body", b""), bool(message.get("more_body"))
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if isinstance(request, dict) and self.floods(request):
            await self._flood(request.get("id"), receive, send)
            return
        replay: Iterator[Any] = iter(messages)

        async def replayed() -> Any:
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)

    async def _flood(self, request_id: Any, receive: Receive, send: Send) -> None:
        self.flooded += 1
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        entry = json.dumps({"name": "t", "inputSchema": TOOL, "description": "x" * 900}).encode() + b","
        chunk = entry * (CHUNK // len(entry))
        head = b'{"jsonrpc":"2.0","id":' + json.dumps(request_id).encode() + b',"result":{"tools":['
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            for part in itertools.chain([head], itertools.repeat(chunk)):
                if gone.is_set() or self.sent >= self.total:
                    break
                await send({"type": "http.response.body", "body": part, "more_body": True})
                self.sent += len(part)
                await asyncio.sleep(0)  # the watcher hears a hang-up between two parts
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()


def _server() -> Server[Any]:
    tools = [
        types.Tool(name="echo", description="Answers its text", input_schema=TOOL),
        types.Tool(name="flood", description="Answers without end", input_schema=TOOL),
    ]

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        text = str((params.arguments or {}).get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server("flood", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


@asynccontextmanager
async def flood_server(
    floods: Callable[[dict[str, Any]], bool] = listing_and_flood_calls, total: int = 128 * 1024 * 1024
) -> Any:
    """Serve on a free loopback port; yields (its /mcp URL, the `Flooding` wrapper to read `sent` from)."""
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = Flooding(_server().streamable_http_app(transport_security=security), floods, total)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}/mcp", app
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
