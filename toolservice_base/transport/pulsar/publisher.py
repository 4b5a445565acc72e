"""`PulsarPublisher`: a producer on pulsar-client's `send_async`, waiting for the broker's receipt or not.

A receipt is a Python callback the client runs on its I/O thread, and
pybind11 makes every callback cost the GIL several times: once to call it,
once to destroy its wrapper, and once for each copy the client makes of it
inside `sendAsync` (the loop's thread takes the GIL back for those while it
holds the producer's lock). Measured in bench/PROFILE.md, at 64 calls in
flight 63 % of a caller's client-thread samples waited for the GIL, and
`sendAsync` with its lock was 23.6 % of its loop thread.

So a send that nobody waits on (`send(..., confirm=False)`: a request, whose
answer is its receipt; a response) goes to the client with no callback at
all, and costs the GIL nothing more. What the receipts did is kept:

- **Back-pressure.** Sends are counted until the client settles them, and a
  send past `queue` waits for a slot (the client's own `ProducerQueueIsFull`
  never shows). A *cover* settles them: `flush_async` with a callback, which
  the client runs once the last message pending then completes; a producer's
  messages complete in the order they were sent, so that one callback settles
  every send before it. One cover is out at a time, asked for `COVER_AFTER`
  after the first send it covers (so a cover settles every send of that
  span: one callback on the client's I/O thread, and the GIL taken there,
  for many sends, where one per send cost a sequential caller and its
  service each a callback per call), or at once when a quarter of `queue` is
  uncovered or a send waits for room; a cover that comes back with sends
  made after it asks for the next the same way.
- **Failures.** A send fails later only by timing out or by the producer
  closing, and the client then fails every message pending at once, covers
  included (a cover asked after that fails as well, at once): a failed cover
  reports its error (asked of the broker, as a
  confirmed send's is) to the `on_failure` of each send it covers, or logs it.
  What fails at once is refused at once: a closed producer, one the broker
  refuses us, and any message over `LARGE_MESSAGE`, which is always sent
  confirmed (a message the broker takes as too large fails only so).

Confirmed sends (the default) wait for their receipt, so a failure reaches
the caller who can act on it; the receipt comes through the `LoopBridge`,
batched with whatever else completed meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import pulsar.asyncio as pulsar_asyncio

from ...errors import TransportClosed, TransportError
from ...logs import get_logger
from ..base import LARGE_MESSAGE, FailureHook, Payload, encode
from .bridge import LoopBridge
from .diagnosis import Action
from .errors import Explain, broker_errors, translate
from .native import RESULT_OK, MessageBuilder, native_producer

log = get_logger("toolservice_base.transport")

_OK = RESULT_OK
COVER_AFTER = 0.02
"""Seconds between an unconfirmed send and the cover asked for it (and for every send until then)."""


class PulsarPublisher:
    """A producer that takes models, dicts or bytes and sends them through pulsar-client's `send_async`.

    A send builds the native message and hands it to the client on the loop's
    thread (no thread hop). Confirmed, the client's I/O thread reports the
    broker's receipt through the `LoopBridge`; unconfirmed, a cover per loop
    iteration settles it (see the module). At most `queue` sends are pending
    in the client; past that, a send waits for a slot.

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
        self._native: Any = native_producer(producer)
        self.topic = topic
        self._url = url
        self._bridge = bridge
        self._loop = bridge.loop
        self._explain = explain
        self._refused = refused
        self._queue = max(1, queue)
        self._doing = f"sending on {topic}"
        self._closed = False
        # Unconfirmed sends are numbered in the order they reach the client, which completes them in that order.
        self._sent = 0
        self._asked = 0
        """The newest unconfirmed send a cover was asked for."""
        self._covered = 0
        """The newest unconfirmed send a cover settled: written on client threads only, under `_cover_lock`."""
        self._cover_lock = threading.Lock()
        self._failed = 0
        """The newest unconfirmed send a failed cover settled (on the loop)."""
        self._cover_due: asyncio.Handle | None = None
        """The cover asked for later (a timer), or soon (`call_soon`): one at a time."""
        self._cover_soon = False
        self._cover_out = False
        """A cover is out: set on the loop when asked for, cleared on the client's thread when it comes back."""
        self._watchers: deque[tuple[int, FailureHook]] = deque()
        self._confirming = 0
        """Confirmed sends whose receipt has not come back."""
        self._room_wanted = False
        self._room: asyncio.Event | None = None
        self._reports: set[asyncio.Task[None]] = set()

    def _pending(self) -> int:
        """Sends the client holds (as far as the loop knows): what counts against `queue`."""
        return self._sent - max(self._covered, self._failed) + self._confirming

    async def send(
        self,
        payload: Payload,
        properties: dict[str, str] | None = None,
        *,
        key: str | None = None,
        confirm: bool = True,
        on_failure: FailureHook | None = None,
    ) -> None:
        if self._closed:
            raise TransportClosed(f"the producer on {self.topic} is closed")
        if (
            self._refused is not None
            and not self._native.is_connected()
            and (refused := self._refused(self.topic)) is not None
        ):
            raise refused
        data = encode(payload)
        builder = MessageBuilder()
        builder.content(data)
        if properties:
            builder.properties(properties)
        if key is not None:
            builder.partition_key(key)
        while self._pending() >= self._queue:
            await self._wait_for_room()
        if confirm or len(data) > LARGE_MESSAGE:
            await self._send_confirmed(builder.build())
            return
        with broker_errors(self._doing, self._url, self.topic):
            self._native.send_async(builder.build(), None)
        self._sent += 1
        watchers = self._watchers
        settled = self._covered
        while watchers and watchers[0][0] <= settled:  # calls long answered: nothing left to tell them
            watchers.popleft()
        if on_failure is not None:
            watchers.append((self._sent, on_failure))
        # After counting the send: a cover coming back now either sees it or has cleared `_cover_out` for us.
        if not self._cover_out:
            self._ask_cover()

    def _ask_cover(self) -> None:
        """On the loop, with no cover out: ask for one after `COVER_AFTER`, or at the end of this turn if many sends
        are uncovered or one waits for room."""
        now = self._room_wanted or self._sent - self._asked >= self._queue // 4
        due = self._cover_due
        if due is not None and (self._cover_soon or not now):
            return
        if due is not None:
            due.cancel()
        self._cover_soon = now
        self._cover_due = self._loop.call_soon(self._cover) if now else self._loop.call_later(COVER_AFTER, self._cover)

    async def _send_confirmed(self, message: Any) -> None:
        receipt: asyncio.Future[Any] = self._loop.create_future()
        with broker_errors(self._doing, self._url, self.topic):
            self._native.send_async(message, partial(self._receipt, receipt))
        self._confirming += 1
        # Cancelled, the caller hears nothing more; the receipt still frees the slot when it comes.
        result = await receipt
        if result != _OK:
            raise await self._error_of(pulsar_asyncio.PulsarException(result))

    def _receipt(self, receipt: asyncio.Future[Any], result: Any, message_id: Any) -> None:
        """Runs on a client I/O thread (or, for a send refused at once, inside `send_async`): handed to the loop."""
        self._bridge.post(self._settle, (receipt, result))

    def _settle(self, completion: tuple[asyncio.Future[Any], Any]) -> None:
        """On the loop: a confirmed send's receipt."""
        receipt, result = completion
        self._confirming -= 1
        self._free_room(None)
        if not receipt.done():
            receipt.set_result(result)

    # --- covers: one receipt for every unconfirmed send of a loop iteration ------------------------------------

    def _cover(self, _: object = None) -> None:
        """On the loop: ask for a cover of every unconfirmed send so far, unless one is out or none is needed."""
        if self._cover_due is not None:
            self._cover_due.cancel()
            self._cover_due = None
        upto = self._sent
        if upto <= self._asked or self._cover_out or self._closed:  # closing flushes, or fails, what is pending
            return
        self._asked = upto
        self._cover_out = True
        with broker_errors(keep=True) as covering:
            self._native.flush_async(partial(self._covered_by, upto))
        if covering.error is not None:
            self._cover_out = False
            self._cover_failed((upto, covering.error))

    def _covered_by(self, upto: int, result: Any) -> None:
        """Runs on a client I/O thread (or at once, inside `flush_async`, when nothing was pending)."""
        if result != _OK:
            self._bridge.post(self._cover_failed, (upto, pulsar_asyncio.PulsarException(result)))
            return
        with self._cover_lock:
            if upto > self._covered:
                self._covered = upto
        self._cover_out = False
        if self._sent > upto:  # sends made while it was out: the loop asks for the next cover
            self._bridge.post(self._next_cover, None)
        elif self._room_wanted:
            self._bridge.post(self._free_room, None)
        else:
            self._bridge.check()

    def _next_cover(self, _: object) -> None:
        self._free_room(None)
        if not self._cover_out and self._sent > self._asked:
            self._ask_cover()

    def _cover_failed(self, failure: tuple[int, BaseException]) -> None:
        """On the loop: every unconfirmed send up to `upto` failed with the cover (the client fails them together)."""
        upto, exc = failure
        settled = max(self._covered, self._failed)
        self._cover_out = False
        self._failed = max(self._failed, upto)
        self._free_room(None)
        self._cover()
        hooks: list[FailureHook] = []
        watchers = self._watchers
        while watchers and watchers[0][0] <= upto:
            hooks.append(watchers.popleft()[1])
        report = self._loop.create_task(self._report(exc, hooks, max(0, upto - settled - len(hooks))))
        self._reports.add(report)
        report.add_done_callback(self._reports.discard)

    async def _report(self, exc: BaseException, hooks: list[FailureHook], unwatched: int) -> None:
        """Each watcher told; the sends nobody watched, logged (at most that many were lost)."""
        error = await self._error_of(exc)
        if unwatched:
            log.warning("producer.send_failed", topic=self.topic, error=str(error), messages=unwatched)
        for hook in hooks:
            try:
                hook(error)
            except Exception:
                log.exception("producer.failure_hook_failed", topic=self.topic)

    async def _error_of(self, exc: BaseException) -> TransportError:
        """The product's error for a send the client failed (asking the broker why, for a timeout)."""
        if self._explain is None:
            return translate(exc, self._doing, self._url, self.topic)
        return await self._explain(exc, self._doing, self.topic)

    # --- back-pressure -------------------------------------------------------------------------------------

    def _free_room(self, _: object) -> None:
        if self._room is not None:
            self._room.set()

    async def _wait_for_room(self) -> None:
        if self._room is None:
            self._room = asyncio.Event()
        self._room.clear()
        self._room_wanted = True  # before looking again: a cover settling after this line wakes us
        try:
            if self._pending() >= self._queue:
                if not self._cover_out:
                    self._ask_cover()  # at once: a send waits
                await self._room.wait()
        finally:
            self._room_wanted = False

    @property
    def connected(self) -> bool:
        return bool(self._native.is_connected())

    async def close(self) -> None:
        self._closed = True
        if self._cover_due is not None:  # closing flushes what is pending
            self._cover_due.cancel()
        with broker_errors(log="producer.close_failed", topic=self.topic):
            await self._producer.flush()
            await self._producer.close()
