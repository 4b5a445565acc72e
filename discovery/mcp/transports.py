"""Transports for `McpFront`: a stream pair (stdio) and streamable HTTP (uvicorn, in this event loop).

Both carry the SDK's own protocol handling; what is added here is what the
SDK leaves to the application:

- stdio: a line that is not JSON, or not a JSON-RPC message, gets a JSON-RPC
  error back (the SDK's stdio transport drops it silently, which leaves a
  client waiting), and the server keeps serving.
- HTTP: an optional static bearer token, compared in constant time, checked
  before the SDK sees the request; no token, no answer but 401. The socket is
  bound here, so a taken port is a one-line error and port 0 works.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import socket
import stat
import sys
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.shared.message import SessionMessage
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from toolservice_base.logs import get_logger

from .server import McpFront, one_line

log = get_logger("discovery.mcp")

SHUTDOWN_GRACE = 1.0
"""Seconds open HTTP streams get to finish when the server stops."""


# --- stdio -------------------------------------------------------------------

MAX_LINE = 64 * 1024 * 1024
"""Longest stdio message accepted (bytes); a line is one JSON-RPC message."""


class StdinLines:
    """The lines of fd 0, read by the event loop instead of a worker thread.

    Handed to the SDK's `stdio_server(stdin=...)`. Its own reader blocks a
    thread in read(2), which nothing can interrupt, so a SIGTERM while the
    client still holds stdin open would wait for the client's next line.
    `stop()` ends this one at once. Only pipes and sockets are read this way;
    for anything else (a file, a terminal) `open()` returns None and the
    SDK's reader is used.
    """

    def __init__(self) -> None:
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.ReadTransport | None = None

    async def open(self) -> StdinLines | None:
        try:
            mode = os.fstat(sys.stdin.fileno()).st_mode
        except (OSError, ValueError):
            return None
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return None  # a file, /dev/null or a terminal: the SDK's threaded reader handles those
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE)
        try:
            self._transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        except (ValueError, OSError):
            return None
        self._reader = reader
        return self

    def stop(self) -> None:
        if self._reader is not None:
            self._reader.feed_eof()
        if self._transport is not None:
            self._transport.close()

    def __aiter__(self) -> StdinLines:
        return self

    async def __anext__(self) -> str:
        assert self._reader is not None
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


def malformed_reply(exc: Exception) -> types.JSONRPCError:
    """The JSON-RPC error for a line that could not be read as a message (id null unless one was readable)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if not errors or any(e["type"] == "json_invalid" for e in errors):
        error = types.ErrorData(code=types.PARSE_ERROR, message="Parse error: the line is not JSON; send one JSON-RPC message per line")
    else:
        error = types.ErrorData(code=types.INVALID_REQUEST, message="Invalid request: not a JSON-RPC 2.0 request, notification or response")
    request_id: types.RequestId | None = None
    for item in errors:
        given = item.get("input")
        if isinstance(given, dict) and isinstance(given.get("id"), (str, int)) and not isinstance(given.get("id"), bool):
            request_id = given["id"]
            break
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)


async def serve_streams(front: McpFront, read_stream: Any, write_stream: Any) -> None:
    """Serve one connection over a stream pair (stdio's) until the client closes it."""
    replies = write_stream.clone()
    inbound_send, inbound = anyio.create_memory_object_stream[SessionMessage | Exception](0)

    async def relay() -> None:
        async with inbound_send, replies:
            async for item in read_stream:
                if not isinstance(item, Exception):
                    await inbound_send.send(item)
                    continue
                reply = malformed_reply(item)
                log.warning("mcp.malformed_message", code=reply.error.code, id=reply.id)
                try:
                    await replies.send(SessionMessage(reply))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(relay)
        await front.server.run(inbound, write_stream, front.server.create_initialization_options())
        tasks.cancel_scope.cancel()


# --- HTTP --------------------------------------------------------------------


class BearerTokenGuard:
    """ASGI wrapper: HTTP requests without `Authorization: Bearer <token>` get 401 and never reach MCP."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._authorized(scope):
            body = json.dumps({"error": "invalid_token", "error_description": "send Authorization: Bearer <token>"}).encode()
            await send({
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer error="invalid_token"'),
                ],
            })
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        given = next((value for key, value in scope["headers"] if key == b"authorization"), b"")
        scheme, _, credential = given.partition(b" ")
        # Constant time in the token's content: how long a refusal takes says nothing about how close a guess was.
        return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token)


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the command decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --http address") from None


@contextlib.asynccontextmanager
async def http_server(front: McpFront, host: str, port: int, *, token: str | None = None) -> AsyncIterator[str]:
    """Serve `front` over streamable HTTP while the block runs; yields the endpoint URL."""
    sock = _bind(host, port)
    app: ASGIApp = front.server.streamable_http_app(host=host)
    if token:
        app = BearerTokenGuard(app, token)
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on", log_level="warning",
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE) or 1,
    )
    server = _Uvicorn(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="mcp-http")
    try:
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise OSError(f"the HTTP server on {host}:{port} stopped while starting")
            await asyncio.sleep(0.01)
        bound_host, bound_port = sock.getsockname()[:2]
        url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}/mcp"
        log.info("mcp.listening", url=url, token=bool(token))
        yield url
    finally:
        front.close()
        server.should_exit = True
        try:
            await task
        except Exception as exc:
            log.warning("mcp.http_stop_failed", error=one_line(exc))
        sock.close()
