"""The registry's start: what the previous run left in the store, read back into memory before a message is taken.

A registry that starts empty would, at its first merge, delete every tool a
live service announced before the restart, and re-add it a heartbeat later.
So before it listens, it reads back its own records: the ownership record of
every service it wrote (`merge`), in every workspace it wrote to (the index
`batches` keeps), gives each recorded instance a lease of one ttl of grace,
and probes: a service that lives re-announces and keeps its tools without a
store write; one that died while the registry was down never answers and
expires after the grace. A registry elected from standby starts warm: each
lease ends when what it heard as a standby says (`heard`), with no grace.

Beside the records: `departed` (withdrawn instances, whose replayed messages
stay refused, and names kept for a service that went, so a restart hands no
name over early), and with pinned definitions the pins and the held changes
(`pins`), so no definition gets in as a "first" one after a restart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from toolservice_base.configclient import ConfigClient
from toolservice_base.logs import get_logger

from .book import ServiceBook
from .departed import DEPARTED_KEY, Departed
from .heard import HeardLeases
from .keys import unreadable
from .leases import LeaseTable, ServiceKey
from .merge import RECORD_TYPE, OwnershipRecord
from .pins import PENDING_TYPE, PIN_TYPE, PinBook
from .store_writes import PROBE_WORKSPACE
from .validation import AnnouncementValidator
from .writer import StoreWriter

log = get_logger("discovery.registry")


@dataclass
class Restore:
    """The parts of a registry its start fills from the store; `await Restore(...).run()` once, before it listens."""

    config: ConfigClient
    writer: StoreWriter
    book: ServiceBook
    leases: LeaseTable
    departed: Departed
    validator: AnnouncementValidator
    pins: PinBook | None
    """None without `--pin-definitions`: then nothing of pins is read."""
    heard: HeardLeases | None
    """What this process heard as a standby; None for a cold start (every lease gets one ttl of grace)."""

    async def run(self) -> None:
        await self.writer.read_index()
        now, wall = time.monotonic(), time.time()
        await self._departed(wall)
        if self.pins is not None:
            await self._pins(self.pins)
        for workspace in sorted(self.writer.indexed):
            records = await self.config.getvalues(RECORD_TYPE, workspace=workspace)
            for service_id, value in sorted(records.items()):
                self._record(workspace, service_id, value, now)

    async def _departed(self, wall: float) -> None:
        """Withdrawn instances and kept names; a withdrawn instance's sequence stays refused until its record ends."""
        found = await self.config.get([DEPARTED_KEY], workspace=PROBE_WORKSPACE)
        try:
            self.departed.load(found.get(DEPARTED_KEY), wall)
        except ValueError as exc:
            unreadable(DEPARTED_KEY, exc, PROBE_WORKSPACE)
        for instance, withdrawn in self.departed.instances.items():
            self.validator.ended(instance, withdrawn.sequence, withdrawn.until)

    async def _pins(self, pins: PinBook) -> None:
        """The pins of every workspace the registry writes to, and the pending changes."""
        for workspace in sorted(self.writer.indexed):
            pins.load_pins(workspace, await self.config.getvalues(PIN_TYPE, workspace=workspace))
        pins.load_pending(await self.config.getvalues(PENDING_TYPE, workspace=PROBE_WORKSPACE))
        log.info("registry.pins_restored", pins=len(pins), pending=len(pins.pending))

    def _record(self, workspace: str, service_id: str, value: str, now: float) -> None:
        """One service's ownership record: its state in the book, a lease per recorded instance. One that cannot be
        read is logged and skipped: the rest of the fleet still starts."""
        try:
            record = OwnershipRecord.from_value(value)
            owned = record.owned_keys()
        except ValueError as exc:
            unreadable((RECORD_TYPE, service_id), exc, workspace)
            return
        key = ServiceKey(workspace, service_id)
        state = self.book.restore(key, record, owned)
        self.writer.adopt(state)
        for instance, item in record.instances.items():
            heard = self.heard.restore_expiry(instance, workspace, item.ttl, now) if self.heard is not None else None
            self.leases.restore(instance, key, ttl=item.ttl, now=now, digest=record.digest, heard=heard)
        if self.pins is not None:  # what the store holds for a pinned tool is its pin, until the service re-announces
            state.digests = {
                name: pin.digest for name in state.tool_names() if (pin := self.pins.get(workspace, name)) is not None
            }
        if not record.instances:
            self.writer.mark(key)
