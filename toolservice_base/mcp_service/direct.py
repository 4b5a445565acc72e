"""Requests written straight to a command server's stdin, their answers taken from its stdout by id.

The SDK's session sends a request through its dispatcher: an anyio memory
stream, an OpenTelemetry span and context, anyio checkpoints (a turn of the
loop each) and a hand-off to the writer task, every one of them per request.
At 32 calls in flight that was a third of the sidecar's loop thread
(`bench/PROFILE.md`). The sidecar owns the stdio transport (`stdio`), so it
can send `tools/call` itself: the request is one line handed to the
transport's writer, and the response line is taken off the transport's reader
by its id and given to a future before the session would see it.

The ids are strings with a prefix (`toolreg-1`, `toolreg-2`, ...). The SDK's
own are integers, and it correlates a numeric string with the integer
(`"7"` is 7), so an id that does not parse as one can never collide with
them, whichever side sends first. Everything else the server says (the
SDK's responses, its requests to the client, other notifications, lines that
are no message) goes to the session as before.

What the dispatcher does for a request and its waiter, this does too: a
progress callback gets the request id as its progress token and each
`notifications/progress` for it (checked as the SDK checks one, the callback
run in a task of its own so it cannot hold the reader); a caller that stops
waiting sends `notifications/cancelled` for the id (reason "caller
cancelled", the SDK's); an error response raises `MCPError`; the connection
ending fails every request waiting, and any sent after, with the SDK's
`MCPError(CONNECTION_CLOSED, "Connection closed")`. One thing more: a
response of ours the transport cannot parse fails its request at once (the
session, unable to read its id, would leave it waiting).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic_core import to_json

from ..logs import get_logger

log = get_logger("toolservice_base.mcp_service")

ID_PREFIX = "toolreg-"
"""Ids of the requests sent here: never a number, so never one of the SDK session's (see the module)."""


@dataclass(slots=True)
class _Pending:
    answer: asyncio.Future[dict[str, Any]]
    progress: ProgressFnT | None


def _closed() -> MCPError:
    return MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")


class DirectCalls:
    """The requests sent past the session on one command's transport, each waiting for its answer by id.

    Closed until the transport attaches its writer (`attach`), and again once the connection ends (`close`)."""

    def __init__(self) -> None:
        self._write: Callable[[bytes], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)
        self._progressing: set[asyncio.Task[None]] = set()

    def attach(self, write: Callable[[bytes], None]) -> None:
        """Send through `write` (one line, to the transport's writer) from now on; called on the transport's loop."""
        self._write = write
        self._loop = asyncio.get_running_loop()

    def close(self) -> None:
        """The connection ended: every request waiting fails with the SDK's CONNECTION_CLOSED, as do later ones."""
        self._write = None
        pending, self._pending = self._pending, {}
        for waiting in pending.values():
            if not waiting.answer.done():
                waiting.answer.set_exception(_closed())

    async def request(self, method: str, params: dict[str, Any], progress: ProgressFnT | None) -> dict[str, Any]:
        """Send `method` with `params` and return the response's `result`; MCPError for an error response or the
        connection ending. Cancelled, it sends `notifications/cancelled` for the request before re-raising."""
        write, loop = self._write, self._loop
        if write is None or loop is None:
            raise _closed()
        request_id = f"{ID_PREFIX}{next(self._ids)}"
        if progress is not None:
            params = {**params, "_meta": {**(params.get("_meta") or {}), "progressToken": request_id}}
        answer: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[request_id] = _Pending(answer, progress)
        try:
            write(to_json({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}) + b"\n")
            return await answer
        except asyncio.CancelledError:
            if self._write is not None:  # sent even if the answer came meanwhile, as the SDK does
                notice = {"requestId": request_id, "reason": "caller cancelled"}
                self._write(to_json({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": notice}) + b"\n")
            raise
        finally:
            self._pending.pop(request_id, None)

    def take(self, item: SessionMessage | Exception, line: bytes) -> bool:
        """Whether the transport's reader should keep `item` (read as `line`) from the session: a response to one
        of these requests (resolved here), or a progress notification for one (delivered here)."""
        if isinstance(item, Exception):
            self._unreadable(line)
            return False
        message = item.message
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            if not (isinstance(message.id, str) and message.id.startswith(ID_PREFIX)):
                return False
            waiting = self._pending.get(message.id)
            if waiting is None or waiting.answer.done():
                log.debug("mcp.late_response", id=message.id)
            elif isinstance(message, types.JSONRPCResponse):
                waiting.answer.set_result(message.result)
            else:
                error = message.error
                waiting.answer.set_exception(MCPError(code=error.code, message=error.message, data=error.data))
            return True
        if isinstance(message, types.JSONRPCNotification) and message.method == "notifications/progress":
            return self._progressed(message.params)
        return False

    def _progressed(self, params: dict[str, Any] | None) -> bool:
        """A progress notification: to the callback of the request its token names, if one of ours (checked as the
        SDK's dispatcher checks it: no bool token or progress, `total` a number, `message` a string, else None)."""
        match params:
            case {"progressToken": str() as token, "progress": int() | float() as progress} if token.startswith(
                ID_PREFIX
            ) and not isinstance(progress, bool):
                waiting = self._pending.get(token)
                if waiting is not None and waiting.progress is not None and self._loop is not None:
                    total, message = (params or {}).get("total"), (params or {}).get("message")
                    task = self._loop.create_task(
                        _told(
                            waiting.progress,
                            float(progress),
                            float(total) if isinstance(total, int | float) else None,
                            message if isinstance(message, str) else None,
                        )
                    )
                    self._progressing.add(task)
                    task.add_done_callback(self._progressing.discard)
                return True
            case _:
                return False

    def _unreadable(self, line: bytes) -> None:
        """A line that is no JSON-RPC message: if it carries one of our ids, that request fails now."""
        try:
            found = json.loads(line)
        except ValueError:
            return
        request_id = found.get("id") if isinstance(found, dict) else None
        if isinstance(request_id, str) and (waiting := self._pending.get(request_id)) is not None:
            if not waiting.answer.done():
                waiting.answer.set_exception(
                    MCPError(code=types.PARSE_ERROR, message="the server's response is not a JSON-RPC response")
                )


async def _told(progress: ProgressFnT, done: float, total: float | None, message: str | None) -> None:
    """A progress callback that raises costs only its own step, as in the SDK's dispatcher."""
    try:
        await progress(done, total, message)
    except Exception as exc:
        log.warning("mcp.progress_callback_failed", error=f"{type(exc).__name__}: {exc}")
