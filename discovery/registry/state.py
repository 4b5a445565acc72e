"""What the registry knows about one announced service, between store writes.

A service is `(workspace, id)`: all its instances share it. It keeps the
offers (descriptor sets) its instances announced, the ownership record last
written for it, and its current conflicts. Which offer is merged is decided
here: the newest announce among the instances still holding a lease, so a
rolling upgrade moves to the new descriptors and an instance of the old ones
dying moves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from toolservice_base.schemas import (
    DEFAULT_TTL,
    ToolDescriptor,
    ToolServiceDescriptor,
    check_tool_against_service,
    validate_config_item,
)
from toolservice_base.schemas.tools import definition_digest

from .keys import Key
from .leases import Lease, ServiceKey
from .merge import InstanceRecord, Offer, OwnershipRecord
from .protocol import NameConflict, PendingChange, ToolStatus

__all__ = ["ServiceState", "held_statuses", "service_status", "static_status"]


STATUSES = ("live", "held", "grace", "refused")
"""Best first: a service is as alive as its most alive instance."""
UNWRITTEN = "unwritten"
"""An announced tool the registry could not write to the store yet (the store cannot write): agents do not see it."""


def service_status(leases: list[Lease]) -> str:
    """`live` if any instance is heard from; else `held` (self-preservation); else `grace` (restart);
    else `refused` (its instances are sending, but refused, and run out within their ttl)."""
    states = {lease.state for lease in leases}
    for status in STATUSES:
        if status in states:
            return status
    return "removing"


def status_detail(status: str, leases: list[Lease]) -> str:
    """One line on why a service is not plainly live, for `toolreg tools`."""
    if status == "refused":
        reason = next((lease.refused for lease in leases if lease.refused), "")
        return f"its messages are refused ({reason}); removed when its lease runs out"
    if status == "held":
        return "its lease ran out together with most others: self-preservation holds it (`toolreg release` removes it)"
    if status == "grace":
        return "not heard from since the registry started; removed if still silent after one ttl"
    return ""


HELD_BY_PIN = "held"
"""A tool whose only definition on offer is a changed one, held by pinning: no agent sees it until an operator
decides. (`held` is also a service's status while self-preservation holds its removal; WHY tells the two apart.)"""


def held_statuses(
    listed: Mapping[str, ToolStatus],
    changes: Iterable[PendingChange],
    instances_of: Callable[[str], int],
    wall_now: float,
) -> dict[str, ToolStatus]:
    """What pinning adds to one workspace's `listed` tools, by name: a tool whose changed definition is held and no
    longer listed (no instance offers the pinned one) comes back as `held`; a listed one with a change held says so.

    So `toolreg tools`, the registry page and `toolreg call` point at `toolreg pending` wherever such a tool is looked
    up, instead of it vanishing. `instances_of(service)`: its instances holding a lease.
    """
    found: dict[str, ToolStatus] = {}
    for change in changes:
        shown = listed.get(change.tool)
        if shown is not None:
            note = "a changed definition is held, agents keep this one: `toolreg pending` shows it"
            found[change.tool] = shown.model_copy(update={"detail": "; ".join(p for p in (shown.detail, note) if p)})
            continue
        found[change.tool] = ToolStatus(
            name=change.tool,
            service=change.service,
            source="announced",
            status=HELD_BY_PIN,
            instances=instances_of(change.service),
            last_heartbeat_age=round(max(0.0, wall_now - change.last_seen), 3),
            workspace=change.workspace,
            version=change.version,
            detail=(
                "its definition changed and is held until an operator decides; agents do not see it: `toolreg"
                f" pending` shows the change, `toolreg approve {change.tool}` or `toolreg reject {change.tool}`"
                " decides"
            ),
            digest=change.offered,
        )
    return found


def static_status(name: str, value: str, services: Mapping[str, str], workspace: str) -> ToolStatus:
    """A `tool` item the registry does not own: `configured`, or `unavailable` with why agents skip it.

    The same checks an agent's tool set makes before it builds a tool of
    type `tool-service`: the item parses, its service's item exists and
    parses, and the tool's config values fit the service's params. Tools of
    other types are the agent's own business: `configured`.
    """

    def unavailable(service: str | None, detail: str) -> ToolStatus:
        return ToolStatus(
            name=name, service=service, source="static", status="unavailable", workspace=workspace, detail=detail
        )

    try:
        tool = validate_config_item("tool", name, value)
    except ValueError as exc:  # not JSON, no `name`, ...: this one row says so, the others are unaffected
        return unavailable(_named_service(value), f"agents skip it: {str(exc).splitlines()[0]}")
    assert isinstance(tool, ToolDescriptor)
    service: ToolServiceDescriptor | None = None
    if tool.type == "tool-service":
        if not tool.service:
            return unavailable(None, "agents skip it: a tool of type 'tool-service' needs 'service'")
        text = services.get(tool.service)
        if text is None:
            return unavailable(
                tool.service,
                f"no tool-service/{tool.service} in the store: its service went away or was never configured; agents"
                " skip it",
            )
        try:
            parsed = validate_config_item("tool-service", tool.service, text)
            assert isinstance(parsed, ToolServiceDescriptor)
            check_tool_against_service(tool, parsed)
        except ValueError as exc:
            return unavailable(tool.service, f"agents skip it: {str(exc).splitlines()[0]}")
        service = parsed
    return ToolStatus(
        name=name,
        service=tool.service,
        source="static",
        status="configured",
        workspace=workspace,
        digest=definition_digest(tool, service),
    )


def _named_service(value: str) -> str | None:
    """The `service` a malformed tool item names, if it names one: shown beside why agents skip it."""
    try:
        body = json.loads(value)
    except ValueError:
        return None
    service = body.get("service") if isinstance(body, dict) else None
    return service if isinstance(service, str) and service else None


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
    conflicts: dict[str, NameConflict] = field(default_factory=dict)
    merged: Offer | None = None
    """The offer last written (pinned definitions only, under `--pin-definitions`); None before, or restored at
    start."""
    digests: dict[str, str] = field(default_factory=dict)
    """Tool name -> definition digest of what was last written for it (`definition_digest`)."""

    @property
    def workspace(self) -> str:
        return self.key.workspace

    @property
    def service_id(self) -> str:
        return self.key.service

    def active_offer(self, leases: list[Lease]) -> Offer | None:
        """The offer of the most recent announce among live leases; forgets offers nobody holds."""
        offers = self.live_offers(leases)
        return offers[0] if offers else None

    def live_offers(self, leases: list[Lease]) -> list[Offer]:
        """The offers live leases hold, the most recently announced first; forgets offers nobody holds."""
        in_use = {lease.digest for lease in leases}
        for digest in [d for d in self.offers if d not in in_use]:
            del self.offers[digest]
        newest_first: dict[str, Offer] = {}
        for lease in sorted(leases, key=lambda lease: -lease.announced):
            if lease.announced and lease.digest is not None and lease.digest in self.offers:
                newest_first.setdefault(lease.digest, self.offers[lease.digest])
        return list(newest_first.values())

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
            lease.instance: InstanceRecord(
                ttl=lease.ttl, since=round(self.since.get(lease.instance, lease.last_seen or 0.0), 3)
            )
            for lease in sorted(leases, key=lambda lease: lease.instance)
        }
        return OwnershipRecord(
            service=self.service_id, workspace=self.workspace, digest=digest, version=version, instances=instances
        )

    def record_is_current(self, desired: OwnershipRecord | None) -> bool:
        """True when writing `desired` would change nothing but (possibly) ownership."""
        if desired is None or self.record is None:
            return False
        return desired == self.record.model_copy(update={"owned": {}})

    def ttl(self) -> float:
        """The longest ttl of its instances as last recorded: how long its names are kept after it goes."""
        if self.record is None or not self.record.instances:
            return DEFAULT_TTL
        return max(item.ttl for item in self.record.instances.values())

    def tool_names(self) -> list[str]:
        return sorted(key for item_type, key in self.owned if item_type == "tool")

    def tool_statuses(self, leases: list[Lease], wall_now: float, unwritten: str | None = None) -> list[ToolStatus]:
        """The statuses of the tools it owns in the store. `unwritten`: why its latest change is not in the store yet;
        each tool then says so, and tools it announced that the store does not hold yet are listed as `unwritten`."""
        status = service_status(leases)
        last = max((lease.last_seen for lease in leases if lease.last_seen is not None), default=None)
        version = self.record.version if self.record is not None else ""
        detail = status_detail(status, leases)
        note = "" if unwritten is None else f"not in the config store yet, agents do not see this change: {unwritten}"
        names = {name: status for name in self.tool_names()}
        if unwritten is not None:
            names.update(
                (name, UNWRITTEN)
                for name in self._offered_names(leases)
                if name not in names and name not in self.conflicts
            )
        return [
            ToolStatus(
                name=name,
                service=self.service_id,
                source="announced",
                status=shown,
                instances=len(leases),
                last_heartbeat_age=None if last is None else round(max(0.0, wall_now - last), 3),
                workspace=self.workspace,
                version=version,
                detail="; ".join(part for part in (detail if shown == status else "", note) if part),
                digest=self.digests.get(name),
            )
            for name, shown in sorted(names.items())
        ]

    def _offered_names(self, leases: list[Lease]) -> list[str]:
        """Tool names of the newest offer a lease holds, read without forgetting anything (a query changes nothing)."""
        for lease in sorted(leases, key=lambda lease: -lease.announced):
            offer = self.offers.get(lease.digest or "") if lease.announced else None
            if offer is not None:
                return [tool.name for tool in offer.tools]
        return []
