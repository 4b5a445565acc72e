"""The config store replicated on Apache Pulsar: one active replica writes, standbys follow (`toolreg up --store
pulsar`).

The store's items and version live in persistent topics of `<topicspace>/state`
(`discovery.replicas`): every write is one entry of a log, snapshots keep
start-up bounded, and the broker elects the one replica that writes through
an exclusive producer. Each replica keeps the items in an in-memory SQLite
store (`ConfigStore.in_memory`), so reads, paging and validation are the
embedded store's own code.

- **Standby**: restores the last snapshot, tails the log, serves nothing. It
  holds the same items and version as the active one, a poll behind. Before
  it joins it compares itself with the active one: other settings, or a log
  that ends below the version the active has applied (the broker deleted
  entries: a `state` namespace without retention), and it refuses in one line.
- **Active**: once the election hands it the lock it opens the log's writer
  (fencing a deposed one), reads the log to its end, and only then serves the
  config queues. A write is applied locally, appended to the log and
  answered once the broker has persisted it (`Journal`); requests are served
  one at a time around that append, so nothing un-persisted is ever read.
- **Deposed** (fenced, or an append that may not have reached the log): it
  stops serving, drops its state and starts again as a standby from the log,
  so whatever it had that the log lacks is gone with it.
- **Alone on its topicspace**: before it joins, a replica asks who is there
  (`Membership.look_around`); a config store of another kind (a SQLite
  `toolreg up`) answering the same queues makes it refuse in one line naming
  it (`AnotherStore`), and one heard later is logged and makes `/readyz` fail.

What a standby holds against the active's status (its settings, the version
it applied) is only a hint unless a group key authenticates the status: then
it is a replica's own word and a mismatch refuses the join; without a key it
is logged, never a reason to stop.

`on_active` / `on_standby` let the caller run what belongs to the active one
(the registry) beside the store, without this package knowing it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any, Self

from discovery.errors import ReplicationError
from discovery.replicas import (
    Election,
    GroupKey,
    Membership,
    ReplicaStatus,
    ReplicatedLog,
    differing_settings,
)
from discovery.replicas.status import describe
from toolservice_base.errors import ToolDiscoveryError, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.tasks import cancel_and_wait
from toolservice_base.transport import Transport

from .changes import ChangeWindow
from .log_state import LogJournal, StoreState
from .operations import StoreProtocol
from .service import ConfigStoreService
from .sqlite import ConfigStore
from .write_policy import ConfigWriteGuard

log = get_logger("discovery.store")

GROUP = "config-store"
"""The replica group of the config store (`toolreg replicas` shows it)."""
DEFAULT_TAKEOVER_AFTER = 10.0
"""Seconds the active replica may be silent to the group before a standby fences it (a frozen process)."""
SETTINGS_WAIT = 2.5
"""Status intervals a starting standby waits to hear the active replica's settings and version before it joins (it
publishes every one)."""
RIVAL_WAIT = 0.5
"""Seconds a starting store listens for another store on its topicspace (every member answers a newcomer at once)."""
REJOIN_DELAYS = (0.5, 1.0, 2.0, 4.0)
"""Seconds between attempts to start the next generation while the broker cannot be reached (the last repeats): a
replica deposed while its broker restarts waits for it, as every other process does, instead of exiting."""


class AnotherStore(ToolDiscoveryError):
    """Another config store already answers on this topicspace; the message names it."""


def another_store(rival: ReplicaStatus, topic: str) -> AnotherStore:
    return AnotherStore(
        f"another config store already answers on this topicspace: {describe(rival)}, heard on {topic}; run one store"
        " per topicspace (stop that one first, or give this one another TOOLREG_TOPICSPACE)"
    )


Hook = Callable[[], Awaitable[None]]


def new_replica_id() -> str:
    """Unique per process start, readable in `toolreg replicas`: host, pid and a random tail."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class ReplicatedStore:
    """One replica of the config store group on `connection`'s topicspace. `async with` it; it runs until closed."""

    def __init__(
        self,
        connection: Transport,
        *,
        protocol: StoreProtocol = "toolreg",
        replica_id: str | None = None,
        takeover_after: float = DEFAULT_TAKEOVER_AFTER,
        settings: Mapping[str, Any] | None = None,
        on_active: Hook | None = None,
        on_standby: Hook | None = None,
        snapshot_every: int = 10_000,
        key: GroupKey | None = None,
        write_guard: ConfigWriteGuard | None = None,
        window: ChangeWindow = ChangeWindow(),
    ) -> None:
        """`settings`: what every replica of the group must share (the trust policy's digest, say), compared across the
        group; `key`: the group key its state records are signed and checked with (None: the broker's permissions
        alone protect them)."""
        self._connection = connection
        self.protocol = protocol
        self.replica_id = replica_id or new_replica_id()
        self.takeover_after = takeover_after
        self._settings = dict(settings or {})
        self._on_active = on_active
        self._on_standby = on_standby
        self._snapshot_every = snapshot_every
        self.key = key
        self._write_guard = write_guard
        self._window = window
        self._looked_around = False
        self.store: ConfigStore | None = None
        self._state: StoreState | None = None
        self.service: ConfigStoreService | None = None
        self._log: ReplicatedLog | None = None
        self._election: Election | None = None
        self._members: Membership | None = None
        self._generation_over = asyncio.Event()
        self._started = asyncio.Event()
        self._failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    # --- what others see ------------------------------------------------------------------

    @property
    def role(self) -> str:
        return self._election.role if self._election is not None else "starting"

    @property
    def version(self) -> int:
        return self._log.version if self._log is not None else 0

    def replicas(self) -> list[ReplicaStatus]:
        """The group as this replica hears it (itself included)."""
        return self._members.replicas() if self._members is not None else []

    def heard_itself_at(self) -> float | None:
        """When (monotonic) this replica last heard its own status back (`Membership.heard_itself_at`)."""
        return self._members.heard_itself_at if self._members is not None else None

    def readiness(self) -> str | None:
        """None when this replica does its part: a standby that follows the log, or an active one whose store
        answers."""
        if self._failure is not None:
            return f"replica stopped: {self._failure}"
        if self._log is None or not self._started.is_set():
            return "restoring the replicated store from the log"
        if self._log.failure is not None:
            return str(self._log.failure)
        if self._members is not None and (rivals := self._members.rivals()):
            return str(another_store(rivals[0], self._members.topic))
        if self.role == "active":
            return "promoted, not serving yet" if self.service is None else self.service.readiness()
        return None

    def describe(self) -> str:
        """One line for `toolreg up`: where the store lives, this replica's id and role."""
        return (
            f"replicated on {self._connection.topics.state_log} (replica {self.replica_id}, {self.role}, version"
            f" {self.version})"
        )

    # --- life cycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run(), name=f"replicated-store:{self.replica_id}")
        started = asyncio.ensure_future(self._started.wait())
        try:
            await asyncio.wait({started, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
        if not self._started.is_set():
            await self.close()
            raise self._failure or ToolDiscoveryError("the replicated store stopped while starting")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def wait_failed(self) -> None:
        """Return (raising its error) once this replica stopped for good; for `toolreg up` to watch."""
        assert self._task is not None
        await asyncio.shield(self._task)
        if self._failure is not None:
            raise self._failure

    # --- generations: one per stint as a standby (and, maybe, active) ----------------------

    async def _run(self) -> None:
        try:
            while True:
                self._generation_over.clear()
                await self._next_generation()
        except ToolDiscoveryError as exc:
            self._failure = exc
            log.error("config.replica_failed", replica=self.replica_id, error=str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: reported, never a silently dead replica
            self._failure = exc
            log.exception("config.replica_crashed", replica=self.replica_id)

    async def _next_generation(self) -> None:
        """A generation; after the first one started, one the broker cannot be reached for is tried again (the first
        fails at once: that is `toolreg up` told in one line that its broker is not there)."""
        for attempt in itertools.count():
            try:
                await self._generation()
                return
            except TransportError as exc:
                if not self._started.is_set() or not exc.retriable:
                    raise
                delay = REJOIN_DELAYS[min(attempt, len(REJOIN_DELAYS) - 1)]
                log.warning("config.replica_waiting", replica=self.replica_id, error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)

    async def _generation(self) -> None:
        """Restore, follow, maybe serve; return once deposed, so the next generation starts from the log alone."""
        connection = self._connection
        async with AsyncExitStack() as stack:
            store = ConfigStore.in_memory(f"replicated {connection.topics.state_log}", window=self._window)
            stack.callback(store.close)
            replicated_log: ReplicatedLog | None = None
            members = await self._join(stack, lambda: replicated_log.version if replicated_log is not None else 0)
            election = Election(
                connection,
                connection.topics.state_lock,
                self.replica_id,
                membership=members,
                takeover_after=self.takeover_after,
                key=self.key,
            )
            state = StoreState(store)
            replicated_log = ReplicatedLog(
                connection,
                state,
                election=election,
                snapshot_every=self._snapshot_every,
                key=self.key,
            )
            await stack.enter_async_context(replicated_log)
            election.add_listener(self._promoted, self._demoted)
            self.store, self._state, self._log, self._election = store, state, replicated_log, election
            self._members = members
            stack.callback(self._forget)
            await stack.enter_async_context(election)
            if election.role == "standby":
                await self._compare_with_the_active(members, replicated_log, election)
            self._started.set()
            log.info(
                "config.replica_started", replica=self.replica_id, role=election.role, version=replicated_log.version
            )
            self._check_settings()
            stopped = asyncio.ensure_future(election.wait_stopped())
            over = asyncio.ensure_future(self._generation_over.wait())
            try:
                await asyncio.wait({stopped, over}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                over.cancel()
                await asyncio.wait({stopped, over})  # so the failure `stopped` may hold is read, not left unretrieved
            if election.failure is not None:
                raise election.failure
        log.info(
            "config.replica_restarting", replica=self.replica_id, note="deposed: state dropped, following the log again"
        )

    async def _join(self, stack: AsyncExitStack, version: Callable[[], int]) -> Membership:
        """This replica's membership of the group; at the first start, unless another store answers here."""
        members = Membership(
            self._connection,
            self.replica_id,
            GROUP,
            settings=self._settings,
            version=version,
            key=self.key,
            store="replicated",
        )
        await stack.enter_async_context(members)
        if not self._looked_around:  # once per process: a rival heard later is reported, not refused
            if rivals := await members.look_around(RIVAL_WAIT):
                raise another_store(rivals[0], members.topic)
            self._looked_around = True
        members.joined()
        return members

    def _forget(self) -> None:
        self.store = self.service = None
        self._state = None
        self._log = self._election = self._members = None

    async def _compare_with_the_active(
        self, members: Membership, replicated_log: ReplicatedLog, election: Election
    ) -> None:
        """A standby refuses to join a group whose active replica it cannot stand in for.

        - other settings: promoted, it would apply another trust policy;
        - a log that, read to its end, stops below the version the active has
          applied: every version a replica applied was in the log first, so
          the broker deleted entries (a `state` namespace without retention),
          even all of them, which the log alone cannot show.

        The active is the replica the lock's newest marker names. Its status
        is a hint unless the group key authenticates it: then a mismatch
        refuses the join; without a key it is logged (`config.replica_settings_differ`,
        `config.replica_log_behind`) and the replica joins, since anyone who may
        produce on the members topic could have written that status.

        Waits for the active's status (published every `interval`) for up to
        `SETTINGS_WAIT` intervals; a group with no active heard by then is
        compared again on each promotion (`_check_settings`, logged).
        """
        own = members.status.settings
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTINGS_WAIT * members.interval
        while loop.time() < deadline:
            actives = [r for r in members.replicas() if r.role == "active" and r.id != self.replica_id]
            active = next((r for r in actives if r.id == election.holder), actives[0] if actives else None)
            if active is not None:
                if own and active.settings and active.settings != own:
                    if active.verified:
                        differ = differing_settings(members.status, active)
                        which = f"; they differ in {', '.join(differ)}" if differ else ""
                        raise ReplicationError(
                            f"replica {self.replica_id} runs with other group settings (trust policy and limits, {own})"
                            f" than the active replica {active.id} ({active.settings}){which}: start every replica of"
                            " a group alike (`toolreg replicas -o wide` shows each one's settings digest)"
                        )
                    self._settings_differ(active)
                if active.verified:
                    await replicated_log.expect_at_least(active.version, active.id)
                elif await replicated_log.catch_up() < active.version:
                    log.error(
                        "config.replica_log_behind",
                        replica=self.replica_id,
                        active=active.id,
                        active_version=active.version,
                        log_version=replicated_log.version,
                        note=(
                            "a status is a hint without a group key: if that replica is real, the broker deleted"
                            " entries of the log (a `state` namespace without retention: deploy/pulsar-init.sh sets it)"
                        ),
                    )
                return
            await asyncio.sleep(0.05)

    def _settings_differ(self, other: ReplicaStatus) -> None:
        log.error(
            "config.replica_settings_differ",
            replica=self.replica_id,
            other=other.id,
            differ=differing_settings(self._members.status, other) if self._members is not None else [],
            note="replicas of one group must run with the same trust policy and options; restart them alike",
        )

    def _check_settings(self) -> None:
        """Replicas of one group must share their settings (the trust policy); say so loudly if one does not."""
        assert self._members is not None
        own = self._members.status.settings
        for other in self._members.replicas():
            if other.settings and own and other.settings != own:
                self._settings_differ(other)

    async def _promoted(self) -> None:
        """Serve the store (the log has caught up and holds the writer), then what the caller runs beside it."""
        assert self.store is not None and self._log is not None and self._election is not None
        assert self._state is not None
        self._check_settings()
        service = ConfigStoreService(
            self._connection,
            self.store,
            protocol=self.protocol,
            journal=LogJournal(self._log, self._election, self._state),
            close_store=False,
            write_guard=self._write_guard,
        )
        await service.start()
        self.service = service
        log.info("config.replica_active", replica=self.replica_id, version=self._log.version, term=self._election.term)
        if self._on_active is not None:
            await self._on_active()

    async def _demoted(self, reason: str) -> None:
        try:
            if self._on_standby is not None:
                await self._on_standby()
        finally:
            service, self.service = self.service, None
            if service is not None:
                await service.stop()
            self._generation_over.set()
