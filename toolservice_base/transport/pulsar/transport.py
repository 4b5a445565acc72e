"""`PulsarTransport`: one pulsar-client per process, and the producers, readers and subscriptions it opens."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Unpack

import pulsar
import pulsar.asyncio as pulsar_asyncio

from ...errors import (
    AuthenticationFailed,
    BrokerUnreachable,
    ProducerBusy,
    TransportError,
)
from ...logs import get_logger
from ...settings import Settings
from ...tasks import close_when_granted
from ...topics import Topics
from ..base import (
    Capabilities,
    ExclusiveMode,
    Handler,
    InlineHandler,
    OpenedResources,
    ReaderStart,
    SubscribeOptions,
    SubscriptionOptions,
    broker_unreachable,
    unique_name,
)
from .batches import BatchedSubscription
from .bridge import LoopBridge
from .broker_questions import BrokerQuestions
from .client_log import client_logger
from .consumer_ids import subscribe_shifted
from .diagnosis import TopicWatch
from .errors import HELD, broker_errors
from .handles import PulsarExclusivePublisher, PulsarReader
from .native import native_client
from .publisher import PulsarPublisher
from .subscription import PulsarSubscription, subscribe_listening

log = get_logger("toolservice_base.transport")

PRODUCER_QUEUE = 20_000
SEND_TIMEOUT_MS = 10_000

_ACCESS_MODES = {
    "exclusive": pulsar.ProducerAccessMode.Exclusive,
    "wait": pulsar.ProducerAccessMode.WaitForExclusive,
    "fence": pulsar.ProducerAccessMode.ExclusiveWithFencing,
}


class PulsarTransport(OpenedResources):
    """A Pulsar client plus everything opened on it, closed in the safe order.

    Its `TopicWatch` looks after the consumers and producers it opened: one
    that stays disconnected is diagnosed (`BrokerQuestions.diagnose`), the reason logged and
    kept for `problem`, while pulsar-client goes on reconnecting.
    """

    def __init__(
        self,
        client: pulsar_asyncio.Client,
        url: str,
        client_options: dict[str, Any],
        capabilities: Capabilities,
        topics: Topics,
        token: str | None = None,
    ) -> None:
        super().__init__()
        self._client = client
        self._abandoned: set[asyncio.Future[Any]] = set()
        self._questions = BrokerQuestions(client, url, token, self._abandoned)
        self._watch = TopicWatch(url, self._watched, self._questions.broker_problem, self._questions.ask)
        self.topics = topics
        self._client_options = client_options
        self._capabilities = capabilities
        self._shared_client: pulsar_asyncio.Client | None = None
        self._bulk_client: pulsar_asyncio.Client | None = None
        self._shift_subscription = unique_name("consumer-id-shift")
        self.url = url
        self._bridge = LoopBridge(asyncio.get_running_loop(), self._loop_gone)
        self._closed_off_loop = threading.Lock()
        self._closing = False
        self._shut_off_loop = False
        self._clients_closed = False
        self._guard = asyncio.ensure_future(self._close_when_the_loop_ends())

    @classmethod
    async def open(cls, settings: Settings | None = None, *, url: str | None = None) -> "PulsarTransport":
        """Connect to `url`, or to the broker the settings resolve to.

        Creation is lazy in pulsar-client: the first producer or consumer is
        where an unreachable broker or a bad token shows up, as a
        `TransportError` with a one-line message.
        """
        settings = settings or Settings.from_env()
        target = url or settings.resolve_pulsar_url()
        kwargs: dict[str, Any] = {
            "operation_timeout_seconds": settings.operation_timeout,
            "connection_timeout_ms": 5000,
            "logger": client_logger(),
        }
        if settings.auth_token:
            kwargs["authentication"] = pulsar.AuthenticationToken(settings.auth_token)
        try:
            with broker_errors("connecting", target):
                client = pulsar_asyncio.Client(target, **kwargs)
        except ValueError as exc:  # a malformed URL is refused before any I/O
            raise BrokerUnreachable(f"bad broker URL {target!r}: {exc}; expected pulsar://host:port") from None
        kind = settings.broker_kind(target)
        capabilities = Capabilities.for_broker(kind)
        log.debug(
            "transport.opened",
            url=target,
            broker=kind,
            topicspace=settings.topicspace,
            capabilities=capabilities.enabled(),
        )
        return cls(client, target, kwargs, capabilities, settings.topics, settings.auth_token)

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    async def unreachable(self, timeout: float = 1.0) -> str | None:
        return await broker_unreachable(self.url, timeout)

    def problem(self, topic: str) -> str | None:
        return self._watch.problem(topic)

    def _watched(self) -> list[PulsarPublisher | PulsarSubscription]:
        """What the watch looks after: plain producers and consumers (exclusive producers and readers have their own
        rules)."""
        return [p for p in self._publishers if type(p) is PulsarPublisher] + list(self._subscriptions)

    async def publisher(self, topic: str) -> PulsarPublisher:
        self._check_open()
        doing = f"opening a producer on {topic}"
        creating = asyncio.ensure_future(
            self._client.create_producer(
                topic,
                batching_enabled=False,
                max_pending_messages=PRODUCER_QUEUE,
                send_timeout_millis=SEND_TIMEOUT_MS,
            )
        )
        try:
            async with broker_errors(explain=lambda exc: self._questions.explain(exc, doing, topic)):
                # Shielded: cancelled or refused, the producer is closed when it comes.
                producer = await self._questions.unless_refused(asyncio.shield(creating), doing)
        except (asyncio.CancelledError, AuthenticationFailed):
            close_when_granted(creating, lambda opened: self._close_quietly(opened, topic), self._abandoned)
            raise
        publisher = PulsarPublisher(
            producer,
            topic,
            self.url,
            self._bridge,
            queue=PRODUCER_QUEUE,
            explain=lambda exc, doing, on: self._questions.explain(exc, doing, on, "produce"),
            refused=self._watch.refusal,
        )
        self._publishers.append(publisher)
        self._watch.start()
        return publisher

    async def exclusive_publisher(self, topic: str, mode: ExclusiveMode) -> PulsarExclusivePublisher:
        self._check_open()
        self._capabilities.require_replicated_state(f"an exclusive producer ({mode}) on {topic}", self.url)
        if mode not in _ACCESS_MODES:
            raise ValueError(f"unknown exclusive mode {mode!r}; expected exclusive, wait or fence")
        doing = f"opening an exclusive producer ({mode}) on {topic}"
        timeout = self._client_options["operation_timeout_seconds"]

        def held(name: str) -> TransportError | None:
            if name in HELD:
                return ProducerBusy(
                    f"{topic} is held by another exclusive producer ({name}); try again later, or wait for it"
                )
            if name == "Timeout" and mode == "wait":
                return ProducerBusy(
                    f"{topic} is still held by another producer after waiting {timeout}s (one wait); wait again"
                )
            return None

        async def create(access_mode: Any) -> pulsar_asyncio.Producer:
            creating = asyncio.ensure_future(
                self._client.create_producer(
                    topic,
                    batching_enabled=False,
                    max_pending_messages=PRODUCER_QUEUE,
                    send_timeout_millis=SEND_TIMEOUT_MS,
                    access_mode=access_mode,
                )
            )
            try:
                async with broker_errors(refine=held, explain=lambda exc: self._questions.explain(exc, doing, topic)):
                    # Shielded: cancelling the native creation would not withdraw it, and a producer the broker
                    # grants afterwards would hold the topic for nobody. `close_when_granted` closes it instead.
                    return await self._questions.unless_refused(asyncio.shield(creating), doing)
            except (asyncio.CancelledError, AuthenticationFailed):
                close_when_granted(creating, lambda opened: self._close_quietly(opened, topic), self._abandoned)
                raise

        if mode == "fence":
            # Take the topic over with ExclusiveWithFencing, then hold it with a plain Exclusive producer. Measured
            # on 4.0.8: a fenced ExclusiveWithFencing producer reconnects on its own, and the broker fences every
            # producer of the topic before it refuses that reconnect for its old epoch, so the new holder loses its
            # producer; its next send then reaches a producer the broker has closed, and the broker drops its whole
            # connection (an elected replica's lock with it). A fenced Exclusive producer's reconnect is refused
            # without touching anyone. Between the two, the topic is free: a `wait` queued since may get it, and
            # then this fails with ProducerBusy (a live replica won; nothing stale can: the epoch moved).
            fencer = await create(pulsar.ProducerAccessMode.ExclusiveWithFencing)
            await self._close_quietly(fencer, topic)
            producer = await create(pulsar.ProducerAccessMode.Exclusive)
        else:
            producer = await create(_ACCESS_MODES[mode])
        publisher = PulsarExclusivePublisher(producer, topic, mode, self.url)
        self._publishers.append(publisher)
        return publisher

    @staticmethod
    async def _close_quietly(producer: pulsar_asyncio.Producer, topic: str) -> None:
        with broker_errors(log="producer.close_failed", topic=topic):
            await producer.close()

    async def reader(self, topic: str, start: ReaderStart, *, inclusive: bool = False) -> PulsarReader:
        self._check_open()
        if start == "latest":
            self._capabilities.require_replicated_state(f"reading the last message of {topic}", self.url)
            position, inclusive = pulsar.MessageId.latest, True
        elif start == "earliest":
            position = pulsar.MessageId.earliest
        elif isinstance(start, bytes):
            try:
                position = pulsar.MessageId.deserialize(start)
            except Exception:  # the C++ parser's own error type
                raise TransportError(
                    f"{start[:16]!r} is not a message id of this broker; start at earliest", retriable=False
                ) from None
        else:
            raise ValueError(f"a reader starts at 'earliest', 'latest' or a message id, not {start!r}")
        doing = f"opening a reader of {topic}"
        creating = asyncio.ensure_future(
            self._client.create_reader(
                topic, position, start_message_id_inclusive=inclusive, reader_name=unique_name("reader")
            )
        )
        try:
            async with broker_errors(explain=lambda exc: self._questions.explain(exc, doing, topic)):
                native = await self._questions.unless_refused(asyncio.shield(creating), doing)
        except (asyncio.CancelledError, AuthenticationFailed):
            close_when_granted(creating, lambda opened: self._questions.undo(opened, topic), self._abandoned)
            raise
        reader = PulsarReader(native, topic, self.url)
        self._readers.append(reader)
        if start == "latest":
            # Measured: a reader at the latest message, inclusive, reads nothing until asked whether a message is
            # available (that is when pulsar-client looks the last message up and moves to it).
            try:
                await reader.has_message_available()
            except BaseException:
                await self.close_reader(reader)
                raise
        return reader

    async def subscribe(
        self, topic: str, handler: Handler | InlineHandler, **options: Unpack[SubscribeOptions]
    ) -> PulsarSubscription:
        self._check_open()
        how = SubscriptionOptions.of(options)
        shared, receiver_queue = how.shared, how.receiver_queue
        name = how.subscription or unique_name("sub")
        doing = f"subscribing to {topic}" + (f" as {name!r}" if how.subscription else "")
        # A stream that lingers is taken by the loop's own looks, in batches; the rest on the listener.
        made: dict[str, Any] = {"receiver_queue": receiver_queue, "delete_on_close": not shared, "inline": how.inline}
        sub = (
            BatchedSubscription(topic, handler, self._bridge, linger=how.linger, **made)
            if how.linger > 0
            else PulsarSubscription(topic, handler, self._bridge, **made)
        )
        reserved = name if shared else ""
        async with broker_errors(explain=lambda exc: self._questions.explain(exc, doing, topic, "consume", reserved)):
            listener: Callable[[Any, Any], None] | None
            if isinstance(sub, BatchedSubscription):
                listener, queue, batches = None, sub.client_queue, sub.batches()
            else:
                listener, queue, batches = sub.on_message, receiver_queue, None
            if shared:
                creating = self._subscribe_shared(topic, name, queue, listener, batches)
            else:
                client = self._bulk() if how.bulk and self._capabilities.separate_bulk_connection else self._client
                creating = subscribe_listening(
                    client, topic, name, pulsar.ConsumerType.Exclusive, queue, listener, batches
                )
            # Not shielded: cancelled, the subscription closes whatever the broker grants it late
            # (`subscribe_listening`); refused, nothing is granted (the broker closed the connection).
            attempt = asyncio.ensure_future(creating)
            try:
                consumer = await self._questions.unless_refused(attempt, doing)
            except (asyncio.CancelledError, AuthenticationFailed):
                attempt.cancel()
                raise
        sub.attach(consumer)
        self._subscriptions.append(sub)
        self._watch.start()
        return sub

    def _bulk(self) -> pulsar_asyncio.Client:
        if self._bulk_client is None:
            self._bulk_client = pulsar_asyncio.Client(self.url, **self._client_options)
        return self._bulk_client

    async def _subscribe_shared(
        self,
        topic: str,
        name: str,
        receiver_queue: int,
        listener: Callable[[Any, Any], None] | None,
        batches: Any = None,
    ) -> Any:
        if not self._capabilities.shift_consumer_ids:
            return await subscribe_listening(
                self._client, topic, name, pulsar.ConsumerType.Shared, receiver_queue, listener, batches
            )
        if self._shared_client is None:
            # A short operation timeout: a collision shows up as a timeout, and we retry.
            self._shared_client = pulsar_asyncio.Client(
                self.url, **{**self._client_options, "operation_timeout_seconds": 2}
            )
        return await subscribe_shifted(
            self._shared_client, topic, name, receiver_queue, listener, self._shift_subscription, batches
        )

    async def _close_when_the_loop_ends(self) -> None:
        """Close the transport if the loop ends with it open: `asyncio.run` cancels this task before it closes the
        loop, and a client left open would outlive it (its threads, its connection, its callbacks into a closed
        loop)."""
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            if not self._closing:
                log.debug("transport.closed_with_the_loop", url=self.url)
                await self.close()

    def _loop_gone(self) -> None:
        """The loop closed under pending completions (it was never given the chance to run the guard): close the
        clients on a thread of their own, as nothing can run on the loop any more."""
        with self._closed_off_loop:
            if self._shut_off_loop or self._clients_closed:
                return
            self._shut_off_loop = self._closed = True
            clients = [c for c in (self._shared_client, self._bulk_client, self._client) if c is not None]
        log.warning("transport.loop_closed_while_open", url=self.url, hint="close the transport before the loop")
        threading.Thread(target=_shut_down, args=(clients,), name="pulsar-close", daemon=True).start()

    async def close(self) -> None:
        self._closing = True
        guard = self._guard
        if guard is not asyncio.current_task() and not guard.done():
            guard.cancel()
        await self._watch.stop()
        self._questions.close()
        if not await self._close_opened():
            return
        for client in (self._shared_client, self._bulk_client, self._client):
            if client is None:
                continue
            with broker_errors(log="client.close_failed"):
                await client.close()
        self._clients_closed = True
        if self._abandoned:  # creations the broker had not answered: the closed client fails them now
            await asyncio.wait(set(self._abandoned), timeout=self._client_options["operation_timeout_seconds"])
        if self._capabilities.close_grace:
            await asyncio.sleep(self._capabilities.close_grace)


def _shut_down(clients: list[pulsar_asyncio.Client]) -> None:
    for client in clients:
        with broker_errors(log="client.close_failed"):
            native_client(client).close()
