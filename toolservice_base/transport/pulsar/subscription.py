"""`PulsarSubscription`: a consumer whose messages arrive on pulsar-client's listener thread and are handled on the
loop.

The client's `message_listener` hands each message to `on_message` on its
listener thread, which takes the bytes and properties, acknowledges (see
below), appends the `Envelope` to the subscription's inbox and, only if the
subscription's task is idle, wakes it through the `LoopBridge`. The task hands
the inbox to the handler one message at a time, in order (a queue's
answers and a stream's chunks are read in the order they were sent). A burst
costs one wake-up, not one loop crossing per message. An inline handler (one
that never waits: `Transport.subscribe(..., inline=True)`) has no task: the
wake-up itself hands it the inbox, so an answer reaches the caller waiting for
it one loop iteration sooner.

Under a steady stream each message still costs a wake-up of the listener
thread and the GIL taken there: a subscription with `linger` (heartbeats) is
taken by the loop's own looks instead, `BatchedSubscription` in batches.py.

Flow control: the inbox holds at most `receiver_queue` messages. At that mark
the listener is paused (`pause_message_listener`), so the client's own receiver
queue (the same size) fills, its permits stop, and the broker holds (persistent)
or drops (non-persistent) what comes next, exactly as when a `receive()` loop
falls behind; the task resumes the listener once it has taken half of it. Nothing
between the listener thread and the loop grows without bound.

Acknowledging: on a non-persistent topic an acknowledgement means nothing to the
broker, and it is sent from the listener thread at once. On a persistent topic
it is sent once the handler has run: a subscription closed with messages still
in its inbox leaves them unacknowledged, and the broker gives them to another
consumer of a Shared subscription (what the in-memory transport does too).
Acknowledgements go with no callback: a Python callback would cost the GIL
again on every copy pulsar-client makes of it, and all it could report is a
consumer already closed.

Bad input and faults: the listener catches everything (a message it cannot read
is logged with its topic and size, never raised into the C++ client, whose
listener thread goes on); a handler that raises is logged and the next message
is handled: one bad request must not stop a service from answering the rest.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import pulsar
import pulsar.asyncio as pulsar_asyncio

from ...logs import get_logger
from ...tasks import close_when_granted
from ..base import Envelope, Handler, InlineHandler
from .bridge import LoopBridge
from .diagnosis import Action
from .errors import broker_errors
from .native import ConsumerConfiguration, NativeError, native_client

log = get_logger("toolservice_base.transport")

_BYTES = pulsar.schema.BytesSchema()
INLINE_BATCH = 128
"""Messages an inline handler takes in one turn of the loop before others get theirs."""


class PulsarSubscription:
    """One consumer on a listener, its inbox and the task that feeds the handler.

    The handler runs in the subscription's task, or, `inline`, in the loop's
    wake-up itself: a handler that wants concurrency starts its own tasks (and
    so owns its back-pressure). `delete_on_close` (an exclusive subscription,
    this process's alone): closing unsubscribes, so the broker keeps nothing for
    it (see `Transport.unsubscribe`).
    """

    action: Action = "consume"

    def __init__(
        self,
        topic: str,
        handler: Handler | InlineHandler,
        bridge: LoopBridge,
        *,
        receiver_queue: int = 1000,
        delete_on_close: bool = False,
        inline: bool = False,
    ) -> None:
        self.topic = topic
        self._handler = handler
        self._inline = inline
        self._bridge = bridge
        self._delete_on_close = delete_on_close
        self._ack_after = topic.startswith("persistent://")
        self._inbox: deque[tuple[Envelope, Any]] = deque()
        self._high = max(1, receiver_queue)
        self._low = self._high // 2
        self._paused = False
        self._pause_lock = threading.Lock()
        self._idle = True
        self._waiter: asyncio.Future[None] | None = None
        self._closing = False
        self._native: Any = None
        self._consumer: pulsar_asyncio.Consumer | None = None
        self._task: asyncio.Task[None] | None = None

    def attach(self, native: Any) -> None:
        """Start handling: `native` is the consumer pulsar-client made for this subscription."""
        self._native = native
        self._consumer = pulsar_asyncio.Consumer(native, _BYTES)
        if self._inline:
            if self._inbox or not self._idle:  # arrived while the subscription was being made
                self._idle = False
                self._bridge.post(self._wake, None)
            return
        self._task = asyncio.create_task(self._run(), name=f"receive:{self.topic}")

    @property
    def connected(self) -> bool:
        """Whether the consumer is attached to the broker now: False while pulsar-client reconnects (for
        `TopicWatch`)."""
        return self._native is None or bool(self._native.is_connected())

    @property
    def backlog(self) -> int:
        """Messages received and not yet handed to the handler."""
        return len(self._inbox)

    # --- on pulsar-client's listener thread ------------------------------------------------------------------

    def on_message(self, consumer: Any, message: Any) -> None:
        """The message listener: runs on pulsar-client's listener thread, so it touches no asyncio object."""
        try:
            if not self._accept(consumer, message):
                return
            if len(self._inbox) >= self._high:
                self._pause(consumer)
            if self._idle:
                self._idle = False
                self._bridge.post(self._wake, None)
            else:  # busy: the handler finds it
                self._bridge.check()
        except BaseException as exc:  # noqa: BLE001
            log.error("consumer.listener_failed", topic=self.topic, error=repr(exc))

    def _accept(self, consumer: Any, message: Any) -> bool:
        """`message` into the inbox (acknowledged at once on a non-persistent topic); False: it could not be read
        (logged and acknowledged)."""
        try:
            envelope = self._envelope(message)
        except BaseException as exc:  # noqa: BLE001 - nothing may escape into the C++ client
            self._unreadable(consumer, message, exc)
            return False
        if self._ack_after:
            self._inbox.append((envelope, message))
        else:
            self._acknowledge(consumer, message)
            self._inbox.append((envelope, None))
        return True

    def _envelope(self, message: Any) -> Envelope:
        return Envelope(message.data(), message.properties(), self.topic, producer=message.producer_name())

    def _unreadable(self, consumer: Any, message: Any, exc: BaseException) -> None:
        """A message we cannot turn into an `Envelope` (its properties not UTF-8, say): said, and acknowledged so it
        does not come back for ever."""
        try:
            size = len(message.data())
        except BaseException:  # noqa: BLE001
            size = -1
        log.error("consumer.message_unreadable", topic=self.topic, bytes=size, error=repr(exc))
        try:
            self._acknowledge(consumer, message)
        except BaseException:  # noqa: BLE001
            pass

    def _acknowledge(self, consumer: Any, message: Any) -> None:
        """Acknowledge without waiting: pulsar-client groups acknowledgements and calls back at once.

        Not the blocking `acknowledge`: it lets go of the GIL to wait and must take it back, so on the listener
        thread each message would wait for the loop thread's next switch (py-spy: the listener thread's time went
        to `waitForAsyncResult` under 64 calls in flight). An ack failure was only ever logged; it still is.

        A callback that does nothing, not None: with None pybind11 tries both of `acknowledge_async`'s overloads
        before it takes one (measured warm, 1.6 µs a message; 1.2 µs with the callback, measured together with a
        failure caught without a `broker_errors`, which this keeps: Pulsar's exceptions are caught in one place).
        pulsar-client calls it at once, on the acknowledging thread.
        """
        with broker_errors(log="consumer.ack_failed", topic=self.topic):
            consumer.acknowledge_async(message, _acknowledged)

    def _pause(self, consumer: Any) -> None:
        with self._pause_lock:
            if not self._paused and len(self._inbox) >= self._high and not self._closing:
                self._paused = True
                consumer.pause_message_listener()

    # --- on the event loop ------------------------------------------------------------------------------------

    def _wake(self, _: object) -> None:
        if self._inline:
            self._hand_inline()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _hand_inline(self) -> None:
        """The inbox to an inline handler, in order; at most `INLINE_BATCH` at a time, so the loop gets a turn."""
        if self._native is None:
            return  # not attached yet: `attach` wakes us
        inbox = self._inbox
        handler: Any = self._handler
        for _ in range(INLINE_BATCH):
            if not inbox or self._closing:
                break
            envelope, message = inbox.popleft()
            if self._paused and len(inbox) <= self._low:
                self._resume()
            try:
                handler(envelope)
            except Exception:
                log.exception("consumer.handler_failed", topic=self.topic)
            if message is not None:
                self._acknowledge(self._native, message)
        else:
            if inbox and not self._closing:
                self._bridge.loop.call_soon(self._hand_inline)
                return
        # Idle is published before the inbox is looked at again (as in `_run`): a message appended after this line
        # sees it and wakes us; one appended before it is found by the look.
        self._idle = True
        if inbox and not self._closing:
            self._idle = False
            self._bridge.loop.call_soon(self._hand_inline)

    def _resume(self) -> None:
        with self._pause_lock:
            if self._paused and len(self._inbox) <= self._low and not self._closing:
                self._paused = False
                with broker_errors(log="consumer.resume_failed", topic=self.topic):
                    self._native.resume_message_listener()

    async def _run(self) -> None:
        inbox = self._inbox
        loop = asyncio.get_running_loop()
        while not self._closing:
            if not inbox:
                # Idle is published before the inbox is looked at again: a message appended after this line
                # sees it and wakes us; one appended before it is found by the look.
                self._idle = True
                if not inbox:
                    self._waiter = loop.create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
                self._idle = False
                continue
            envelope, message = inbox.popleft()
            if self._paused and len(inbox) <= self._low:
                self._resume()
            try:
                await self._handler(envelope)  # type: ignore[misc]  # not inline: a Handler
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer.handler_failed", topic=self.topic)
            if message is not None:
                self._acknowledge(self._native, message)

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        consumer = self._consumer
        if consumer is None:
            return
        self._closing = True
        if self._delete_on_close:
            # If unsubscribing fails (the broker is gone, say), the consumer is only closed.
            with broker_errors(keep=True) as deleting:
                await consumer.unsubscribe()
            if deleting.error is not None:
                log.debug("consumer.unsubscribe_failed", topic=self.topic, error=str(deleting.error))
        # Closed even after an unsubscribe: a client closed with an unsubscribed, unclosed consumer leaves one of its
        # threads running for good (measured, pulsar-client 3.13: one OS thread per client so closed).
        with broker_errors(log="consumer.close_failed", topic=self.topic):
            await consumer.close()
        self._inbox.clear()  # unacknowledged ones (persistent topics) go back to the subscription
        # The native consumer holds its listener (our bound method), and we hold it: a cycle through C++ that no
        # garbage collector sees. Let go of it, or the consumer, and the listener thread it keeps, live for good.
        self._native = self._consumer = None


async def subscribe_listening(
    client: pulsar_asyncio.Client,
    topic: str,
    name: str,
    consumer_type: Any,
    receiver_queue: int,
    listener: Callable[[Any, Any], None] | None,
    batches: Any = None,
) -> Any:
    """Subscribe with `listener` as the consumer's message listener (None: messages are received, in `batches`, a
    `BatchReceivePolicy`: see `BatchedSubscription`); the native consumer once the broker has it.

    As `pulsar.asyncio.Client.subscribe` does, without a thread: the creation's
    completion comes back through its callback.
    """
    conf = ConsumerConfiguration()
    conf.consumer_type(consumer_type)
    conf.receiver_queue_size(receiver_queue)
    conf.schema(_BYTES.schema_info())
    if listener is not None:
        conf.message_listener(listener)
    if batches is not None:
        conf.batch_receive_policy(batches)
    loop = asyncio.get_running_loop()
    created: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any) -> None:
        if created.done():
            return
        if isinstance(value, NativeError):
            created.set_exception(pulsar_asyncio.PulsarException(value.error, value.message))
        else:
            created.set_result(value)

    def done(value: Any) -> None:  # on a client thread
        try:
            loop.call_soon_threadsafe(settle, value)
        except RuntimeError:  # the loop is closed: the client is being closed with it
            pass

    native_client(client).subscribe_async_v2(topic, name, conf, done)
    try:
        return await asyncio.shield(created)
    except asyncio.CancelledError:
        close_when_granted(created, _close_granted, _abandoned)  # a consumer the broker grants after we gave up
        raise


_abandoned: set[asyncio.Future[Any]] = set()
"""Consumers being opened for a caller that gave up, then their closes (`close_when_granted`)."""


async def _close_granted(granted: Any) -> None:
    with broker_errors(log="consumer.close_failed"):
        await pulsar_asyncio.Consumer(granted, _BYTES).close()


def _acknowledged(_: object) -> None:
    """The callback of every acknowledgement (`PulsarSubscription._acknowledge`): nothing to do."""
