"""An in-process broker with the delivery semantics the product relies on.

For fast contract tests and for `toolservice_base.testing.ServiceHarness`, so
a tool-service author can test a service through the real request path with
no broker. What it keeps of Pulsar's semantics, and nothing more:

- a Shared subscription splits messages over its consumers, round robin;
- every other subscription is exclusive: its one consumer gets every message;
- each subscription of a topic gets its own copy of every message;
- non-persistent topics keep nothing for a subscription with no consumer (and
  a closed subscription is gone); persistent topics keep a durable
  subscription's backlog until a consumer comes back;
- each consumer receives in order, one message at a time, on its own task (an
  inline handler on a later turn of the loop, with no task);
- what a closing consumer had not finished handling goes back to its
  subscription on a persistent topic (Pulsar redelivers what was never
  acknowledged), and is lost on a non-persistent one, as on Pulsar.

Replicated state needs two more things, kept as Apache Pulsar does them:

- a persistent topic keeps every message (as a namespace with unlimited
  retention does) for `Reader`s, which start at the earliest message, at the
  last one (inclusive), or after (or at) a message id; a reader of a
  non-persistent topic sees only what is sent after it opened;
- exclusive publishers: `exclusive` fails at once on a held topic, `wait`
  queues until the holder (and every shared publisher) closes, first come
  first served, `fence` takes the topic at once, fails the queued waiters
  and fences the holder, whose every later send raises `Fenced`. One
  difference, on purpose: on Apache Pulsar a fenced `wait` publisher queues
  again (its sends time out) rather than failing; here it fails like the
  others. Nothing in the product writes through a `wait` publisher.

`drop` makes it lose that share of deliveries at random, to test what the
product does when a non-persistent message is lost.

A `MemoryBroker` is found by name through a `memory://<name>` URL, so a
process's components find it exactly as they find a real broker.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import weakref
from collections import deque
from typing import Unpack

from ..brokers import MEMORY
from ..errors import Fenced, MessageTooLarge, ProducerBusy, TransportClosed
from ..logs import get_logger
from ..topics import Topics
from .base import (
    MESSAGE_LIMIT,
    Capabilities,
    Envelope,
    ExclusiveMode,
    FailureHook,
    Handler,
    InlineHandler,
    OpenedResources,
    Payload,
    ReaderStart,
    SubscribeOptions,
    SubscriptionOptions,
    encode,
    unique_name,
)
from .memory_reader import MemoryReader, message_id_of

log = get_logger("toolservice_base.transport")

SCHEME = "memory://"
_brokers: weakref.WeakValueDictionary[str, "MemoryBroker"] = weakref.WeakValueDictionary()
_names = itertools.count(1)


class _Consumer:
    def __init__(self, sub: "_Sub", handler: Handler | InlineHandler, topic: str, inline: bool = False) -> None:
        self.sub = sub
        self.topic = topic
        self._handler = handler
        self._inbox: asyncio.Queue[Envelope] = asyncio.Queue()
        self._handling: Envelope | None = None
        self._loop = asyncio.get_running_loop()
        self._inline: deque[Envelope] | None = deque() if inline else None
        self._drain_due = False
        self._closed = False
        self._task = None if inline else asyncio.create_task(self._run(), name=f"memory-receive:{topic}")

    def deliver(self, envelope: Envelope) -> None:
        if self._inline is None:
            self._inbox.put_nowait(envelope)
            return
        self._inline.append(envelope)  # handled on a later turn of the loop, as a broker's message would be
        if not self._drain_due:
            self._drain_due = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """An inline handler's messages, in order, each as it came (see `Transport.subscribe`)."""
        self._drain_due = False
        pending = self._inline
        assert pending is not None
        while pending and not self._closed:
            envelope = pending.popleft()
            try:
                self._handler(envelope)
            except Exception:
                log.exception("consumer.handler_failed", topic=self.topic)

    async def _run(self) -> None:
        while True:
            self._handling = await self._inbox.get()
            try:
                await self._handler(self._handling)  # type: ignore[misc]  # not inline: a Handler
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer.handler_failed", topic=self.topic)
            self._handling = None

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self.sub.detach(self)
        if not self.sub.topic.persistent or not self.sub.shared:
            return  # what it had not finished is lost, as on Pulsar; an exclusive subscription is gone
        if self._handling is not None:
            self.sub.offer(self._handling, drop=0.0)
        while not self._inbox.empty():
            self.sub.offer(self._inbox.get_nowait(), drop=0.0)
        while self._inline:
            self.sub.offer(self._inline.popleft(), drop=0.0)


