"""Transports for `McpFront`: a stream pair (stdio) and streamable HTTP (uvicorn, in this event loop).

Both carry the SDK's own protocol handling; what is added here is what the
SDK leaves to the application:

- stdio: a line that is not JSON, or not a JSON-RPC message, gets a JSON-RPC
  error back (the SDK's stdio transport drops it silently, which leaves a
  client waiting), and the server keeps serving. So does a request whose
  `id` is neither a string nor an integer (the SDK would take it for a
  notification and never answer), and a line longer than `MAX_LINE` (read
  past and answered: the SDK's reader would end the process on it).
- HTTP: the `Host` and `Origin` of every request are checked against the
  bound address, on every bind (the SDK checks them only on the literal
  hosts 127.0.0.1, localhost and ::1), so no other site can reach the server
  through DNS rebinding; then either an OAuth 2.1 access token of the
  configured issuer (`auth.http`), or an optional static bearer token
  compared in constant time; both before the SDK sees the request. A 2025-era call
  whose client disconnects before its answer is cancelled, as over stdio
  (`dropped`). Request heads have a
  deadline and open sockets a cap (`discovery.web.hardening.bounded_config`).
  The socket is bound here, so a taken port is a one-line error and port 0
  works. Idle sessions end, and at most so many are open (503 past it), so
  abandoned ones cannot pile up (`McpSettings.session_idle`, `max_sessions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import secrets
import socket
import stat
import sys
import time
from collections.abc import AsyncIterator, Iterable
from typing import IO, Any
from urllib.parse import urlsplit

import anyio
import mcp_types as types
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import SessionMessage
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from discovery.web.hardening import (
    HEADER_TIMEOUT,
    MAX_CONNECTIONS,
    WRITE_TIMEOUT,
    BoundedServer,
    bounded_config,
    tcp_listener,
)
from discovery.web.health import is_loopback_host, split_host
from toolservice_base.logs import get_logger

from .auth.http import BearerTokenGuard, OAuthSettings, ResourceServer, resource_server
from .dropped import CancelDroppedCalls
from .events import RETRY_MS, BoundedEventStore
from .server import McpFront, one_line
from .settings import McpSettings

log = get_logger("discovery.mcp")

SHUTDOWN_GRACE = 1.0
"""Seconds open HTTP streams get to finish when the server stops."""


# --- stdio -------------------------------------------------------------------

MAX_LINE = 64 * 1024 * 1024
"""Longest stdio message accepted (bytes); a line is one JSON-RPC message. A longer one is read past and answered with
an error."""
ID_PREFIX = 4096
"""Bytes at the start of an over-long line searched for its `id`, so the error can name the request it answers."""

_REFUSED = f"toolreg-refused-{secrets.token_hex(8)}"
"""Key of the stand-in line for a message refused before the SDK saw it; unguessable, so no client can send one."""


def _refused_line(code: int, message: str, request_id: types.RequestId | None = None) -> str:
    """A line the SDK fails to read as JSON-RPC, which `malformed_reply` turns back into this error."""
    return json.dumps({_REFUSED: {"code": code, "message": message, "id": request_id}}) + "\n"


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def screen_line(line: str) -> str:
    """`line`, or a stand-in for an error when the SDK would read it wrongly.

    A request (it has `method`) whose `id` is not a string or an integer is
    read by the SDK as a notification, which gets no answer: its client would
    wait forever. It gets an Invalid Request error instead (id null, as it
    cannot be echoed).
    """
    try:
        message = json.loads(line)
    except ValueError:
        return line  # not JSON: the SDK says so
    if isinstance(message, dict) and "method" in message and "id" in message and not _valid_id(message["id"]):
        given = type(message["id"]).__name__ if message["id"] is not None else "null"
        return _refused_line(
            types.INVALID_REQUEST, f"Invalid request: 'id' must be a string or an integer, not {given}"
        )
    return line


def leading_id(prefix: str) -> types.RequestId | None:
    """The `id` of the JSON object that `prefix` begins, if it comes before any nested value; else None.

    Read token by token with the JSON decoder, never guessed from the text,
    so a string that merely contains `"id":` is not taken for it.
    """
    decoder = json.JSONDecoder()
    text = prefix.lstrip()
    if not text.startswith("{"):
        return None
    at = 1
    try:
        while True:
            while at < len(text) and text[at] in " \t\r\n,":
                at += 1
            key, at = decoder.raw_decode(text, at)
            while at < len(text) and text[at] in " \t\r\n":
                at += 1
            if not isinstance(key, str) or text[at : at + 1] != ":":
                return None
            at += 1
            while at < len(text) and text[at] in " \t\r\n":
                at += 1
            if text[at : at + 1] in ("{", "["):
                return None  # a nested value before the id: not worth reading past
            value, at = decoder.raw_decode(text, at)
            while at < len(text) and text[at] in " \t\r\n":
                at += 1
            if text[at : at + 1] not in (",", "}"):
                return None  # the prefix ends inside the value (a number cut short): not to be trusted
            if key == "id":
                return value if _valid_id(value) else None
    except (ValueError, IndexError):
        return None


class StdinLines:
    """The lines of fd 0 (or `source`), read by the event loop instead of a worker thread.

    Handed to the SDK's `stdio_server(stdin=...)`. Its own reader blocks a
    thread in read(2), which nothing can interrupt, so a SIGTERM while the
    client still holds stdin open would wait for the client's next line.
    `stop()` ends this one at once. Only pipes and sockets are read this way;
    for anything else (a file, a terminal) `open()` returns None and the
    SDK's reader is used.

    Every line goes through `screen_line`; a line longer than `limit` bytes
    is read past (never held whole) and stands in for an error that names
    its `id` when the line's first bytes show it.
    """

    def __init__(self, source: IO[bytes] | None = None, *, limit: int = MAX_LINE) -> None:
        self._source = source
        self.limit = limit
        self._reader: asyncio.StreamReader | None = None
        self._transport: asyncio.ReadTransport | None = None

    async def open(self) -> StdinLines | None:
        source = self._source if self._source is not None else sys.stdin.buffer
        try:
            mode = os.fstat(source.fileno()).st_mode
        except (OSError, ValueError):
            return None
        if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            return None  # a file, /dev/null or a terminal: the SDK's threaded reader handles those
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=self.limit)
        try:
            self._transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), source)
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
        try:
            line = await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as end:
            line = end.partial  # the last line, without its newline
            if not line:
                raise StopAsyncIteration from None
        except asyncio.LimitOverrunError as over:
            return await self._skip_long_line(over.consumed)
        return screen_line(line.decode("utf-8", errors="replace"))

    async def _skip_long_line(self, consumed: int) -> str:
        """Read past the rest of a line longer than `limit`; the stand-in line for its error."""
        assert self._reader is not None
        head = await self._reader.readexactly(min(consumed, ID_PREFIX)) if consumed else b""
        size = len(head)
        pending = consumed - len(head)
        while True:
            while pending:  # in pieces: the line is dropped as it is read, never copied whole
                piece = min(pending, 1024 * 1024)
                await self._reader.readexactly(piece)
                size += piece
                pending -= piece
            try:
                rest = await self._reader.readuntil(b"\n")
            except asyncio.LimitOverrunError as over:
                pending = over.consumed
                continue
            except asyncio.IncompleteReadError as end:
                rest = end.partial  # the stream ended inside the line
            size += len(rest)
            break
        request_id = leading_id(head.decode("utf-8", errors="replace"))
        log.warning("mcp.line_too_long", bytes=size, limit=self.limit, id=request_id)
        return _refused_line(
            types.INVALID_REQUEST,
            f"Invalid request: the message is {size} bytes, longer than the {self.limit} a line may have; it was not"
            " read",
            request_id,
        )


def malformed_reply(exc: Exception) -> types.JSONRPCError:
    """The JSON-RPC error for a line that could not be read as a message (id null unless one was readable)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    for item in errors:
        given = item.get("input")
        refused = given.get(_REFUSED) if isinstance(given, dict) and len(given) == 1 else None
        if isinstance(refused, dict):
            error = types.ErrorData(code=int(refused["code"]), message=str(refused["message"]))
            echoed = refused.get("id")
            return types.JSONRPCError(jsonrpc="2.0", id=echoed if _valid_id(echoed) else None, error=error)
    if not errors or any(e["type"] == "json_invalid" for e in errors):
        error = types.ErrorData(
            code=types.PARSE_ERROR, message="Parse error: the line is not JSON; send one JSON-RPC message per line"
        )
    else:
        error = types.ErrorData(
            code=types.INVALID_REQUEST, message="Invalid request: not a JSON-RPC 2.0 request, notification or response"
        )
    request_id: types.RequestId | None = None
    for item in errors:
        given = item.get("input")
        if isinstance(given, dict) and _valid_id(given.get("id")):
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


