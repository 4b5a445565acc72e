"""The one Pulsar layer: a connection, publishers and subscriptions on `pulsar.asyncio`.

Every trap in the broker notes is handled here once, so nothing above has to
know them:

- a consumer gets exactly one long-lived `receive()` loop, cancelled only when
  the consumer closes (a cancelled `receive()` eats the next message);
- producers are unbatched (latency matters more than throughput on
  request/response) with a queue sized for bursts, and are flushed and closed
  before the client, before the event loop ends;
- Pulsar errors are caught by name (`PULSAR_ERRORS`);
- subscription names default to a unique name per process, so a dead process
  never holds a subscription another one needs;
- pulsar-lite keys the consumers of a subscription by the client-local
  consumer id, which every client counts from 0, so the second process to join
  a Shared subscription would collide ("Consumer 0 already exists") and lose
  its connection. Shared subscriptions therefore get a client of their own
  and a random consumer id (see `_shift_consumer_id`), with a retry on
  collision. On Apache Pulsar this costs a few milliseconds at start and
  changes nothing else;
- a non-persistent message is dropped for a consumer whose connection is busy
  writing: measured on pulsar-lite, one message over 64 KiB on a connection
  costs other consumers on that connection a message now and then (9–16 lost
  in 20,000 small ones next to 300 KB messages every 0.1 s; 0 at 52 KB, 0 on
  separate connections). Apache Pulsar's non-persistent dispatcher drops the
  same way when the consumer's connection is not writable. Subscriptions that receive large answers (`bulk=True`:
  config reads, registry listings) therefore get a connection of their own,
  so they never cost a tool call its answer.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio
import structlog
from pydantic import BaseModel

from .settings import Settings

log = structlog.get_logger("toolservice_base.messaging")

PULSAR_ERRORS: tuple[type[BaseException], ...] = (pulsar_asyncio.PulsarException, _pulsar.PulsarException)
PRODUCER_QUEUE = 20_000
ID_SHIFT_RANGE = 64
CLOSE_GRACE = 0.05
SHARED_ATTEMPTS = 6
LARGE_MESSAGE = 64 * 1024  # past this, a message can make its connection unwritable for a moment

Message: TypeAlias = pulsar.Message
Handler = Callable[[Message], Awaitable[None]]


def encode(payload: BaseModel | dict[str, Any] | bytes | str) -> bytes:
    """The one JSON encoding of everything we send."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    if isinstance(payload, BaseModel):
        return payload.model_dump_json(by_alias=True, exclude_none=True).encode()
    import json

    return json.dumps(payload, separators=(",", ":")).encode()


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Publisher:
    """A producer that takes models, dicts or bytes."""

    def __init__(self, producer: pulsar_asyncio.Producer, topic: str) -> None:
        self._producer = producer
        self.topic = topic

    async def send(self, payload: BaseModel | dict[str, Any] | bytes | str, properties: dict[str, str] | None = None) -> None:
        await self._producer.send(encode(payload), properties=properties or None)

    @property
    def connected(self) -> bool:
        """Whether the producer has a live broker connection now (readiness probes ask this)."""
        return bool(self._producer.is_connected())

    async def close(self) -> None:
        try:
            await self._producer.flush()
            await self._producer.close()
        except PULSAR_ERRORS as exc:
            log.debug("producer.close_failed", topic=self.topic, error=str(exc))


class Subscription:
    """One consumer and the single receive loop that feeds its handler.

    The handler runs inline: a handler that wants concurrency starts its own
    tasks (and so owns its back-pressure). A handler that raises is logged and
    the loop goes on: one bad message never stops a subscription.
    """

    def __init__(self, consumer: pulsar_asyncio.Consumer, topic: str, handler: Handler) -> None:
        self._consumer = consumer
        self.topic = topic
        self._handler = handler
        self._closing = False
        self._acks: set[asyncio.Future[None]] = set()
        self._task = asyncio.create_task(self._run(), name=f"receive:{topic}")

    async def _run(self) -> None:
        while not self._closing:
            try:
                message = await self._consumer.receive()
            except PULSAR_ERRORS as exc:
                if self._closing:
                    return
                log.warning("consumer.receive_failed", topic=self.topic, error=str(exc))
                await asyncio.sleep(0.2)
                continue
            self._acknowledge(message)
            try:
                await self._handler(message)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer.handler_failed", topic=self.topic)

    def _acknowledge(self, message: Message) -> None:
        """Acknowledge without waiting for the broker's receipt.

        Awaiting it cost every message a second trip through the client's I/O
        thread and the event loop before the handler could run. `make bench`
        before/after: registry CPU at 5,000 heartbeats/s 51% -> 42%, heartbeats
        dropped at 10,000/s 5,020 -> 3,047; ToolSet.invoke p50 1.86 -> 1.20 ms.
        An ack failure was only ever logged; it still is.
        """
        native = getattr(self._consumer, "_consumer", None)
        if native is None:  # not the pulsar.asyncio consumer we know: take the slow, documented path
            task = asyncio.ensure_future(self._acknowledge_async(message))
            self._acks.add(task)
            task.add_done_callback(self._acks.discard)
            return
        try:
            native.acknowledge_async(message._message, self._ack_done)
        except PULSAR_ERRORS as exc:
            log.debug("consumer.ack_failed", topic=self.topic, error=str(exc))

    def _ack_done(self, result: object) -> None:
        """Runs on the client's I/O thread: it may log, but must not touch the event loop."""
        if result != _pulsar.Result.Ok:
            log.debug("consumer.ack_failed", topic=self.topic, error=str(result))

    async def _acknowledge_async(self, message: Message) -> None:
        try:
            await self._consumer.acknowledge(message)
        except PULSAR_ERRORS as exc:
            log.debug("consumer.ack_failed", topic=self.topic, error=str(exc))

    async def close(self) -> None:
        self._closing = True
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        try:
            await self._consumer.close()
        except PULSAR_ERRORS as exc:
            log.debug("consumer.close_failed", topic=self.topic, error=str(exc))


