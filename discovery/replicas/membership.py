"""Who is in a replica group, in which role, how far along: a status a second from each replica.

Every replica of a group (the config store's, the registry's) publishes a
small `ReplicaStatus` (the record and how it is sent: `status`) every
`interval` on the non-persistent topic `Topics.state_members`, and collects
everyone's. The view serves two
purposes:

- `toolreg replicas`: id, role, pid, host, version applied, since when;
- the takeover rule of `Election`: a standby fences the lock only when the
  active's status has been silent for a while (a frozen active keeps its
  exclusive producer at the broker for about a minute; a dead one loses it
  within milliseconds, and then no takeover is needed).

Soft state on purpose: a lost status is replaced a second later, an entry
not heard for `expire_after` seconds is dropped, and nothing here is ever
written to disk. Several groups share the topic; each view keeps its own.

A status is a **hint**, never authority: anyone allowed to produce on the
topic can claim anything in one. No status makes a replica step down or
stop; the lock and the log decide (`Election`, `ReplicatedLog`). With a group
key (`groupkey`) statuses carry a MAC and one that does not check is
dropped from the view (and logged); what is left is then a replica's own
word. A status that is malformed or out of range is dropped the same way.

A config store (`store` set: `replicated` or `sqlite`) also hears the other
stores of its topicspace: a store of another kind, or any other SQLite store,
is a **rival** (`rivals`): two stores on one topicspace would answer the same
queues in turn. A replica that hears a new member publishes its own status at
once, so a starting store hears who is there within a round trip.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any, Self

from toolservice_base.errors import TransportError
from toolservice_base.logs import get_logger
from toolservice_base.tasks import cancel_and_wait, wait_event
from toolservice_base.transport import Envelope, Publisher, Transport, encode

from .groupkey import GroupKey
from .records import Malformed, RecordCheck, sign
from .status import STATUS_KIND, ReplicaStatus, Role, describe, is_question, setting_digests, settings_digest

log = get_logger("discovery.replicas.membership")

ECHO_GAP = 1.5
"""Status intervals between two of its own statuses heard back past which a replica takes it that it could not hear
in between (`hearing_since`)."""
WAKE_EVERY = 0.05
"""The shortest time between two statuses published at once on hearing a new member (a flood of newcomers)."""
ANSWERS_WITHIN = 0.15
"""Seconds a newcomer listens for answers once its question came back to it (members answer at once)."""


class Membership:
    """This replica's status, published every `interval`, and the group's, as heard.

    `version` is read at each heartbeat (the replicated log's applied
    version, say). `Election` sets the role through `set_role`, which also
    publishes at once, so a promotion is seen without waiting a second.
    """

    def __init__(
        self,
        transport: Transport,
        replica_id: str,
        group: str,
        *,
        topic: str | None = None,
        interval: float = 1.0,
        expire_after: float | None = None,
        settings: Mapping[str, Any] | None = None,
        version: Callable[[], int] = lambda: 0,
        key: GroupKey | None = None,
        store: str = "",
    ) -> None:
        """`key`: the group key statuses are signed and checked with; `store`: the kind of config store this replica
        is (`STORE_KINDS`), for a config store's group."""
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self._transport = transport
        self.replica_id = replica_id
        self.group = group
        self.topic = topic or transport.topics.state_members
        self.interval = interval
        self.expire_after = expire_after if expire_after is not None else 3.5 * interval
        self._version = version
        self._own = ReplicaStatus(
            id=replica_id,
            group=group,
            role="standby",
            pid=os.getpid(),
            host=socket.gethostname(),
            version=0,
            since=time.time(),
            settings=settings_digest(settings),
            each=setting_digests(settings),
            store=store,
        )
        self.key = key
        self._check = RecordCheck(self.topic, key)
        self._others: dict[str, ReplicaStatus] = {}
        self._rivals: dict[str, ReplicaStatus] = {}
        self._rivals_said: set[str] = set()
        self._active_heard: dict[str, float] = {}
        self._any_active_heard: float | None = None
        self._heard_itself: float | None = None
        self._hearing_since: float | None = None
        self._woken_at = 0.0
        self._publisher: Publisher | None = None
        self._wake = asyncio.Event()
        self._echo = asyncio.Event()
        self._rival_heard = asyncio.Event()
        self._other_heard = asyncio.Event()
        self._asking = bool(store)
        """A store's statuses are questions until it `joined` (after `look_around`): one refused at start never
        counts, for the stores already there, as a member or a rival."""
        self._paused = False
        self._stack = AsyncExitStack()

    # --- lifecycle ------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        async with AsyncExitStack() as stack:
            subscription = await self._transport.subscribe(self.topic, self._heard)
            stack.push_async_callback(self._transport.unsubscribe, subscription)
            self._publisher = await self._transport.publisher(self.topic)
            stack.push_async_callback(self._transport.close_publisher, self._publisher)
            await self._publish()  # a first status at once: refuses now, in one line, if the topic cannot be written
            task = asyncio.create_task(self._heartbeats(), name=f"membership:{self.group}:{self.replica_id}")
            stack.push_async_callback(cancel_and_wait, task)
            self._stack = stack.pop_all()
        log.debug("membership.started", group=self.group, replica=self.replica_id, topic=self.topic)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._stack.aclose()

    # --- this replica ---------------------------------------------------------------

    @property
    def status(self) -> ReplicaStatus:
        """This replica's status as it would be published now."""
        return replace(self._own, version=self._version(), heard=time.monotonic())

    def set_role(self, role: Role, term: int = 0) -> None:
        """Take a new role (from `Election`); published at once."""
        self._own = replace(self._own, role=role, term=term if role == "active" else 0, since=time.time())
        self._wake.set()

    def pause(self, paused: bool = True) -> None:
        """Stop (or resume) publishing while the process goes on: a replica that looks dead to the others (tests)."""
        self._paused = paused
        self._wake.set()

    async def _heartbeats(self) -> None:
        while True:
            await wait_event(self._wake, self.interval)
            self._wake.clear()
            if self._paused:
                continue
            try:
                await self._publish()
            except TransportError as exc:
                log.warning("membership.publish_failed", group=self.group, replica=self.replica_id, error=str(exc))

    async def _publish(self) -> None:
        assert self._publisher is not None
        status = self.status
        data = encode(status.probing() if self._asking else status.to_wire())
        await self._publisher.send(data, sign(self.key, STATUS_KIND, self.topic, data))

    def joined(self) -> None:
        """Done asking who is there (a store after `look_around`): from now on each status says this one serves."""
        if self._asking:
            self._asking = False
            self._wake.set()

    async def look_around(self, wait: float, answers_within: float = ANSWERS_WITHIN) -> list[ReplicaStatus]:
        """Ask every member to say itself now; the rival stores heard (at once if any, after at most `wait` s).

        Once our own question comes back (the broker delivers to us), members
        have it too and answer within a moment: `answers_within` after the
        echo is as long as this waits then. The question is repeated every
        0.1 s until it echoes: a subscription's first moments can drop what
        arrives before its permits reach the broker.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        self._echo.clear()
        while loop.time() < deadline and not self.rivals():
            await self._publish()
            if await wait_event(self._echo, min(0.1, max(0.0, deadline - loop.time()))):
                await wait_event(self._rival_heard, max(0.0, min(deadline, loop.time() + answers_within) - loop.time()))
                break
        return self.rivals()

    # --- the group ------------------------------------------------------------------

    async def _heard(self, envelope: Envelope) -> None:
        forged = self._check.forgery(envelope, STATUS_KIND)
        if forged is not None:
            self._check.refuse(envelope, STATUS_KIND, forged)
            return
        try:
            status = ReplicaStatus.parse(envelope.data, time.monotonic(), verified=self.key is not None)
        except Malformed as exc:
            self._check.refuse(envelope, STATUS_KIND, f"malformed status: {exc}")
            return
        if status.group != self.group:
            return
        if status.id == self.replica_id:
            if self._heard_itself is None or status.heard - self._heard_itself > ECHO_GAP * self.interval:
                self._hearing_since = status.heard
            self._heard_itself = status.heard
            if is_question(envelope.data):
                self._echo.set()
            return
        asks = is_question(envelope.data)
        new = status.id not in self._others and status.id not in self._rivals
        if (new or asks) and status.heard - self._woken_at >= WAKE_EVERY:
            self._woken_at = status.heard  # a newcomer: let it hear this replica now, not in a second
            self._wake.set()
        if asks and status.id not in self._others:
            return  # a newcomer's question, not yet a member (a store that is refused goes away at once)
        if self._rival(status):
            self._rivals[status.id] = status
            self._rival_heard.set()
            self._said_rival(status)
            return
        self._others[status.id] = status
        self._other_heard.set()
        if status.role == "active":
            self._active_heard[status.id] = self._any_active_heard = status.heard

    async def other_heard(self) -> None:
        """Wait until another member of the group says itself (at once if one did since the last wait returned): a
        watch on the group wakes when there is something to see, not every fraction of a second."""
        await self._other_heard.wait()
        self._other_heard.clear()

    def _rival(self, status: ReplicaStatus) -> bool:
        """Another config store on this topicspace: of another kind, or another SQLite store."""
        own = self._own.store
        if not own:
            return False
        theirs = status.store or "replicated"  # replicas from before stores said their kind were replicated
        return theirs != own or own == "sqlite"

    def _said_rival(self, status: ReplicaStatus) -> None:
        if status.id in self._rivals_said:
            return
        self._rivals_said.add(status.id)
        log.error(
            "membership.rival_store",
            group=self.group,
            replica=self.replica_id,
            rival=describe(status),
            note="two config stores on one topicspace answer the same queues in turn: stop one of them",
        )

    def rivals(self) -> list[ReplicaStatus]:
        """Other config stores heard on this topicspace within `expire_after` (a config store's group only)."""
        horizon = time.monotonic() - self.expire_after
        for gone in [rid for rid, status in self._rivals.items() if status.heard < horizon]:
            del self._rivals[gone]
        return sorted(self._rivals.values(), key=lambda status: status.since)

    def _live_others(self) -> list[ReplicaStatus]:
        horizon = time.monotonic() - self.expire_after
        for gone in [rid for rid, status in self._others.items() if status.heard < horizon]:
            del self._others[gone]
        return list(self._others.values())

    def replicas(self) -> list[ReplicaStatus]:
        """Every replica heard within `expire_after`, this one included, by id."""
        return sorted([self.status, *self._live_others()], key=lambda status: status.id)

    def active(self) -> ReplicaStatus | None:
        """The active replica the group agrees on: the one in the highest term, if any is heard (this one included)."""
        actives = [status for status in self.replicas() if status.role == "active"]
        return max(actives, key=lambda status: (status.term, status.since), default=None)

    def other_active(self) -> ReplicaStatus | None:
        """The live replica other than this one that claims to be active in the highest term."""
        actives = [status for status in self._live_others() if status.role == "active"]
        return max(actives, key=lambda status: (status.term, status.since), default=None)

    @property
    def heard_itself_at(self) -> float | None:
        """When (monotonic) the broker last delivered this replica's own status back to it (None: not yet).

        A status goes out every `interval`: one that came back is the proof
        this process could hear the broker then, which its connection's state
        is not (a connection that loses whatever comes in, or hangs, stays
        "connected" until a keep-alive fails, half a minute later).
        """
        return self._heard_itself

    @property
    def hearing_since(self) -> float | None:
        """When (monotonic) this replica's current unbroken run of its own statuses heard back began: before it, it
        could not hear (its link in was down, or it was frozen), so nobody's silence then counts."""
        return self._hearing_since

    @property
    def active_heard(self) -> dict[str, float]:
        """When (monotonic) each other replica last said it was active (the core's silence rule reads it)."""
        return self._active_heard

    def active_heard_at(self, replica_id: str | None = None) -> float | None:
        """When (monotonic) replica `replica_id` (None: any other) last said it was active; None if it never has."""
        if replica_id is None:
            return self._any_active_heard
        return self._active_heard.get(replica_id)

    @property
    def refused(self) -> int:
        """Statuses dropped as malformed, out of range, or not signed by the group key."""
        return self._check.refused
