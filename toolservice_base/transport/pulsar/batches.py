"""`BatchedSubscription`: a lingering stream taken by the loop itself, in batches, with no thread woken per message.

A message listener costs every message a wake-up of the client's listener
thread and the GIL taken there, and then a wake-up of the loop, before our
code runs at all. For a stream where milliseconds do not matter and messages
come steadily (heartbeats, hundreds a second on a registry), those wake-ups
are most of what the stream costs: measured with 2,000 instances at 400
heartbeats/s (`python -m bench --only scale`), a bare consumer on a message
listener spent 2.9 % of a core; the registry on it, 5.4 %, most of it in
wake-ups, its own work per heartbeat a few microseconds.

So a subscription that lingers is taken this way instead:

- **Quiet**: one receive waits in pulsar-client (`receive_async`); the
  message that completes it comes back on a client thread and is handed over
  at once, one wake-up of the loop, and a receive waits again. Once two come
  within `linger` of each other, the loop looks by itself every `linger` from
  then on, and no receive is left waiting.
- **Steady**: each look takes what the client holds in one `batch_receive`
  (at most `COLLECT_AT_MOST`): one call into the client for the whole batch,
  where asking message by message cost each one a call, a callback through
  pybind11 and a `Result` compared in Python (measured warm: 5.3 µs a
  message asked for, against about 0.7 µs one in a batch). A look
  that finds nothing means the stream went quiet: a receive waits again.

A look waits in pulsar-client for `LOOK_WAIT_MS` (the shortest wait its
`batch_receive` takes: it always waits for more, up to a count, a size or a
time), with the GIL let go; the loop runs nothing else meanwhile, about a
millisecond every `linger`.

(Not `receive(0)` for the looks: measured, a `receive(0)` that finds the
queue empty costs about 90 µs, an exception thrown through C++ and pybind11.)

Flow control is the listener's: a look is taken only while the inbox has room
for a whole batch (`receiver_queue`); the rest stays in the client's own
receiver queue, whose permits then stop, so the broker holds (persistent) or
drops (non-persistent) what comes next, as when a `receive()` loop falls
behind. That queue is twice `receiver_queue` (`client_queue`): while the loop
does not run (a long write, a pause), it alone holds what comes, where the
listener would have moved up to `receiver_queue` of it into the inbox
meanwhile (measured at 100,000 instances and 10,000 heartbeats/s: with the
same queue as the listener, 1 % of a minute's heartbeats were dropped, none
with twice). Closing the consumer ends the waiting receive (`AlreadyClosed`,
ignored). A message that cannot be read is logged and acknowledged, as on the
listener.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...logs import get_logger
from ..base import Handler, InlineHandler
from .bridge import LoopBridge
from .errors import broker_errors
from .native import RESULT_OK, BatchReceivePolicy
from .subscription import PulsarSubscription

log = get_logger("toolservice_base.transport")

_OK = RESULT_OK
COLLECT_AT_MOST = 1024
"""Messages one look takes, at most: a backlog is taken over several turns of the loop, not in one long one."""
LOOK_WAIT_MS = 1
"""Milliseconds a look's `batch_receive` waits for more than the client holds: the shortest it takes (0 would wait
for a full batch)."""


class BatchedSubscription(PulsarSubscription):
    """A `PulsarSubscription` whose messages the loop takes every `linger` instead of a message listener (see the
    module). The consumer must be made without a listener.

    The handler's side is the listener subscription's own (its task or the
    inline hand-over, acknowledgements, closing); only how messages reach the
    inbox differs.
    """

    def __init__(
        self,
        topic: str,
        handler: Handler | InlineHandler,
        bridge: LoopBridge,
        *,
        receiver_queue: int = 1000,
        delete_on_close: bool = False,
        inline: bool = False,
        linger: float,
    ) -> None:
        super().__init__(
            topic, handler, bridge, receiver_queue=receiver_queue, delete_on_close=delete_on_close, inline=inline
        )
        self.linger = linger
        self._batch = min(COLLECT_AT_MOST, self._high)
        """Messages one look takes at most; a look is taken only while the inbox has room for them all."""
        self._looking = False
        """Looks are due (set and cleared on the loop, read by the thread completing a waiting receive)."""
        self._look_timer: asyncio.TimerHandle | None = None
        self._waiting = False
        """A receive waits in pulsar-client."""
        self._arrived = 0
        """Messages taken by a receive so far (counted by whichever thread completes it: one receive at a time)."""
        self._last_came = float("-inf")
        """When (loop time) the last message after a quiet spell was handed over."""
        self.looks = 0
        """Looks that took at least one message (under a steady stream, about one per `linger`)."""

    @property
    def client_queue(self) -> int:
        """The receiver queue the consumer is made with: what arrives while the loop does not run waits there."""
        return 2 * self._high

    def batches(self) -> Any:
        """How the consumer is to take a look's batch (its `batch_receive_policy`): up to `_batch` messages, any
        size, waiting `LOOK_WAIT_MS` for more."""
        return BatchReceivePolicy(self._batch, 0, LOOK_WAIT_MS)

    def attach(self, native: Any) -> None:
        super().attach(native)
        if not self._ask(native) and not self._waiting:  # the client refused the receive: try again at a look
            self._collect_later()

    def _ask(self, native: Any) -> bool:
        """On the loop: leave a receive waiting for the next message; True if one was there and is in the inbox
        already (then nothing waits)."""
        before = self._arrived
        self._waiting = True
        with broker_errors(log="consumer.receive_failed", topic=self.topic) as asking:
            native.receive_async(self._completed)
        if asking.error is not None:
            self._waiting = False
            return False
        return self._arrived != before

    def _completed(self, result: Any, message: Any) -> None:
        """The waiting receive completed: at once inside `_ask` (on the loop), or later on a client thread."""
        self._waiting = False
        if result != _OK:  # the consumer closed (or failed): `message` is empty, nothing to take
            self._bridge.check()
            return
        try:
            native = self._native
            if native is not None:
                self._accept(native, message)
            self._arrived += 1
            if not self._looking:
                self._bridge.post(self._came, None)
        except BaseException as exc:  # noqa: BLE001 - nothing may escape into the C++ client
            log.error("consumer.receive_failed", topic=self.topic, error=repr(exc))

    def _came(self, _: object) -> None:
        """On the loop: a message after a quiet spell, handed over at once. If it came within `linger` of the last
        such one, the stream is steady: from now on the loop looks by itself; else the next one waits alone again."""
        self._hand_over()
        native = self._native
        if self._looking or self._closing or native is None:
            return
        now = self._bridge.loop.time()
        steady, self._last_came = now - self._last_came < self.linger, now
        if steady:
            self._collect_later()
        elif not self._waiting:
            self._wait_again(native)

    def _wait_again(self, native: Any) -> None:
        """Quiet: leave a receive waiting; one that the client refused is tried again at a look."""
        if not self._ask(native) and not self._waiting:
            self._collect_later()

    def _collect_later(self) -> None:
        self._looking = True
        self._look_timer = self._bridge.loop.call_later(self.linger, self._collect)

    def _collect(self) -> None:
        """Take what the client holds in one batch, if the inbox has room for it; a look that finds nothing: quiet."""
        self._look_timer = None
        native = self._native
        if native is None or self._closing:
            self._looking = False
            return
        if self._waiting:  # a receive waits: it hands over what comes, as when quiet
            self._looking = False
            return
        if len(self._inbox) + self._batch > self._high:  # the handler is behind: the client's queue holds the rest
            self._collect_later()
            return
        with broker_errors(log="consumer.receive_failed", topic=self.topic) as taking:
            messages = native.batch_receive()
        if taking.error is not None:  # refused (closing, say): try again at a look, which stops if closed
            self._collect_later()
            return
        if messages:
            self.looks += 1
            for message in messages:
                self._accept(native, message)
            self._hand_over()
            self._collect_later()
            return
        self._looking = False
        self._wait_again(native)

    def _hand_over(self) -> None:
        """The inbox to the handler (its task, or inline), if it is not at work on it already."""
        if self._inbox and self._idle:
            self._idle = False
            self._wake(None)

    async def close(self) -> None:
        self._closing = True
        if self._look_timer is not None:
            self._look_timer.cancel()
        await super().close()  # closing the consumer ends a waiting receive
