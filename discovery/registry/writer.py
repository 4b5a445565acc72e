"""The registry's store writer: one task, every write, coalesced and conditional.

Whatever changes a service (an announce, a withdraw, an expiry, a release)
only marks it dirty here. One task waits a short window for more changes to
ride along, then, per workspace: reads the keys involved, plans each dirty
service with the pure rules of `merge`, and sends the result as one
conditional write. So a burst of messages costs one store version, nothing is
written when nothing changed, and an item an operator wrote since the read
makes the write fail (`ConfigConflict`): the writer reads again and replans.
On a store that ignores `expect` (TrustGraph's), writes go through
`store_writes` as read-compare-write instead.

A store that does not answer (broker restart, store down) is retried with a
growing delay; the dirty set is kept, so nothing is lost, only late.

A service that goes keeps its tool names for one ttl (`departed`): they
count as owned by it when others are planned. What `departed` gained in a
round (withdrawn instances, kept names) is written after the round's merges,
as one item in the reserved workspace.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
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

from .departed import DEPARTED_KEY, Departed
from .leases import LeaseTable, ServiceKey
from .merge import Finding, Key, Offer, OwnershipRecord, Plan, apply_plan, combine, plan_service, record_key
from .metrics import RegistryMetrics
from .protocol import NameConflict
from .state import ServiceState
from .store_writes import PROBE_WORKSPACE, StoreWrites

log = get_logger("discovery.registry")

INDEX_KEY: Key = ("discovery-index", "workspaces")
"""In the default workspace: every workspace holding ownership records, read at start."""

CONFLICT_RETRIES = 5

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
        coalesce_window: float,
        max_retry_delay: float,
        metrics: RegistryMetrics,
        on_refused: Callable[[str, str], object],
        on_merged: Callable[[], None],
        departed: Departed | None = None,
        on_conflicts: Callable[[ServiceKey, list[NameConflict]], Awaitable[None]] | None = None,
    ) -> None:
        self._config = config
        self.writes = StoreWrites(config)
        """Conditional writes, or read-compare-write where the store ignores `expect`."""
        self._services = services
        self._leases = leases
        self.workspace_default = workspace_default
        self.coalesce_window = coalesce_window
        self.max_retry_delay = max_retry_delay
        self.metrics = metrics
        self._on_refused = on_refused
        self._on_merged = on_merged
        self.departed = departed or Departed()
        self._on_conflicts = on_conflicts
        self.indexed: set[str] = {workspace_default}
        self.store_writes = 0
        """Transactions sent to the store (tests use it to prove coalescing)."""
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
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._dirty)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="registry-writer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    async def settle(self, timeout: float = 5.0) -> None:
        """Wait until every pending change has been written."""
        deadline = time.monotonic() + timeout
        while self._dirty or self._busy or self._wake.is_set() or self.departed.dirty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"registry still has {len(self._dirty)} service(s) to write after {timeout:g}s")
            await asyncio.sleep(0.01)

    async def _run(self) -> None:
        delay = 0.1
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.coalesce_window)
            self._wake.clear()
            batch, forced = self._dirty, self._forced
            self._dirty, self._forced = set(), set()
            links = [link for key in batch for link in self._links.pop(key, ())]
            self._busy = True
            try:
                with tracing.registry_merge(len(batch), links), self.metrics.merge_timer():
                    await self._merge(batch, forced)
                self._on_merged()
                delay = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # nothing may end this loop
                if isinstance(exc, TransportError):
                    self.writes.forget()  # what answers next may be another store: ask it again
                if isinstance(exc, (TransportError, ConfigError)) and not isinstance(exc, ConfigRefused):
                    log.warning("registry.store_unavailable", error=str(exc), retry_in=delay, services=len(batch))
                else:
                    log.exception("registry.merge_failed", retry_in=delay)
                self._dirty |= {key for key in batch if key in self._services}
                self._forced |= forced
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_retry_delay)
                self._wake.set()
            finally:
                self._busy = False

    async def _merge(self, batch: set[ServiceKey], forced: set[ServiceKey]) -> None:
        by_workspace: dict[str, list[ServiceKey]] = defaultdict(list)
        for key in sorted(batch):
            if key in self._services:
                by_workspace[key[0]].append(key)
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
                self._on_refused(key[1], f"the config store refused service {key[1]!r}: {exc}")

    async def _merge_workspace(self, workspace: str, keys: list[ServiceKey], forced: set[ServiceKey]) -> None:
        grouped = self._leases.by_service()
        entries: list[Entry] = []
        for key in keys:
            state = self._services.get(key)
            if state is None:
                continue
            leases = grouped.get(key, [])
            offer = state.active_offer(leases) if leases else None
            record = state.desired_record(leases, offer)
            if key not in forced and state.record_is_current(record):
                continue  # unchanged digest, same instances: no write, no version bump
            entries.append((state, offer, record))
        if not entries:
            return
        wanted: set[Key] = set()
        for state, offer, _ in entries:
            wanted.add(record_key(state.service_id))
            wanted |= set(state.owned)
            if offer is not None:
                wanted |= set(offer.items())
        found = await self._config.get(sorted(wanted), workspace=workspace)
        original: dict[Key, str | None] = {key: found.get(key) for key in wanted}
        view = dict(original)
        wall = time.time()
        kept = {("tool", name): k for name, k in self.departed.kept(workspace, wall).items()}
        owners = {key: k.service for key, k in kept.items()}
        owners.update({key: s.service_id for s in self._services.values() if s.workspace == workspace for key in s.owned})
        until = {key: k.until for key, k in kept.items()}
        entries.sort(key=lambda entry: (entry[2] is not None, entry[0].order))  # departures free names first
        plans: list[Plan] = []
        for state, offer, record in entries:
            plan = plan_service(view, owners, service_id=state.service_id, owned=state.owned, record=record, offer=offer, kept=until)
            apply_plan(view, owners, plan, state.owned)
            if plan.record is None:  # gone: its names stay with it for one ttl, in this batch too
                for key in state.owned:
                    if key[0] == "tool":
                        owners[key], until[key] = state.service_id, wall + state.ttl()
            plans.append(plan)
        puts, deletes, expect = combine(original, view, plans)
        version = None
        if puts or deletes:
            with tracing.registry_write(workspace, len(puts), len(deletes)):
                version = await self.writes.apply(puts=puts, deletes=deletes, expect=expect, workspace=workspace)
            self.store_writes += 1
        refused = self._commit(entries, plans, version, wall)
        if self._on_conflicts is not None:
            for key, conflicts in refused.items():
                await self._on_conflicts(key, conflicts)

    def _commit(self, entries: list[Entry], plans: list[Plan], version: int | None, wall: float) -> dict[ServiceKey, list[NameConflict]]:
        """Take the written plans as the new truth; returns the conflicts that are new, by service."""
        refused: dict[ServiceKey, list[NameConflict]] = {}
        for (state, offer, _), plan in zip(entries, plans):
            names = [key[1] for key in state.owned if key[0] == "tool"]
            if plan.record is None and names:
                self.departed.keep(state.workspace, names, state.service_id, wall + state.ttl())
            elif plan.record is not None:
                self.departed.claimed(state.workspace, [key[1] for key in plan.owned if key[0] == "tool"], state.service_id)
            state.record = plan.record
            state.owned = dict(plan.owned)
            fields: dict[str, Any] = {"service": state.service_id, "workspace": state.workspace, "version": version}
            for name in plan.registered:
                log.info("tool.registered", tool=name, service_version=offer.version if offer else "", **fields)
            for name in plan.removed:
                log.info("tool.removed", tool=name, **fields)
            new = self._update_conflicts(state, plan.conflicts, wall)
            if new:
                refused[state.key] = new
            if plan.record is None and not self._leases.of_service(state.key):
                del self._services[state.key]
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
                at=wall, tool=name, service=state.service_id, held_by=finding.held_by, workspace=state.workspace, reason=finding.reason
            )
            if known is None:
                self.metrics.conflict()
            new.append(state.conflicts[name])
            log.warning("tool.conflict", tool=name, service=state.service_id, held_by=finding.held_by, workspace=state.workspace, reason=finding.reason)
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
                    await self.writes.apply(puts=[(*INDEX_KEY, value)], expect=[(*INDEX_KEY, current)], workspace=self.workspace_default)
                except ConfigConflict:
                    continue
            self.indexed.add(workspace)
            return
        raise ConfigConflict(f"{INDEX_KEY[0]}/{INDEX_KEY[1]} keeps changing under the registry", "conflict")
