"""What a `PulsarTransport` hands out besides subscriptions (`subscription`): publishers (plain and exclusive) and
readers, each owning its pulsar-client object."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import _pulsar
import pulsar.asyncio as pulsar_asyncio

from ...errors import (
    BrokerUnsupported,
    Fenced,
    TransportClosed,
    TransportError,
)
from ...logs import get_logger
from ..base import (
    Envelope,
    ExclusiveMode,
    Payload,
    encode,
)
from .bridge import LoopBridge
from .diagnosis import Action
from .errors import Explain, broker_errors, result_name

log = get_logger("toolservice_base.transport")

READ_BATCH = 500
"""The most messages a reader takes from the client's prefetch queue in one trip through its thread."""


class PulsarPublisher:
    """A producer that takes models, dicts or bytes, sending through pulsar-client's `send_async` and its callback.

    A send builds the native message and hands it to the client on the loop's
    thread (no thread hop); the client's I/O thread reports the broker's receipt
    through the `LoopBridge`, batched with whatever else completed meanwhile.
    Back-pressure: at most `queue` sends are pending in the client; past that, a
    send waits for a slot (the client's own `ProducerQueueIsFull` never shows).

    Disconnected because the broker refuses us (a token, a permission, a
    namespace: what the transport's `TopicWatch` found), a send fails at once
    with that reason instead of waiting out its send timeout; once the client
    reconnects (after a grant, say), sends go through again.
    """

    action: Action = "produce"

    def __init__(
        self,
        producer: pulsar_asyncio.Producer,
        topic: str,
        url: str,
        bridge: LoopBridge,
        *,
        queue: int,
        explain: Explain | None = None,
        refused: Callable[[str], TransportError | None] | None = None,
    ) -> None:
        self._producer = producer
        self._native: Any = producer._producer  # the C++ producer: its send_async takes a callback
        self.topic = topic
        self._url = url
        self._bridge = bridge
        self._explain = explain
        self._refused = refused
        self._room = max(1, queue)
        self._slot_free: asyncio.Event | None = None
        self._doing = f"sending on {topic}"

    async def send(self, payload: Payload, properties: dict[str, str] | None = None, *, key: str | None = None) -> None:
        if (
            self._refused is not None
            and not self._native.is_connected()
            and (refused := self._refused(self.topic)) is not None
        ):
            raise refused
        builder = _pulsar.MessageBuilder()
        builder.content(encode(payload))
        if properties:
            builder.properties(properties)
        if key is not None:
            builder.partition_key(key)
        while self._room <= 0:
            await self._wait_for_room()
        loop = self._bridge.loop
        receipt: asyncio.Future[Any] = loop.create_future()
        self._room -= 1
        try:
            with broker_errors(self._doing, self._url, self.topic):
                self._native.send_async(builder.build(), partial(self._sent, receipt))
            result = await receipt
        finally:
            self._room += 1
            if self._slot_free is not None:
                self._slot_free.set()
        if result != _OK:
            await self._failed(pulsar_asyncio.PulsarException(result))

    def _sent(self, receipt: asyncio.Future[Any], result: Any, message_id: Any) -> None:
        """Runs on a client I/O thread: the broker's receipt (or the failure), handed to the loop."""
        self._bridge.post(_settle, (receipt, result))

    async def _wait_for_room(self) -> None:
        if self._slot_free is None:
            self._slot_free = asyncio.Event()
        self._slot_free.clear()
        await self._slot_free.wait()

    async def _failed(self, exc: BaseException) -> None:
        """Raise the product's error for a send the client failed (asking the broker why, for a timeout)."""
        explain = self._explain
        if explain is None:
            with broker_errors(self._doing, self._url, self.topic):
                raise exc
        else:
            async with broker_errors(explain=lambda failure: explain(failure, self._doing, self.topic)):
                raise exc

    @property
    def connected(self) -> bool:
        return bool(self._native.is_connected())

    async def close(self) -> None:
        with broker_errors(log="producer.close_failed", topic=self.topic):
            await self._producer.flush()
            await self._producer.close()


_OK = _pulsar.Result.Ok


def _settle(completion: tuple[asyncio.Future[Any], Any]) -> None:
    """On the loop: a send's receipt; a caller that gave up (cancelled) has nothing left to hear."""
    receipt, result = completion
    if not receipt.done():
        receipt.set_result(result)


class PulsarExclusivePublisher:
    """A producer holding its topic alone (see `base.ExclusiveMode`): unbatched, each send returns once persisted."""

    def __init__(self, producer: pulsar_asyncio.Producer, topic: str, mode: ExclusiveMode, url: str) -> None:
        self._producer = producer
        self.topic = topic
        self.mode = mode
        self._url = url
        self._fenced = False

    def _refine(self, name: str) -> TransportError | None:
        if name == "Timeout" and self.mode == "wait" and not self._producer.is_connected():
            return self._lost()
        if name != "ProducerFenced":
            return None
        self._fenced = True
        return self._fenced_error()

    def _fenced_error(self) -> Fenced:
        return Fenced(
            f"another replica took {self.topic} over (this producer was fenced); it never writes there again: step down"
            " to standby"
        )

    def _lost(self) -> TransportError:
        return TransportError(
            f"the wait-mode producer on {self.topic} does not hold the topic now (fenced, or reconnecting); close it"
            " and acquire the topic again",
            retriable=False,
        )

    async def send(self, payload: Payload, properties: dict[str, str] | None = None) -> bytes:
        if self._fenced:
            raise self._fenced_error()
        if self.mode == "wait" and not self._producer.is_connected():
            # Fenced, a `wait` producer queues again instead of failing, and would send this once it gets the topic
            # back.
            raise self._lost()
        with broker_errors(f"sending on {self.topic}", self._url, self.topic, refine=self._refine):
            message_id = await self._producer.send(encode(payload), properties=properties or None)
        return bytes(message_id.serialize())

    @property
    def connected(self) -> bool:
        return not self._fenced and bool(self._producer.is_connected())

    @property
    def fenced(self) -> bool:
        return self._fenced

    async def close(self) -> None:
        with broker_errors(log="producer.close_failed", topic=self.topic):
            await self._producer.close()  # pending sends fail (AlreadyClosed): a fenced `wait` producer's never go out


