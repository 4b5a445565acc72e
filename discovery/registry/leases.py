"""Leases of tool-service instances, their expiry, and self-preservation.

Pure bookkeeping with the clock passed in, so every rule here is unit-tested
without a broker. A lease is one instance's claim to be alive: it lasts `ttl`
seconds past the instance's last message. The registry sweeps the table every
fraction of a second; what a sweep returns is what the registry deletes.

Self-preservation: when more than a set share of all leases stop renewing at
the same time, the likelier story is that the registry (or the broker between
it and the services) went deaf, not that most services died at once. Those
expiries are *held*: the leases stay, the tools stay in the store, and the
operator is told. A hold ends when a held instance is heard from again (then
every held lease gets one more `ttl` and expires normally, never held twice),
or when the operator confirms it (`toolreg release`).

Only silence is protected. A lease whose holder is still sending, but whose
messages the registry refuses (a trust policy turned on, a key revoked, its
queues no longer allowed), is *refused*, not silent: the registry hears it,
so neither the registry nor the broker can be at fault. A refused lease runs
out one ttl after its last accepted message like any other, is never held,
and does not count towards the share that trips self-preservation; a held
lease that turns out to be refused is dropped at the next sweep.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from .keys import ServiceKey
from .usage import InstanceCalls

__all__ = ["Lease", "LeaseTable", "ServiceKey", "SweepResult", "should_hold"]


@dataclass
class Lease:
    """One instance's lease. Times: `expires_at` monotonic, `last_seen` wall clock."""

    instance: str
    service: ServiceKey
    ttl: float
    expires_at: float
    last_seen: float | None
    """Wall clock of the last accepted message; None: not heard from since the registry started."""
    digest: str | None = None
    announced: int = 0
    """Registry-local order of this instance's last announce (0: none yet); the newest offer wins."""
    grace: bool = False
    """Restored from an ownership record at registry start, not yet heard from."""
    held: bool = False
    """Expired in a sweep that tripped self-preservation; kept until released."""
    exempt: bool = False
    """Released from a hold: expires normally and is never held again."""
    sequence: int = 0
    """`sequence` of the last accepted message (0: none since the registry started)."""
    signer: str | None = None
    """Key id that signed the last accepted message under a trust policy; None: unsigned, or no policy
    (without a policy no signature is checked, so none is claimed). The registry page names it."""
    refused: str | None = None
    """Why the holder's messages are refused, if any arrived since the last accepted one: it is not silent."""
    calls: InstanceCalls | None = None
    """The call counters its last two heartbeats carried (`usage`), for the page; None: none (yet). Gone with the
    lease."""

    @property
    def state(self) -> str:
        if self.refused is not None:
            return "refused"
        if self.held:
            return "held"
        if self.grace:
            return "grace"
        return "live"


@dataclass(frozen=True)
class SweepResult:
    """What one sweep decided."""

    expired: list[Lease] = field(default_factory=list)
    held: list[Lease] = field(default_factory=list)
    failing: int = 0
    """Leases that stopped renewing: held already, running out now, or silent past half their ttl."""
    total: int = 0
    """Every lease in the table when the sweep began."""

    @property
    def share(self) -> float:
        return self.failing / self.total if self.total else 0.0


def should_hold(failing: int, total: int, threshold: float, minimum: int) -> bool:
    """Self-preservation's test: at least `minimum` failing leases, and more than `threshold` of all.

    `minimum` keeps a small deployment normal: one service with one or two
    instances dying (or two services on a laptop) is removed, not held.
    """
    if failing < max(minimum, 1) or total <= 0:
        return False
    return failing / total > threshold


COMPACT_FACTOR, COMPACT_SLACK = 4, 1024
"""The deadlines are rebuilt from the leases once they hold more than this many entries per lease (plus the slack)."""


