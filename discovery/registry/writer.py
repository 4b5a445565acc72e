"""The registry's store writer: one task, every write, batched on the leading edge.

Whatever changes a service (an announce, a withdraw, an expiry, a release)
only marks it dirty here. One task takes every dirty service and hands it to
`batches`, which plans and writes it per workspace as one conditional write.
Batching is on the leading edge, with no window: when nothing is being
written, a change is written at once; what is marked while a write is in
flight waits for it to end and then goes, all of it, into the next one.
"At once" means as soon as the registry has handled the messages it had
already received: the writer yields to the event loop until a few turns pass
with no new change (`QUIET_TURNS`, microseconds when nothing else is
arriving), so a burst being handled back to back is one batch, not one per
few messages, up to `DRAIN_MAX` services. So a lone change waits for nothing,
a burst of messages costs a few store versions, and nothing is written when
nothing changed.

A store that does not answer (broker restart, store down) is retried with a
growing delay; the dirty set is kept, so nothing is lost, only late.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from opentelemetry.trace import SpanContext

from toolservice_base import tracing
from toolservice_base.configclient import ConfigClient
from toolservice_base.errors import ConfigError, ConfigRefused, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.tasks import cancel_and_wait

from .batches import BatchWriter
from .book import ServiceBook
from .departed import Departed
from .leases import LeaseTable, ServiceKey
from .metrics import RegistryMetrics
from .owners import Owners
from .pins import PinBook
from .refusals import Refusals
from .state import ServiceState
from .store_writes import StoreWrites

log = get_logger("discovery.registry")

QUIET_TURNS = 3
"""Event-loop turns in a row without a new change after which the writer takes its batch. Handling one
message takes about two (its receive completes, then its handler runs), so a burst being handled back
to back keeps the writer waiting, and a lone change costs it three turns: no timer, no window."""

DRAIN_MAX = 500
"""Changes marked, or services pending, at which the writer stops waiting for the rest of a burst: one
write stays a request the store takes in one message, and a sender that floods the registry holds the
writes back no longer than it takes to handle this many messages. What comes meanwhile goes into the
next write."""

BATCH_MAX = 500
"""Services in one write at most. About 1.5 KB of ownership record, tools and service item each at five
instances, so a full batch is well under the broker's 5 MB message both ways (the read of the keys it
touches, and the write); one batch of 3,519 services once read back 5.28 MB and could never be written."""


class StoreWriter:
    """Merges dirty services into the config store. Shares `services` and `leases` with the registry."""

    def __init__(
        self,
        config: ConfigClient,
        book: ServiceBook,
        leases: LeaseTable,
        *,
        workspace_default: str,
        max_retry_delay: float,
        metrics: RegistryMetrics,
        on_merged: Callable[[], None],
        refusals: Refusals | None = None,
        departed: Departed | None = None,
        pins: PinBook | None = None,
    ) -> None:
        self._book = book
        self.max_retry_delay = max_retry_delay
        self.metrics = metrics
        self._on_merged = on_merged
        self.departed = departed or Departed()
        self.pins = pins
        """Pinned definitions and pending changes; None: definitions are not pinned (`--pin-definitions` off)."""
        self.batches = BatchWriter(
            config,
            book,
            leases,
            workspace_default=workspace_default,
            metrics=metrics,
            mark=self.mark,
            refusals=refusals,
            departed=self.departed,
            pins=pins,
        )
        """What one batch writes, and what the writes made true (`owners`, `conflicted`, `indexed`)."""
        self.waits: deque[float] = deque(maxlen=100)
        """Seconds from the first change of each recent batch being marked to the writer taking the batch,
        oldest first: nothing but a write in flight, a retry's back-off or the rest of a burst (`_caught_up`) should be
        in them."""
        self.failure: str | None = None
        """Why the last write to the store failed (the store cannot write, or does not answer); None once one
        succeeds."""
        self._noted: float | None = None
        self._marks = 0
        self._dirty: set[ServiceKey] = set()
        self._forced: set[ServiceKey] = set()
        self._links: dict[ServiceKey, list[SpanContext]] = {}
        self._wake = asyncio.Event()
        self._busy = False
        self._task: asyncio.Task[None] | None = None

    @property
    def writes(self) -> StoreWrites:
        """Conditional writes, or read-compare-write where the store ignores `expect`."""
        return self.batches.writes

    @property
    def owners(self) -> Owners:
        """Who owns each key, kept in step with every service's `owned`."""
        return self.batches.owners

    @property
    def conflicted(self) -> set[ServiceKey]:
        """Services refused a tool name now: a change in the store may let them have it (`recheck_conflicts`)."""
        return self.batches.conflicted

    @property
    def indexed(self) -> set[str]:
        """The workspaces that hold ownership records."""
        return self.batches.indexed

    @property
    def store_writes(self) -> int:
        """Transactions sent to the store (tests use it to prove batching)."""
        return self.batches.store_writes

    async def read_index(self) -> None:
        """Learn the workspaces that hold ownership records (at start)."""
        await self.batches.read_index()

    def mark(self, key: ServiceKey, *, force: bool = False, link: SpanContext | None = None) -> None:
        """`key` needs merging; `force` re-checks the store even if its record says nothing changed.

        `link`: the span of the announcement behind the change; the merge's span links to it.
        """
        self._dirty.add(key)
        if link is not None:
            links = self._links.setdefault(key, [])
            if len(links) < tracing.MAX_LINKS:
                links.append(link)
        if force:
            self._forced.add(key)
        if self._noted is None:
            self._noted = time.monotonic()
        self._marks += 1
        self._wake.set()

    def adopt(self, state: ServiceState) -> None:
        """A service restored from its ownership record at start: what it owns counts from now on."""
        self.owners.update(state.workspace, state.service_id, {}, state.owned)

    def recheck_conflicts(self, workspaces: list[str] | set[str]) -> None:
        """The store changed in `workspaces` (a push, a kept name let go): a service refused a name there may have it
        now."""
        for key in [key for key in self.conflicted if key.workspace in workspaces]:
            self.mark(key, force=True)

    def wake(self) -> None:
        """Something other than a service changed (a pin an operator decided on): write it."""
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._dirty)

    def waiting(self, key: ServiceKey) -> bool:
        """Whether `key` has a change not yet written (being retried after a failure, or next in line)."""
        return key in self._dirty

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="registry-writer")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def settle(self, timeout: float = 5.0) -> None:
        """Wait until every pending change has been written."""
        deadline = time.monotonic() + timeout
        while (
            self._dirty
            or self._busy
            or self._wake.is_set()
            or self.departed.dirty
            or (self.pins is not None and self.pins.dirty)
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"registry still has {len(self._dirty)} service(s) to write after {timeout:g}s")
            await asyncio.sleep(0.01)

    async def _run(self) -> None:
        """Leading-edge batching: take everything marked so far, write it, repeat; never wait on a timer.

        While one batch is being written (`_busy`), `mark` only adds to the next; the next round
        starts the moment this one ends, with all of it.
        """
        delay = 0.1
        while True:
            await self._wake.wait()
            await self._caught_up()
            self._wake.clear()
            batch, forced = self._take()
            noted, self._noted = self._noted, (self._noted if self._dirty else None)
            if noted is not None:
                self.waits.append(time.monotonic() - noted)
            links = [link for key in batch for link in self._links.pop(key, ())]
            self._busy = True
            try:
                with tracing.registry_merge(len(batch), links), self.metrics.merge_timer():
                    await self.batches.write(batch, forced)
                self._on_merged()
                self.failure = None
                delay = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # nothing may end this loop
                if isinstance(exc, TransportError):
                    self.writes.forget()  # what answers next may be another store: ask it again
                if isinstance(exc, (TransportError, ConfigError)) and not isinstance(exc, ConfigRefused):
                    self.failure = str(exc)
                    log.warning("registry.store_unavailable", error=str(exc), retry_in=delay, services=len(batch))
                else:
                    log.exception("registry.merge_failed", retry_in=delay)
                self._dirty |= {key for key in batch if key in self._book}
                self._forced |= forced
                if noted is not None:  # the retried changes have waited since they were first marked
                    self._noted = noted if self._noted is None else min(noted, self._noted)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_retry_delay)
                self._wake.set()
            finally:
                self._busy = False

    def _take(self) -> tuple[set[ServiceKey], set[ServiceKey]]:
        """The next batch and which of it is forced: every dirty service, or the `BATCH_MAX` seen first.

        The rest stays dirty and goes next, at once: a write (and the store's
        answer to the read before it) stays well inside one broker message
        however many services changed together.
        """
        if len(self._dirty) <= BATCH_MAX:
            batch, forced = self._dirty, self._forced
            self._dirty, self._forced = set(), set()
            return batch, forced
        never = 1 << 62
        first = sorted(self._dirty, key=lambda key: (state.order if (state := self._book.get(key)) else never, key))
        batch = set(first[:BATCH_MAX])
        self._dirty.difference_update(batch)
        forced = self._forced & batch
        self._forced -= forced
        self._wake.set()
        return batch, forced

    async def _caught_up(self) -> None:
        """Return once the registry has handled what it had received: `QUIET_TURNS` loop turns without a new mark.

        Or once `DRAIN_MAX` changes came meanwhile, or services are pending. A turn is a pass of
        the event loop, not a span of time: with nothing else to run, this returns within microseconds.
        """
        quiet, start = 0, self._marks
        while quiet < QUIET_TURNS and len(self._dirty) < DRAIN_MAX and self._marks - start < DRAIN_MAX:
            seen = self._marks
            await asyncio.sleep(0)
            quiet = quiet + 1 if self._marks == seen else 0
