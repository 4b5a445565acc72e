"""One simulated replica: the real `ReplicaCore` driven as `Election`, `ReplicatedLog`, `Membership` and the store
service drive it, against the model broker, on the world's virtual clock.

The drivers here decide nothing: each step asks the core and carries out
what it answers, in the order the product's drivers do (take the lock, read
the markers, write ours, open the log's writer, read the log to its end,
then serve; confirm the lock before each answer; append before each
acknowledgement; on stepping down, start a new generation from the log).
The store is a versioned map of keys, each write one log entry.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from discovery.replicas.core import (
    Acknowledge,
    Append,
    Apply,
    Confirmed,
    Heard,
    NotHolding,
    Promotion,
    ReadMarkers,
    ReplicaCore,
    StandbyLook,
    StepDown,
    Stop,
    TryLock,
    WriteMarker,
    WriteSnapshot,
)
from discovery.replicas.groupkey import GroupKey
from discovery.replicas.records import sign

from .broker import Producer, Record

if TYPE_CHECKING:
    from .world import Request, World

CHECK_INTERVAL = 0.2
STATUS_INTERVAL = 1.0
EXPIRE_AFTER = 3.5
POLL = 0.1
TAKEOVER_AFTER = 3.0
LOST_LOCK_GRACE = 2.0
APPEND_TIMEOUT = 1.0
RETRY_DELAY = 0.5


_encode = json.JSONEncoder(separators=(",", ":")).encode
"""One encoder for every record (`json.dumps` with separators builds a new one per call)."""


def record(key: GroupKey | None, kind: str, topic: str, body: dict[str, Any], producer: str) -> Record:
    """A record as a replica writes it: its body's JSON, signed once here (`records.sign`, the product's own)."""
    data = _encode(body).encode()
    return Record(data, sign(key, kind, topic, data), producer, body)


@dataclass
class Store:
    """A generation's state: the items, the version, and which requests made which version."""

    items: dict[str, str] = field(default_factory=dict)
    made: dict[str, int] = field(default_factory=dict)


