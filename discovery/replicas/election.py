"""One active replica per group, elected by the broker through an exclusive producer.

The lock is a persistent topic (`Topics.state_lock`, `Topics.registry_lock`);
whoever holds its exclusive producer is the active replica. How it is taken:

- at start, one `exclusive` attempt: a free lock is ours at once, and a
  refusal that is not "busy" (no namespace, no permission, a broker without
  access modes) fails `async with Election(...)` in one line;
- a standby then waits for it with `wait` (WaitForExclusive): the broker
  hands it to the first in line as soon as the holder closes or its
  connection dies (measured on Apache Pulsar 4.0.8: 5-15 ms after a kill -9).
  Each wait ends after the client's operation timeout, so it waits again;
- a holder alive to the broker but silent to the group (frozen, SIGSTOP:
  the broker keeps its producer about 60 s) is taken over with `fence`
  (ExclusiveWithFencing) once it has been silent for `takeover_after`
  seconds; `fence` takes the lock from a live holder too: silence first.

Each promotion writes a marker with the next term on the lock topic
(`markers`), so terms only grow and a replica that reads a marker of a newer
term knows it was deposed, whatever the clocks say.

The active writes data only through `writer(topic)` (`elected`). A deposed
active steps down on the first sign: `Fenced` on a send, its lock
disconnected for `lost_lock_grace` seconds, a marker of a newer term, or a
lock it cannot confirm. Stepping down revokes its writers before anything
else, so it never writes again; then it is a standby like any other.

Statuses (`Membership`) are hints: what counts is the silence of the replica
the last marker names, and a status claiming a newer term only makes this
replica read the markers again (`markers`; it also says why an active
confirms its lock before it acknowledges a write, `confirm`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Self

from discovery.errors import NotActive, ReplicationError
from toolservice_base.errors import Fenced, ProducerBusy, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.tasks import cancel_and_wait, wait_event
from toolservice_base.transport import ExclusiveMode, ExclusivePublisher, Reader, Transport

from .core import (
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
)
from .elected import ElectedWriter
from .groupkey import GroupKey
from .markers import Markers
from .membership import Membership
from .status import Role, RoleChange

log = get_logger("discovery.replicas.election")

Promoted = Callable[[], Awaitable[None]]
"""Called once this replica holds the lock, before it serves as active (open writers, catch up)."""
Demoted = Callable[[str], Awaitable[None]]
"""Called with the reason once this replica stepped down; its writers are already revoked."""

__all__ = ["Demoted", "ElectedWriter", "Election", "Promoted", "RoleChange"]

LISTENER_TIMEOUT = 30.0
"""How long a demotion listener may take before it is abandoned (stepping down must finish)."""


class Election:
    """Compete for `lock_topic` as `replica_id`; `role` says who won.

    `async with Election(...)` starts competing (and raises at once, in one
    line, if the lock cannot be used at all); leaving it steps down if
    active (so a standby takes over within milliseconds) and stops.
    Role changes reach `on_promoted`/`on_demoted` (and `add_listener`), in
    order, and `changes()`. Without a `membership`, this replica never takes
    over by fencing nor notices a newer term through the group; and since it
    publishes no heartbeats, standbys that have one fence it once it has held
    the lock for `takeover_after`: every replica of a group needs one.
    """

    def __init__(
        self,
        transport: Transport,
        lock_topic: str,
        replica_id: str,
        *,
        membership: Membership | None = None,
        takeover_after: float = 10.0,
        on_promoted: Promoted | None = None,
        on_demoted: Demoted | None = None,
        check_interval: float = 0.2,
        lost_lock_grace: float = 2.0,
        retry_delay: float = 0.5,
        startup_timeout: float = 15.0,
        key: GroupKey | None = None,
        core: ReplicaCore | None = None,
    ) -> None:
        """`lost_lock_grace`: how long an active goes on without its lock (disconnected, or unconfirmed before it
        acknowledges a write); `key`: the group key markers are signed and checked with (None: permissions alone);
        `core`: the replica's rules, shared with its log (one is made if none is given)."""
        if takeover_after <= 0:
            raise ValueError(f"takeover_after must be positive, got {takeover_after}")
        self._transport = transport
        self.lock_topic = lock_topic
        self.replica_id = replica_id
        self._membership = membership
        self.takeover_after = takeover_after
        self._check_interval = check_interval
        self._lost_lock_grace = lost_lock_grace
        self._retry_delay = retry_delay
        self._startup_timeout = startup_timeout
        self._promoted: list[Promoted] = [on_promoted] if on_promoted else []
        self._demoted: list[Demoted] = [on_demoted] if on_demoted else []
        self.core = core or ReplicaCore(
            replica_id,
            lock_topic=lock_topic,
            takeover_after=takeover_after,
            lost_lock_grace=lost_lock_grace,
            key=key,
            now=time.monotonic(),
        )
        """The rules: role, term, the lock's markers, confirmations, when to take over and step down."""
        self._marks = Markers(lock_topic, key, self.core)
        self._lock: ExclusivePublisher | None = None
        self._confirming = asyncio.Lock()
        self._since = time.time()
        self._writers: list[ElectedWriter] = []
        self._lost = asyncio.Event()
        self._active = asyncio.Event()
        self._settled = asyncio.Event()
        self._failure: BaseException | None = None
        self._watchers: list[asyncio.Queue[RoleChange | None]] = []
        self._task: asyncio.Task[None] | None = None
        self._markers: Reader | None = None
        self._stack = AsyncExitStack()

    # --- what others see ----------------------------------------------------------------

    @property
    def role(self) -> Role:
        return "active" if self.core.role == "active" else "standby"

    @property
    def is_active(self) -> bool:
        return self.core.role == "active"

    @property
    def term(self) -> int:
        """The term this replica is active in; the last one it held while standby (0: never)."""
        return self.core.term

    @property
    def since(self) -> float:
        """When this replica took its current role (seconds since the epoch)."""
        return self._since

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the election for good (a lost permission, say); None while it runs."""
        return self._failure

    @property
    def holder(self) -> str | None:
        """The replica the newest marker on the lock names (None: no marker read yet)."""
        return self.core.holder

    def add_listener(self, on_promoted: Promoted | None = None, on_demoted: Demoted | None = None) -> None:
        """More callbacks (before `async with`): promotions run in the order added, demotions in reverse."""
        if self._task is not None:
            raise RuntimeError("add listeners before the election starts")
        if on_promoted:
            self._promoted.append(on_promoted)
        if on_demoted:
            self._demoted.append(on_demoted)

    async def wait_active(self, timeout: float | None = None) -> None:
        """Return once this replica is active and its promotion listeners are done; raises the election's failure, or
        TimeoutError."""
        async with asyncio.timeout(timeout):
            while not self._active.is_set():
                if self._failure is not None:
                    raise self._failure
                await wait_event(self._active, self._check_interval)

    async def wait_stopped(self) -> None:
        """Return once the election has stopped for good; raise its failure if it failed (for a process to watch).

        Checked before subscribing, with no await in between, so a failure
        that came first is not missed.
        """
        if self._failure is None and self._task is not None:
            async for _ in self.changes():  # ends when the election stops, raising its failure
                pass
        if self._failure is not None:
            raise self._failure

    async def changes(self) -> AsyncIterator[RoleChange]:
        """Every role change from now on; ends when the election stops (raising its failure, if any)."""
        queue: asyncio.Queue[RoleChange | None] = asyncio.Queue()
        self._watchers.append(queue)
        try:
            while (change := await queue.get()) is not None:
                yield change
            if self._failure is not None:
                raise self._failure
        finally:
            self._watchers.remove(queue)

    async def writer(self, topic: str) -> ElectedWriter:
        """A publisher on `topic` that fences whoever wrote there before; only while active."""
        if not self.is_active or self._lost.is_set():
            raise NotActive(f"replica {self.replica_id} is not active; only the active replica writes on {topic}")
        publisher = await self._transport.exclusive_publisher(topic, "fence")
        writer = ElectedWriter(self, publisher, self._transport)
        if not self.is_active or self._lost.is_set():
            await writer.close()
            raise NotActive(f"replica {self.replica_id} stepped down while opening a writer on {topic}")
        self._writers.append(writer)
        return writer

    def deposed(self, reason: str) -> None:
        """Step down now (a writer met `Fenced`, say): writers are revoked at once, the rest follows in the election's
        task."""
        if not self.core.deposed(reason):
            return
        for writer in self._writers:
            writer.revoke()
        self._lost.set()

    async def confirm(self) -> None:
        """Return if this replica still holds its lock, as confirmed within `lost_lock_grace`; else step down and raise
        `NotActive`. Called before a write is acknowledged (`ReplicaCore.confirm`): a confirmation older than the
        grace is renewed, one at a time, by a `held` marker the lock must take within the grace."""
        async with self._confirming:
            started = time.monotonic()
            decision = self.core.confirm(started)
            if isinstance(decision, Confirmed):
                return
            lock = self._lock
            if isinstance(decision, NotHolding) or lock is None:
                raise NotActive(
                    decision.reason
                    if isinstance(decision, NotHolding)
                    else f"replica {self.replica_id} does not hold {self.lock_topic}; it acknowledges no write"
                )
            why = await self._marks.confirm(lock, self.replica_id, decision.term, decision.within)
            outcome = self.core.on_held(started, why)
            if isinstance(outcome, NotHolding):
                self.deposed(outcome.reason)
                raise NotActive(outcome.reason)

    # --- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._transport.capabilities.require_replicated_state(
            f"electing one active replica on {self.lock_topic}", self._transport.url
        )
        async with AsyncExitStack() as stack:
            # Open for the election's life (at the last marker): reading on from there at a promotion costs a
            # round trip, where opening a reader at the latest message costs about 100 ms (pulsar-client seeks).
            # Also where a missing namespace or a missing permission to read it shows, in one line.
            self._markers = await self._transport.reader(self.lock_topic, "latest")
            stack.push_async_callback(self._transport.close_reader, self._markers)
            await self._read_markers()
            self._task = asyncio.create_task(self._run(), name=f"election:{self.lock_topic}:{self.replica_id}")
            stack.push_async_callback(self._stop)
            if not await wait_event(self._settled, self._startup_timeout):
                log.warning(
                    "election.start_unsettled",
                    lock=self.lock_topic,
                    replica=self.replica_id,
                    waited=self._startup_timeout,
                )
            if self._failure is not None:
                raise self._failure
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Step down if active (a standby takes over at once) and stop competing."""
        await self._stack.aclose()

    async def _stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        for queue in self._watchers:
            queue.put_nowait(None)

    # --- the election's task --------------------------------------------------------------

    async def _run(self) -> None:
        first = True
        try:
            while True:
                acquired = await self._acquire(first)
                first = False
                if acquired is not None:
                    await self._serve(*acquired)
        except (TransportError, ReplicationError) as exc:
            self._fail(exc)
        except Exception as exc:  # a bug: recorded and reported, never a silently dead task
            log.exception("election.crashed", lock=self.lock_topic, replica=self.replica_id)
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        log.error("election.failed", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
        self._settled.set()
        for queue in self._watchers:
            queue.put_nowait(None)

    async def _acquire(self, first: bool) -> tuple[ExclusivePublisher, ExclusiveMode] | None:
        """Wait for the lock, taking it over from a silent holder as the core says (`ReplicaCore.standby_look`); None
        to go round again after a failure."""
        if first:
            try:
                self._carry_out_stop(self.core.first_attempt())
                return await self._attempt("exclusive"), "exclusive"
            except ProducerBusy:
                pass
            except TransportError as exc:
                if not exc.retriable:
                    raise  # no permission, no access modes, closed: one line from `async with`
                log.warning("election.retry", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
            finally:
                self._settled.set()
        self.core.waiting(random.random())
        waiting: asyncio.Future[ExclusivePublisher] | None = None
        try:
            while True:
                if waiting is None:
                    waiting = asyncio.ensure_future(self._attempt("wait"))
                done, _ = await asyncio.wait({waiting}, timeout=self._check_interval)
                if done:
                    attempt, waiting = waiting, None
                    try:
                        return attempt.result(), "wait"
                    except ProducerBusy:
                        continue  # one wait ended (the client's operation timeout): wait again at once
                look = StandbyLook(lambda: self.core.standby_look(time.monotonic(), self._heard()))
                for _ in look:  # the core asked for the markers first
                    await self._read_markers()
                    self._marks.unconfirmed(self._claim(), self.replica_id)
                decision = look.decision
                self._carry_out_stop(decision)
                if isinstance(decision, TryLock):
                    silent = self.core.silent_for(time.monotonic(), self._heard())
                    lock = await self._attempt(decision.mode)
                    log.warning(
                        "election.takeover", lock=self.lock_topic, replica=self.replica_id, silent_s=round(silent, 2)
                    )
                    return lock, decision.mode
        except TransportError as exc:
            if not exc.retriable:
                raise
            log.warning("election.retry", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
            await asyncio.sleep(self._retry_delay)
            return None
        finally:
            if waiting is not None:
                await self._abandon(waiting)

    def _carry_out_stop(self, decision: object) -> None:
        """A `Stop` from the core ends the election for good, in its one line."""
        if isinstance(decision, Stop):
            raise self.core.failure(decision)

    async def _attempt(self, mode: ExclusiveMode) -> ExclusivePublisher:
        return await self._transport.exclusive_publisher(self.lock_topic, mode)

    async def _abandon(self, waiting: asyncio.Future[ExclusivePublisher]) -> None:
        """Give up a wait: cancelled, the transport closes a producer the broker grants after; granted, we close it."""
        if not waiting.done():
            waiting.cancel()
        await asyncio.wait({waiting})
        if waiting.cancelled():
            return
        if waiting.exception() is None:
            await self._transport.close_publisher(waiting.result())

    def _claim(self) -> tuple[str, int] | None:
        other = self._membership.other_active() if self._membership is not None else None
        return None if other is None else (other.id, other.term)

    def _heard(self) -> Heard:
        """What the membership heard, for the core's silence rule (nothing without one: a replica with no membership
        never takes over by fencing)."""
        members = self._membership
        if members is None:
            return Heard(echo_at=float("-inf"))
        return Heard(
            members.active_heard,
            members.active_heard_at(None),
            members.heard_itself_at,
            self._claim(),
            members.hearing_since,
        )

    async def _read_markers(self) -> int:
        """Read the lock topic's markers to its end; the highest term seen. Exact once we hold the lock."""
        assert self._markers is not None
        return await self._marks.read(self._markers)

    async def _hinted(self) -> None:
        """A status claims a term the markers may bear out: read them (the core then says what it means)."""
        if self._markers is None:
            return
        try:
            await self._read_markers()
        except TransportError as exc:
            log.warning("election.markers_unread", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
            return
        self._marks.unconfirmed(self._claim(), self.replica_id)

    async def _serve(self, lock: ExclusivePublisher, mode: ExclusiveMode) -> None:
        """Hold the lock: promote, stay active until a sign of deposition (or closing), step down."""
        promotion = Promotion(self.core, mode)
        try:
            for step in promotion:
                if isinstance(step, ReadMarkers):
                    await self._read_markers()
                else:
                    await self._marks.write(lock, self.replica_id, step.term, step.mode)
            self._carry_out_stop(promotion.stop)
        except TransportError as exc:  # fenced the moment it was granted, say: a standby again
            log.warning("election.promotion_failed", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
            promotion.failed()
            await self._transport.close_publisher(lock)
            await asyncio.sleep(self._retry_delay)
            return
        except ReplicationError:  # a `Stop` of the core
            promotion.failed()
            await self._transport.close_publisher(lock)
            raise
        promotion.promoted(time.monotonic())
        self._lock = lock
        self._lost.clear()
        self._set_role("active", f"took the lock ({mode})")
        reason = "closing"
        failure: Exception | None = None
        try:
            for promoted in self._promoted:
                await promoted()
            self._active.set()
            reason = await self._hold(lock)
        except Exception as exc:  # a promotion step failed: better a standby than an active that cannot serve
            failure, reason = exc, f"a promotion step failed: {exc}"
            log.error("election.promotion_step_failed", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
        finally:
            await self._step_down(lock, reason)
        if failure is not None:
            if _fatal(failure):
                raise failure  # no permission on a state topic, a log in a newer format: trying again cannot help
            await asyncio.sleep(self._retry_delay)

    async def _hold(self, lock: ExclusivePublisher) -> str:
        """Wait for the core to see a sign that we were deposed (`ReplicaCore.active_look`); the reason."""
        hint: asyncio.Task[None] | None = None
        try:
            while True:
                await wait_event(self._lost, self._check_interval)
                decision = self.core.active_look(time.monotonic(), lock.connected, self._claim())
                if isinstance(decision, StepDown):
                    return decision.reason
                if isinstance(decision, ReadMarkers) and (hint is None or hint.done()):
                    hint = asyncio.ensure_future(self._hinted())  # beside the loop: a slow read never delays a look
        finally:
            await cancel_and_wait(hint)

    async def _step_down(self, lock: ExclusivePublisher, reason: str) -> None:
        for writer in self._writers:
            writer.revoke()  # first: nothing is written from here on
        self._lock = None
        self.core.stepped_down(time.monotonic())
        self._set_role("standby", reason)
        for demoted in reversed(self._demoted):
            try:
                async with asyncio.timeout(LISTENER_TIMEOUT):
                    await demoted(reason)
            except Exception:
                log.exception("election.demotion_listener_failed", lock=self.lock_topic, replica=self.replica_id)
        writers, self._writers = self._writers, []
        for writer in writers:
            await writer.close()
        await self._transport.close_publisher(lock)

    def _set_role(self, role: Role, reason: str) -> None:
        self._since = time.time()
        if role == "standby":
            self._active.clear()
        if self._membership is not None:
            self._membership.set_role(role, self.core.term)
        level = log.info if role == "active" or reason == "closing" else log.warning
        level(
            f"election.{'promoted' if role == 'active' else 'demoted'}",
            lock=self.lock_topic,
            replica=self.replica_id,
            term=self.core.term,
            reason=reason,
        )
        change = RoleChange(role, self.core.term, reason, self._since)
        for queue in self._watchers:
            queue.put_nowait(change)


def _fatal(exc: Exception) -> bool:
    """Whether a failed promotion step will fail the same way every time."""
    if isinstance(exc, Fenced | NotActive):
        return False  # deposed while promoting: the normal course of an election
    if isinstance(exc, TransportError):
        return not exc.retriable
    return isinstance(exc, ReplicationError)
