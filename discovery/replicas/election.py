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
- a holder that is alive to the broker but silent to the group (frozen,
  SIGSTOP: the broker keeps its producer about 60 s) is taken over with
  `fence` (ExclusiveWithFencing) once its `Membership` status has been
  silent for `takeover_after` seconds. `fence` would take the lock from a
  live holder too, which is why silence must come first.

Each promotion writes a marker with the next term on the lock topic (read
back from its last message), so terms only grow and a replica that sees an
active in a newer term knows it was deposed, whatever the clocks say.

The active writes data only through `writer(topic)`: `fence`-mode producers
(opening one fences a deposed writer's, which then fails every send with
`Fenced`, for good). The deposed active steps down on the first sign:
`Fenced` on a send, its lock disconnected for `lost_lock_grace` seconds, or a
newer term in the group's statuses. Stepping down revokes its writers before
anything else, so it never writes again; then it is a standby like any other.
A `wait` producer is never written through, except for the marker, right
after it was granted: fenced, it would queue again and write later (measured).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Self

from discovery.errors import NotActive, ReplicationError
from toolservice_base.errors import Fenced, ProducerBusy, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.tasks import cancel_and_wait
from toolservice_base.transport import ExclusiveMode, ExclusivePublisher, Reader, Transport

from .elected import ElectedWriter
from .membership import Membership, Role, wait_event

log = get_logger("discovery.replicas.election")

Promoted = Callable[[], Awaitable[None]]
"""Called once this replica holds the lock, before it serves as active (open writers, catch up)."""
Demoted = Callable[[str], Awaitable[None]]
"""Called with the reason once this replica stepped down; its writers are already revoked."""

__all__ = ["Demoted", "ElectedWriter", "Election", "Promoted", "RoleChange"]

MARKER_READ_TIMEOUT = 10.0
"""How long reading a marker may take once the broker said one is there."""
LISTENER_TIMEOUT = 30.0
"""How long a demotion listener may take before it is abandoned (stepping down must finish)."""


