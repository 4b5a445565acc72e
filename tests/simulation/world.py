"""A seeded world: a virtual clock, the model broker, replicas running the real core, clients, and faults.

One thread, one heap of timed steps (the clients' timeouts in a queue beside
it, taken in the same order), one `random.Random(seed)`: the same seed
replays the same schedule step by step (`python -m simulation --seed N
--trace`). Faults are drawn from the seed too (`Faults`): kills and
restarts, freezes, partitions both ways and one way, a broker restart, lost
receipts, clock rates, forged and replayed records, a group-key rotation,
a replica with a wrong key or none. Clients put, conditionally put, delete
and read a few keys in an ordinary and a reserved workspace; their history
is what `check` judges. They keep a busy pace from just before each fault
to a little after it ends, and a slow one while nothing is wrong: nearly
all of a schedule's cost is its operations, and the busy ones are where a
bad rule shows (`_pause`).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faults.history import Op

from discovery.replicas.groupkey import GroupKey

from .broker import KEEPALIVE, Broker, Producer, Record
from .replica import SimReplica, record
from .variants import Variants

NET = (0.0003, 0.003)
"""Seconds a message takes through the broker, drawn per message."""
CLIENT_TIMEOUT = 2.0
CLIENTS = 5
BUSY_PAUSE = (0.01, 0.1)
"""Seconds a client waits between operations while the group is disturbed or about to be: where the faults bite."""
QUIET_PAUSE = (0.3, 1.0)
"""Seconds it waits while nothing is wrong nor about to be: enough for the history to show the group serving."""
AFTERMATH = 2.5
"""How long after a fault ends the clients stay busy: the time in which a replica that was frozen or cut off may still
act on what it last knew (where `no-confirm` is caught), and a client's timeout after it."""
LEAD = 0.5
"""How long before a planned fault the clients get busy."""
FAULTS = (
    "kill",
    "freeze",
    "partition",
    "inbound",
    "outbound",
    "broker-restart",
    "receipts",
    "skew",
    "forge",
    "forged-status",
    "replay",
)
"""The kinds of fault a schedule may draw (`rotation` and `wrong-key` are schedules of their own)."""
CUTS = {"partition": frozenset({"in", "out"}), "inbound": frozenset({"in"}), "outbound": frozenset({"out"})}
"""The directions of a replica's link each kind of cut takes down."""


Step = tuple[float, int, "SimReplica | None", int, Callable[..., Any], tuple[Any, ...]]
"""A timed step on the heap: (when, order, the replica it belongs to, its generation, what to call, with what)."""


_NONE: tuple[()] = ()


@dataclass(slots=True)
class Request:
    """A client's request as the config queue carries it; `record` is its operation in the history. Its key lists are
    shared with `record` (neither is changed after), and one it has none of is the empty tuple: two lists fewer to
    build per operation."""

    id: str
    client: int
    op: str
    keys: list[str] | tuple[()] = _NONE
    puts: list[tuple[str, str]] | tuple[()] = _NONE
    deletes: list[str] | tuple[()] = _NONE
    expect: list[tuple[str, str | None]] | tuple[()] = _NONE
    reserved: bool = False
    record: Op | None = None
    done: bool = False


@dataclass
class Faults:
    """What one schedule does to the group, drawn from its seed."""

    kinds: tuple[str, ...]
    rotation: bool = False
    stranger: str | None = None
    """`wrong-key` or `unkeyed`: a replica that is not of the group joins."""

    @property
    def name(self) -> str:
        extra = [k for k, on in (("rotation", self.rotation), (self.stranger or "", bool(self.stranger))) if on]
        return "+".join([*self.kinds, *extra]) or "none"


