"""The Pulsar transport: the only module that imports `pulsar`.

Every trap in the broker notes is handled here once, so nothing above has to
know them:

- a consumer gets exactly one long-lived `receive()` loop, cancelled only when
  the consumer closes (a cancelled `receive()` eats the next message);
- producers are unbatched (latency matters more than throughput on
  request/response) with a queue sized for bursts, and are flushed and closed
  before the client, before the event loop ends;
- Pulsar exceptions are caught here, by name (they are not all `Exception`
  subclasses of one tree), in one place (`broker_errors`, as httpx maps its
  transport's exceptions), and translated into the product's `TransportError`
  family: none crosses this module's boundary. A bare `Timeout` is not taken
  for an unreachable broker: the broker is asked why (`diagnosis`: a revoked
  permission, an expired or wrong token, a deleted namespace), and consumers
  and producers that stay disconnected are diagnosed and logged while the
  client reconnects (`TopicWatch`, read by `problem`);
- a reader never leaves a read pending in the client: `has_message_available`
  ignores a message already handed to a pending read (measured), and a
  cancelled read loses its message, so reads are blocking calls with a timeout
  on a thread of the reader's own, and what a cancelled call still got is kept
  for the next one;
- an exclusive producer whose creation the caller abandons is closed when the
  broker grants it, so it cannot hold the topic for nobody; a topic taken by
  fencing is held by an Exclusive producer, not an ExclusiveWithFencing one,
  whose reconnect after being fenced would fence the next holder;
- broker-specific workarounds are `Capabilities`, on only for the broker kind
  that needs them (`Capabilities.for_broker`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Literal

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio

from ..errors import (
    AuthenticationFailed,
    BrokerUnreachable,
    Fenced,
    MessageTooLarge,
    ProducerBusy,
    TransportClosed,
    TransportError,
)
from ..logs import CLIENT_LOGGER, get_logger
from ..schemas import queue_namespace
from ..settings import Settings
from ..topics import Topics
from .base import (
    Capabilities,
    Envelope,
    ExclusiveMode,
    Handler,
    OpenedResources,
    Payload,
    ReaderStart,
    broker_unreachable,
    encode,
    unique_name,
)
from .diagnosis import Action, Claims, TopicWatch, handshake, namespace_missing, not_authorized, token_refused

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
SEND_TIMEOUT_MS = 10_000
READ_BATCH = 500
"""The most messages a reader takes from the client's prefetch queue in one trip through its thread."""
ID_SHIFT_RANGE = 64
SHARED_ATTEMPTS = 6

_NOT_RETRIABLE_AUTH = {"AuthenticationError", "ErrorGettingAuthenticationData"}
LOOKUP_TIMEOUT = 2.0
"""Seconds a diagnostic lookup of a topic may take; a broker that lets us in answers one in milliseconds."""
_ACCESS_MODES = {
    "exclusive": pulsar.ProducerAccessMode.Exclusive,
    "wait": pulsar.ProducerAccessMode.WaitForExclusive,
    "fence": pulsar.ProducerAccessMode.ExclusiveWithFencing,
}
_HELD = {"ProducerBusy", "ProducerFenced"}
"""What creating an exclusive producer on a held topic says: ProducerFenced too (measured on 4.0.8, for a second
`Exclusive` producer, and for the `WaitForExclusive` ones queued when another fences the topic)."""
_UNREACHABLE = {"ConnectError", "Timeout", "NotConnected", "ServiceUnitNotReady", "LookupError", "TooManyLookupRequestException"}
_CLOSED = {"AlreadyClosed", "ConsumerNotInitialized", "ProducerNotInitialized"}


def _result_name(exc: BaseException) -> str:
    """The Pulsar result code's name, whichever of the two exception families raised it."""
    if isinstance(exc, pulsar_asyncio.PulsarException):
        return str(exc.error().name)
    return type(exc).__name__