class LeaseTable:
    """Every lease the registry knows, by instance id."""

    def __init__(self, *, threshold: float = 0.5, minimum: int = 3) -> None:
        self.threshold = threshold
        self.minimum = minimum
        self._leases: dict[str, Lease] = {}
        self._services: dict[ServiceKey, dict[str, Lease]] = {}
        """The same leases by service, kept in step: a service's leases cost its own size to find, not the fleet's."""
        self._holding = False
        """A sweep held leases, and `held()` has not found them all gone since: only then is looking for them worth a
        pass."""
        self._deadlines: list[tuple[float, str]] = []
        """(expires_at, instance) for every time a lease's end was set: a sweep pops what is due and costs what ran
        out, not the fleet. An entry whose lease has since moved on (renewed, removed) is dropped when popped."""

    def _due_at(self, lease: Lease) -> None:
        """Keep `lease`'s current end in the deadlines (call after each change of `expires_at`)."""
        deadlines = self._deadlines
        heapq.heappush(deadlines, (lease.expires_at, lease.instance))
        if len(deadlines) > COMPACT_FACTOR * len(self._leases) + COMPACT_SLACK:  # renewals far faster than a ttl
            self._deadlines = [(lease.expires_at, lease.instance) for lease in self._leases.values()]
            heapq.heapify(self._deadlines)

    def _put(self, lease: Lease) -> None:
        old = self._leases.get(lease.instance)
        if old is not None and old is not lease:
            self._unindex(old)
        self._leases[lease.instance] = lease
        self._services.setdefault(lease.service, {})[lease.instance] = lease

    def _unindex(self, lease: Lease) -> None:
        siblings = self._services.get(lease.service)
        if siblings is not None and siblings.get(lease.instance) is lease:
            del siblings[lease.instance]
            if not siblings:
                del self._services[lease.service]

    def __len__(self) -> int:
        return len(self._leases)

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._leases.values()))

    def get(self, instance: str) -> Lease | None:
        return self._leases.get(instance)

    def of_service(self, service: ServiceKey) -> list[Lease]:
        return list(self._services.get(service, {}).values())

    def has_service(self, service: ServiceKey) -> bool:
        """Whether any instance of `service` holds a lease."""
        return service in self._services

    def service_count(self) -> int:
        """Services with at least one lease."""
        return len(self._services)

    def renew(
        self,
        instance: str,
        service: ServiceKey,
        *,
        ttl: float,
        now: float,
        wall: float,
        digest: str | None = None,
        announced: int = 0,
        sequence: int = 0,
        signer: str | None = None,
    ) -> tuple[Lease, bool]:
        """Extend (or create) `instance`'s lease; returns it and whether it is new.

        A renewal of a held lease is the "heartbeats resumed" signal: the
        caller then calls `resume_held` to give the other held leases a ttl.
        An instance that now names another service moves to it.
        """
        lease = self._leases.get(instance)
        created = lease is None or lease.service != service
        if lease is None or lease.service != service:
            lease = Lease(instance=instance, service=service, ttl=ttl, expires_at=now + ttl, last_seen=wall)
            self._put(lease)
        lease.ttl = ttl
        lease.expires_at = now + ttl
        self._due_at(lease)
        lease.last_seen = wall
        lease.grace = False
        lease.held = False
        lease.refused = None
        lease.signer = signer
        if sequence:
            lease.sequence = sequence
        if digest is not None:
            lease.digest = digest
        if announced:
            lease.announced = announced
        return lease, created

    def restore(
        self,
        instance: str,
        service: ServiceKey,
        *,
        ttl: float,
        now: float,
        digest: str | None,
        heard: tuple[float, float | None] | None = None,
    ) -> Lease:
        """A lease from an ownership record: one `ttl` of grace from now to be heard from (and never heard from yet).

        `heard` (a standby's `HeardLeases.restore_expiry`): when it ends by
        what the standby heard, and when the instance last spoke (None: not
        while it listened). Heard from, the lease is live as at the registry
        it replaces; never heard, it keeps `grace` until its (earlier) end.
        """
        expires_at, last_seen = heard if heard is not None else (now + ttl, None)
        lease = Lease(
            instance=instance,
            service=service,
            ttl=ttl,
            expires_at=expires_at,
            last_seen=last_seen,
            digest=digest,
            grace=last_seen is None,
        )
        self._put(lease)
        self._due_at(lease)
        return lease

    def refuse(self, instance: str, reason: str) -> Lease | None:
        """The holder of `instance` sent a message the registry refused: it is alive, not silent.

        The lease is not renewed (it still runs out one ttl after the last
        accepted message), but it will not be held when it does.
        """
        lease = self._leases.get(instance)
        if lease is not None:
            lease.refused = reason
            if lease.held:  # its end has passed: the next sweep drops it
                self._due_at(lease)
        return lease

    def remove(self, instance: str) -> Lease | None:
        lease = self._leases.pop(instance, None)
        if lease is not None:
            self._unindex(lease)
        return lease

    def held(self) -> list[Lease]:
        if not self._holding:
            return []
        found = [lease for lease in self._leases.values() if lease.held]
        self._holding = bool(found)
        return found

    def resume_held(self, now: float) -> list[Lease]:
        """Heartbeats resumed: every held lease gets one more ttl, and will expire normally."""
        resumed = []
        for lease in self._leases.values():
            if lease.held:
                lease.held = False
                lease.exempt = True
                lease.expires_at = now + lease.ttl
                self._due_at(lease)
                resumed.append(lease)
        return resumed

    def release_held(self) -> list[Lease]:
        """The operator confirmed the held deletions: drop those leases now."""
        released = self.held()
        for lease in released:
            self.remove(lease.instance)
        return released

    def sweep(self, now: float) -> SweepResult:
        """Drop the leases that ran out, unless self-preservation holds them.

        Heartbeats come every ttl/3, so instances that fall silent together
        still run out one by one, spread over a third of a ttl. A sweep
        therefore judges "many at once" by every lease that stopped
        renewing: those held already, those running out now, and those
        silent for more than half their ttl (they missed a heartbeat and
        will run out within the next sweeps). While anything is held, that
        share stays high, so further expiries are held too until the hold
        ends. Released leases (`exempt`) always expire normally, and so do
        refused ones (their holder is sending: the registry is not deaf);
        a held lease found refused goes at once.
        """
        due = self._due(now)
        if not due:
            return SweepResult()
        candidates = [lease for lease in due if not lease.exempt and lease.refused is None]
        held_before = sum(1 for lease in self._leases.values() if lease.held and lease.refused is None)
        silent = sum(
            1
            for lease in self._leases.values()
            if not lease.held
            and not lease.exempt
            and lease.refused is None
            and lease.expires_at > now
            and now - (lease.expires_at - lease.ttl) > lease.ttl / 2
        )
        failing, total = held_before + len(candidates) + silent, len(self._leases)
        if candidates and should_hold(failing, total, self.threshold, self.minimum):
            for lease in candidates:
                lease.held = True
            self._holding = True
            expired = [lease for lease in due if lease.exempt or lease.refused is not None]
            held = candidates
        else:
            expired, held = due, []
        for lease in expired:
            lease.held = False
            self.remove(lease.instance)
        return SweepResult(expired=expired, held=held, failing=failing, total=total)

    def next_due(self) -> float:
        """When (monotonic) the next lease can run out, held ones aside; infinity when none can. What a sweep would
        drop from the deadlines on the way (entries a lease has moved on from) is dropped here."""
        deadlines = self._deadlines
        while deadlines:
            if self._takeable(*deadlines[0]) is not None:
                return deadlines[0][0]
            heapq.heappop(deadlines)
        return float("inf")

    def _due(self, now: float) -> list[Lease]:
        """The leases whose end has come, unless held (and not refused): popped from the deadlines, each once."""
        deadlines = self._deadlines
        due: dict[str, Lease] = {}
        while deadlines and deadlines[0][0] <= now:
            lease = self._takeable(*heapq.heappop(deadlines))
            if lease is not None:
                due[lease.instance] = lease
        return list(due.values())

    def _takeable(self, expires_at: float, instance: str) -> Lease | None:
        """The lease a deadline still stands for, if a sweep may take it: None once renewed or removed since, and
        while held (a held lease waits for `resume_held`, `refuse` or `release_held`) unless refused."""
        lease = self._leases.get(instance)
        if lease is None or lease.expires_at != expires_at:
            return None
        return lease if not lease.held or lease.refused is not None else None

    def by_service(self) -> dict[ServiceKey, list[Lease]]:
        """Every lease, grouped by service: a pass over the fleet. For one service, `of_service`."""
        return {service: list(leases.values()) for service, leases in self._services.items()}
