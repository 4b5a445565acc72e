"""A call whose HTTP client went away is cancelled, as it is over stdio: `CancelDroppedCalls`.

Over stdio a client that goes away ends its connection, the SDK cancels
every call the connection made, and the cancellation reaches the tool
service (the `ToolSet`'s stream closes, its `RequestClient` publishes the
call's id on the service's cancel queue, the service stops the work and
frees its slot). Over streamable HTTP the 2026-07-28 transport does the
same on its own: a request is its response stream, and the SDK cancels the
handler when the stream drops. The 2025-era transport does not: its session
outlives any one connection, and a call whose response stream dropped runs
on to its deadline, holding a slot of its service that nobody waits for. A
few vanished agents could fill a small service.

So this ASGI wrapper, between our guards and the SDK's app, watches each
2025-era request (a POST with an `Mcp-Session-Id`): when the client
disconnects before the response is complete, it hands the session a
`notifications/cancelled` for that request, exactly what a client that gave
up politely sends, through the SDK's own endpoint. The SDK then cancels the
handler as it would for that client.

The specification lets a client resume a dropped stream instead, when the
server keeps an event store (`Last-Event-ID`). This server keeps none (the
SDK then sends no priming event, so no client tries): the answer of a
dropped stream could reach nobody, and cancelling it loses nothing. A server
that enabled resumption would have to stop using this wrapper.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolservice_base.logs import get_logger

log = get_logger("discovery.mcp")

SESSION_HEADER = b"mcp-session-id"
CANCEL_WAIT = 2.0
"""Seconds the session gets to take a dropped call's cancellation (it waits only for the session's read loop)."""
_KEPT_HEADERS = frozenset(
    {b"host", b"origin", b"authorization", SESSION_HEADER, b"mcp-protocol-version", b"user-agent"}
)


def request_id_of(body: bytes) -> types.RequestId | None:
    """The `id` of the JSON-RPC request `body`, or None if it is no request (a notification, a response, not JSON)."""
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return None
    given = message.get("id")
    if isinstance(given, str) or (isinstance(given, int) and not isinstance(given, bool)):
        return given
    return None


def answers(chunk: bytes, request_id: types.RequestId) -> bool:
    """Whether the SSE `chunk` carries the JSON-RPC response to `request_id` (a client may go as soon as it has it)."""
    for line in chunk.splitlines():
        if not line.startswith(b"data:"):
            continue
        try:
            message = json.loads(line[5:])
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if (
            isinstance(message, dict)
            and message.get("id") == request_id
            and ("result" in message or "error" in message)
        ):
            return True
    return False


class CancelDroppedCalls:
    """ASGI wrapper: a 2025-era request whose client disconnected before its answer is cancelled in its session."""

    def __init__(self, app: ASGIApp, *, max_body: int = DEFAULT_MAX_REQUEST_BODY_SIZE) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not _header(scope, SESSION_HEADER):
            await self.app(scope, receive, send)
            return
        body: bytearray | None = bytearray()  # a copy of what the SDK reads; None past max_body (the SDK refuses it)
        complete = dropped = False
        last_event = b""  # the response is the last event of its stream

        async def watched_receive() -> Message:
            nonlocal body, dropped
            message = await receive()
            if message["type"] == "http.request" and body is not None:
                chunk = message.get("body", b"")
                if len(body) + len(chunk) > self.max_body:
                    body = None
                else:
                    body.extend(chunk)
            elif message["type"] == "http.disconnect" and not complete:
                dropped = True
            return message

        async def watched_send(message: Message) -> None:
            nonlocal complete, last_event
            if message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if chunk and not chunk.startswith(b":"):  # not a keep-alive comment
                    last_event = chunk
                if not message.get("more_body", False):
                    complete = True
            await send(message)

        try:
            await self.app(scope, watched_receive, watched_send)
        finally:
            if dropped and not complete and body is not None:
                request_id = request_id_of(bytes(body))
                if request_id is not None and not answers(last_event, request_id):
                    # Shielded: the request's own task may be ending under a cancellation; the call must not outlive it.
                    with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT):
                        await self._cancel(scope, request_id)

    async def _cancel(self, scope: Scope, request_id: types.RequestId) -> None:
        """Post `notifications/cancelled` for `request_id` to the dropped request's session, as its client would
        have."""
        notice = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "the client disconnected before the answer"},
        }
        data = json.dumps(notice).encode()
        headers = [(key, value) for key, value in scope["headers"] if key in _KEPT_HEADERS]
        headers += [
            (b"content-type", b"application/json"),
            (b"accept", b"application/json, text/event-stream"),
            (b"content-length", str(len(data)).encode()),
        ]
        answered = anyio.Event()
        status: list[int] = []
        sent_body = False

        async def receive() -> Message:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": data, "more_body": False}
            await answered.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                answered.set()

        await self.app({**scope, "headers": headers}, receive, send)
        # No session id in the logs: on this wire it is what lets a request into the session.
        if status and status[0] == 202:
            log.info(
                "mcp.call_dropped",
                id=request_id,
                note="the client disconnected before the answer; its call was cancelled",
            )
        else:
            log.warning(
                "mcp.call_drop_not_cancelled",
                id=request_id,
                status=status[0] if status else None,
                hint="the session did not take the cancellation; the call runs until it ends or reaches its deadline",
            )


def _header(scope: Scope, name: bytes) -> str | None:
    value: Any = next((value for key, value in scope["headers"] if key == name), None)
    return value.decode("latin-1") if value is not None else None