class _Sub:
    """One named subscription of a topic: its consumers, and a backlog while it has none (persistent only)."""

    def __init__(self, topic: "_Topic", name: str, shared: bool) -> None:
        self.topic = topic
        self.name = name
        self.shared = shared
        self.consumers: list[_Consumer] = []
        self.backlog: deque[Envelope] = deque()
        self._next = 0

    def offer(self, envelope: Envelope, drop: float) -> None:
        if not self.consumers:
            if self.topic.persistent:
                self.backlog.append(envelope)
            return
        if drop and random.random() < drop:
            return
        consumer = self.consumers[self._next % len(self.consumers)]
        self._next += 1
        consumer.deliver(envelope)

    def attach(self, consumer: _Consumer) -> None:
        self.consumers.append(consumer)
        while self.backlog:
            consumer.deliver(self.backlog.popleft())

    def detach(self, consumer: _Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        # Pulsar ends a non-persistent subscription with its last consumer; an exclusive one we delete on close
        # (`Transport.unsubscribe`). A shared subscription of a persistent topic keeps a backlog for the next.
        if not self.consumers and (not self.topic.persistent or not self.shared):
            self.topic.subs.pop(self.name, None)


class _Topic:
    def __init__(self, name: str) -> None:
        self.name = name
        self.persistent = name.startswith("persistent://")
        self.subs: dict[str, _Sub] = {}
        self.log: list[Envelope] = []
        """Every message, for readers (persistent topics only; as with unlimited retention)."""
        self.sent = 0
        self.readers: set[MemoryReader] = set()
        self.shared: set[MemoryPublisher] = set()
        self.holder: MemoryExclusivePublisher | None = None
        self.waiting: deque[tuple[MemoryExclusivePublisher, asyncio.Future[None]]] = deque()

    def append(self, data: bytes, properties: dict[str, str], producer: str) -> bytes:
        """Keep the message for readers and wake them; its id."""
        index = self.sent
        self.sent += 1
        message_id = message_id_of(index)
        envelope = Envelope(data, dict(properties), self.name, message_id, producer)
        if self.persistent:
            self.log.append(envelope)
        for reader in self.readers:
            reader.offer(envelope)
        return message_id

    def acquire(self, publisher: "MemoryExclusivePublisher") -> asyncio.Future[None] | None:
        """Take the topic the publisher's way: None once it holds it, or the future a `wait` publisher awaits."""
        busy = self.holder is not None or bool(self.shared)
        if publisher.mode == "fence":
            for _, queued in self.waiting:
                if not queued.done():
                    queued.set_exception(ProducerBusy(f"{self.name} was taken over by a fencing producer; wait again"))
            self.waiting.clear()
            if self.holder is not None:
                self.holder.fence()
            self.holder = publisher
            return None
        if busy or self.waiting:
            if publisher.mode == "exclusive":
                raise ProducerBusy(
                    f"{self.name} is held by another exclusive producer; try again later, or wait for it"
                )
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiting.append((publisher, granted))
            return granted
        self.holder = publisher
        return None

    def release(self, publisher: "MemoryExclusivePublisher | MemoryPublisher") -> None:
        """A publisher closed: if the topic is free now, the first waiter still waiting gets it."""
        if publisher is self.holder:
            self.holder = None
        self.shared.discard(publisher)
        while self.holder is None and not self.shared and self.waiting:
            waiter, granted = self.waiting.popleft()
            if not granted.done():
                self.holder = waiter
                granted.set_result(None)

    def withdraw(self, publisher: "MemoryExclusivePublisher") -> None:
        """A `wait` whose caller gave up: out of the queue, or, if already granted, released."""
        self.waiting = deque((w, f) for w, f in self.waiting if w is not publisher)
        self.release(publisher)


class MemoryBroker:
    """Topics and subscriptions in this process; `transport()` opens a client on it."""

    def __init__(self, name: str | None = None, *, drop: float = 0.0) -> None:
        self.name = name or f"broker-{next(_names)}"
        if not 0.0 <= drop < 1.0:
            raise ValueError(f"drop must be in [0, 1), got {drop}")
        self.drop = drop
        self._topics: dict[str, _Topic] = {}
        self.sent = 0
        _brokers[self.name] = self

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.name}"

    @classmethod
    def named(cls, url: str) -> "MemoryBroker":
        name = url[len(SCHEME) :] if url.startswith(SCHEME) else url
        broker = _brokers.get(name)
        if broker is None:
            raise TransportClosed(f"no in-memory broker named {name!r} in this process; create a MemoryBroker first")
        return broker

    def transport(self, topics: Topics | None = None) -> "MemoryTransport":
        return MemoryTransport(self, topics or Topics())

    def _topic(self, name: str) -> _Topic:
        topic = self._topics.get(name)
        if topic is None:
            topic = self._topics[name] = _Topic(name)
        return topic

    def publish(self, topic: str, data: bytes, properties: dict[str, str], producer: str = "") -> bytes:
        """Deliver to every subscription and reader; the message's id. `producer`: the sending publisher's name."""
        self.sent += 1
        target = self._topics.get(topic)
        if target is None:
            if not topic.startswith("persistent://"):
                return message_id_of(0)  # nobody could read it: a non-persistent topic keeps nothing
            target = self._topic(topic)
        message_id = target.append(data, properties, producer)
        envelope = Envelope(data, dict(properties), topic, producer=producer)
        for sub in list(target.subs.values()):
            sub.offer(envelope, self.drop)
        return message_id

    def attach(
        self, topic: str, name: str, shared: bool, handler: Handler | InlineHandler, inline: bool = False
    ) -> _Consumer:
        target = self._topic(topic)
        sub = target.subs.get(name)
        if sub is None:
            sub = target.subs[name] = _Sub(target, name, shared)
        elif not shared or not sub.shared:
            if sub.consumers:
                raise TransportClosed(f"subscription {name!r} on {topic} already has a consumer (exclusive)")
        consumer = _Consumer(sub, handler, topic, inline)
        sub.attach(consumer)
        return consumer


