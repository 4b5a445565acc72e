"""What Apache Pulsar does that the replica group's rules depend on, as a model a simulated clock drives.

Each rule here is one the group relies on, and each is held to the real
broker by a test on the run's Apache Pulsar that fails if the broker does
otherwise (`tests/transport/test_exclusive_and_readers.py` and
`tests/simulation/test_broker_model.py`):

- **the lock** (an exclusive producer): `exclusive` is granted only while
  nobody holds it; `wait` queues and is granted once the holder closes or
  its connection dies; `fence` is granted at once, fails the waiters queued
  behind the holder (they wait again), and the holder it displaced is
  fenced: every later send of its fails, but an idle fenced producer is not
  told (it stays "connected" until it sends);
- **the log's writer** is the same kind of producer, opened in `fence` mode;
- **persistent topics** (markers, log, snapshots) keep every record in the
  order the broker took it, and a reader from a position reads them in that
  order; a send is persisted before its receipt, and a receipt may be lost
  (the send then times out: it may or may not be in the log);
- **the shared subscription** of the config queue hands each request to one
  consumer; one a consumer did not finish before it closed goes to another
  consumer (delivered again);
- **non-persistent statuses** reach whoever listens, or are lost;
- **connections**: a client cut off from the broker is dropped after the
  keep-alive, which releases what it held (its lock goes to the next in line).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from discovery.replicas.core import Seen, authenticate
from discovery.replicas.groupkey import GroupKey

KEEPALIVE = 1.5
"""Seconds after which the broker drops a client it no longer hears (its producers and consumers go)."""


@dataclass(eq=False, slots=True)
class Record:
    """A message on a persistent topic: its JSON body as bytes, its properties (the MAC), who sent it.

    Written once and never changed (a replayed record is a copy), so the verdict of the real rule
    (`core.keys.authenticate`) on it under one key is the same at every read: `seen` keeps it, by key, and a record
    read by three replicas over several generations is checked once per key instead of at every read."""

    data: bytes
    properties: dict[str, str]
    producer: str
    body: dict[str, Any] = field(default_factory=dict)
    seen: dict[tuple[int, str], tuple[GroupKey | None, Seen]] = field(default_factory=dict)
    """(id of the reader's key, kind) -> (that key, the verdict): the key is kept so its id is never reused."""

    def authenticated(self, key: GroupKey | None, kind: str, topic: str) -> Seen:
        """The real rule's verdict on this record, read as `kind` from `topic` by a replica holding `key`."""
        cached = self.seen.get((id(key), kind))
        if cached is not None and cached[0] is key:
            return cached[1]
        seen = authenticate(key, self.properties, kind, topic, self.data)
        self.seen[(id(key), kind)] = (key, seen)
        return seen


@dataclass(eq=False)
class Producer:
    """An exclusive producer of one client on one topic (the lock, or the log's writer)."""

    client: str
    topic: str
    mode: str
    fenced: bool = False
    closed: bool = False


@dataclass
class Exclusive:
    """One topic's exclusive producer, and who waits for it."""

    holder: Producer | None = None
    waiting: list[tuple[Producer, Callable[[Producer | None], None]]] = field(default_factory=list)
    """Who waits, and what to call: with the producer once it is theirs, with None if a fence failed the wait."""


class Broker:
    """The broker the simulated replicas and clients share; `links` says who can reach it (set by the world)."""

    def __init__(self) -> None:
        self.topics: dict[str, list[Record]] = {"markers": [], "log": [], "snapshots": []}
        self.exclusive: dict[str, Exclusive] = {"lock": Exclusive(), "log": Exclusive()}
        self.consumers: list[str] = []
        """Clients with a consumer on the config queue, in the order they subscribed."""
        self.dropped: set[str] = set()
        """Clients the broker has dropped (keep-alive) since they last reached it."""

    # --- exclusive producers ----------------------------------------------------------------

    def open(self, client: str, topic: str, mode: str, granted: Callable[[Producer | None], None]) -> Producer | None:
        """Ask for `topic`'s exclusive producer in `mode`; the producer if granted now, None if refused (`exclusive`
        while held) or queued (`wait`: `granted` is called once it is handed over)."""
        slot = self.exclusive[topic]
        producer = Producer(client, topic, mode)
        if slot.holder is None:
            slot.holder = producer
            return producer
        if mode == "fence":
            slot.holder.fenced = True
            slot.holder = producer
            failed, slot.waiting = slot.waiting, []
            for _, refused in failed:
                refused(None)
            return producer
        if mode == "wait":
            slot.waiting.append((producer, granted))
        return None

    def close(self, producer: Producer) -> None:
        """Close a producer (or give up waiting): a lock it held goes to the next in line."""
        producer.closed = True
        slot = self.exclusive[producer.topic]
        slot.waiting = [(p, g) for p, g in slot.waiting if p is not producer]
        if slot.holder is producer:
            slot.holder = None
            self._hand_over(slot)

    def _hand_over(self, slot: Exclusive) -> None:
        while slot.holder is None and slot.waiting:
            producer, granted = slot.waiting.pop(0)
            if not producer.closed:
                slot.holder = producer
                granted(producer)

    def holds(self, producer: Producer) -> bool:
        return self.exclusive[producer.topic].holder is producer and not producer.fenced

    def send(self, producer: Producer, record: Record) -> int | str:
        """Persist `record` through `producer`: its position, or why not (`Fenced`, closed)."""
        if producer.closed:
            return "closed"
        if producer.fenced or not self.holds(producer):
            producer.fenced = True
            return "Fenced"
        topic = self.topics["markers" if producer.topic == "lock" else "log"]
        topic.append(record)
        return len(topic) - 1

    def forge(self, topic: str, record: Record) -> None:
        """A record written by someone allowed to produce there (not a replica): the broker takes it."""
        self.topics[topic].append(record)

    # --- connections --------------------------------------------------------------------------

    def drop(self, client: str) -> list[str]:
        """The client's connection is gone (killed, or not heard for the keep-alive): its producers close, its
        consumer goes; the clients handed a lock because of it."""
        self.dropped.add(client)
        for slot in self.exclusive.values():
            for producer, _ in list(slot.waiting):
                if producer.client == client:
                    self.close(producer)
            if slot.holder is not None and slot.holder.client == client:
                self.close(slot.holder)
        if client in self.consumers:
            self.consumers.remove(client)
        holders = [slot.holder.client for slot in self.exclusive.values() if slot.holder is not None]
        return holders