def translate(exc: BaseException, doing: str, url: str, topic: str | None = None, *, role: str | None = None) -> TransportError:
    """One Pulsar exception as the product's error, with a line that says what to do.

    `topic`: the one `doing` is on; `role`: the one our token names. A
    `Timeout` says only that no answer came: where the transport can ask the
    broker why (`PulsarTransport.diagnose`), it does, and says that instead.
    """
    name = _result_name(exc)
    namespace = _namespace_of(topic) if topic is not None else None
    if name == "AuthorizationError" and namespace:
        return not_authorized(url, namespace, role, doing=doing)
    if name == "AuthorizationError":
        return AuthenticationFailed(
            f"the broker at {url} does not authorize our role{f' {role}' if role else ''} for {doing} (AuthorizationError): "
            "grant it produce and consume on the topicspace's namespaces (deploy/pulsar-init.sh does, with TOOLREG_ROLE)"
        )
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
    if name == "TopicNotFound" and namespace:
        return namespace_missing(url, namespace, doing=doing)
    return TransportError(f"the broker at {url} failed while {doing}: {name}")


Refine = Callable[[str], TransportError | None]
"""A call site's own reading of a Pulsar result name (None: the general translation applies)."""


class broker_errors:  # noqa: N801 - used like a function: `with broker_errors(...)`
    """The one place a Pulsar exception is caught and turned into the product's error.

    As httpx maps its transport's exceptions in one context manager, every call
    into pulsar-client here runs inside one of these, in one of three ways:

    - raising (the default): the exception leaves as the translated
      `TransportError` (`refine` first, for a site's own result names), with no
      Pulsar traceback attached (`from None`). As `async with`, `explain` may
      replace the translation (it can ask whether a timed-out broker is up);
    - `log="event"`: logged at `level` with the error and dropped (closing,
      acknowledging: there is nothing to tell a caller);
    - `keep=True`: dropped silently; `error` holds it for the caller to decide
      (the receive loop, the retry loops).

    Anything that is not a Pulsar exception passes through untouched.
    """

    def __init__(
        self,
        doing: str = "",
        url: str = "",
        topic: str | None = None,
        *,
        refine: Refine | None = None,
        explain: Callable[[BaseException], Awaitable[TransportError]] | None = None,
        log: str | None = None,
        level: Literal["debug", "warning"] = "debug",
        keep: bool = False,
        **fields: Any,
    ) -> None:
        self._doing, self._url, self._topic = doing, url, topic
        self._refine, self._explain = refine, explain
        self._log, self._level, self._keep, self._fields = log, level, keep, fields
        self.error: BaseException | None = None

    def __enter__(self) -> "broker_errors":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is None or not isinstance(exc, _PULSAR_ERRORS):
            return False
        self.error = exc
        if self._keep:
            return True
        if self._log is not None:
            getattr(log, self._level)(self._log, **self._fields, error=str(exc))
            return True
        raise self._translated(exc) from None

    async def __aenter__(self) -> "broker_errors":
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc is not None and isinstance(exc, _PULSAR_ERRORS) and self._explain is not None and not (self._keep or self._log):
            self.error = exc
            refined = self._refine(_result_name(exc)) if self._refine else None
            raise (refined or await self._explain(exc)) from None
        return self.__exit__(kind, exc, tb)

    def _translated(self, exc: BaseException) -> TransportError:
        refined = self._refine(_result_name(exc)) if self._refine else None
        return refined or translate(exc, self._doing, self._url, self._topic)


def _namespace_of(topic: str) -> str | None:
    """`tenant/namespace` of `topic`: Apache Pulsar says TopicNotFound when that is missing."""
    try:
        return queue_namespace(topic)
    except ValueError:
        return None


Explain = Callable[[BaseException, str, str], Awaitable[TransportError]]
"""The transport's reading of a failed call (exception, what it was doing, topic), asking the broker why if it timed out."""