def _sized(payload: Payload, topic: str) -> bytes:
    """The message's bytes; refused as Pulsar's broker refuses one over its limit."""
    data = encode(payload)
    if len(data) > MESSAGE_LIMIT:
        raise MessageTooLarge(
            f"the in-memory broker refused a {len(data)}-byte message on {topic} as too large; send less at once"
        )
    return data


class MemoryPublisher:
    def __init__(self, broker: MemoryBroker, topic: str) -> None:
        self._broker = broker
        self.topic = topic
        self.name = f"{broker.name}-producer-{next(_names)}"
        self._closed = False
        self._topic = broker._topic(topic)
        self._topic.shared.add(self)

    async def send(
        self,
        payload: Payload,
        properties: dict[str, str] | None = None,
        *,
        key: str | None = None,
        confirm: bool = True,
        on_failure: FailureHook | None = None,
    ) -> None:
        """`key` changes nothing here: the in-memory broker has one partition and no `Key_Shared` subscriptions.
        Every send is delivered or refused at once, so `confirm` changes nothing and `on_failure` is never called."""
        if self._closed:
            raise TransportClosed(f"the producer on {self.topic} is closed")
        if self._topic.holder is not None:
            raise ProducerBusy(f"{self.topic} is held by an exclusive producer; only it may send there")
        data = _sized(payload, self.topic)
        self._broker.publish(self.topic, data, properties or {}, self.name)

    @property
    def connected(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._topic.release(self)


class MemoryExclusivePublisher:
    """Holds its topic alone, the way its `mode` took it (see the module docstring)."""

    def __init__(self, broker: MemoryBroker, topic: str, mode: ExclusiveMode) -> None:
        self._broker = broker
        self.topic = topic
        self.name = f"{broker.name}-producer-{next(_names)}"
        self.mode = mode
        self._topic = broker._topic(topic)
        self._closed = False
        self._fenced = False

    def fence(self) -> None:
        self._fenced = True

    async def send(self, payload: Payload, properties: dict[str, str] | None = None) -> bytes:
        await asyncio.sleep(
            0
        )  # a round trip to a broker lets others run: a loop of sends must not starve the event loop
        if self._closed:
            raise TransportClosed(f"the producer on {self.topic} is closed")
        if self._fenced:
            raise Fenced(
                f"another replica took {self.topic} over (this producer was fenced); it never writes there again: step"
                " down to standby"
            )
        data = _sized(payload, self.topic)
        return self._broker.publish(self.topic, data, properties or {}, self.name)

    @property
    def connected(self) -> bool:
        return not self._closed and not self._fenced

    @property
    def fenced(self) -> bool:
        return self._fenced

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._topic.release(self)


class MemorySubscription:
    def __init__(self, consumer: _Consumer) -> None:
        self._consumer = consumer
        self.topic = consumer.topic
        self._closed = False

    @property
    def connected(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        self._closed = True
        await self._consumer.close()


class MemoryTransport(OpenedResources):
    """The `Transport` of a `MemoryBroker`: same calls, same close order, no I/O."""

    def __init__(self, broker: MemoryBroker, topics: Topics) -> None:
        super().__init__()
        self._broker = broker
        self.url = broker.url
        self.topics = topics

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities.for_broker(MEMORY)

    async def publisher(self, topic: str) -> MemoryPublisher:
        self._check_open()
        publisher = MemoryPublisher(self._broker, topic)
        self._publishers.append(publisher)
        return publisher

    async def exclusive_publisher(self, topic: str, mode: ExclusiveMode) -> MemoryExclusivePublisher:
        self._check_open()
        if mode not in ("exclusive", "wait", "fence"):
            raise ValueError(f"unknown exclusive mode {mode!r}; expected exclusive, wait or fence")
        publisher = MemoryExclusivePublisher(self._broker, topic, mode)
        target = self._broker._topic(topic)
        granted = target.acquire(publisher)
        if granted is not None:
            try:
                await granted
            except BaseException:
                target.withdraw(publisher)
                raise
        self._publishers.append(publisher)
        return publisher

    async def reader(self, topic: str, start: ReaderStart, *, inclusive: bool = False) -> MemoryReader:
        self._check_open()
        reader = MemoryReader(self._broker._topic(topic), start, inclusive)
        self._readers.append(reader)
        return reader

    async def subscribe(
        self, topic: str, handler: Handler | InlineHandler, **options: Unpack[SubscribeOptions]
    ) -> MemorySubscription:
        """`bulk`, `receiver_queue` and `linger` change nothing here: a message costs no wake-up of a thread, and
        every one is whole in memory."""
        self._check_open()
        how = SubscriptionOptions.of(options)
        name = how.subscription or unique_name("sub")
        consumer = self._broker.attach(topic, name, how.shared, handler, how.inline)
        sub = MemorySubscription(consumer)
        self._subscriptions.append(sub)
        return sub
