"""Resumable SSE streams for `toolreg mcp --http` (SEP-1699): what a client missed is replayed when it reconnects.

The SDK's streamable HTTP transport opens each stream with a *priming event*
(an id and no data) and tags every event with an id when it has an event
store, and tells the client how soon to reconnect (`retry`). A client whose
connection dropped mid-call (a proxy's idle timeout, a laptop's network
change) reconnects with `Last-Event-ID` and gets the rest of the answer
instead of waiting forever for it.

The store is memory, and bounded: at most `max_events` events and
`max_bytes` of them (the oldest go first), and an event larger than
`max_event_bytes` (a megabyte image, say) is not kept: its replay is
skipped. Event ids are `<random stream token>.<sequence>`, so a client cannot
name an event of a stream it was never given.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage, jsonrpc_message_adapter

MAX_EVENTS = 10_000
MAX_BYTES = 32 * 1024 * 1024
MAX_EVENT_BYTES = 1024 * 1024
RETRY_MS = 1000
"""How soon a client should reconnect after a stream closed before its answer (the SSE `retry` field)."""


class BoundedEventStore(EventStore):
    """The recent events of every stream, in memory, within a count and a byte budget."""

    def __init__(
        self, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES, max_event_bytes: int = MAX_EVENT_BYTES
    ) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.max_event_bytes = max_event_bytes
        self._events: OrderedDict[EventId, tuple[StreamId, bytes | None]] = OrderedDict()
        self._tokens: OrderedDict[StreamId, tuple[str, int]] = OrderedDict()
        self._bytes = 0

    @property
    def size(self) -> int:
        """Events kept. (Not `__len__`: the SDK tests the store for truth, and an empty one must count.)"""
        return len(self._events)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        token, sequence = self._tokens.pop(stream_id) if stream_id in self._tokens else (secrets.token_hex(12), 0)
        self._tokens[stream_id] = (token, sequence + 1)
        event_id = f"{token}.{sequence}"
        data = None if message is None else message.model_dump_json(by_alias=True, exclude_unset=True).encode()
        if data is not None and len(data) > self.max_event_bytes:
            return event_id  # numbered, never kept: a replay goes on past it
        self._events[event_id] = (stream_id, data)
        self._bytes += len(data or b"")
        while len(self._events) > self.max_events or self._bytes > self.max_bytes:
            _, (_, gone) = self._events.popitem(last=False)
            self._bytes -= len(gone or b"")
        while len(self._tokens) > self.max_events:  # the streams least recently written to
            self._tokens.popitem(last=False)
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        known = self._events.get(last_event_id)
        if known is None:
            return None
        stream_id = known[0]
        after = False
        for event_id, (stream, data) in list(self._events.items()):
            if event_id == last_event_id:
                after = True
            elif after and stream == stream_id and data is not None:
                await send_callback(EventMessage(jsonrpc_message_adapter.validate_json(data), event_id))
        return stream_id