REFUSALS_LOGGED_EVERY = 10.0
"""Seconds between log lines about refused Host/Origin requests (each says how many there were)."""
MAX_VERDICTS = 256
"""(Host, Origin) pairs whose verdict `HostOriginGuard` keeps; past it they are judged anew."""
MAX_KEPT_HEADERS = 512
"""Bytes of Host and Origin together up to which their verdict is kept (so the kept pairs hold at most ~128 KiB)."""


def _ip(name: str) -> str:
    """An IP literal in one spelling (`0:0::1` -> `::1`); anything else as it is."""
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return name


class HostOriginGuard:
    """ASGI wrapper: a request whose `Host` is not this server's address, or whose `Origin` is another site, gets 403.

    What the MCP specification asks of every streamable HTTP server, against
    DNS rebinding: a page on another site whose name resolves to this address
    must not reach the tools. Allowed as `Host` (compared as a parsed name and
    port, never as text prefix): the bound address and port; on a loopback
    bind also `localhost` and every loopback IP literal; on a wildcard bind
    (0.0.0.0, ::) any IP literal, which no rebinding can produce; and the
    names in `allowed_hosts`. An `Origin`, when sent, must name one of those
    with the same port.
    """

    def __init__(self, app: ASGIApp, host: str, port: int, allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.host = _ip(host.lower())
        self.port = port
        self.loopback = is_loopback_host(host)
        self.wildcard = self.host in ("0.0.0.0", "::")
        self.names = {_ip(name.strip().lower()) for name in allowed_hosts if name.strip()}
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.address = f"{shown}:{port}"
        self._refused = 0
        self._said = -REFUSALS_LOGGED_EVERY
        self._verdicts: dict[tuple[bytes, bytes | None], str | None] = {}
        """`refusal`'s answer by (Host, Origin) as sent: a client sends the same two on every request, and parsing
        them (IP literals, the URL) was a few percent of the front's loop per call; bounded, emptied when full."""

    def allows(self, name: str, port: int) -> bool:
        if port != self.port:
            return False
        name = _ip(name)
        if name == self.host or name in self.names:
            return True
        if self.loopback and is_loopback_host(name):
            return True
        return self.wildcard and _is_ip(name)

    def refusal(self, scope: Scope) -> str | None:
        """None if the request may pass; else the one-line reason."""
        host_header, origin = b"", None
        for key, value in scope["headers"]:
            if key == b"host":
                host_header = value
            elif key == b"origin":
                origin = value
        key = (host_header, origin)
        try:
            return self._verdicts[key]
        except KeyError:
            pass
        verdict = self._judge(host_header, origin)
        if len(host_header) + len(origin or b"") <= MAX_KEPT_HEADERS:  # a long header is judged each time, not kept
            if len(self._verdicts) >= MAX_VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict

    def _judge(self, host_header: bytes, origin: bytes | None) -> str | None:
        given = host_header.decode("latin-1")
        host = split_host(given)
        if host is None or not self.allows(host[0], host[1] if host[1] is not None else 80):
            return f"Host {given[:100]!r} is not this server's address ({self.address}); refused against DNS rebinding"
        if origin is None:
            return None
        text = origin.decode("latin-1")
        try:
            parts = urlsplit(text)
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        except ValueError:
            port = None
        if (
            port is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or not self.allows(parts.hostname, port)
        ):
            return (
                f"Origin {text[:100]!r} is another site than this server ({self.address}); cross-origin requests are"
                " refused"
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            reason = self.refusal(scope)
            if reason is not None:
                self._refused += 1
                if time.monotonic() - self._said >= REFUSALS_LOGGED_EVERY:  # a page hammering us must not flood the log
                    log.warning(
                        "mcp.http_refused", reason=reason, refused=self._refused, window_s=REFUSALS_LOGGED_EVERY
                    )
                    self._said, self._refused = time.monotonic(), 0
                body = (json.dumps({"error": "forbidden", "error_description": reason}) + "\n").encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 403,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _bind(host: str, port: int) -> socket.socket:
    try:
        return tcp_listener(host, port)
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --http address") from None


def _guarded_app(
    front: McpFront,
    host: str,
    port: int,
    token: str | None,
    resource: ResourceServer | None,
    allowed_hosts: Iterable[str],
    sessions: tuple[float, int],
) -> ASGIApp:
    """The front's streamable-HTTP app behind its guards: Host/Origin first, then who may call."""
    # The SDK's own Host/Origin check is off: it covers only three literal hosts; HostOriginGuard covers every bind.
    # Every stream resumable (SEP-1699): a client that lost its connection mid-call reconnects and gets the rest.
    app: ASGIApp = front.server.streamable_http_app(
        host=host,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        event_store=BoundedEventStore(),
        retry_interval=RETRY_MS,
        custom_starlette_routes=resource.routes() if resource is not None else None,
        session_idle_timeout=sessions[0],
        max_sessions=sessions[1],
    )
    app = CancelDroppedCalls(app)
    if resource is not None:
        app = resource.guard(app)
    elif token:
        app = BearerTokenGuard(app, token)
    return HostOriginGuard(app, host, port, allowed_hosts)


@contextlib.asynccontextmanager
async def http_server(
    front: McpFront,
    host: str,
    port: int,
    *,
    token: str | None = None,
    oauth: OAuthSettings | None = None,
    allowed_hosts: Iterable[str] = (),
    header_timeout: float = HEADER_TIMEOUT,
    write_timeout: float = WRITE_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    session_idle: float = McpSettings.session_idle,
    max_sessions: int = McpSettings.max_sessions,
) -> AsyncIterator[str]:
    """Serve `front` over streamable HTTP while the block runs; yields the endpoint URL.

    With `oauth` it is an OAuth 2.1 resource server (`auth.http`): the issuer is read before the port answers, its
    metadata routes are served, and its guard stands where the static `token`'s would.
    """
    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}/mcp"
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(sock.close)
        resource = await stack.enter_async_context(resource_server(oauth, url)) if oauth is not None else None
        config = bounded_config(
            _guarded_app(front, host, bound_port, token, resource, allowed_hosts, (session_idle, max_sessions)),
            header_timeout=header_timeout,
            write_timeout=write_timeout,
            max_connections=max_connections,
            event="mcp.slow_clients_dropped",
            log_config=None,
            access_log=False,
            lifespan="on",
            log_level="warning",
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE) or 1,
        )
        server = BoundedServer(config)  # without uvicorn's signal handlers: the command decides when to stop
        task = asyncio.create_task(server.serve(sockets=[sock]), name="mcp-http")
        try:
            while not server.started:
                if task.done():
                    task.result()  # raises what stopped it
                    raise OSError(f"the HTTP server on {host}:{port} stopped while starting")
                await asyncio.sleep(0.01)
            log.info("mcp.listening", url=url, token=bool(token), oauth=resource.resource if resource else None)
            yield url
        finally:
            front.close()
            server.should_exit = True
            try:
                await task
            except Exception as exc:
                log.warning("mcp.http_stop_failed", error=one_line(exc))
