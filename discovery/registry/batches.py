"""One batch of the registry's store writes: plan every dirty service of a workspace, write it as one transaction.

`writer` decides when a batch goes; this module decides what it writes. Per
workspace it reads the keys involved, plans each service with the pure rules
of `merge` over who owns what (`owners`), and sends the result as one
conditional write: an item an operator wrote since the read makes the write
fail (`ConfigConflict`), and the batch is read again and replanned. On a
store that ignores `expect` (TrustGraph's), writes go through `store_writes`
as read-compare-write instead. A batch that keeps failing is written one
service at a time, so one cannot hold back the others.

A service that goes keeps its tool names for one ttl (`departed`): they
count as owned by it when others are planned. What `departed` gained in a
round (withdrawn instances, kept names) is written after the round's merges,
as one item in the reserved workspace.

Under `--pin-definitions` (`pins`), each service's offer is first reduced to
its pinned definitions (`pins.effective`), the pins of a workspace's tools are
read with the keys a batch touches, a new tool's pin travels in the same
transaction as the tool, and the pending changes are written after the
round's merges, in the reserved workspace.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from toolservice_base import tracing
from toolservice_base.configclient import ConfigClient
from toolservice_base.errors import ConfigConflict, ConfigRefused
from toolservice_base.logs import get_logger
from toolservice_base.schemas import canonical_json

from .book import ServiceBook
from .departed import DEPARTED_KEY, Departed
from .keys import Key
from .leases import LeaseTable, ServiceKey
from .merge import Finding, Offer, OwnershipRecord, Plan, apply_plan, combine, plan_service, record_key
from .metrics import RegistryMetrics
from .owners import Owners
from .pins import PIN_TYPE, Pin, PinBook
from .protocol import NameConflict
from .refusals import Refusals
from .state import ServiceState
from .store_writes import PROBE_WORKSPACE, StoreWrites

__all__ = ["INDEX_KEY", "BatchWriter", "parse_index"]

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


class BatchWriter:
    """Writes one batch of dirty services (`write`), and keeps what the writes made true: who owns which key
    (`owners`), which services are refused a name (`conflicted`), which workspaces hold records (`indexed`)."""

    def __init__(
        self,
        config: ConfigClient,
        book: ServiceBook,
        leases: LeaseTable,
        *,
        workspace_default: str,
        metrics: RegistryMetrics,
        mark: Callable[[ServiceKey], None],
        refusals: Refusals | None,
        departed: Departed,
        pins: PinBook | None,
    ) -> None:
        self._config = config
        self.writes = StoreWrites(config)
        """Conditional writes, or read-compare-write where the store ignores `expect`."""
        self._book = book
        self._leases = leases
        self.workspace_default = workspace_default
        self.metrics = metrics
        self.mark = mark
        self._refusals = refusals
        """Where a refused write or a refused name is told; None: nobody to tell (a writer measured alone)."""
        self.departed = departed
        self.pins = pins
        """Pinned definitions and pending changes; None: definitions are not pinned (`--pin-definitions` off)."""
        self.owners = Owners()
        """Who owns each key, kept in step with every service's `owned` (`StoreWriter.adopt`, `_commit`)."""
        self.conflicted: set[ServiceKey] = set()
        """Services refused a tool name now: a change in the store may let them have it
        (`StoreWriter.recheck_conflicts`)."""
        self.indexed: set[str] = {workspace_default}
        self.store_writes = 0
        """Transactions sent to the store (tests use it to prove batching)."""

    async def write(self, batch: set[ServiceKey], forced: set[ServiceKey]) -> None:
        by_workspace: dict[str, list[ServiceKey]] = defaultdict(list)
        for key in sorted(batch):
            if key in self._book:
                by_workspace[key.workspace].append(key)
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
                if self._refusals is not None:
                    self._refusals.write_refused(key, f"the config store refused service {key.service!r}: {exc}")

    def _entries(
        self, workspace: str, keys: list[ServiceKey], forced: set[ServiceKey], *, note: bool = False
    ) -> list[Entry]:
        """What each service should have now; those whose record says nothing changed are left out unless forced."""
        owners = self.owners.of(workspace)
        wall = time.time()
        entries: list[Entry] = []
        for key in keys:
            state = self._book.get(key)
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
        wanted = self._wanted(entries, pin_keys)
        found = await self._config.get(sorted(wanted), workspace=workspace)
        original: dict[Key, str | None] = {key: found.get(key) for key in wanted}
        if self.pins is not None:  # the store's pins are the truth: decide again on them, and note what is held
            self.pins.load_pins(workspace, {key[1]: value for key, value in original.items() if key[0] == PIN_TYPE})
            # A key the first look did not read counts as absent: the conditional write fails if it is not, and is
            # planned again.
            entries = self._entries(workspace, [entry[0].key for entry in entries], forced, note=True)
        view = dict(original)
        wall = time.time()
        entries.sort(key=lambda entry: (entry[2] is not None, entry[0].order))  # departures free names first
        plans = self._plans(workspace, entries, view, wall)
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
        if self._refusals is not None:
            for key, conflicts in refused.items():
                await self._refusals.tell_conflicts(key, conflicts)

    def _wanted(self, entries: list[Entry], pin_keys: set[Key]) -> set[Key]:
        """The keys a batch reads before it plans: each service's record, what it owns and offers, and the pins of
        what it offers (and the pins an operator changed)."""
        wanted: set[Key] = set(pin_keys)
        for state, offer, _ in entries:
            wanted.add(record_key(state.service_id))
            wanted |= set(state.owned)
            if offer is not None:
                wanted |= set(offer.items())
            if self.pins is not None:
                wanted |= {(PIN_TYPE, name) for known in state.offers.values() for name in known.digests}
        return wanted

    def _plans(self, workspace: str, entries: list[Entry], view: dict[Key, str | None], wall: float) -> list[Plan]:
        """Plan each service's write over `view` in turn, each seeing what the ones before it took (and `view` is
        left as the batch would leave the store). Names kept for a service that went are taken unless a live one owns
        them; a service going now keeps its names for one ttl, in this batch too."""
        kept = {("tool", name): k for name, k in self.departed.kept(workspace, wall).items()}
        owners = self.owners.layer(workspace)
        for key, k in kept.items():
            if key not in owners:  # a name kept for a service that went, unless a live one owns it
                owners[key] = k.service
        until = {key: k.until for key, k in kept.items()}
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
        return plans

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
                self._book.forget(state.key)
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
