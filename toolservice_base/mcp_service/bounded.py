"""An HTTP MCP server's messages read within a stated size, so a server cannot grow the sidecar without bound.

The MCP SDK's streamable-HTTP client bounds each server-sent event it reads
(`max_sse_event_size`, which the sidecar sets to its limit), but reads a JSON
response whole (`response.aread()`): a server answering `tools/list` with
300 MB grew the sidecar past a gigabyte. `BoundedReads` is a `response` event
hook of the sidecar's client, which every response passes (proxied or not):
it reads a JSON response's body itself, decoded, up to `limit` bytes, and
hands the SDK either that body or, past the limit, a JSON-RPC error answer
to the same request saying what was refused. The request then fails with a
one-line reason (the caller of a tool is told, a listing at start stops the
sidecar in one line), the rest of the body is never read, and the connection
and the sidecar go on. Other responses (event streams, 202s) pass untouched.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import mcp_types as types

from ..transport.base import MESSAGE_LIMIT
from .settings import SidecarSettings

DEFAULT_MAX_MESSAGE = MESSAGE_LIMIT
"""Bytes of one message of an HTTP MCP server read at most: the broker's message limit, since no answer larger than
that could be forwarded to a caller in one message anyway."""
_HOP_HEADERS = ("content-length", "content-encoding", "transfer-encoding")


def too_large(limit: int) -> str:
    """What a request whose answer was over the limit is told (and, through it, its caller)."""
    return (
        f"the MCP server sent a message larger than {limit} bytes, the sidecar's limit"
        f" ({SidecarSettings.env('max_message')}); it was refused unread"
    )


class BoundedReads:
    """An httpx `response` event hook that reads every JSON response's body here, within `limit` bytes (see the
    module). A hook rather than a transport: it sees every response, proxied ones included."""

    def __init__(self, limit: int = DEFAULT_MAX_MESSAGE) -> None:
        self.limit = limit
        self.refused = 0
        """Responses refused for their size since the hook was made."""

    async def __call__(self, response: httpx2.Response) -> None:
        if not response.headers.get("content-type", "").lower().startswith("application/json"):
            return
        body = await self._read(response)
        if body is None:
            self.refused += 1
            body = _refusal(response.request, too_large(self.limit))
        for name in _HOP_HEADERS:  # the body handed on is decoded and whole
            response.headers.pop(name, None)
        response.stream = httpx2.ByteStream(body)

    async def _read(self, response: httpx2.Response) -> bytes | None:
        """The decoded body if it is at most `limit` bytes; None (and the rest left unread) if it is more.

        Read through a response of its own, so the one the SDK reads next is untouched but for its new stream."""
        declared = response.headers.get("content-length", "")
        reading = httpx2.Response(response.status_code, headers=response.headers, stream=response.stream)
        try:
            if declared.isdigit() and int(declared) > self.limit and "content-encoding" not in response.headers:
                return None
            body = bytearray()
            async for chunk in reading.aiter_bytes():  # decoded: a compressed answer is counted as it unpacks
                body += chunk
                if len(body) > self.limit:
                    return None
            return bytes(body)
        finally:
            await reading.aclose()


def _refusal(request: httpx2.Request, message: str) -> bytes:
    """A JSON-RPC error answering `request` (its id read from its body), as if the server had said `message`."""
    try:
        sent: Any = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        sent = None
    request_id = sent.get("id") if isinstance(sent, dict) else None
    error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": types.INTERNAL_ERROR, "message": message}}
    return json.dumps(error).encode()
