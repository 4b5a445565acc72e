"""Who is in a replica group, in which role, how far along: a status a second from each replica.

Every replica of a group (the config store's, the registry's) publishes a
small `ReplicaStatus` every `interval` on the non-persistent topic
`Topics.state_members`, and collects everyone's. The view serves two
purposes:

- `toolreg replicas`: id, role, pid, host, version applied, since when;
- the takeover rule of `Election`: a standby fences the lock only when the
  active's status has been silent for a while (a frozen active keeps its
  exclusive producer at the broker for about a minute; a dead one loses it
  within milliseconds, and then no takeover is needed).

Soft state on purpose: a lost status is replaced a second later, an entry
not heard for `expire_after` seconds is dropped, and nothing here is ever
written to disk. Several groups share the topic; each view keeps its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Self

from toolservice_base.errors import TransportError
from toolservice_base.logs import get_logger
from toolservice_base.tasks import cancel_and_wait
from toolservice_base.transport import Envelope, Publisher, Transport

log = get_logger("discovery.replicas.membership")

Role = Literal["active", "standby"]
ROLES: tuple[Role, ...] = ("active", "standby")
STATUS_FORMAT = 1
"""Format of a status message; a status in a newer format is skipped (it is only a view)."""


def settings_digest(settings: Mapping[str, Any] | None) -> str:
    """A short digest of the settings every replica of a group must share, so `toolreg replicas` can show a mismatch."""
    if not settings:
        return ""
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def setting_digests(settings: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """A short digest of each setting, by name: what lets a replica refused for other settings be told which differ
    (the values themselves, a trust policy's keys say, are not published)."""
    return tuple(sorted((name, settings_digest({name: value})[:8]) for name, value in (settings or {}).items()))


def differing_settings(one: ReplicaStatus, other: ReplicaStatus) -> list[str]:
    """The names of the group settings two replicas hold differently; empty when either did not say (an older one)."""
    if not one.each or not other.each:
        return []
    mine, theirs = dict(one.each), dict(other.each)
    return sorted(name for name in mine.keys() | theirs.keys() if mine.get(name) != theirs.get(name))


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica as it last described itself."""

    id: str
    group: str
    role: Role
    pid: int
    host: str
    version: int
    """The last version of the replicated state it has applied."""
    since: float
    """When it took its current role (seconds since the epoch, its own clock)."""
    term: int = 0
    """The election term it is active in (0 while standby): a higher term wins over a lower one."""
    settings: str = ""
    """Digest of its group settings (`settings_digest`)."""
    each: tuple[tuple[str, str], ...] = ()
    """Digest of each group setting by name (`setting_digests`): which differ, when `settings` does."""
    heard: float = field(default=0.0, compare=False)
    """When this view last heard it (this process's monotonic clock): what expiry and the takeover rule go by."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "format": STATUS_FORMAT,
            "id": self.id,
            "group": self.group,
            "role": self.role,
            "pid": self.pid,
            "host": self.host,
            "version": self.version,
            "since": self.since,
            "term": self.term,
            "settings": self.settings,
            "settings-each": dict(self.each),
        }

    @classmethod
    def from_wire(cls, data: bytes, heard: float) -> "ReplicaStatus | None":
        """The status in a message, or None if it is not one (logged at debug: a view ignores what it cannot read)."""
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict) or int(raw.get("format", 0)) > STATUS_FORMAT or raw.get("role") not in ROLES:
                raise ValueError("not a status this version reads")
            return cls(
                id=str(raw["id"]),
                group=str(raw["group"]),
                role=raw["role"],
                pid=int(raw["pid"]),
                host=str(raw["host"]),
                version=int(raw["version"]),
                since=float(raw["since"]),
                term=int(raw.get("term", 0)),
                settings=str(raw.get("settings", "")),
                each=tuple(sorted((str(k), str(v)) for k, v in dict(raw.get("settings-each") or {}).items())),
                heard=heard,
            )
        except (ValueError, KeyError, TypeError) as exc:
            log.debug("membership.status_skipped", error=str(exc))
            return None


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
    ) -> None:
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
        )
        self._others: dict[str, ReplicaStatus] = {}
        self._active_heard: float | None = None
        self._publisher: Publisher | None = None
        self._wake = asyncio.Event()
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
        await self._publisher.send(self.status.to_wire())

    # --- the group ------------------------------------------------------------------

    async def _heard(self, envelope: Envelope) -> None:
        status = ReplicaStatus.from_wire(envelope.data, time.monotonic())
        if status is None or status.group != self.group or status.id == self.replica_id:
            return
        self._others[status.id] = status
        if status.role == "active":
            self._active_heard = status.heard

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

    def active_heard_at(self) -> float | None:
        """When (monotonic) another replica last said it was active, however long ago; None if none ever has."""
        return self._active_heard


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Whether `event` was set within `timeout` seconds.

    Not `asyncio.wait_for(event.wait(), timeout)`: on Python 3.11 that swallows
    a cancellation arriving as the event is set (seen here: a heartbeat loop
    woken by `set_role` as it was being closed went on for ever).
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