class SimReplica:
    def __init__(self, world: World, name: str, key: GroupKey | None, *, group: bool = True) -> None:
        self.world = world
        self.name = name
        self.key = key
        self.group = group
        """False: started with a key that is not the group's (it must never become active)."""
        self.alive = False
        self.frozen = False
        self.generation = 0
        self.rate = 1.0
        self.offset = 0.0
        self.core = ReplicaCore(name)
        self.store = Store()
        self.lock: Producer | None = None
        self.waiter: Producer | None = None
        self.writer: Producer | None = None
        self.serving = False
        self.log_at = 0
        self.markers_at = 0
        self.snapshot_position = -1
        """Where the restored snapshot's own entry sits in the log (-1: none restored this generation)."""
        self.queue: list[Request] = []
        self.busy = False
        self.active_at: dict[str, float] = {}
        self.any_active_at: float | None = None
        self.echo_at: float | None = None
        self.hearing_since: float | None = None
        self.claims: dict[str, tuple[int, float]] = {}
        self.stopped: str | None = None
        self.promotions: list[tuple[float, int]] = []

    # --- the clock and the process -------------------------------------------------------------

    def clock(self) -> float:
        return self.offset + self.world.now * self.rate

    def later(self, delay: float, step: Any, *args: Any) -> None:
        """`World.later` for this replica's own steps (they die with its generation, wait out its freeze)."""
        world = self.world
        at = world.now + delay if delay > 0.0 else world.now
        heapq.heappush(world._heap, (at, next(world._seq), self, self.generation, step, args))

    def start(self) -> None:
        """A new generation: restore from the log alone, then compete (as `ReplicatedStore._generation`)."""
        if self.stopped is not None or not self.alive:
            return
        self.generation += 1
        self.core = ReplicaCore(
            self.name,
            lock_topic="lock",
            log_topic="log",
            takeover_after=TAKEOVER_AFTER,
            lost_lock_grace=LOST_LOCK_GRACE,
            key=self.key,
            now=self.clock(),
        )
        self.store, self.log_at, self.markers_at, self.snapshot_position = Store(), 0, 0, -1
        self.lock = self.waiter = self.writer = None
        self.serving, self.queue, self.busy = False, [], False
        self.active_at, self.any_active_at, self.echo_at, self.claims = {}, None, None, {}
        self.hearing_since = None
        if not self.world.reaches(self, "in"):
            self.later(RETRY_DELAY, self.start)
            return
        self.restore()
        self.read_log()
        self.read_markers()
        self.later(0.0, self.publish)
        self.later(POLL, self.tail)
        decision = self.core.first_attempt()
        if isinstance(decision, Stop):
            return self.stop(decision.reason)
        lock = self.open_lock("exclusive")
        if lock is not None:
            return self.serve(lock, "exclusive")
        self.acquire()

    def stop(self, reason: str) -> None:
        """Stopped for good (the process exits 1, its one line `reason`)."""
        self.stopped = reason
        self.world.event(self, f"stopped: {reason}")
        self.release_all()
        self.alive = False
        self.generation += 1

    def release_all(self) -> None:
        broker = self.world.broker
        for producer in (self.lock, self.waiter, self.writer):
            if producer is not None:
                broker.close(producer)
        self.lock = self.waiter = self.writer = None
        self.unsubscribe()

    def unsubscribe(self) -> None:
        self.serving = False
        if self.name in self.world.broker.consumers:
            self.world.broker.consumers.remove(self.name)
        pending, self.queue = self.queue, []
        for request in pending:
            self.world.redeliver(request)

    # --- reading the state topics --------------------------------------------------------------

    def restore(self) -> None:
        snapshots = self.world.broker.topics["snapshots"]
        if not snapshots:
            return
        last = snapshots[-1]
        seen = last.authenticated(self.key, "manifest", "snapshots")
        self.core.saw(seen, "snapshots")
        if not seen.accepted:
            return
        body = last.body
        self.store = Store(dict(body["items"]), dict(body["made"]))
        self.core.restored(body["version"], b"at", seen.key_id)
        self.log_at = body["position"]
        self.snapshot_position = body["position"]

    def read_log(self) -> None:
        """Read the log to its end (when this replica can hear the broker): apply what the core says."""
        log, decide, core, key = self.world.broker.topics["log"], self.world.variants.entry, self.core, self.key
        while self.log_at < len(log):
            entry = log[self.log_at]
            at_snapshot = self.log_at == self.snapshot_position
            self.log_at += 1
            seen = entry.authenticated(key, "entry", "log")
            core.saw(seen, "log")
            body = entry.body
            decision = decide(self, seen, body, at_snapshot)
            if isinstance(decision, Apply):
                self.apply(body)
            elif isinstance(decision, Stop):
                return self.stop(decision.reason)

    def apply(self, body: dict[str, Any]) -> None:
        for key, value in body["puts"]:
            self.store.items[key] = value
        for key in body["deletes"]:
            self.store.items.pop(key, None)
        if body.get("request"):
            self.store.made[body["request"]] = body["version"]
        self.core.applied(body["version"])

    def read_markers(self) -> None:
        markers = self.world.broker.topics["markers"]
        while self.markers_at < len(markers):
            marker = markers[self.markers_at]
            self.markers_at += 1
            seen = marker.authenticated(self.key, "marker", "lock")
            self.core.saw(seen, "lock")
            if seen.accepted and isinstance(marker.body.get("term"), int):
                self.core.on_marker(str(marker.body.get("replica")), marker.body["term"])
        self.core.on_markers_read(self.clock())

    def tail(self) -> None:
        if self.world.reaches(self, "in"):
            self.read_log()
        if self.alive and self.stopped is None:
            self.later(POLL, self.tail)

    # --- statuses ------------------------------------------------------------------------

    def publish(self) -> None:
        body = {"id": self.name, "role": self.core.role, "term": self.core.term, "version": self.core.version}
        status = record(self.key, "status", "members", body, self.name)
        self.world.broadcast(self, status)
        self.later(STATUS_INTERVAL, self.publish)

    def heard(self, status: Record) -> None:
        seen = status.authenticated(self.key, "status", "members")
        if not seen.accepted:
            return
        body, now = status.body, self.clock()
        if body.get("id") == self.name:
            if self.echo_at is None or now - self.echo_at > 1.5 * STATUS_INTERVAL:
                self.hearing_since = now
            self.echo_at = now
        elif body.get("role") == "active":
            self.active_at[str(body["id"])] = self.any_active_at = now
            self.claims[str(body["id"])] = (int(body.get("term", 0)), now)

    def view(self) -> Heard:
        now = self.clock()
        live = [(term, rid) for rid, (term, at) in self.claims.items() if now - at < EXPIRE_AFTER]
        claim = max(live, default=None)
        claimed = None if claim is None else (claim[1], claim[0])
        return Heard(self.active_at, self.any_active_at, self.echo_at, claimed, self.hearing_since)

    # --- the election --------------------------------------------------------------------

    def open_lock(self, mode: str) -> Producer | None:
        if not (self.world.reaches(self, "out") and self.world.reaches(self, "in")):
            return None
        granted = self.world.broker.open(self.name, "lock", mode, self.world.granted(self, self.generation))
        return granted

    def acquire(self) -> None:
        self.core.waiting(self.world.rng.random())
        if not self.wait():
            self.later(CHECK_INTERVAL, self.look)

    def wait(self) -> bool:
        """Queue for the lock; whether it was free (then this replica serves at once)."""
        self.waiter = self.world.broker.open(self.name, "lock", "wait", self.world.granted(self, self.generation))
        if self.waiter is None:
            return False
        lock, self.waiter = self.waiter, None
        self.serve(lock, "wait")
        return True

    def granted(self, lock: Producer | None) -> None:
        if lock is None:  # a fence failed the wait (`ProducerBusy`): it waits again at once, as `Election` does
            if self.core.role == "standby" and self.lock is None:
                self.wait()
            return
        if self.core.role != "standby" or self.lock is not None:
            self.world.broker.close(lock)
            return
        self.waiter = None
        self.serve(lock, "wait")

    def look(self) -> None:
        if self.core.role != "standby" or self.lock is not None:
            return
        look = StandbyLook(lambda: self.world.variants.standby_look(self))
        for _ in look:  # the core asked for the markers first: `Election`'s order, from the same place
            if self.world.reaches(self, "in"):
                self.read_markers()
            else:
                self.core.on_markers_read(self.clock())
        decision = look.decision
        if isinstance(decision, Stop):
            return self.stop(decision.reason)
        if isinstance(decision, TryLock):
            holding = self.world.broker.exclusive["lock"].holder
            holder = holding.client if holding is not None else None
            lock = self.open_lock("fence")
            if lock is not None:
                self.world.event(self, f"fenced the lock from {holder} (its markers named {self.core.holder})")
                held_by = next((r for r in self.world.replicas if r.name == holder), None)
                since = held_by.promotions[-1][0] if held_by is not None and held_by.core.role == "active" else None
                self.world.fences.append((self.world.now, self.name, holder, since))
                if self.waiter is not None:
                    self.world.broker.close(self.waiter)
                    self.waiter = None
                return self.serve(lock, "fence")
        self.later(CHECK_INTERVAL, self.look)

    def serve(self, lock: Producer, mode: str) -> None:
        promotion = Promotion(self.core, mode)  # type: ignore[arg-type]
        for step in promotion:
            if isinstance(step, ReadMarkers):
                self.read_markers()
                continue
            body = {"term": step.term, "replica": self.name, "mode": mode}
            sent = self.world.broker.send(lock, record(self.key, "marker", "lock", body, self.name))
            if isinstance(sent, str):
                promotion.failed()
                self.world.broker.close(lock)
                self.later(RETRY_DELAY, self.acquire)
                return
        if promotion.stop is not None:
            self.world.broker.close(lock)
            return self.stop(promotion.stop.reason)
        self.lock = lock
        term = promotion.promoted(self.clock()).term
        self.world.promoted(self, term)
        self.writer = self.world.broker.open(self.name, "log", "fence", lambda _: None)
        self.read_log()
        if self.core.role != "active":
            return
        if isinstance(self.core.on_caught_up(self.key.signing if self.key else None), WriteSnapshot):
            self.write_snapshot()
        self.serving = True
        self.world.broker.consumers.append(self.name)
        self.later(CHECK_INTERVAL, self.hold)

    def hold(self) -> None:
        if self.core.role != "active" or self.lock is None:
            return
        connected = not self.lock.closed and self.world.reaches(self, "in") and self.world.reaches(self, "out")
        claim = self.view().claim
        decision = self.world.variants.active_look(self, connected, claim)
        if isinstance(decision, StepDown):
            return self.step_down(decision.reason)
        if isinstance(decision, ReadMarkers) and self.world.reaches(self, "in"):
            self.read_markers()
        self.later(CHECK_INTERVAL, self.hold)

    def step_down(self, reason: str) -> None:
        """Revoke first, then the rest; then a new generation from the log (its state dropped)."""
        self.world.event(self, f"stepped down: {reason}")
        broker = self.world.broker
        holding = self.lock is not None and broker.holds(self.lock)
        writing = self.writer is not None and broker.holds(self.writer)
        self.world.stepdowns.append((self.world.now, self.name, holding and writing, reason))
        self.unsubscribe()
        self.core.stepped_down(self.clock())
        self.release_all()
        self.generation += 1
        self.world.later(0.05, self.start, owner=self, generation=self.generation)

    def write_snapshot(self) -> None:
        body = {
            "version": self.core.version,
            "position": self.log_at,
            "items": dict(self.store.items),
            "made": dict(self.store.made),
        }
        self.world.broker.topics["snapshots"].append(record(self.key, "manifest", "snapshots", body, self.name))
        self.core.snapshot_written(self.key.signing if self.key else None)

    # --- serving requests (the store service) ------------------------------------------------------

    def deliver(self, request: Request) -> None:
        self.queue.append(request)
        if not self.busy:
            self.next_request()

    def next_request(self) -> None:
        if not self.queue or not self.serving:
            self.busy = False
            return
        self.busy = True
        request = self.queue.pop(0)
        decision = self.world.variants.confirm(self)
        if isinstance(decision, WriteMarker):
            started = self.clock()
            sent: int | str = "the broker did not take a marker within the grace"
            if self.world.reaches(self, "out") and self.lock is not None and self.world.reaches(self, "in"):
                body = {"term": decision.term, "replica": self.name, "held": True}
                sent = self.world.broker.send(self.lock, record(self.key, "marker", "lock", body, self.name))
            decision = self.core.on_held(started, sent if isinstance(sent, str) else None)
        if isinstance(decision, NotHolding):
            self.answer(request, error=decision.reason)
            return
        assert isinstance(decision, Confirmed)
        self.execute(request)

    def execute(self, request: Request) -> None:
        if request.op == "read":
            values = {key: self.store.items.get(key) for key in request.keys}
            return self.answer(request, version=self.core.version, values=values)
        if request.id in self.store.made:
            return self.answer(request, version=self.store.made[request.id])
        for key, value in request.expect:
            if self.store.items.get(key) != value:
                return self.answer(request, error="conflict", conflict=True)
        changed = [(k, v) for k, v in request.puts if self.store.items.get(k) != v]
        deleted = [k for k in request.deletes if k in self.store.items]
        moved = self.core.version + 1 if changed or deleted else None
        body: dict[str, Any] = {"version": moved, "previous": self.core.version, "term": self.core.term}
        body |= {"puts": changed, "deletes": deleted, "request": request.id}
        decision = self.world.variants.executed(self, request, moved)
        if isinstance(decision, Acknowledge):
            if moved is not None:  # applied without a log entry (a bad variant): the state moves all the same
                self.apply(body)
            return self.answer(request, version=decision.version if moved is None else moved)
        if isinstance(decision, NotHolding):
            return self.answer(request, error=decision.reason)
        assert isinstance(decision, Append)
        self.append(request, body)

    def append(self, request: Request, body: dict[str, Any]) -> None:
        sent: int | str = "no receipt"
        if self.writer is not None and self.world.reaches(self, "out"):
            sent = self.world.broker.send(self.writer, record(self.key, "entry", "log", body, self.name))
        receipt = isinstance(sent, int) and self.world.reaches(self, "in") and not self.world.receipt_lost()
        if receipt:
            self.later(self.world.delay(), self.appended, request, body, None)
        else:
            why = sent if isinstance(sent, str) else "no receipt"
            self.later(APPEND_TIMEOUT if why == "no receipt" else self.world.delay(), self.appended, request, body, why)

    def appended(self, request: Request, body: dict[str, Any], why: str | None) -> None:
        decision = self.core.on_appended(body["version"], why)
        if isinstance(decision, Acknowledge):
            if body["version"] > self.core.version:  # unless the tail already read it back
                self.apply(body)
            return self.answer(request, version=decision.version)
        self.answer(request, error=decision.reason, unknown=True)

    def answer(self, request: Request, **outcome: Any) -> None:
        self.world.answered(self, request, **outcome)
        self.next_request()
