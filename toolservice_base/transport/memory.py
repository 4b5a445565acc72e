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
- each consumer receives in order, one message at a time, on its own task;
- what a closing consumer had not finished handling goes back to its
  subscription on a persistent topic (Pulsar redelivers what was never
  acknowledged), and is lost on a non-persistent one, as on Pulsar.

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

from ..errors import MessageTooLarge, TransportClosed
from ..logs import get_logger
from ..topics import Topics
from .base import MESSAGE_LIMIT, Capabilities, Envelope, Handler, OpenedResources, Payload, encode, unique_name

log = get_logger("toolservice_base.transport")

SCHEME = "memory://"
_brokers: weakref.WeakValueDictionary[str, "MemoryBroker"] = weakref.WeakValueDictionary()
_names = itertools.count(1)


class _Consumer:
    def __init__(self, sub: "_Sub", handler: Handler, topic: str) -> None:
        self.sub = sub
        self.topic = topic
        self._handler = handler
        self._inbox: asyncio.Queue[Envelope] = asyncio.Queue()
        self._handling: Envelope | None = None
        self._task = asyncio.create_task(self._run(), name=f"memory-receive:{topic}")

    def deliver(self, envelope: Envelope) -> None:
        self._inbox.put_nowait(envelope)

    async def _run(self) -> None:
        while True:
            self._handling = await self._inbox.get()
            try:
                await self._handler(self._handling)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("consumer.handler_failed", topic=self.topic)
            self._handling = None

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        self.sub.detach(self)
        if not self.sub.topic.persistent:
            return  # what it had not finished is lost, as on Pulsar
        if self._handling is not None:
            self.sub.offer(self._handling, drop=0.0)
        while not self._inbox.empty():
            self.sub.offer(self._inbox.get_nowait(), drop=0.0)


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
        if not self.consumers and not self.topic.persistent:
            self.topic.subs.pop(self.name, None)


class _Topic:
    def __init__(self, name: str) -> None:
        self.name = name
        self.persistent = name.startswith("persistent://")
        self.subs: dict[str, _Sub] = {}


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

    def publish(self, topic: str, data: bytes, properties: dict[str, str]) -> None:
        self.sent += 1
        target = self._topics.get(topic)
        if target is None:
            return
        envelope = Envelope(data, dict(properties), topic)
        for sub in list(target.subs.values()):
            sub.offer(envelope, self.drop)

    def attach(self, topic: str, name: str, shared: bool, handler: Handler) -> _Consumer:
        target = self._topic(topic)
        sub = target.subs.get(name)
        if sub is None:
            sub = target.subs[name] = _Sub(target, name, shared)
        elif not shared or not sub.shared:
            if sub.consumers:
                raise TransportClosed(f"subscription {name!r} on {topic} already has a consumer (exclusive)")
        consumer = _Consumer(sub, handler, topic)
        sub.attach(consumer)
        return consumer


class MemoryPublisher:
    def __init__(self, broker: MemoryBroker, topic: str) -> None:
        self._broker = broker
        self.topic = topic
        self._closed = False

    async def send(self, payload: Payload, properties: dict[str, str] | None = None) -> None:
        if self._closed:
            raise TransportClosed(f"the producer on {self.topic} is closed")
        data = encode(payload)
        if len(data) > MESSAGE_LIMIT:
            raise MessageTooLarge(f"the in-memory broker refused a {len(data)}-byte message on {self.topic} as too large; send less at once")
        self._broker.publish(self.topic, data, properties or {})

    @property
    def connected(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        self._closed = True


class MemorySubscription:
    def __init__(self, consumer: _Consumer) -> None:
        self._consumer = consumer
        self.topic = consumer.topic

    async def close(self) -> None:
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
        return Capabilities()

    async def publisher(self, topic: str) -> MemoryPublisher:
        self._check_open()
        publisher = MemoryPublisher(self._broker, topic)
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
    ) -> MemorySubscription:
        self._check_open()
        consumer = self._broker.attach(topic, subscription or unique_name("sub"), shared, handler)
        sub = MemorySubscription(consumer)
        self._subscriptions.append(sub)
        return sub
