"""What the registry knows about one announced service, between store writes.

A service is `(workspace, id)`: all its instances share it. It keeps the
offers (descriptor sets) its instances announced, the ownership record last
written for it, and its current conflicts. Which offer is merged is decided
here: the newest announce among the instances still holding a lease, so a
rolling upgrade moves to the new descriptors and an instance of the old ones
dying moves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolservice_base.schemas import Conflict, ToolStatus

from .leases import Lease, ServiceKey
from .merge import InstanceRecord, Key, Offer, OwnershipRecord

__all__ = ["ServiceState", "service_status"]


def service_status(leases: list[Lease]) -> str:
    """`live` if any instance is heard from; else `held` (self-preservation); else `grace` (restart)."""
    states = {lease.state for lease in leases}
    for status in ("live", "held", "grace"):
        if status in states:
            return status
    return "removing"


@dataclass
class ServiceState:
    key: ServiceKey
    order: int
    """First-seen order: in a batch, the earlier service claims a contested name first."""
    offers: dict[str, Offer] = field(default_factory=dict)
    record: OwnershipRecord | None = None
    """The ownership record as last written (or read at start); None before the first write."""
    owned: dict[Key, str] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)
    conflicts: dict[str, Conflict] = field(default_factory=dict)

    @property
    def workspace(self) -> str:
        return self.key[0]

    @property
    def service_id(self) -> str:
        return self.key[1]

    def active_offer(self, leases: list[Lease]) -> Offer | None:
        """The offer of the most recent announce among live leases; forgets offers nobody holds."""
        in_use = {lease.digest for lease in leases}
        for digest in [d for d in self.offers if d not in in_use]:
            del self.offers[digest]
        announced = [lease for lease in leases if lease.announced and lease.digest in self.offers]
        if not announced:
            return None
        newest = max(announced, key=lambda lease: lease.announced)
        return self.offers[newest.digest]  # type: ignore[index]

    def desired_record(self, leases: list[Lease], offer: Offer | None) -> OwnershipRecord | None:
        """The record this service should have, before ownership is decided; None when it is gone."""
        if not leases:
            return None
        for instance in [i for i in self.since if i not in {lease.instance for lease in leases}]:
            del self.since[instance]
        digest: str | None = None
        version = ""
        if offer is not None:
            digest, version = offer.digest, offer.version
        elif self.record is not None:
            digest, version = self.record.digest, self.record.version
        instances = {
            lease.instance: InstanceRecord(ttl=lease.ttl, since=round(self.since.get(lease.instance, lease.last_seen), 3))
            for lease in sorted(leases, key=lambda lease: lease.instance)
        }
        return OwnershipRecord(service=self.service_id, workspace=self.workspace, digest=digest, version=version, instances=instances)

    def record_is_current(self, desired: OwnershipRecord | None) -> bool:
        """True when writing `desired` would change nothing but (possibly) ownership."""
        if desired is None or self.record is None:
            return False
        return desired == self.record.model_copy(update={"owned": {}})

    def tool_names(self) -> list[str]:
        return sorted(key for item_type, key in self.owned if item_type == "tool")

    def tool_statuses(self, leases: list[Lease], wall_now: float) -> list[ToolStatus]:
        status = service_status(leases)
        last = max((lease.last_seen for lease in leases), default=None)
        version = self.record.version if self.record is not None else ""
        return [
            ToolStatus(
                name=name,
                service=self.service_id,
                source="announced",
                status=status,
                instances=len(leases),
                last_heartbeat_age=None if last is None else round(max(0.0, wall_now - last), 3),
                workspace=self.workspace,
                version=version,
            )
            for name in self.tool_names()
        ]