@dataclass(frozen=True)
class RoleChange:
    """One change of role, as `Election.changes()` yields it."""

    role: Role
    term: int
    reason: str
    at: float
    """When (seconds since the epoch)."""


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
    ) -> None:
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
        self._role: Role = "standby"
        self._term = 0
        self._term_seen = 0
        self._since = time.time()
        self._standby_since = time.monotonic()
        self._writers: list[ElectedWriter] = []
        self._lost = asyncio.Event()
        self._lost_reason = ""
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
        return self._role

    @property
    def is_active(self) -> bool:
        return self._role == "active"

    @property
    def term(self) -> int:
        """The term this replica is active in; the last one it held while standby (0: never)."""
        return self._term

    @property
    def since(self) -> float:
        """When this replica took its current role (seconds since the epoch)."""
        return self._since

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the election for good (a lost permission, say); None while it runs."""
        return self._failure

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
        if not self.is_active or self._lost.is_set():
            return
        for writer in self._writers:
            writer.revoke()
        self._lost_reason = reason
        self._lost.set()

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
        """Wait for the lock (taking it over from a silent holder); None to go round again after a failure."""
        if first:
            try:
                return await self._attempt("exclusive"), "exclusive"
            except ProducerBusy:
                pass
            except TransportError as exc:
                if not exc.retriable:
                    raise  # no permission, no access modes, closed: one line from `async with`
                log.warning("election.retry", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
            finally:
                self._settled.set()
        patience = self.takeover_after + random.uniform(
            0, min(1.0, self.takeover_after / 10)
        )  # two standbys seldom fence at once
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
                if (silent := self._silent_for()) > patience:
                    lock = await self._attempt("fence")
                    log.warning(
                        "election.takeover", lock=self.lock_topic, replica=self.replica_id, silent_s=round(silent, 2)
                    )
                    return lock, "fence"
        except TransportError as exc:
            if not exc.retriable:
                raise
            log.warning("election.retry", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
            await asyncio.sleep(self._retry_delay)
            return None
        finally:
            if waiting is not None:
                await self._abandon(waiting)

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

    def _silent_for(self) -> float:
        """Seconds since the group last heard an active replica (or since this one became a standby, if later)."""
        if self._membership is None:
            return 0.0
        heard = self._membership.active_heard_at()
        return time.monotonic() - max(heard or 0.0, self._standby_since)

    async def _read_markers(self) -> int:
        """Read the lock topic's markers to its end; the highest term seen. Exact once we hold the lock."""
        assert self._markers is not None
        while await self._markers.has_message_available():
            marker = await self._markers.read_next(MARKER_READ_TIMEOUT)
            if marker is None:
                continue
            try:
                self._term_seen = max(self._term_seen, int(json.loads(marker.data)["term"]))
            except (ValueError, KeyError, TypeError):
                log.warning(
                    "election.bad_marker", lock=self.lock_topic, data=marker.data[:100].decode(errors="replace")
                )
        return self._term_seen

    async def _serve(self, lock: ExclusivePublisher, mode: ExclusiveMode) -> None:
        """Hold the lock: promote, stay active until a sign of deposition (or closing), step down."""
        try:
            term = await self._read_markers() + 1
            await lock.send(self._marker(term, mode))
        except TransportError as exc:  # fenced the moment it was granted, say: a standby again
            log.warning("election.promotion_failed", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
            await self._transport.close_publisher(lock)
            await asyncio.sleep(self._retry_delay)
            return
        self._term = self._term_seen = term
        self._lost.clear()
        self._set_role("active", f"took the lock ({mode})")
        reason = "closing"
        failure: Exception | None = None
        try:
            for promoted in self._promoted:
                await promoted()
            self._active.set()
            reason = await self._hold(lock, mode)
        except Exception as exc:  # a promotion step failed: better a standby than an active that cannot serve
            failure, reason = exc, f"a promotion step failed: {exc}"
            log.error("election.promotion_step_failed", lock=self.lock_topic, replica=self.replica_id, error=str(exc))
        finally:
            await self._step_down(lock, reason)
        if failure is not None:
            if _fatal(failure):
                raise failure  # no permission on a state topic, a log in a newer format: trying again cannot help
            await asyncio.sleep(self._retry_delay)

    def _marker(self, term: int, mode: ExclusiveMode) -> dict[str, Any]:
        return {"term": term, "replica": self.replica_id, "mode": mode, "since": time.time()}

    async def _hold(self, lock: ExclusivePublisher, mode: ExclusiveMode) -> str:
        """Wait for a sign that we were deposed; the reason.

        A lock held by a `wait` producer is given up as soon as it is seen
        disconnected: fenced, such a producer queues again and would be handed
        the lock back, epoch and all, once the new holder leaves (measured).
        An Exclusive one that reconnects holds the lock again only if nobody
        took it meanwhile (the broker checks its epoch), so it gets a grace
        period for a broker restart.
        """
        grace = 0.0 if mode == "wait" else self._lost_lock_grace
        disconnected_at: float | None = None
        while True:
            if await wait_event(self._lost, self._check_interval):
                return self._lost_reason
            now = time.monotonic()
            if lock.connected:
                disconnected_at = None
            elif disconnected_at is None:
                disconnected_at = now
            if disconnected_at is not None and now - disconnected_at >= grace:
                return f"lost the lock on {self.lock_topic} (fenced, or disconnected for {grace:g}s)"
            other = self._membership.other_active() if self._membership else None
            if other is not None and other.term > self._term:
                return f"replica {other.id} is active in a newer term ({other.term} > {self._term})"

    async def _step_down(self, lock: ExclusivePublisher, reason: str) -> None:
        for writer in self._writers:
            writer.revoke()  # first: nothing is written from here on
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
        self._role = role
        self._since = time.time()
        if role == "standby":
            self._active.clear()
            self._standby_since = time.monotonic()
        if self._membership is not None:
            self._membership.set_role(role, self._term)
        level = log.info if role == "active" or reason == "closing" else log.warning
        level(
            f"election.{'promoted' if role == 'active' else 'demoted'}",
            lock=self.lock_topic,
            replica=self.replica_id,
            term=self._term,
            reason=reason,
        )
        change = RoleChange(role, self._term, reason, self._since)
        for queue in self._watchers:
            queue.put_nowait(change)


def _fatal(exc: Exception) -> bool:
    """Whether a failed promotion step will fail the same way every time."""
    if isinstance(exc, Fenced | NotActive):
        return False  # deposed while promoting: the normal course of an election
    if isinstance(exc, TransportError):
        return not exc.retriable
    return isinstance(exc, ReplicationError)
