"""The Pulsar transport: the only module that imports `pulsar`.

Every trap in the broker notes is handled here once, so nothing above has to
know them:

- a consumer gets exactly one long-lived `receive()` loop, cancelled only when
  the consumer closes (a cancelled `receive()` eats the next message);
- producers are unbatched (latency matters more than throughput on
  request/response) with a queue sized for bursts, and are flushed and closed
  before the client, before the event loop ends;
- Pulsar exceptions are caught here, by name (they are not all `Exception`
  subclasses of one tree), and translated into the product's `TransportError`
  family: none crosses this module's boundary;
- broker-specific workarounds are `Capabilities`, on only for the broker kind
  that needs them (`Capabilities.for_broker`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from typing import Any

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio

from ..errors import (
    AuthenticationFailed,
    BrokerUnreachable,
    MessageTooLarge,
    TransportClosed,
    TransportError,
)
from ..logs import CLIENT_LOGGER, get_logger
from ..schemas import queue_namespace
from ..settings import Settings
from ..topics import Topics
from .base import Capabilities, Envelope, Handler, OpenedResources, Payload, broker_unreachable, encode, unique_name

log = get_logger("toolservice_base.transport")

CLIENT_LOG = logging.getLogger(CLIENT_LOGGER)
"""pulsar-client's own (C++) log lines, routed into `logging`: its console logger writes to stdout, which
belongs to command output and to MCP over stdio. They repeat what the product reports itself (a refused
connection, every retry), so they are off unless the application sets this logger's level
(`configure_logging("debug")` shows its warnings and errors)."""
if CLIENT_LOG.level == logging.NOTSET:
    CLIENT_LOG.setLevel(logging.CRITICAL)


def client_logger() -> logging.Logger | pulsar.FileLogger:
    """The logger a new pulsar-client gets: `CLIENT_LOG` only while someone listens to it.

    Given a Python logger, pulsar-client calls it for every line it makes,
    debug ones included, from its I/O threads under the GIL, and `logging`
    drops them only afterwards. Measured with `python -m bench --quick --only
    throughput` on pulsar-lite: registry CPU at 5,000 heartbeats/s 90% with the
    Python logger, 37% without. So unless `CLIENT_LOG` is enabled for warnings
    (`configure_logging("debug")`), the library's own logger writes its errors
    to the null device: never to stdout, which belongs to command output and to
    MCP over stdio. pulsar-client keeps the first client's logger for the whole
    process (measured: later clients' loggers received nothing), so configure
    logging before opening a transport.
    """
    if CLIENT_LOG.isEnabledFor(logging.WARNING):
        return CLIENT_LOG
    return pulsar.FileLogger(pulsar.LoggerLevel.Error, os.devnull)


_PULSAR_ERRORS: tuple[type[BaseException], ...] = (pulsar_asyncio.PulsarException, _pulsar.PulsarException)
PRODUCER_QUEUE = 20_000
ID_SHIFT_RANGE = 64
SHARED_ATTEMPTS = 6

_NOT_RETRIABLE_AUTH = {"AuthenticationError", "AuthorizationError", "ErrorGettingAuthenticationData"}
_UNREACHABLE = {"ConnectError", "Timeout", "NotConnected", "ServiceUnitNotReady", "LookupError", "TooManyLookupRequestException"}
_CLOSED = {"AlreadyClosed", "ConsumerNotInitialized", "ProducerNotInitialized"}


def _result_name(exc: BaseException) -> str:
    """The Pulsar result code's name, whichever of the two exception families raised it."""
    if isinstance(exc, pulsar_asyncio.PulsarException):
        return str(exc.error().name)
    return type(exc).__name__


def translate(exc: BaseException, doing: str, url: str, topic: str | None = None) -> TransportError:
    """One Pulsar exception as the product's error, with a line that says what to do; `topic`: the one `doing` is on."""
    name = _result_name(exc)
    if name in _NOT_RETRIABLE_AUTH:
        return AuthenticationFailed(
            f"the broker at {url} refused our credentials while {doing} ({name}); set PULSAR_AUTH_TOKEN to a valid token"
        )
    if name == "MessageTooBig":
        return MessageTooLarge(f"the broker at {url} refused a message as too large while {doing}; send less at once")
    if name in _CLOSED:
        return TransportClosed(f"{doing}: already closed")
    if name in _UNREACHABLE:
        return BrokerUnreachable(f"cannot reach the broker at {url} while {doing} ({name}); is it running?")
    if name == "TopicNotFound" and topic is not None and (namespace := _namespace_of(topic)):
        return TransportError(
            f"the broker at {url} has no namespace {namespace} ({doing}); create it (deploy/pulsar-init.sh does, for "
            "the topicspace in TOOLREG_TOPICSPACE) or set TOOLREG_TOPICSPACE to a tenant that has the product's namespaces"
        )
    return TransportError(f"the broker at {url} failed while {doing}: {name}")


def _namespace_of(topic: str) -> str | None:
    """`tenant/namespace` of `topic`: Apache Pulsar says TopicNotFound when that is missing."""
    try:
        return queue_namespace(topic)
    except ValueError:
        return None


class PulsarPublisher:
    """A producer that takes models, dicts or bytes."""

    def __init__(self, producer: pulsar_asyncio.Producer, topic: str, url: str) -> None:
        self._producer = producer
        self.topic = topic
        self._url = url

    async def send(self, payload: Payload, properties: dict[str, str] | None = None) -> None:
        try:
            await self._producer.send(encode(payload), properties=properties or None)
        except _PULSAR_ERRORS as exc:
            raise translate(exc, f"sending on {self.topic}", self._url, self.topic) from None

    @property
    def connected(self) -> bool:
        return bool(self._producer.is_connected())

    async def close(self) -> None:
        try:
            await self._producer.flush()
            await self._producer.close()
        except _PULSAR_ERRORS as exc:
            log.debug("producer.close_failed", topic=self.topic, error=str(exc))


class PulsarSubscription:
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
        self._native: Any = getattr(consumer, "_consumer", None)
        self._task = asyncio.create_task(self._run(), name=f"receive:{topic}")

    async def _run(self) -> None:
        while not self._closing:
            try:
                message = await self._consumer.receive()
            except _PULSAR_ERRORS as exc:
                if self._closing:
                    return
                log.warning("consumer.receive_failed", topic=self.topic, error=str(exc))
                await asyncio.sleep(0.2)
                continue
            self._acknowledge(message)
            envelope = Envelope(message.data(), message.properties() or {}, self.topic)
            try:
                await self._handler(envelope)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer.handler_failed", topic=self.topic)

    def _acknowledge(self, message: pulsar.Message) -> None:
        """Acknowledge without waiting for the broker's receipt.

        Awaiting it cost every message a second trip through the client's I/O
        thread and the event loop before the handler could run. `make bench`
        before/after: registry CPU at 5,000 heartbeats/s 51% -> 42%,
        ToolSet.invoke p50 1.86 -> 1.20 ms. An ack failure was only ever
        logged; it still is. The native consumer is pulsar.asyncio's own
        attribute; if a release renames it, the awaited path takes over.
        """
        if self._native is None:
            asyncio.ensure_future(self._acknowledge_awaited(message))
            return
        try:
            self._native.acknowledge_async(message._message, self._ack_done)
        except _PULSAR_ERRORS as exc:
            log.debug("consumer.ack_failed", topic=self.topic, error=str(exc))

    def _ack_done(self, result: object) -> None:
        """Runs on the client's I/O thread: it may log, but must not touch the event loop."""
        if result != _pulsar.Result.Ok:
            log.debug("consumer.ack_failed", topic=self.topic, error=str(result))

    async def _acknowledge_awaited(self, message: pulsar.Message) -> None:
        try:
            await self._consumer.acknowledge(message)
        except _PULSAR_ERRORS as exc:
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
        except _PULSAR_ERRORS as exc:
            log.debug("consumer.close_failed", topic=self.topic, error=str(exc))


class PulsarTransport(OpenedResources):
    """A Pulsar client plus everything opened on it, closed in the safe order."""

    def __init__(
        self,
        client: pulsar_asyncio.Client,
        url: str,
        client_options: dict[str, Any],
        capabilities: Capabilities,
        topics: Topics,
    ) -> None:
        super().__init__()
        self._client = client
        self.topics = topics
        self._client_options = client_options
        self._capabilities = capabilities
        self._shared_client: pulsar_asyncio.Client | None = None
        self._bulk_client: pulsar_asyncio.Client | None = None
        self.url = url

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
            client = pulsar_asyncio.Client(target, **kwargs)
        except _PULSAR_ERRORS as exc:
            raise translate(exc, "connecting", target) from None
        except ValueError as exc:  # a malformed URL is refused before any I/O
            raise BrokerUnreachable(f"bad broker URL {target!r}: {exc}; expected pulsar://host:port") from None
        kind = settings.broker_kind(target)
        capabilities = Capabilities.for_broker(kind)
        log.debug("transport.opened", url=target, broker=kind, topicspace=settings.topicspace, capabilities=capabilities.enabled())
        return cls(client, target, kwargs, capabilities, settings.topics)

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    async def unreachable(self, timeout: float = 1.0) -> str | None:
        return await broker_unreachable(self.url, timeout)

    async def publisher(self, topic: str) -> PulsarPublisher:
        self._check_open()
        try:
            producer = await self._client.create_producer(
                topic,
                batching_enabled=False,
                max_pending_messages=PRODUCER_QUEUE,
                send_timeout_millis=10_000,
            )
        except _PULSAR_ERRORS as exc:
            raise await self._explain(exc, f"opening a producer on {topic}", topic) from None
        publisher = PulsarPublisher(producer, topic, self.url)
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
    ) -> PulsarSubscription:
        self._check_open()
        name = subscription or unique_name("sub")
        try:
            if shared:
                consumer = await self._subscribe_shared(topic, name, receiver_queue)
            else:
                client = self._bulk() if bulk and self._capabilities.separate_bulk_connection else self._client
                consumer = await client.subscribe(
                    topic, name, consumer_type=pulsar.ConsumerType.Exclusive, receiver_queue_size=receiver_queue
                )
        except _PULSAR_ERRORS as exc:
            raise await self._explain(exc, f"subscribing to {topic}", topic) from None
        sub = PulsarSubscription(consumer, topic, handler)
        self._subscriptions.append(sub)
        return sub

    async def _explain(self, exc: BaseException, doing: str, topic: str) -> TransportError:
        """`translate`, and for a timeout, which kind: a broker that is down, or one that will not let us in.

        Apache Pulsar drops a connection whose token is missing or wrong, and
        pulsar-client retries until its operation timeout, then says only
        "Timeout". A broker that still accepts TCP connections is not down, so
        the line points at the token instead.
        """
        error = translate(exc, doing, self.url, topic)
        if _result_name(exc) == "Timeout" and await broker_unreachable(self.url) is None:
            token = "the token in PULSAR_AUTH_TOKEN" if self._client_options.get("authentication") else "a token (PULSAR_AUTH_TOKEN)"
            return TransportError(
                f"the broker at {self.url} accepts connections but did not complete {doing} within "
                f"{self._client_options['operation_timeout_seconds']}s; it may be refusing {token}, or be overloaded"
            )
        return error

    def _bulk(self) -> pulsar_asyncio.Client:
        if self._bulk_client is None:
            self._bulk_client = pulsar_asyncio.Client(self.url, **self._client_options)
        return self._bulk_client

    async def _subscribe_shared(self, topic: str, name: str, receiver_queue: int) -> pulsar_asyncio.Consumer:
        if not self._capabilities.shift_consumer_ids:
            return await self._client.subscribe(
                topic, name, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=receiver_queue
            )
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
            except _PULSAR_ERRORS as exc:
                last = exc
                log.warning("consumer.shared_subscribe_retry", topic=topic, subscription=name, attempt=attempt, error=str(exc))
        assert last is not None
        raise last

    @staticmethod
    async def _shift_consumer_id(client: pulsar_asyncio.Client, topic: str) -> None:
        """Use up a random number of consumer ids on a throwaway topic in `topic`'s namespace."""
        count = random.randrange(ID_SHIFT_RANGE)
        if not count:
            return
        _, _, rest = topic.partition("://")
        tenant_ns = "/".join(rest.split("/")[:2])
        throwaway = f"non-persistent://{tenant_ns}/consumer-id-shift"
        results = await asyncio.gather(
            *(client.subscribe(throwaway, unique_name("shift"), receiver_queue_size=1) for _ in range(count)),
            return_exceptions=True,
        )
        await asyncio.gather(*(c.close() for c in results if isinstance(c, pulsar_asyncio.Consumer)), return_exceptions=True)

    async def close(self) -> None:
        if not await self._close_opened():
            return
        for client in (self._shared_client, self._bulk_client, self._client):
            if client is None:
                continue
            try:
                await client.close()
            except _PULSAR_ERRORS as exc:
                log.debug("client.close_failed", error=str(exc))
        if self._capabilities.close_grace:
            await asyncio.sleep(self._capabilities.close_grace)
