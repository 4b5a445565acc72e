"""How the registry writes: conditionally where the store honours `expect`, else read-compare-write.

Our store checks a write's `expect` preconditions in the same transaction as
the write, so an item an operator wrote since the registry read it is never
clobbered. TrustGraph's config service does not know `expect`, and its
deserializer drops unknown fields without a word: a conditional put sent
there lands as an unconditional one. So the registry asks once, with a write
that must fail where `expect` is honoured (a put of a fresh key expecting a
value it cannot have). Refused: conditional writes. Accepted: the store
ignores `expect`; the probe item is deleted again and every later write is
read-compare-write:

1. read the keys the write touches (and the store's version) and compare
   them with what the plan was made from; any difference is a conflict, and
   the registry re-reads and replans as it does on a refused conditional write;
2. delete, then put (TrustGraph's `put` ignores our `keys`, so deletes are a
   request of their own; deleting first means a failure in between leaves
   keys the ownership record still claims, never keys nobody claims);
3. read the keys back with the version. Each TrustGraph write moves the
   version by exactly one and is pushed with its version and the types and
   workspaces it wrote. A version that moved by more than our own writes
   means someone else wrote between step 1 and step 3; if one of those
   writes was to a type we wrote in our workspace (or its push never
   arrived, so we cannot tell), the keys this write set may have overwritten
   theirs. Those are logged (`registry.write_race`) and kept in `races`.

The window in which an operator's write can be lost is from the store
answering step 1 to it applying step 2: one store round trip (see
docs/operators.md for the measured figure). The probe is repeated after the
store was unreachable, since what answers afterwards may be another store.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from toolservice_base.configclient import ConfigClient
from toolservice_base.errors import ConfigConflict
from toolservice_base.logs import get_logger
from toolservice_base.schemas import ConfigPush, is_reserved_workspace
from toolservice_base.tasks import wait_event

log = get_logger("discovery.registry")

PROBE_WORKSPACE = "_toolreg"
"""Reserved (leading `_`): stored, never announced to processors, so the probe disturbs no one."""
PROBE_TYPE = "expect-probe"
PROBE_UNMATCHABLE = "the probe item never holds this value"
MAX_RACES = 100
PUSH_MEMORY = 10_000
"""Versions whose push is remembered (what each write touched), to tell a foreign write in our scope from one
elsewhere."""
PUSH_WAIT = 0.25
"""Seconds to wait for the pushes of a version range after a read-back showed foreign writes."""

Item = tuple[str, str, str]
ItemKey = tuple[str, str]
Expectation = tuple[str, str, str | None]


@dataclass(frozen=True)
class WriteRace:
    """A read-compare-write that another writer interleaved with: `keys` may have overwritten (or deleted) theirs."""

    at: float
    workspace: str
    keys: tuple[str, ...]
    foreign_writes: int
    """Other writers' writes to our types in our workspace between the check and the read-back (or whose push was
    lost)."""


class StoreWrites:
    """The registry's writes, conditional or read-compare-write, whichever the store can do."""

    def __init__(self, config: ConfigClient) -> None:
        self._config = config
        self.conditional: bool | None = None
        """True: the store honours `expect`; False: it ignores it; None: not asked yet."""
        self.races: deque[WriteRace] = deque(maxlen=MAX_RACES)
        self.windows: deque[float] = deque(maxlen=1000)
        """Seconds from the check's answer to the last write's answer, per read-compare-write: the race window,
        measured."""
        self._pushed: dict[int, set[tuple[str, str]]] = {}
        self._pushed_event = asyncio.Event()

    def observe(self, push: ConfigPush) -> None:
        """Remember what the write of `push.version` touched: `(type, workspace)` pairs."""
        self._pushed[push.version] = {(t, w) for t, workspaces in push.changes.items() for w in workspaces}
        if len(self._pushed) > PUSH_MEMORY:
            for version in sorted(self._pushed)[: len(self._pushed) - PUSH_MEMORY]:
                del self._pushed[version]
        self._pushed_event.set()

    async def detect(self) -> bool:
        """Ask the store whether it honours `expect`, by a write it must refuse if it does."""
        key = f"probe-{uuid.uuid4().hex}"
        try:
            await self._config.apply(
                puts=[(PROBE_TYPE, key, "probe")],
                expect=[(PROBE_TYPE, key, PROBE_UNMATCHABLE)],
                workspace=PROBE_WORKSPACE,
            )
        except ConfigConflict:
            self.conditional = True
        else:
            await self._config.delete([(PROBE_TYPE, key)], workspace=PROBE_WORKSPACE)
            self.conditional = False
            log.warning(
                "registry.store_without_conditional_writes",
                note=(
                    "the config store ignores `expect` (TrustGraph's does): writing by read-compare-write; "
                    "an operator's write landing within one store round trip of the registry's can be overwritten, "
                    "and is reported as registry.write_race"
                ),
            )
        log.info("registry.store_protocol", conditional=self.conditional)
        return self.conditional

    def forget(self) -> None:
        """The store was unreachable: ask again before the next write."""
        self.conditional = None

    async def apply(
        self,
        *,
        puts: Iterable[Item] = (),
        deletes: Iterable[ItemKey] = (),
        expect: Iterable[Expectation] = (),
        workspace: str,
    ) -> int:
        """Puts and deletes guarded by `expect`; raises `ConfigConflict` when a precondition fails. Returns the
        version."""
        if self.conditional is None:
            await self.detect()
        if self.conditional:
            return await self._config.apply(puts=puts, deletes=deletes, expect=expect, workspace=workspace)
        return await self._read_compare_write(list(puts), list(deletes), list(expect), workspace)

    async def _read_compare_write(
        self, puts: list[Item], deletes: list[ItemKey], expect: list[Expectation], workspace: str
    ) -> int:
        watched = list(dict.fromkeys([(t, k) for t, k, _ in expect] + [(t, k) for t, k, _ in puts] + deletes))
        before, current = await self._config.snapshot(watched, workspace=workspace)
        checked = time.monotonic()
        for item_type, key, wanted in expect:
            found = current.get((item_type, key))
            if found != wanted:
                state = "absent" if found is None else "different"
                raise ConfigConflict(f"{item_type}/{key} is {state} since the registry read it", "conflict")
        ours = 0
        if deletes:
            await self._config.delete(deletes, workspace=workspace)
            ours += 1
        if puts:
            await self._config.put(puts, workspace=workspace)
            ours += 1
        self.windows.append(time.monotonic() - checked)
        after, now = await self._config.snapshot(watched, workspace=workspace)
        scope = {(t, workspace) for t, _, _ in puts} | {(t, workspace) for t, _ in deletes}
        if after - before > ours and (touching := await self._writes_touching(scope, before, after)) > ours:
            exposed = [f"{t}/{k}" for t, k, v in puts if now.get((t, k)) == v] + [
                f"{t}/{k}" for t, k in deletes if (t, k) not in now
            ]
            race = WriteRace(at=time.time(), workspace=workspace, keys=tuple(exposed), foreign_writes=touching - ours)
            self.races.append(race)
            log.warning(
                "registry.write_race",
                workspace=workspace,
                keys=list(exposed),
                foreign_writes=race.foreign_writes,
                note=(
                    "another writer wrote while the registry did; if it wrote one of these keys, its value was"
                    " overwritten"
                ),
            )
        return after

    async def _writes_touching(self, scope: set[tuple[str, str]], before: int, after: int) -> int:
        """Writes in versions (before, after] that touched `scope`, ours included; a version whose push is missing
        counts as touching it."""
        versions = range(before + 1, after + 1)
        if any(is_reserved_workspace(w) for _, w in scope):
            return len(versions)  # pushes never name reserved workspaces: every write counts
        deadline = time.monotonic() + PUSH_WAIT
        while any(v not in self._pushed for v in versions) and time.monotonic() < deadline:
            self._pushed_event.clear()
            if not await wait_event(self._pushed_event, deadline - time.monotonic()):
                break
        return sum(1 for v in versions if v not in self._pushed or self._pushed[v] & scope)
