"""`MemoryReader`: a reader of the in-memory broker's topics, and the message ids it starts from.

A persistent topic keeps every message (as a namespace with unlimited retention does), and a reader starts at the
earliest message, at the last one (inclusive), or after (or at) a message id; a reader of a non-persistent topic sees
only what is sent after it opened (`toolservice_base.transport.memory` has the rest of the broker's semantics).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Protocol

from ..errors import TransportClosed, TransportError
from .base import Envelope, ReaderStart

_ID_PREFIX = b"memory:"


def message_id_of(index: int) -> bytes:
    """The id of a topic's `index`-th kept message."""
    return _ID_PREFIX + str(index).encode()


def index_of(message_id: bytes) -> int:
    if not message_id.startswith(_ID_PREFIX) or not message_id[len(_ID_PREFIX) :].isdigit():
        raise TransportError(
            f"{message_id[:16]!r} is not a message id of this broker; start at earliest", retriable=False
        )
    return int(message_id[len(_ID_PREFIX) :])


class KeptTopic(Protocol):
    """What a reader sees of a topic of the in-memory broker."""

    name: str
    persistent: bool
    log: list[Envelope]
    readers: set[Any]


class MemoryReader:
    """Reads a topic's kept messages from a position (persistent), or what arrives after it opened (non-persistent)."""

    def __init__(self, topic: KeptTopic, start: ReaderStart, inclusive: bool) -> None:
        self._topic = topic
        self.topic = topic.name
        self._queue: deque[Envelope] = deque()
        self._next = 0
        self._wake = asyncio.Event()
        self._closed = False
        if topic.persistent:
            if start == "earliest":
                self._next = 0
            elif start == "latest":
                self._next = max(len(topic.log) - 1, 0)
            elif isinstance(start, bytes):
                self._next = index_of(start) + (0 if inclusive else 1)
            else:
                raise ValueError(f"a reader starts at 'earliest', 'latest' or a message id, not {start!r}")
        topic.readers.add(self)

    def offer(self, envelope: Envelope) -> None:
        if not self._topic.persistent:
            self._queue.append(envelope)
        self._wake.set()

    def _take(self) -> Envelope | None:
        if not self._topic.persistent:
            return self._queue.popleft() if self._queue else None
        if self._next < len(self._topic.log):
            self._next += 1
            return self._topic.log[self._next - 1]
        return None

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"the reader of {self.topic} is closed")

    async def read_next(self, timeout: float) -> Envelope | None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_open()
            envelope = self._take()
            if envelope is not None:
                return envelope
            self._wake.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                async with asyncio.timeout(remaining):  # not wait_for: on 3.11 it can swallow a cancellation
                    await self._wake.wait()
            except TimeoutError:
                return None

    async def has_message_available(self) -> bool:
        self._check_open()
        return bool(self._queue) if not self._topic.persistent else self._next < len(self._topic.log)

    async def close(self) -> None:
        self._closed = True
        self._topic.readers.discard(self)
        self._wake.set()