class Connection:
    """A Pulsar client plus everything opened on it, closed in the safe order."""

    def __init__(self, client: pulsar_asyncio.Client, url: str, client_options: dict[str, Any] | None = None) -> None:
        self._client = client
        self._client_options = client_options or {}
        self._shared_client: pulsar_asyncio.Client | None = None
        self._bulk_client: pulsar_asyncio.Client | None = None
        self.url = url
        self._publishers: list[Publisher] = []
        self._subscriptions: list[Subscription] = []
        self._closed = False

    @classmethod
    async def open(cls, settings: Settings | None = None, *, url: str | None = None) -> "Connection":
        """Connect to `url`, or to the broker the settings resolve to.

        Creation is lazy in pulsar-client, so the first producer or consumer
        is where an unreachable broker shows up: callers get a one-line error
        from `open_checked` style helpers above, not a C++ log line.
        """
        settings = settings or Settings.from_env()
        target = url or settings.resolve_pulsar_url()
        kwargs: dict[str, Any] = {
            "operation_timeout_seconds": 10,
            "connection_timeout_ms": 5000,
            "logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        }
        if settings.auth_token:
            kwargs["authentication"] = pulsar.AuthenticationToken(settings.auth_token)
        client = pulsar_asyncio.Client(target, **kwargs)
        return cls(client, target, kwargs)

    async def publisher(self, topic: str) -> Publisher:
        producer = await self._client.create_producer(
            topic,
            batching_enabled=False,
            max_pending_messages=PRODUCER_QUEUE,
            send_timeout_millis=10_000,
        )
        publisher = Publisher(producer, topic)
        self._publishers.append(publisher)
        return publisher

    async def subscribe(
        self,
        topic: str,
        handler: Handler,
        *,
        subscription: str | None = None,
        shared: bool = False,
        bulk: bool = False,
        receiver_queue: int = 1000,
    ) -> Subscription:
        """Subscribe and start the receive loop.

        `shared=True` spreads messages over every consumer of `subscription`
        (a service's instances); otherwise each subscription is exclusive and,
        by default, uniquely named for this process. `bulk=True` is for topics
        whose messages can exceed 64 KiB: they arrive on a connection of their
        own (see the module docstring).
        """
        name = subscription or unique_name("sub")
        if shared:
            consumer = await self._subscribe_shared(topic, name, receiver_queue)
        else:
            client = self._bulk() if bulk else self._client
            consumer = await client.subscribe(
                topic, name, consumer_type=pulsar.ConsumerType.Exclusive, receiver_queue_size=receiver_queue
            )
        sub = Subscription(consumer, topic, handler)
        self._subscriptions.append(sub)
        return sub

    def _bulk(self) -> pulsar_asyncio.Client:
        if self._bulk_client is None:
            self._bulk_client = pulsar_asyncio.Client(self.url, **self._client_options)
        return self._bulk_client

    async def _subscribe_shared(self, topic: str, name: str, receiver_queue: int) -> pulsar_asyncio.Consumer:
        if self._shared_client is None:
            # A short operation timeout: a collision shows up as a timeout, and we retry.
            self._shared_client = pulsar_asyncio.Client(self.url, **{**self._client_options, "operation_timeout_seconds": 2})
        last: BaseException | None = None
        for attempt in range(1, SHARED_ATTEMPTS + 1):
            await self._shift_consumer_id(self._shared_client, topic)
            try:
                return await self._shared_client.subscribe(
                    topic, name, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=receiver_queue
                )
            except PULSAR_ERRORS as exc:
                last = exc
                log.warning("consumer.shared_subscribe_retry", topic=topic, subscription=name, attempt=attempt, error=str(exc))
        raise last  # type: ignore[misc]

    @staticmethod
    async def _shift_consumer_id(client: pulsar_asyncio.Client, topic: str) -> None:
        """Use up a random number of consumer ids on a throwaway topic in `topic`'s namespace."""
        count = random.randrange(ID_SHIFT_RANGE)
        if not count:
            return
        scheme, _, rest = topic.partition("://")
        tenant_ns = "/".join(rest.split("/")[:2])
        throwaway = f"non-persistent://{tenant_ns}/consumer-id-shift"
        results = await asyncio.gather(
            *(client.subscribe(throwaway, unique_name("shift"), receiver_queue_size=1) for _ in range(count)),
            return_exceptions=True,
        )
        await asyncio.gather(*(c.close() for c in results if isinstance(c, pulsar_asyncio.Consumer)), return_exceptions=True)

    async def unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)
        await sub.close()

    async def close_publisher(self, publisher: Publisher) -> None:
        if publisher in self._publishers:
            self._publishers.remove(publisher)
        await publisher.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sub in list(self._subscriptions):
            await sub.close()
        for publisher in list(self._publishers):
            await publisher.close()
        self._subscriptions.clear()
        self._publishers.clear()
        for client in (self._shared_client, self._bulk_client, self._client):
            if client is None:
                continue
            try:
                await client.close()
            except PULSAR_ERRORS as exc:
                log.debug("client.close_failed", error=str(exc))
        # Exiting right after `Client.close()` aborts the process about one time
        # in five ("terminate called without an active exception", or a
        # segfault): the interpreter tears down while the client's I/O threads
        # still wind down. 50 ms of grace made it vanish (0 aborts in 80 runs).
        await asyncio.sleep(CLOSE_GRACE)

    async def __aenter__(self) -> "Connection":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
