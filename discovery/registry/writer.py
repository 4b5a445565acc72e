"""The registry's store writer: one task, every write, batched and conditional.

Whatever changes a service (an announce, a withdraw, an expiry, a release)
only marks it dirty here. One task takes every dirty service and, per
workspace: reads the keys involved, plans each with the pure rules of
`merge`, and sends the result as one conditional write. Batching is on the
leading edge, with no window: when nothing is being written, a change is
written at once; what is marked while a write is in flight waits for it to
end and then goes, all of it, into the next one. "At once" means as soon as
the registry has handled the messages it had already received: the writer
yields to the event loop until a few turns pass with no new change
(`QUIET_TURNS`, microseconds when nothing else is arriving), so a burst being
handled back to back is one batch, not one per few messages, up to
`DRAIN_MAX` services. So a lone change waits for nothing, a burst of messages
costs a few store versions, nothing is written when nothing changed, and an
item an operator wrote since the read makes the write fail
(`ConfigConflict`): the writer reads again and replans.
On a store that ignores `expect` (TrustGraph's), writes go through
`store_writes` as read-compare-write instead.

A store that does not answer (broker restart, store down) is retried with a
growing delay; the dirty set is kept, so nothing is lost, only late.

A service that goes keeps its tool names for one ttl (`departed`): they
count as owned by it when others are planned. What `departed` gained in a
round (withdrawn instances, kept names) is written after the round's merges,
as one item in the reserved workspace.

Under `--pin-definitions` (`pins`), each service's offer is first reduced to
its pinned definitions (`pins.hold`), the pins of a workspace's tools are read
with the keys a batch touches, a new tool's pin travels in the same
transaction as the tool, and the pending changes are written after the
round's merges, in the reserved workspace.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry.trace import SpanContext

from toolservice_base import tracing
from toolservice_base.configclient import ConfigClient
from toolservice_base.errors import (
    ConfigConflict,
    ConfigError,
    ConfigRefused,
    TransportError,
)
from toolservice_base.logs import get_logger
from toolservice_base.schemas import canonical_json
from toolservice_base.tasks import cancel_and_wait

from .departed import DEPARTED_KEY, Departed
from .leases import LeaseTable, ServiceKey
from .merge import Finding, Key, Offer, OwnershipRecord, Plan, apply_plan, combine, plan_service, record_key
from .metrics import RegistryMetrics
from .owners import Owners
from .pins import PIN_TYPE, Pin, PinBook
from .protocol import NameConflict
from .state import ServiceState
from .store_writes import PROBE_WORKSPACE, StoreWrites

log = get_logger("discovery.registry")

INDEX_KEY: Key = ("discovery-index", "workspaces")
"""In the default workspace: every workspace holding ownership records, read at start."""

CONFLICT_RETRIES = 5

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

Entry = tuple[ServiceState, Offer | None, OwnershipRecord | None]


def parse_index(value: str | None) -> list[str]:
    if not value:
        return []
    try:
        items = json.loads(value)
    except ValueError:
        return []
    return [item for item in items if isinstance(item, str)] if isinstance(items, list) else []


class StoreWriter:
    """Merges dirty services into the config store. Shares `services` and `leases` with the registry."""

    def __init__(
        self,
        config: ConfigClient,
        services: dict[ServiceKey, ServiceState],
        leases: LeaseTable,
        *,
        workspace_default: str,
        max_retry_delay: float,
        metrics: RegistryMetrics,
        on_refused: Callable[[ServiceKey, str], object],
        on_merged: Callable[[], None],
        departed: Departed | None = None,
        on_conflicts: Callable[[ServiceKey, list[NameConflict]], Awaitable[None]] | None = None,
        pins: PinBook | None = None,
    ) -> None:
        self._config = config
        self.writes = StoreWrites(config)
        """Conditional writes, or read-compare-write where the store ignores `expect`."""
        self._services = services
        self._leases = leases
        self.workspace_default = workspace_default
        self.max_retry_delay = max_retry_delay
        self.metrics = metrics
        self._on_refused = on_refused
        self._on_merged = on_merged
        self.departed = departed or Departed()
        self._on_conflicts = on_conflicts
        self.pins = pins
        """Pinned definitions and pending changes; None: definitions are not pinned (`--pin-definitions` off)."""
        self.owners = Owners()
        """Who owns each key, kept in step with every service's `owned` (`adopt`, `_commit`)."""
        self.conflicted: set[ServiceKey] = set()
        """Services refused a tool name now: a change in the store may let them have it
        (`Registry._recheck_conflicts`)."""
        self.indexed: set[str] = {workspace_default}
        self.store_writes = 0
        """Transactions sent to the store (tests use it to prove batching)."""
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
                    await self._merge(batch, forced)
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
                self._dirty |= {key for key in batch if key in self._services}
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
        first = sorted(self._dirty, key=lambda key: (state.order if (state := self._services.get(key)) else never, key))
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

    async def _merge(self, batch: set[ServiceKey], forced: set[ServiceKey]) -> None:
        by_workspace: dict[str, list[ServiceKey]] = defaultdict(list)
        for key in sorted(batch):
            if key in self._services:
                by_workspace[key[0]].append(key)
        for workspace in sorted(self.pins.dirty_workspaces()) if self.pins is not None else ():
            by_workspace.setdefault(workspace, [])  # a decided pin is written even if no service of it changed
        for workspace, keys in by_workspace.items():
            await self._ensure_indexed(workspace)
            for attempt in range(CONFLICT_RETRIES):
                try:
                    await self._merge_workspace(workspace, keys, forced)
                    break
                except ConfigConflict as exc:
                    log.info("registry.write_conflict", workspace=workspace, attempt=attempt + 1, reason=str(exc))
                except ConfigRefused:
                    await self._merge_one_by_one(workspace, keys, forced)
                    break
            else:
                await self._merge_one_by_one(workspace, keys, forced)
        await self._save_departed()
        await self._save_pending()

    async def _save_pending(self) -> None:
        """Write the pending definition changes that came or were decided: in the reserved workspace, never where agents
        read."""
        if self.pins is None or not self.pins.dirty:
            return
        puts, deletes, keys = self.pins.pending_writes()
        if deletes:
            await self._config.delete(deletes, workspace=PROBE_WORKSPACE)
            self.store_writes += 1
        if puts:
            await self._config.put(puts, workspace=PROBE_WORKSPACE)
            self.store_writes += 1
        self.pins.pending_written(keys)

    async def _save_departed(self) -> None:
        """Write what `departed` gained: withdrawn instances must be in the store before the registry may restart."""
        if not self.departed.dirty:
            return
        self.departed.dirty = False
        try:
            await self._config.put([(*DEPARTED_KEY, self.departed.to_value(time.time()))], workspace=PROBE_WORKSPACE)
        except BaseException:
            self.departed.dirty = True
            raise
        self.store_writes += 1

    async def _merge_one_by_one(self, workspace: str, keys: list[ServiceKey], forced: set[ServiceKey]) -> None:
        """A batch that keeps failing: write each service alone, so one cannot hold back the others."""
        for key in keys:
            try:
                await self._merge_workspace(workspace, [key], forced)
            except ConfigConflict:
                self.mark(key)  # contended: next round
            except ConfigRefused as exc:
                self._on_refused(key, f"the config store refused service {key[1]!r}: {exc}")

    def _entries(
        self, workspace: str, keys: list[ServiceKey], forced: set[ServiceKey], *, note: bool = False
    ) -> list[Entry]:
        """What each service should have now; those whose record says nothing changed are left out unless forced."""
        owners = self.owners.of(workspace)
        wall = time.time()
        entries: list[Entry] = []
        for key in keys:
            state = self._services.get(key)
            if state is None:
                continue
            leases = self._leases.of_service(key)
            offer: Offer | None = None
            if leases and self.pins is None:
                offer = state.active_offer(leases)
            elif leases and self.pins is not None:

                def taken(name: str, service: str = state.service_id) -> bool:
                    return owners.get(("tool", name), service) != service

                offer = self.pins.effective(workspace, state.live_offers(leases), taken, wall, note).offer
            record = state.desired_record(leases, offer)
            if key not in forced and not note and state.record_is_current(record):
                continue  # unchanged digest, same instances: no write, no version bump
            entries.append((state, offer, record))
        return entries

    async def _merge_workspace(self, workspace: str, keys: list[ServiceKey], forced: set[ServiceKey]) -> None:
        entries = self._entries(workspace, keys, forced)
        pin_keys = self.pins.dirty_keys(workspace) if self.pins is not None else set()
        if not entries and not pin_keys:
            return
        wanted: set[Key] = set(pin_keys)
        for state, offer, _ in entries:
            wanted.add(record_key(state.service_id))
            wanted |= set(state.owned)
            if offer is not None:
                wanted |= set(offer.items())
            if self.pins is not None:
                wanted |= {(PIN_TYPE, name) for known in state.offers.values() for name in known.digests}
        found = await self._config.get(sorted(wanted), workspace=workspace)
        original: dict[Key, str | None] = {key: found.get(key) for key in wanted}
        if self.pins is not None:  # the store's pins are the truth: decide again on them, and note what is held
            self.pins.load_pins(workspace, {key[1]: value for key, value in original.items() if key[0] == PIN_TYPE})
            # A key the first look did not read counts as absent: the conditional write fails if it is not, and is
            # planned again.
            entries = self._entries(workspace, [entry[0].key for entry in entries], forced, note=True)
        view = dict(original)
        wall = time.time()
        kept = {("tool", name): k for name, k in self.departed.kept(workspace, wall).items()}
        owners = self.owners.layer(workspace)
        for key, k in kept.items():
            if key not in owners:  # a name kept for a service that went, unless a live one owns it
                owners[key] = k.service
        until = {key: k.until for key, k in kept.items()}
        entries.sort(key=lambda entry: (entry[2] is not None, entry[0].order))  # departures free names first
        plans: list[Plan] = []
        for state, offer, record in entries:
            plan = plan_service(
                view, owners, service_id=state.service_id, owned=state.owned, record=record, offer=offer, kept=until
            )
            apply_plan(view, owners, plan, state.owned)
            if plan.record is None:  # gone: its names stay with it for one ttl, in this batch too
                for key in state.owned:
                    if key[0] == "tool":
                        owners[key], until[key] = state.service_id, wall + state.ttl()
            plans.append(plan)
        fresh, pin_values, pinned = self._pin_plan(workspace, entries, plans, view, wall)
        puts, deletes, expect = combine(original, view, [*plans, pinned])
        version = None
        if puts or deletes:
            with tracing.registry_write(workspace, len(puts), len(deletes)):
                version = await self.writes.apply(puts=puts, deletes=deletes, expect=expect, workspace=workspace)
            self.store_writes += 1
        if self.pins is not None:
            self.pins.written(workspace, pin_values, fresh)
        refused = self._commit(entries, plans, version, wall)
        if self._on_conflicts is not None:
            for key, conflicts in refused.items():
                await self._on_conflicts(key, conflicts)

    def _pin_plan(
        self, workspace: str, entries: list[Entry], plans: list[Plan], view: dict[Key, str | None], wall: float
    ) -> tuple[dict[str, Pin], dict[Key, str], Plan]:
        """The pins this transaction writes: one for each tool a plan owns that has none yet, and those an operator
        changed.

        Only tools the merge owns are pinned (a refused tool, or a static item
        that already says the same, is not); the pins go into `view`, so the
        tool and its pin are written together. Returns the new pins, every
        pin value the store holds once the transaction is in, and the plan
        of those it has to write.
        """
        pinned = Plan(service="(pins)")
        fresh: dict[str, Pin] = {}
        if self.pins is None:
            return fresh, {}, pinned
        for (state, offer, _), plan in zip(entries, plans):
            if plan.record is not None and offer is not None:
                owned = [key[1] for key in plan.owned if key[0] == "tool"]
                fresh.update(self.pins.first_pins(workspace, state.service_id, offer, owned, wall))
        values = self.pins.to_write(workspace, fresh)
        for key, value in values.items():
            if view.get(key) != value:
                view[key] = pinned.writes[key] = value
        return fresh, values, pinned

    def _commit(
        self, entries: list[Entry], plans: list[Plan], version: int | None, wall: float
    ) -> dict[ServiceKey, list[NameConflict]]:
        """Take the written plans as the new truth; returns the conflicts that are new, by service."""
        refused: dict[ServiceKey, list[NameConflict]] = {}
        for (state, offer, _), plan in zip(entries, plans):
            names = [key[1] for key in state.owned if key[0] == "tool"]
            if plan.record is None and names:
                self.departed.keep(state.workspace, names, state.service_id, wall + state.ttl())
            elif plan.record is not None:
                self.departed.claimed(
                    state.workspace, [key[1] for key in plan.owned if key[0] == "tool"], state.service_id
                )
            state.record = plan.record
            self.owners.update(state.workspace, state.service_id, state.owned, plan.owned)
            state.owned = dict(plan.owned)
            if offer is not None:
                state.merged = offer
                state.digests = {
                    key[1]: offer.digests[key[1]] for key in plan.owned if key[0] == "tool" and key[1] in offer.digests
                }
            elif plan.record is None:
                state.merged, state.digests = None, {}
            fields: dict[str, Any] = {"service": state.service_id, "workspace": state.workspace, "version": version}
            for name in plan.registered:
                log.info("tool.registered", tool=name, service_version=offer.version if offer else "", **fields)
            for name in plan.removed:
                log.info("tool.removed", tool=name, **fields)
            new = self._update_conflicts(state, plan.conflicts, wall)
            if new:
                refused[state.key] = new
            if state.conflicts:
                self.conflicted.add(state.key)
            else:
                self.conflicted.discard(state.key)
            if plan.record is None and not self._leases.has_service(state.key):
                del self._services[state.key]
                self.conflicted.discard(state.key)
        return refused

    def _update_conflicts(self, state: ServiceState, findings: list[Finding], wall: float) -> list[NameConflict]:
        """Record this plan's conflicts; returns those that are new or changed (the refused service is told)."""
        new: list[NameConflict] = []
        current = {finding.tool: finding for finding in findings}
        for name, finding in current.items():
            known = state.conflicts.get(name)
            if known is not None and (known.held_by, known.reason) == (finding.held_by, finding.reason):
                continue
            state.conflicts[name] = NameConflict(
                at=wall,
                tool=name,
                service=state.service_id,
                held_by=finding.held_by,
                workspace=state.workspace,
                reason=finding.reason,
            )
            if known is None:
                self.metrics.conflict()
            new.append(state.conflicts[name])
            log.warning(
                "tool.conflict",
                tool=name,
                service=state.service_id,
                held_by=finding.held_by,
                workspace=state.workspace,
                reason=finding.reason,
            )
        for name in [n for n in state.conflicts if n not in current]:
            del state.conflicts[name]
            log.info("tool.conflict_resolved", tool=name, service=state.service_id, workspace=state.workspace)
        return new

    async def read_index(self) -> None:
        """Learn the workspaces that hold ownership records (at start)."""
        found = await self._config.get([INDEX_KEY], workspace=self.workspace_default)
        self.indexed |= set(parse_index(found.get(INDEX_KEY)))

    async def _ensure_indexed(self, workspace: str) -> None:
        """Add `workspace` to the index read at start, once, before its first record is written."""
        if workspace in self.indexed:
            return
        for _ in range(CONFLICT_RETRIES):
            current = (await self._config.get([INDEX_KEY], workspace=self.workspace_default)).get(INDEX_KEY)
            known = set(parse_index(current))
            if workspace not in known:
                value = canonical_json(sorted(known | {workspace}))
                try:
                    await self.writes.apply(
                        puts=[(*INDEX_KEY, value)], expect=[(*INDEX_KEY, current)], workspace=self.workspace_default
                    )
                except ConfigConflict:
                    continue
            self.indexed.add(workspace)
            return
        raise ConfigConflict(f"{INDEX_KEY[0]}/{INDEX_KEY[1]} keeps changing under the registry", "conflict")
