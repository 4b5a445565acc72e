"""What the product sees of a broker: a few small Protocols and one message type.

Everything above `toolservice_base.transport` is written against these, so
it runs unchanged on Apache Pulsar, on pulsar-lite and on the in-memory
transport the tests and `ServiceHarness` use. A handler receives an
`Envelope`, never a broker's message object.

Replicated state (a log on a persistent topic, one writer elected by the
broker) needs two more: an `ExclusivePublisher` (Pulsar's producer access
modes) and a `Reader` (read a topic from a position, know when the end is
reached). `Capabilities.replicated_state` says whether the broker has them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, Self, TypeAlias, TypedDict, Unpack, runtime_checkable

from pydantic import BaseModel

from ..brokers import APACHE_PULSAR, BROKER_KINDS, MEMORY, PULSAR_LITE
from ..errors import BrokerUnsupported, TransportClosed, TransportError
from ..topics import Topics

LARGE_MESSAGE = 64 * 1024
"""Past this, a message can make its connection unwritable for a moment (see
`Capabilities.separate_bulk_connection`)."""

MESSAGE_LIMIT = 5 * 1024 * 1024
"""The largest message the brokers take (Apache Pulsar's default `maxMessageSize`; pulsar-lite's, measured):
the in-memory transport refuses above it, as they do."""

Payload = BaseModel | dict[str, Any] | bytes | str


@dataclass(frozen=True, slots=True)
class Envelope:
    """One received message: its bytes, its properties and the topic it came on.

    `message_id` is where the message sits in its topic (the broker's id, serialized),
    set by a `Reader` so one can read on from there later; empty for subscriptions,
    which have no use for it (and so do not pay for it on every message).
    `producer` is the name the broker gave the producer that sent it: the one thing
    about a sender that a message cannot make up, for logging what was refused.
    """

    data: bytes
    properties: dict[str, str] = field(default_factory=dict)
    topic: str = ""
    message_id: bytes = b""
    producer: str = ""


ExclusiveMode: TypeAlias = Literal["exclusive", "wait", "fence"]
"""How an `ExclusivePublisher` takes its topic (Pulsar's producer access modes):

- `exclusive` (Exclusive): now or never; `ProducerBusy` if someone holds the topic;
- `wait` (WaitForExclusive): queue at the broker until the holder goes. The broker elects:
  the first in line gets the topic when the holder closes or dies. One attempt lasts at
  most the client's operation timeout (then `ProducerBusy`), so callers retry;
- `fence` (ExclusiveWithFencing): take the topic at once, even from a live holder, whose
  next send then fails with `Fenced`. Use it only once the holder is known to be gone.
  (On Apache Pulsar the topic is then held by an `Exclusive` producer: a fenced
  ExclusiveWithFencing producer's own reconnect would fence the new holder, measured.)

Measured on Apache Pulsar 4.0.8: a `wait` producer that is fenced does not fail: it
queues again, its sends time out, and once the fencer closes it gets the topic back and
writes what it had queued. So write data only through `exclusive` or `fence` publishers
(fenced, they fail every send for good), and use a `wait` one as a lock.
"""

EXCLUSIVE_MODES: tuple[ExclusiveMode, ...] = ("exclusive", "wait", "fence")

ReaderStart: TypeAlias = Literal["earliest", "latest"] | bytes
"""Where a `Reader` starts: `earliest` (the first message kept), `latest` (the last message
of the topic, included, so it can be read: the newest snapshot manifest, say), or a
serialized message id (`Envelope.message_id`): the message after it, or that message
itself with `inclusive=True`."""


Handler = Callable[[Envelope], Awaitable[None]]
InlineHandler = Callable[[Envelope], None]
"""A handler that never waits, run on the loop as messages arrive (`Transport.subscribe(..., inline=True)`)."""
FailureHook = Callable[[TransportError], None]
"""Told, on the loop, that an unconfirmed send failed after `Publisher.send` returned (`confirm=False`)."""


def encode(payload: Payload) -> bytes:
    """The one JSON encoding of everything we send."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    if isinstance(payload, BaseModel):
        return payload.model_dump_json(by_alias=True, exclude_none=True).encode()
    return json.dumps(payload, separators=(",", ":")).encode()


async def broker_unreachable(url: str, timeout: float = 1.0) -> str | None:
    """None if some address of the broker URL accepts a TCP connection now; else one line saying it cannot be reached.

    pulsar-client retries a refused connection for its whole operation
    timeout; this answers in at most `timeout` per address, so "the broker is
    down" can be told from "nobody answers" at once.
    """
    if "://" not in url:
        return None  # not a network broker (the in-memory one)
    scheme, _, rest = url.partition("://")
    default_port = 6651 if scheme.endswith("+ssl") else 6650
    reason = "no host in the URL"
    for address in rest.split("/")[0].split(","):
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            host, port = address, str(default_port)
        try:
            async with asyncio.timeout(timeout):
                _, writer = await asyncio.open_connection(host.strip("[]") or "localhost", int(port))
        except (OSError, TimeoutError) as exc:
            reason = f"no answer within {timeout:g}s" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            continue
        writer.close()
        return None
    return f"cannot reach the broker at {url} ({reason}); is it running, and is PULSAR_URL right?"


def unique_name(prefix: str) -> str:
    """A name no other process will pick: per-process subscriptions never collide with a dead one's."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@runtime_checkable
class Publisher(Protocol):
    topic: str

    async def send(
        self,
        payload: Payload,
        properties: dict[str, str] | None = None,
        *,
        key: str | None = None,
        confirm: bool = True,
        on_failure: FailureHook | None = None,
    ) -> None:
        """Send one message; raises a `TransportError` if the broker does not take it.

        `key`: the message's key (Pulsar's partition key). Messages with one key stay
        together: on one partition, and with one consumer of a `Key_Shared` subscription.

        `confirm=False`: return once the client holds the message, without waiting for
        the broker's receipt (for a message whose answer is its receipt, say a request).
        What is refused at once still raises (a closed producer, a message over
        `LARGE_MESSAGE`, which is always confirmed); a failure found later (the send
        timed out) goes to `on_failure`, on the loop, or is logged. Back-pressure is the
        same either way.
        """

    @property
    def connected(self) -> bool:
        """Whether the producer can reach the broker now (readiness probes ask this)."""

    async def close(self) -> None: ...


@runtime_checkable
class ExclusivePublisher(Protocol):
    """A producer that holds its topic alone (see `ExclusiveMode`); unbatched, so each send stands alone."""

    topic: str
    mode: ExclusiveMode

    async def send(self, payload: Payload, properties: dict[str, str] | None = None) -> bytes:
        """Send one message and return its id (serialized) once the broker has it (persisted, on a persistent topic).

        Raises `Fenced` once a newer exclusive producer took the topic over: for good.
        """

    @property
    def connected(self) -> bool:
        """Whether it holds the topic now (a fenced, or re-queued `wait`, producer does not)."""

    @property
    def fenced(self) -> bool:
        """Whether a send has failed with `Fenced`: it will never write again."""

    async def close(self) -> None: ...


@runtime_checkable
class Reader(Protocol):
    """Reads one topic in order from a position; no subscription, nothing acknowledged, nothing kept for it."""

    topic: str

    async def read_next(self, timeout: float) -> Envelope | None:
        """The next message (with its `message_id`), or None if none came within `timeout` seconds.

        Safe to cancel, and a timeout loses nothing: a message that arrives after the
        caller gave up is handed to the next call.
        """

    async def has_message_available(self) -> bool:
        """Whether the topic holds a message this reader has not returned yet.

        Read until this is False to reach the end of the topic as it is now: after
        taking a topic with an exclusive producer, that end is final until we write.
        """

    async def close(self) -> None: ...


@runtime_checkable
class Subscription(Protocol):
    topic: str

    @property
    def connected(self) -> bool:
        """Whether the consumer is attached to the broker now (False while the client reconnects)."""

    async def close(self) -> None: ...


class SubscribeOptions(TypedDict, total=False):
    """The keywords `Transport.subscribe` takes, each as `SubscriptionOptions` describes it (and defaults it): a new
    option is one key here and one field there, beside each other, and every transport takes it (mypy holds the two
    to each other at `SubscriptionOptions.of`)."""

    subscription: str | None
    shared: bool
    bulk: bool
    receiver_queue: int
    inline: bool
    linger: float


@dataclass(frozen=True)
class SubscriptionOptions:
    """How one subscription is made: `subscribe`'s keywords (`SubscribeOptions`), with their defaults."""

    subscription: str | None = None
    """Its name; None: exclusive to this process and uniquely named for it."""
    shared: bool = False
    """Spread messages over every consumer of `subscription` (a service's instances); otherwise the subscription is
    exclusive: this process's alone, and deleted at the broker when it is closed (see `Transport.unsubscribe`)."""
    bulk: bool = False
    """The topic's messages can exceed 64 KiB."""
    receiver_queue: int = 1000
    """Messages the client takes ahead of the handler."""
    inline: bool = False
    """The handler is a plain function that never waits, called on the loop as messages arrive, in order, with no
    task step between a message and it (an answer reaches its waiting caller one loop iteration sooner). It must not
    block; what it raises is logged."""
    linger: float = 0.0
    """Seconds messages of a steady stream may wait to be handed over together, taken by the loop in one look,
    instead of one wake-up each; a message after a quiet spell is handed over at once. For streams where
    milliseconds do not matter and wake-ups do (heartbeats)."""

    @classmethod
    def of(cls, options: SubscribeOptions) -> SubscriptionOptions:
        return cls(**options)


@runtime_checkable
class Transport(Protocol):
    """Makes publishers and subscriptions, and closes everything it made in a safe order."""

    url: str
    topics: Topics
    """The topic names of the topicspace this transport was opened for."""

    @property
    def capabilities(self) -> "Capabilities": ...

    async def publisher(self, topic: str) -> Publisher: ...

    async def exclusive_publisher(self, topic: str, mode: ExclusiveMode) -> ExclusivePublisher:
        """A producer that holds `topic` alone, taken the way `mode` says (see `ExclusiveMode`).

        Raises `ProducerBusy` if the topic is held (`exclusive`, or a `wait` attempt that
        timed out), and `BrokerUnsupported` on a broker without access modes (pulsar-lite).
        Cancelling the call leaves nothing behind: a producer the broker grants afterwards
        is closed at once.
        """

    async def reader(self, topic: str, start: ReaderStart, *, inclusive: bool = False) -> Reader:
        """A `Reader` of `topic` from `start`; `inclusive` also returns the message a message-id start names.

        `latest` needs `Capabilities.replicated_state` (pulsar-lite cannot read its last message).
        """

    async def unreachable(self, timeout: float = 1.0) -> str | None:
        """None if the broker accepts a connection now; else one line saying it cannot be reached.

        For telling "the broker is down" from "a service is silent" when a
        request goes unanswered.
        """

    def problem(self, topic: str) -> str | None:
        """Why a consumer or producer this transport opened on `topic` has stayed disconnected, in one line; else None.

        The broker's own answer (a revoked permission, an expired token, a
        deleted namespace, a broker that is down), found once the handle has
        been down for a second; the client keeps reconnecting meanwhile. For
        readiness checks: cheap, no I/O.
        """

    async def subscribe(
        self, topic: str, handler: Handler | InlineHandler, **options: Unpack[SubscribeOptions]
    ) -> Subscription:
        """Subscribe and start delivering to `handler`, one message at a time, as `options` say
        (`SubscriptionOptions`: `subscription`, `shared`, `bulk`, `receiver_queue`, `inline`, `linger`)."""

    async def unsubscribe(self, subscription: Subscription) -> None:
        """End `subscription`; closing the transport ends the ones still open the same way.

        An exclusive subscription is deleted at the broker: on a persistent
        topic a subscription left behind keeps every later message for a
        consumer that never comes (Apache Pulsar keeps it, and its backlog,
        until someone deletes it). A shared one is only left: the other
        instances, and what is queued for the next one, stay.
        """

    async def close_publisher(self, publisher: Publisher | ExclusivePublisher) -> None: ...

    async def close_reader(self, reader: Reader) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...


@dataclass(frozen=True)
class Capabilities:
    """Broker workarounds, each on only for a broker that needs it, and what a broker can do.

    Each workaround field names one thing the product does to get correct behaviour
    from a particular broker; the docstring says the failure it prevents. The
    `FEATURES` say what the broker supports at all.
    `for_broker` decides them per broker kind, from measurements recorded in
    the operators guide.
    """

    shift_consumer_ids: bool = False
    """pulsar-lite keys a Shared subscription's consumers by the client-local consumer id, which every
    client counts from 0: the second process to join collides ("Consumer 0 already exists") unless it
    first uses up a random number of ids on a throwaway topic."""

    confirm_subscription_receives: bool = False
    """A new subscription on a non-persistent topic drops what arrives before its first permits reach
    the broker: a client pings its own response queue until the ping comes back before it sends."""

    resend_on_silence: bool = False
    """A store request sent in the moment a store (re)subscribes can be dropped: config requests (all
    safe to repeat) are resent with back-off inside the caller's timeout."""

    separate_bulk_connection: bool = False
    """A message over 64 KiB makes its connection unwritable for a moment and the broker drops
    non-persistent messages for the other consumers on it: subscriptions whose answers can be large
    get a connection of their own."""

    close_grace: float = 0.0
    """Seconds to wait after closing the client before the event loop may end: exiting while the
    client's I/O threads wind down aborts the process now and then."""

    replicated_state: bool = False
    """Not a workaround but a feature: the broker has what a log with one elected writer needs
    (producer access modes Exclusive, WaitForExclusive and ExclusiveWithFencing; a reader that can
    start at the last message). Apache Pulsar has them. pulsar-lite 0.2.0 does not (measured: it
    ignores access modes, so two "exclusive" producers both write and fencing fences nothing, and a
    reader at the latest message, inclusive, reads nothing): there, `exclusive_publisher` and a
    `latest` reader refuse with one line saying Apache Pulsar is needed."""

    FEATURES: ClassVar[tuple[str, ...]] = ("replicated_state",)
    """Fields that say what a broker can do rather than what we do for it: `enabled` leaves them out."""

    @classmethod
    def for_broker(cls, kind: str) -> "Capabilities":
        if kind == PULSAR_LITE:
            return cls(
                shift_consumer_ids=True,
                confirm_subscription_receives=True,
                resend_on_silence=True,
                separate_bulk_connection=True,
                close_grace=0.05,
            )
        if kind == APACHE_PULSAR:
            return APACHE_PULSAR_CAPABILITIES
        if kind == MEMORY:
            return cls(replicated_state=True)
        raise ValueError(f"unknown broker kind {kind!r}; expected one of {', '.join(BROKER_KINDS)}")

    def enabled(self) -> dict[str, bool | float]:
        """The workarounds that are on, for logs and the operators guide (features such as `replicated_state` are not
        workarounds)."""
        return {name: value for name, value in vars(self).items() if value and name not in self.FEATURES}

    def require_replicated_state(self, what: str, url: str) -> None:
        """Refuse `what` in one line on a broker that cannot keep replicated state."""
        if not self.replicated_state:
            raise BrokerUnsupported(
                f"{what} needs Apache Pulsar: the broker at {url} (pulsar-lite) has no exclusive producers and cannot"
                " read a topic's last message; use the sqlite store, or point PULSAR_URL at Apache Pulsar"
                " (TOOLREG_BROKER=apache-pulsar)"
            )


APACHE_PULSAR_CAPABILITIES = Capabilities(
    confirm_subscription_receives=True,
    resend_on_silence=True,
    separate_bulk_connection=True,
    close_grace=0.05,
    replicated_state=True,
)
"""Apache Pulsar 4.0: everything but `shift_consumer_ids` (measured in bench/QUIRKS.md; docs/operators.md,
"What the product does per broker")."""


class OpenedResources:
    """What every transport does alike: remember what it opened, close it in a safe order, refuse use after close.

    Subscriptions close before publishers (a handler may still answer while
    its subscription winds down), readers with them, and all before the broker client.
    """

    url: str

    def __init__(self) -> None:
        self._publishers: list[Any] = []
        self._subscriptions: list[Any] = []
        self._readers: list[Any] = []
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"the connection to {self.url} is closed")

    async def unsubscribe(self, subscription: Any) -> None:
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
        await subscription.close()

    async def close_publisher(self, publisher: Any) -> None:
        if publisher in self._publishers:
            self._publishers.remove(publisher)
        await publisher.close()

    async def close_reader(self, reader: Any) -> None:
        if reader in self._readers:
            self._readers.remove(reader)
        await reader.close()

    async def _close_opened(self) -> bool:
        """Close every subscription and reader, then every publisher; False if the transport was already closed."""
        if self._closed:
            return False
        self._closed = True
        subscriptions, self._subscriptions = self._subscriptions, []
        readers, self._readers = self._readers, []
        publishers, self._publishers = self._publishers, []
        for sub in subscriptions:
            await sub.close()
        for reader in readers:
            await reader.close()
        for publisher in publishers:
            await publisher.close()
        return True

    async def close(self) -> None:
        await self._close_opened()

    async def unreachable(self, timeout: float = 1.0) -> str | None:
        return None

    def problem(self, topic: str) -> str | None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