class PulsarPublisher:
    """A producer that takes models, dicts or bytes.

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
        *,
        explain: Explain | None = None,
        refused: Callable[[str], TransportError | None] | None = None,
    ) -> None:
        self._producer = producer
        self.topic = topic
        self._url = url
        self._explain = explain
        self._refused = refused

    async def send(self, payload: Payload, properties: dict[str, str] | None = None) -> None:
        doing = f"sending on {self.topic}"
        if self._refused is not None and not self._producer.is_connected() and (refused := self._refused(self.topic)) is not None:
            raise refused
        if self._explain is None:
            with broker_errors(doing, self._url, self.topic):
                await self._producer.send(encode(payload), properties=properties or None)
            return
        explain = self._explain
        async with broker_errors(explain=lambda exc: explain(exc, doing, self.topic)):
            await self._producer.send(encode(payload), properties=properties or None)

    @property
    def connected(self) -> bool:
        return bool(self._producer.is_connected())

    async def close(self) -> None:
        with broker_errors(log="producer.close_failed", topic=self.topic):
            await self._producer.flush()
            await self._producer.close()


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
            f"another replica took {self.topic} over (this producer was fenced); it never writes there again: step down to standby"
        )

    def _lost(self) -> TransportError:
        return TransportError(
            f"the wait-mode producer on {self.topic} does not hold the topic now (fenced, or reconnecting); close it and "
            "acquire the topic again", retriable=False,
        )

    async def send(self, payload: Payload, properties: dict[str, str] | None = None) -> bytes:
        if self._fenced:
            raise self._fenced_error()
        if self.mode == "wait" and not self._producer.is_connected():
            # Fenced, a `wait` producer queues again instead of failing, and would send this once it gets the topic back.
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
        """Runs on the reader's thread: the next native message (none after `timeout_ms`), and those already prefetched."""
        messages: list[Any] = []
        wait = timeout_ms
        while len(messages) < READ_BATCH:
            with broker_errors(keep=True) as reading:
                messages.append(self._native.read_next(wait))
            if reading.error is not None:
                if _result_name(reading.error) == "Timeout" or messages:
                    break  # an error after some messages shows again on the next read
                raise reading.error
            wait = 0
        return messages

    def _envelope(self, message: Any) -> Envelope:
        return Envelope(message.data(), dict(message.properties() or {}), self.topic, bytes(message.message_id().serialize()))

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
                    self._in_flight = loop.run_in_executor(self._thread, self._read_blocking, max(1, int(timeout * 1000)))
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
            with broker_errors(f"checking for messages on {self.topic}", self._url, self.topic):
                available = await self._reader.has_message_available()
            return bool(available)

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


class PulsarSubscription:
    """One consumer and the single receive loop that feeds its handler.

    The handler runs inline: a handler that wants concurrency starts its own
    tasks (and so owns its back-pressure). A handler that raises is logged and
    the loop goes on: one bad message never stops a subscription.

    `delete_on_close` (an exclusive subscription, this process's alone): closing
    unsubscribes, so the broker keeps nothing for it (see `Transport.unsubscribe`).
    """

    action: Action = "consume"

    def __init__(self, consumer: pulsar_asyncio.Consumer, topic: str, handler: Handler, *, delete_on_close: bool = False) -> None:
        self._consumer = consumer
        self.topic = topic
        self._handler = handler
        self._delete_on_close = delete_on_close
        self._closing = False
        self._native: Any = getattr(consumer, "_consumer", None)
        self._task = asyncio.create_task(self._run(), name=f"receive:{topic}")

    @property
    def connected(self) -> bool:
        """Whether the consumer is attached to the broker now: False while pulsar-client reconnects (for `TopicWatch`)."""
        return self._native is None or bool(self._native.is_connected())

    async def _run(self) -> None:
        while not self._closing:
            with broker_errors(keep=True) as receiving:
                message = await self._consumer.receive()
            if receiving.error is not None:
                if self._closing:
                    return
                log.warning("consumer.receive_failed", topic=self.topic, error=str(receiving.error))
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
        with broker_errors(log="consumer.ack_failed", topic=self.topic):
            self._native.acknowledge_async(message._message, self._ack_done)

    def _ack_done(self, result: object) -> None:
        """Runs on the client's I/O thread: it may log, but must not touch the event loop."""
        if result != _pulsar.Result.Ok:
            log.debug("consumer.ack_failed", topic=self.topic, error=str(result))

    async def _acknowledge_awaited(self, message: pulsar.Message) -> None:
        with broker_errors(log="consumer.ack_failed", topic=self.topic):
            await self._consumer.acknowledge(message)

    async def close(self) -> None:
        self._closing = True
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        if self._delete_on_close:
            # Unsubscribing closes the consumer too; if it fails (the broker is gone, say), it is only closed.
            with broker_errors(keep=True) as deleting:
                await self._consumer.unsubscribe()
            if deleting.error is None:
                return
            log.debug("consumer.unsubscribe_failed", topic=self.topic, error=str(deleting.error))
        with broker_errors(log="consumer.close_failed", topic=self.topic):
            await self._consumer.close()