class World:
    def __init__(self, seed: int, *, seconds: float = 20.0, replicas: int = 3, variant: str | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.seconds = seconds
        self.now = 0.0
        self._heap: list[Step] = []
        self._seq = itertools.count()
        self._timeouts: deque[tuple[float, int, Request]] = deque()
        """The clients' timeouts, due in the order they were set (one length for all): steps of their own, taken in
        turn with the heap's by (when, order), kept off the heap, where they were most of its steps and nearly every
        one found its request answered."""
        self.broker = Broker()
        self.variants = Variants(variant)
        self.trace: list[str] = []
        self.keyed = self.rng.random() < 0.7
        """A group with a key (most), or one the broker's permissions alone protect: a forger's entries are then
        taken (no promise), but a status is still only a hint."""
        self.key: GroupKey | None = GroupKey.generate(self.rng.randbytes(32)) if self.keyed else None
        self.replicas = [SimReplica(self, f"r{n}", self.key) for n in range(replicas)]
        self.down: dict[str, set[str]] = {}
        """Replica -> the directions ('in', 'out') its link to the broker is cut in: the union of its cuts."""
        self._cuts: dict[str, list[frozenset[str]]] = {}
        """Replica -> each cut of its link still on: overlapping faults heal one at a time, each at its own end."""
        self._freezes: dict[str, int] = {}
        """Replica -> how many freezes hold it: it runs again when the last one ends."""
        self._losing = 0
        """How many lost-receipt faults are on."""
        self.lost_receipts = 0.0
        self.ops: list[Op] = []
        self.requests: dict[str, Request] = {}
        self.events: list[tuple[float, str, str]] = []
        self.terms: list[tuple[float, str, int]] = []
        self.fences: list[tuple[float, str, str | None, float | None]] = []
        """(when, who fenced the lock, who held it, since when that one was active: None if it was not)."""
        self.disturbed: list[tuple[float, float, str]] = []
        """(start, end, kind) of every fault but a forged status alone: what may make an active step down."""
        self.forged_statuses: list[float] = []
        self.stepdowns: list[tuple[float, str, bool, str]] = []
        """(when, who, whether it still held the lock and the log's writer at the broker, why) of each step-down."""
        self.unhealthy: dict[str, list[tuple[float, float]]] = {}
        """Replica -> windows in which it was dead, frozen or cut off (what makes a takeover of it justified)."""
        self._parked: dict[str, list[Step]] = {}
        """A frozen replica's steps, run in order once it thaws."""
        self.faults = self.draw_faults()
        self.healed_at = seconds * 0.75
        self.busy_until = 0.0
        """Until when the clients keep the busy pace (`_pause`): a fault and its aftermath."""
        self.planned: list[float] = []
        """When each planned disturbance starts (faults, rotation steps, a stranger's start, the final heal)."""

    # --- the clock ----------------------------------------------------------------------------

    def later(
        self, delay: float, step: Callable[..., Any], *args: Any, owner: SimReplica | None = None, generation: int = 0
    ) -> None:
        """Run `step(*args)` `delay` virtual seconds from now; a replica's steps die with its generation and wait out
        its freeze (`run` judges that as it pops the step: no closure per step)."""
        at = self.now + delay if delay > 0.0 else self.now
        heapq.heappush(self._heap, (at, next(self._seq), owner, generation, step, args))

    def delay(self) -> float:
        return NET[0] + (NET[1] - NET[0]) * self.rng.random()  # `uniform(*NET)`, draw for draw, without its call

    def event(self, replica: SimReplica, what: str) -> None:
        self.events.append((self.now, replica.name, what))
        self.trace.append(f"{self.now:9.4f} {replica.name} {what}")

    # --- links ---------------------------------------------------------------------------------

    def reaches(self, replica: SimReplica, direction: str) -> bool:
        return replica.alive and direction not in self.down.get(replica.name, ())

    def receipt_lost(self) -> bool:
        return self.rng.random() < self.lost_receipts

    def broadcast(self, sender: SimReplica, status: Record) -> None:
        if not self.reaches(sender, "out"):
            return
        for replica in self.replicas:
            if self.reaches(replica, "in"):
                replica.later(self.delay() * 2, self._hear, replica, status)

    @staticmethod
    def _hear(replica: SimReplica, status: Record) -> None:
        if replica.world.reaches(replica, "in"):
            replica.heard(status)

    def granted(self, replica: SimReplica, generation: int) -> Callable[[Producer | None], None]:
        def granted(lock: Producer | None) -> None:
            self.later(self.delay(), self._granted, replica, generation, lock)

        return granted

    def _granted(self, replica: SimReplica, generation: int, lock: Producer | None) -> None:
        if not replica.alive or replica.generation != generation:
            if lock is not None:
                self.broker.close(lock)
            return
        if replica.frozen:  # handed over while frozen: it takes it once it runs again
            self._parked.setdefault(replica.name, []).append(
                (self.now, 0, None, 0, self._granted, (replica, generation, lock))
            )
            return
        replica.granted(lock)

    def promoted(self, replica: SimReplica, term: int) -> None:
        self.terms.append((self.now, replica.name, term))
        replica.promotions.append((self.now, term))
        self.event(replica, f"active in term {term}")

    # --- clients and the config queue ---------------------------------------------------------

    def request(self, request: Request) -> None:
        self.requests[request.id] = request
        self._timeouts.append((self.now + CLIENT_TIMEOUT, next(self._seq), request))
        self._dispatch(request)

    def _dispatch(self, request: Request) -> None:
        if request.done:
            return
        serving = [r for r in self.replicas if r.name in self.broker.consumers and r.alive]
        if not serving:
            self.later(0.05, self._dispatch, request)
            return
        replica = self.rng.choice(serving)
        if self.reaches(replica, "in"):
            replica.later(self.delay(), replica.deliver, request)
        else:
            self.later(0.05, self._dispatch, request)

    def redeliver(self, request: Request) -> None:
        self.later(self.delay(), self._dispatch, request)

    def answered(self, replica: SimReplica, request: Request, **outcome: Any) -> None:
        if request.done or not self.reaches(replica, "out"):
            return
        self.later(self.delay(), self._complete, request, outcome)

    def _complete(self, request: Request, outcome: dict[str, Any]) -> None:
        if request.done or request.record is None:
            return
        request.done = True
        op = request.record
        op.return_ = self._ns()
        if "error" in outcome:
            op.status = "conflict" if outcome.get("conflict") else "unknown"  # as the fault suite records it
            op.error = str(outcome["error"])[:200]
        else:
            op.status, op.version = "ok", int(outcome["version"])
            if op.op == "read":
                op.values = dict(outcome["values"])
        self.ops.append(op)
        self._pause(request.client)

    def _give_up(self, request: Request) -> None:
        if request.done or request.record is None:
            return
        request.done = True
        request.record.return_ = self._ns()
        request.record.status, request.record.error = "unknown", "timed out"
        self.ops.append(request.record)
        self._pause(request.client)

    def _ns(self) -> int:
        return int(self.now * 1e9)

    def client(self, number: int) -> None:
        """One client: an operation, its answer (or its timeout), a pause, the next; as an operator's client does."""
        if self.now < self.seconds + 3.0:
            self._issue(number, next(self._counts[number]))

    def _pause(self, number: int) -> None:
        """A client has its answer (or gave up): its next operation after a pause, short while the group is disturbed
        or about to be, long while it is not. Nearly all of a schedule's cost is its operations, and those far from
        any fault only show the group serving: a few do that as well as many."""
        now = self.now
        busy = now < self.busy_until or any(at - LEAD <= now < at for at in self.planned)
        low, high = BUSY_PAUSE if busy else QUIET_PAUSE
        self.later(low + (high - low) * self.rng.random(), self.client, number)

    def _disturbed_until(self, end: float) -> None:
        if end + AFTERMATH > self.busy_until:
            self.busy_until = end + AFTERMATH

    def _issue(self, number: int, n: int) -> None:
        rid = f"c{number}-{n}"
        roll = self.rng.random()
        shared = f"k{self.rng.randrange(3)}"
        if roll < 0.3:
            keys = [f"w{number}", f"w{number}_r", shared]
            op = Op(id=len(self.requests), client=number, op="read", call=self._ns(), keys=keys)
            request = Request(rid, number, "read", keys=keys, record=op)
        else:
            reserved = roll > 0.8
            marker = f"w{number}_r" if reserved else f"w{number}"
            puts = [(marker, rid)]
            expect: list[tuple[str, str | None]] = []
            deletes: list[str] = []
            if self.rng.random() < 0.3:
                puts.append((shared, rid))
            elif self.rng.random() < 0.15:
                deletes.append(shared)
            if self.rng.random() < 0.1:
                expect = [(shared, None)]
            op = Op(
                id=len(self.requests),
                client=number,
                op="write",
                call=self._ns(),
                puts=puts,
                deletes=deletes,
                expect=[{"key": k, "value": v} for k, v in expect],
            )
            request = Request(
                rid, number, "write", puts=puts, deletes=deletes, expect=expect, reserved=reserved, record=op
            )
        self.request(request)

    # --- faults ----------------------------------------------------------------------------

    def draw_faults(self) -> Faults:
        roll = self.rng.random()
        if roll < 0.08 and self.keyed:
            return Faults(("kill",), rotation=True)
        if roll < 0.16:
            stranger = self.rng.choice(["wrong-key", "unkeyed"]) if self.keyed else "wrong-key"
            return Faults(tuple(self.rng.sample(FAULTS[:3], 1)), stranger=stranger)
        kinds = [kind for kind in FAULTS if self.keyed or kind != "forge"]
        return Faults(tuple(sorted(self.rng.sample(kinds, self.rng.randint(1, 3)))))

    def plan(self) -> None:
        """Schedule the faults of `self.faults` within the first three quarters of the run; all healed after."""
        for kind in self.faults.kinds:
            at = self.rng.uniform(1.0, max(1.0, self.healed_at - 4.0))  # after the group's first records
            self.later(at, self._fault, kind)
            self.planned.append(at)
        self.planned.append(self.healed_at)
        if self.faults.rotation:
            self.later(1.0, self._rotate, 1)
            self.planned.append(1.0)
        if self.faults.stranger is not None:
            key = GroupKey.generate(self.rng.randbytes(32)) if self.faults.stranger == "wrong-key" else None
            stranger = SimReplica(self, "stranger", key, group=False)
            self.replicas.append(stranger)
            at = self.rng.uniform(0.5, 6.0)
            self.later(at, self._start, stranger)
            self.planned.append(at)
            self.later(at, self._disturbed_until, at)
        if "skew" in self.faults.kinds:
            for replica in self.replicas:
                replica.rate, replica.offset = self.rng.uniform(0.95, 1.05), self.rng.uniform(-100, 100)

    def _target(self) -> SimReplica:
        """Most faults hit the active replica (where they hurt); some a standby."""
        group = [r for r in self.replicas if r.group and r.alive]
        active = [r for r in group if r.core.role == "active"]
        return active[0] if active and self.rng.random() < 0.7 else self.rng.choice(group or self.replicas)

    def _fault(self, kind: str) -> None:
        target = self._target()
        length = self.rng.uniform(0.5, 6.0)
        self.trace.append(f"{self.now:9.4f} fault {kind} on {target.name} for {length:.2f}s")
        self._disturbed_until(self.now + length)
        if kind not in ("forged-status", "skew"):
            self.disturbed.append((self.now, self.now + length + CLIENT_TIMEOUT, kind))
        if kind in ("kill", "freeze", "partition", "inbound", "outbound"):
            self.unhealthy.setdefault(target.name, []).append((self.now, self.now + length))
        elif kind == "broker-restart":
            for replica in self.replicas:
                self.unhealthy.setdefault(replica.name, []).append((self.now, self.now + min(length, 1.0)))
        if kind == "kill":
            self._kill(target)
            self.later(length, self._start, target)
        elif kind == "freeze":
            target.frozen = True
            self._freezes[target.name] = self._freezes.get(target.name, 0) + 1
            self.later(length, self._unfreeze, target)
        elif kind in ("partition", "inbound", "outbound"):
            self._cut(target, CUTS[kind], length)
            if kind != "inbound":  # the broker hears nothing from it: dropped after the keep-alive
                self.later(KEEPALIVE, self._keepalive, target)
        elif kind == "broker-restart":
            for replica in self.replicas:
                self._cut(replica, CUTS["partition"], min(length, 1.0))
        elif kind == "receipts":
            self._losing += 1
            self.lost_receipts = 0.2
            self.later(length, self._receipts_kept)
        elif kind == "forge":
            self._forge()
        elif kind == "forged-status":
            self._forged_status(self.now + length)
        elif kind == "replay":
            self._replay()

    def _kill(self, replica: SimReplica) -> None:
        replica.alive = False
        replica.generation += 1
        self.broker.drop(replica.name)
        for request in replica.queue:
            self.redeliver(request)
        replica.queue = []

    def _start(self, replica: SimReplica) -> None:
        if replica.stopped is None and not replica.alive:
            replica.alive = True
            self.broker.dropped.discard(replica.name)
            replica.start()

    def _thaw(self, replica: SimReplica) -> None:
        replica.frozen = False
        for _, _, owner, generation, step, args in self._parked.pop(replica.name, []):
            heapq.heappush(self._heap, (self.now, next(self._seq), owner, generation, step, args))

    def _keepalive(self, replica: SimReplica) -> None:
        if "out" in self.down.get(replica.name, set()):
            self.broker.drop(replica.name)
            for request in replica.queue:
                self.redeliver(request)
            replica.queue = []

    def _cut(self, replica: SimReplica, directions: frozenset[str], length: float) -> None:
        cuts = self._cuts.setdefault(replica.name, [])
        cuts.append(directions)
        self.down[replica.name] = set().union(*cuts)
        self.later(length, self._heal, replica, directions)

    def _heal(self, replica: SimReplica, directions: frozenset[str]) -> None:
        """One cut ends; another still on keeps its directions down."""
        cuts = self._cuts.get(replica.name, [])
        if directions in cuts:
            cuts.remove(directions)
        if cuts:
            self.down[replica.name] = set().union(*cuts)
        else:
            self.down.pop(replica.name, None)

    def _unfreeze(self, replica: SimReplica) -> None:
        held = self._freezes.get(replica.name, 0) - 1
        self._freezes[replica.name] = max(held, 0)
        if held <= 0 and replica.frozen:
            self._thaw(replica)

    def _receipts_kept(self) -> None:
        self._losing = max(self._losing - 1, 0)
        if not self._losing:
            self.lost_receipts = 0.0

    def _forge(self) -> None:
        """Someone allowed to produce on the state topics: a fencing writer on the log, a marker, a status."""
        forger = GroupKey.generate(self.rng.randbytes(32))
        body = {"version": 10**6, "previous": 0, "term": 99, "puts": [["k0", "forged"]], "deletes": [], "request": ""}
        writer = self.broker.open("forger", "log", "fence", lambda _: None)
        assert writer is not None
        self.broker.send(writer, record(forger, "entry", "log", body, "forger"))
        self.broker.close(writer)
        self.broker.forge("markers", record(None, "marker", "lock", {"term": 99, "replica": "ghost"}, "forger"))
        self._forged_status()

    def _forged_status(self, until: float | None = None) -> None:
        """A status claiming term 99 for a replica that does not exist, twice a second until `until`: a hint, never
        the lock's word."""
        forger = GroupKey.generate(self.rng.randbytes(32))
        self.forged_statuses.append(self.now)
        body = {"id": "ghost", "role": "active", "term": 99, "version": 0}
        for replica in self.replicas:
            status = record(forger, "status", "members", body, "forger")
            replica.later(self.delay(), self._hear, replica, status)
        if until is not None and self.now + 0.5 < until:
            self.later(0.5, self._forged_status, until)

    def _replay(self) -> None:
        """A captured entry sent again through a fencing writer: signed, but stale (its version is not above)."""
        entries = self.broker.topics["log"]
        if entries:
            old = self.rng.choice(entries)
            writer = self.broker.open("replayer", "log", "fence", lambda _: None)
            assert writer is not None
            self.broker.send(writer, Record(old.data, dict(old.properties), "replayer", dict(old.body)))
            self.broker.close(writer)

    def _rotate(self, step: int) -> None:
        """The operators' guide's rotation: a step, then a rolling restart of every replica with the new file."""
        assert self.key is not None
        rotated, _ = self.key.rotated(self.rng.randbytes(32))
        self.key = rotated
        self._disturbed_until(self.now + 0.8 * len(self.replicas) + 1.0)
        for n, replica in enumerate(r for r in self.replicas if r.group):
            self.later(0.8 * n + 0.4, self._restart_with, replica, rotated)
        if step < 3:
            self.later(0.8 * len(self.replicas) + 1.0, self._rotate, step + 1)

    def _restart_with(self, replica: SimReplica, key: GroupKey) -> None:
        """SIGTERM, then start again with `key`: steps down and closes what it holds (a standby takes over at once)."""
        if replica.alive and not replica.frozen:
            replica.release_all()
            replica.core.stepped_down(replica.clock())
            replica.alive = False
            replica.generation += 1
        replica.key = key
        self.later(0.1, self._start, replica)

    # --- running ---------------------------------------------------------------------------

    def run(self) -> World:
        for replica in self.replicas:
            self.later(self.rng.uniform(0, 0.3), self._start, replica)
        self.plan()
        self._counts = [itertools.count() for _ in range(CLIENTS)]
        for number in range(CLIENTS):
            self.later(0.5 + 0.1 * number, self.client, number)
        self.later(self.healed_at, self._heal_all)
        end = self.seconds + 6.0
        heap, pop, parked, timeouts, give_up = self._heap, heapq.heappop, self._parked, self._timeouts, self._give_up
        while True:
            if timeouts and (not heap or timeouts[0] < heap[0]):  # (when, order) decides: no order is taken twice
                at, _, request = timeouts.popleft()
                if request.done:  # answered: nothing to do, nothing done at its time
                    continue
                if at > end:
                    break
                self.now = at
                give_up(request)
                continue
            if not heap or heap[0][0] > end:
                break
            entry = pop(heap)
            self.now, _, owner, generation, step, args = entry
            if owner is not None:
                if not owner.alive or owner.generation != generation:
                    continue
                if owner.frozen:
                    parked.setdefault(owner.name, []).append(entry)
                    continue
            step(*args)
        self.now = end
        self._tear_down()
        return self

    def _tear_down(self) -> None:
        """Drop what only the run needed (steps not run, callbacks waiting at the broker, the replicas' link back to
        this world): they tie the schedule's objects in cycles, which wait for the cyclic garbage collector, whose
        full passes walk every such schedule kept alive; without them a schedule goes with its last reference. What
        the checks read stays."""
        self._heap.clear()
        self._timeouts.clear()
        self._parked.clear()
        for slot in self.broker.exclusive.values():
            slot.waiting.clear()
        for replica in self.replicas:
            del replica.world

    def _heal_all(self) -> None:
        self.trace.append(f"{self.now:9.4f} every fault healed")
        self._disturbed_until(self.now)
        self.down.clear()
        self._cuts.clear()
        self._freezes.clear()
        self._losing, self.lost_receipts = 0, 0.0
        for replica in self.replicas:
            if replica.frozen:
                self._thaw(replica)
            if not replica.alive and replica.stopped is None and replica.group:
                self._start(replica)