class PulsarReader:
    """A topic reader whose reads never stay pending inside pulsar-client.

    Two measured traps of `pulsar.asyncio.Reader.read_next`: a cancelled call
    loses the message the client then hands it, and `has_message_available`
    answers False while a pending read holds the topic's last message, which
    would end a catch-up one message early. So a read here is the client's
    blocking `read_next(timeout)` on a thread of this reader's own (it releases
    the GIL; a timeout there leaves nothing pending), awaited without being
    cancelled: a message that arrives after the caller gave up is kept for the
    next call, and `has_message_available` first waits out a read in flight.
    One task at a time uses a reader (a lock keeps it so).

    A read on the thread also takes what the client has already prefetched
    (up to `READ_BATCH`, with `read_next(0)`, which returns at once when
    nothing is there): one trip through the thread and the event loop per
    batch, not per message. Measured on Apache Pulsar 4.0.8: a replay of
    100,000 log entries took 12.0 s one message per trip.
    """

    def __init__(self, reader: pulsar_asyncio.Reader, topic: str, url: str) -> None:
        self._reader = reader
        self._native: Any = reader._reader  # the C++ reader: its blocking read_next takes a timeout
        self.topic = topic
        self._url = url
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pulsar-reader")
        self._in_flight: asyncio.Future[list[Any]] | None = None
        self._kept: deque[Any] = deque()
        self._lock = asyncio.Lock()
        self._closed = False

    def _read_blocking(self, timeout_ms: int) -> list[Any]:
        """Runs on the reader's thread: the next native message (none after `timeout_ms`), and those already
        prefetched."""
        messages: list[Any] = []
        wait = timeout_ms
        while len(messages) < READ_BATCH:
            with broker_errors(keep=True) as reading:
                messages.append(self._native.read_next(wait))
            if reading.error is not None:
                if result_name(reading.error) == "Timeout" or messages:
                    break  # an error after some messages shows again on the next read
                raise reading.error
            wait = 0
        return messages

    def _envelope(self, message: Any) -> Envelope:
        return Envelope(
            message.data(),
            dict(message.properties() or {}),
            self.topic,
            bytes(message.message_id().serialize()),
            message.producer_name(),
        )

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"the reader of {self.topic} is closed")

    async def _finish_in_flight(self, timeout: float | None) -> None:
        """Wait up to `timeout` for the read in flight; what it got is kept."""
        in_flight = self._in_flight
        assert in_flight is not None
        done, _ = await asyncio.wait({in_flight}, timeout=timeout)
        if not done:
            return
        self._in_flight = None
        with broker_errors(f"reading {self.topic}", self._url, self.topic):
            self._kept.extend(in_flight.result())

    async def read_next(self, timeout: float) -> Envelope | None:
        self._check_open()
        async with self._lock:
            if not self._kept:
                if self._in_flight is None:
                    loop = asyncio.get_running_loop()
                    self._in_flight = loop.run_in_executor(
                        self._thread, self._read_blocking, max(1, int(timeout * 1000))
                    )
                # A little past the client's own timeout, so that it, not we, gives up: then nothing stays in flight.
                await self._finish_in_flight(timeout + 0.25)
            message = self._kept.popleft() if self._kept else None
        return None if message is None else self._envelope(message)

    async def has_message_available(self) -> bool:
        self._check_open()
        async with self._lock:
            if self._in_flight is not None:
                await self._finish_in_flight(None)  # bounded by that read's own timeout
            if self._kept:
                return True
            with broker_errors(
                f"checking for messages on {self.topic}", self._url, self.topic, refine=self._unsupported
            ):
                available = await self._reader.has_message_available()
            return bool(available)

    def _unsupported(self, name: str) -> TransportError | None:
        """pulsar-lite answers this with UnknownError: said as what it most likely is, since `PULSAR_URL` alone reads as
        Apache Pulsar."""
        if name != "UnknownError":
            return None
        return BrokerUnsupported(
            f"the broker at {self._url} could not say whether {self.topic} has messages (UnknownError), as pulsar-lite"
            " cannot: if PULSAR_URL names a pulsar-lite broker, set TOOLREG_BROKER=pulsar-lite; otherwise see the"
            " broker's log"
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with broker_errors(log="reader.close_failed", topic=self.topic):
            await self._reader.close()  # wakes a blocking read at once (AlreadyClosed)
        if self._in_flight is not None:
            await asyncio.wait({self._in_flight})
            if not self._in_flight.cancelled():
                self._in_flight.exception()  # retrieved: the AlreadyClosed it ended with is expected
        self._thread.shutdown(wait=False)