class PulsarTransport(OpenedResources):
    """A Pulsar client plus everything opened on it, closed in the safe order.

    Its `TopicWatch` looks after the consumers and producers it opened: one
    that stays disconnected is diagnosed (`diagnose`), the reason logged and
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
        self._token = token
        self._claims = Claims.of(token)
        self._watch = TopicWatch(url, self._watched, self._broker_problem, self._ask)
        self._client = client
        self.topics = topics
        self._client_options = client_options
        self._capabilities = capabilities
        self._shared_client: pulsar_asyncio.Client | None = None
        self._bulk_client: pulsar_asyncio.Client | None = None
        self._shift_subscription = unique_name("consumer-id-shift")
        self._abandoned: set[asyncio.Future[Any]] = set()
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
            with broker_errors("connecting", target):
                client = pulsar_asyncio.Client(target, **kwargs)
        except ValueError as exc:  # a malformed URL is refused before any I/O
            raise BrokerUnreachable(f"bad broker URL {target!r}: {exc}; expected pulsar://host:port") from None
        kind = settings.broker_kind(target)
        capabilities = Capabilities.for_broker(kind)
        log.debug("transport.opened", url=target, broker=kind, topicspace=settings.topicspace, capabilities=capabilities.enabled())
        return cls(client, target, kwargs, capabilities, settings.topics, settings.auth_token)

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    async def unreachable(self, timeout: float = 1.0) -> str | None:
        return await broker_unreachable(self.url, timeout)

    def problem(self, topic: str) -> str | None:
        return self._watch.problem(topic)

    def _watched(self) -> list[PulsarPublisher | PulsarSubscription]:
        """What the watch looks after: plain producers and consumers (exclusive producers and readers have their own rules)."""
        return [p for p in self._publishers if type(p) is PulsarPublisher] + list(self._subscriptions)

    async def diagnose(self, topic: str, doing: str | None = None, action: Action | None = None) -> TransportError | None:
        """Why `topic` cannot be used now, as the broker tells it; None if it lets us use it.

        Asks whether the broker is reachable, whether it accepts our token (a
        handshake of our own), whether it lets our role look the topic up and,
        given an `action`, whether it lets it produce or consume there: each
        answers in milliseconds, where pulsar-client would only say `Timeout`
        (see `diagnosis`).
        """
        return await self._broker_problem(doing) or await self._ask(topic, action, doing)

    async def _broker_problem(self, doing: str | None = None) -> TransportError | None:
        down = await broker_unreachable(self.url)
        if down is not None:
            return BrokerUnreachable(down)
        answer = await handshake(self.url, self._token)
        if answer.accepted is False:
            return token_refused(self.url, self._token, answer.said, doing=doing)
        if answer.accepted is None and self._claims.expired():  # no verdict (TLS, say), and the token's own exp has passed
            return token_refused(self.url, self._token, f"no verdict ({answer.said})", doing=doing)
        if answer.silent:
            return TransportError(
                f"the broker at {self.url} accepts connections but {answer.said}"
                f"{f' ({doing})' if doing else ''}: is it a Pulsar broker, and is it overloaded?"
            )
        return None

    async def _ask(self, topic: str, action: Action | None, doing: str | None = None) -> TransportError | None:
        """Look `topic` up, then try `action` there once: a lookup needs only one of produce and consume (measured).

        A consume try is a reader at the latest message: it needs the same
        permission as a subscription and leaves no durable subscription behind,
        even on a persistent topic. What a try opens is closed at once; one
        the broker grants after we stopped waiting is closed when it comes.
        """
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [(f"looking up {topic}", lambda: self._client.get_topic_partitions(topic))]
        if action == "produce":
            steps.append((f"producing on {topic}", lambda: self._client.create_producer(topic, batching_enabled=False)))
        elif action == "consume":
            steps.append((f"consuming from {topic}", lambda: self._client.create_reader(
                topic, pulsar.MessageId.latest, receiver_queue_size=1)))
        for trying, call in steps:
            attempt = asyncio.ensure_future(call())
            done, _ = await asyncio.wait({attempt}, timeout=LOOKUP_TIMEOUT)
            if not done:
                attempt.add_done_callback(lambda late: self._retire(late, topic))
                return TransportError(
                    f"the broker at {self.url} accepts our token but gave no answer within {LOOKUP_TIMEOUT:g}s while {trying}"
                    f"{f' ({doing})' if doing else ''}; it may be overloaded or still starting"
                )
            with broker_errors(keep=True) as asking:
                await self._undo(attempt.result(), topic)
            if asking.error is not None:
                return translate(asking.error, doing or trying, self.url, topic, role=self._claims.role)
        return None

    def _retire(self, late: asyncio.Future[Any], topic: str) -> None:
        """A try the broker answered after we stopped waiting: undo what it opened."""
        if not late.cancelled() and late.exception() is None:
            closing = asyncio.ensure_future(self._undo(late.result(), topic))
            self._abandoned.add(closing)
            closing.add_done_callback(self._abandoned.discard)

    @staticmethod
    async def _undo(opened: Any, topic: str) -> None:
        """Close the producer or reader a diagnosis opened; a lookup's answer needs nothing."""
        with broker_errors(log="diagnosis.undo_failed", topic=topic):
            if isinstance(opened, pulsar_asyncio.Producer | pulsar_asyncio.Reader):
                await opened.close()

    async def publisher(self, topic: str) -> PulsarPublisher:
        self._check_open()
        doing = f"opening a producer on {topic}"
        async with broker_errors(explain=lambda exc: self._explain(exc, doing, topic)):
            producer = await self._client.create_producer(
                topic,
                batching_enabled=False,
                max_pending_messages=PRODUCER_QUEUE,
                send_timeout_millis=SEND_TIMEOUT_MS,
            )
        publisher = PulsarPublisher(
            producer, topic, self.url, explain=lambda exc, doing, on: self._explain(exc, doing, on, "produce"), refused=self._watch.refusal
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
            if name in _HELD:
                return ProducerBusy(f"{topic} is held by another exclusive producer ({name}); try again later, or wait for it")
            if name == "Timeout" and mode == "wait":
                return ProducerBusy(f"{topic} is still held by another producer after waiting {timeout}s (one wait); wait again")
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
                async with broker_errors(refine=held, explain=lambda exc: self._explain(exc, doing, topic)):
                    # Shielded: cancelling the native creation would not withdraw it, and a producer the broker
                    # grants afterwards would hold the topic for nobody. `_abandon` closes it instead.
                    return await asyncio.shield(creating)
            except asyncio.CancelledError:
                self._abandon(creating, topic)
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

    def _abandon(self, creating: asyncio.Future[Any], topic: str) -> None:
        """Close the producer an abandoned creation still yields; `close` waits for what is left."""
        self._abandoned.add(creating)

        def done(future: asyncio.Future[Any]) -> None:
            if future.cancelled() or future.exception() is not None:
                self._abandoned.discard(future)
                return
            log.debug("producer.abandoned_closed", topic=topic)
            closing = asyncio.ensure_future(self._close_quietly(future.result(), topic))
            self._abandoned.add(closing)
            closing.add_done_callback(self._abandoned.discard)
            self._abandoned.discard(future)

        creating.add_done_callback(done)

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
                raise TransportError(f"{start[:16]!r} is not a message id of this broker; start at earliest", retriable=False) from None
        else:
            raise ValueError(f"a reader starts at 'earliest', 'latest' or a message id, not {start!r}")
        doing = f"opening a reader of {topic}"
        async with broker_errors(explain=lambda exc: self._explain(exc, doing, topic)):
            native = await self._client.create_reader(
                topic, position, start_message_id_inclusive=inclusive, reader_name=unique_name("reader")
            )
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
        doing = f"subscribing to {topic}"
        async with broker_errors(explain=lambda exc: self._explain(exc, doing, topic)):
            if shared:
                consumer = await self._subscribe_shared(topic, name, receiver_queue)
            else:
                client = self._bulk() if bulk and self._capabilities.separate_bulk_connection else self._client
                consumer = await client.subscribe(
                    topic, name, consumer_type=pulsar.ConsumerType.Exclusive, receiver_queue_size=receiver_queue
                )
        sub = PulsarSubscription(consumer, topic, handler, delete_on_close=not shared)
        self._subscriptions.append(sub)
        self._watch.start()
        return sub

    async def _explain(self, exc: BaseException, doing: str, topic: str, action: Action | None = None) -> TransportError:
        """`translate`, and for a timeout, why: asked of the broker (`diagnose`).

        Apache Pulsar drops a connection whose token is missing, wrong or
        expired, and closes the producers and consumers of a role whose
        permission is revoked or whose namespace is deleted; pulsar-client
        retries until its operation (or send) timeout, then says only
        "Timeout". The broker's own answer names the cause; only if it lets
        us in and looks the topic up is the timeout the broker's slowness.
        """
        if _result_name(exc) != "Timeout":
            return translate(exc, doing, self.url, topic, role=self._claims.role)
        found = await self.diagnose(topic, doing, action)
        if found is not None:
            return found
        return TransportError(
            f"the broker at {self.url} accepts our token and lets us use {topic}, but did not complete {doing} in time "
            "(Timeout); it may be overloaded: try again"
        )

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
            await self._shift_consumer_id(self._shared_client, topic, self._shift_subscription)
            with broker_errors(
                log="consumer.shared_subscribe_retry", level="warning", topic=topic, subscription=name, attempt=attempt
            ) as subscribing:
                return await self._shared_client.subscribe(
                    topic, name, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=receiver_queue
                )
            last = subscribing.error
        assert last is not None
        raise last

    @staticmethod
    async def _shift_consumer_id(client: pulsar_asyncio.Client, topic: str, subscription: str) -> None:
        """Use up a random number of consumer ids on a throwaway topic in `topic`'s namespace.

        All on one Shared `subscription`, named once per transport: pulsar-lite keeps every subscription
        name a topic ever had, for good (about 16 KiB each, measured; unsubscribing frees nothing), and a
        name per throwaway consumer cost it 0.5 MB per service start. One name per process cannot collide
        with another process's consumers, and within the process the consumer ids differ.
        """
        count = random.randrange(ID_SHIFT_RANGE)
        if not count:
            return
        _, _, rest = topic.partition("://")
        tenant_ns = "/".join(rest.split("/")[:2])
        throwaway = f"non-persistent://{tenant_ns}/consumer-id-shift"
        results = await asyncio.gather(
            *(
                client.subscribe(throwaway, subscription, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1)
                for _ in range(count)
            ),
            return_exceptions=True,
        )
        await asyncio.gather(*(c.close() for c in results if isinstance(c, pulsar_asyncio.Consumer)), return_exceptions=True)

    async def close(self) -> None:
        await self._watch.stop()
        if not await self._close_opened():
            return
        for client in (self._shared_client, self._bulk_client, self._client):
            if client is None:
                continue
            with broker_errors(log="client.close_failed"):
                await client.close()
        if self._abandoned:  # creations the broker had not answered: the closed client fails them now
            await asyncio.wait(set(self._abandoned), timeout=self._client_options["operation_timeout_seconds"])
        if self._capabilities.close_grace:
            await asyncio.sleep(self._capabilities.close_grace)
