"""Merge rules: from what services offer and what the store holds, to one write.

Pure functions over plain values, so the rules are unit-tested without a
broker. The registry reads the keys a batch touches, plans each service in a
fixed order over a working copy of what it read, and sends the combined
result as one conditional write (`expect` = the values it read), so an item
an operator wrote a moment ago is never clobbered: the write fails, the
registry re-reads and plans again.

The rules:

- **Static wins.** A key the registry does not own (no ownership record
  claims it with its current value) is never written or deleted. An announced
  tool whose key holds such an item is refused and reported as a conflict; an
  item that already holds exactly the announced value is used as is, unowned.
- **First holder keeps it.** A key owned by another service is refused to
  the later one. Ownership is recorded in the store, so the same holder
  keeps it across registry restarts, whatever order services re-announce in.
  A holder that went keeps its tool names for one ttl more (`kept`): a
  restarting service gets them back rather than losing them to a rival.
- **Only what it wrote.** A service going away deletes the keys it owns whose
  value is still the one it wrote (compared by sha256); a key an operator
  changed since has become the operator's and is left alone.
- **No change, no write.** A plan whose keys already hold their values writes
  nothing, so the store's version does not move.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from toolservice_base.schemas import (
    ToolDescriptor,
    ToolServiceDescriptor,
    canonical_json,
)

Key = tuple[str, str]
"""(type, key) of a config item inside one workspace."""

RECORD_TYPE = "discovery"
"""Ownership records live at `discovery/<service-id>`, next to the tools they own."""

STATIC = "static"


def key_text(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


def parse_key_text(text: str) -> Key:
    item_type, sep, key = text.partition("/")
    if not sep or not item_type or not key:
        raise ValueError(f"not a TYPE/KEY: {text!r}")
    return item_type, key


def value_hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class InstanceRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    ttl: float = Field(gt=0, le=3600)
    since: float = 0.0


class OwnershipRecord(BaseModel):
    """The value of `discovery/<service-id>`: what the registry wrote for a service.

    Written when the service's offer, instance set or owned keys change, never
    on a heartbeat: a record write bumps the store's version.
    """

    model_config = ConfigDict(frozen=True)

    service: str
    workspace: str
    digest: str | None = None
    version: str = ""
    instances: dict[str, InstanceRecord] = Field(default_factory=dict)
    owned: dict[str, str] = Field(default_factory=dict)
    """`type/key` -> sha256 of the value the registry wrote there."""

    def to_value(self) -> str:
        return canonical_json(self.model_dump(mode="json"))

    @classmethod
    def from_value(cls, value: str) -> "OwnershipRecord":
        return cls.model_validate_json(value)

    def owned_keys(self) -> dict[Key, str]:
        return {parse_key_text(text): digest for text, digest in self.owned.items()}


@dataclass(frozen=True)
class Offer:
    """One announced version of a service: its descriptors and their digest."""

    service: ToolServiceDescriptor
    tools: tuple[ToolDescriptor, ...]
    digest: str
    version: str = ""

    def items(self) -> dict[Key, str]:
        """The spec's items, values exactly the descriptors' wire JSON; service first."""
        items: dict[Key, str] = {("tool-service", self.service.id): self.service.to_json()}
        for tool in sorted(self.tools, key=lambda t: t.name):
            items[("tool", tool.name)] = tool.to_json()
        return items


@dataclass(frozen=True)
class Finding:
    """A refused key: which tool, who holds it, and why."""

    tool: str
    held_by: str
    reason: str


@dataclass
class Plan:
    """What merging one service decided."""

    service: str
    writes: dict[Key, str | None] = field(default_factory=dict)
    """Final value per key this plan changes; None deletes."""
    owned: dict[Key, str] = field(default_factory=dict)
    conflicts: list[Finding] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    record: OwnershipRecord | None = None


def record_key(service_id: str) -> Key:
    return (RECORD_TYPE, service_id)


def _refusal(key: Key, holder: str | None, kept_until: float | None = None) -> Finding:
    name = key[1]
    if holder is None:
        return Finding(name, STATIC, f"tool/{name} is a static item (not written by the registry); static wins")
    if kept_until is not None:
        until = time.strftime("%H:%M:%S UTC", time.gmtime(kept_until))
        return Finding(
            name, holder, f"tool/{name} is kept for service {holder!r} until {until}: it went less than its ttl ago, and may be restarting"
        )
    return Finding(name, holder, f"tool/{name} belongs to service {holder!r}, which claimed it first")


def plan_service(
    view: Mapping[Key, str | None],
    owners: Mapping[Key, str],
    *,
    service_id: str,
    owned: Mapping[Key, str],
    record: OwnershipRecord | None,
    offer: Offer | None,
    kept: Mapping[Key, float] | None = None,
) -> Plan:
    """Plan one service against `view` (what the store holds, as far as this batch knows).

    - `record` None: the service is gone; delete what it owns and its record.
    - `offer` None with a record: no descriptors known yet (restored at
      start): keep the keys it owns, refresh the record.
    - otherwise converge the store to `offer`.

    `owners` maps each key some *other* service owns to that service;
    `kept` says until when, for the keys held by a service that went.
    """
    plan = Plan(service=service_id)
    desired: dict[Key, str] = {}
    if record is not None and offer is not None:
        desired = offer.items()
    elif record is not None:
        desired = {key: value for key in owned if (value := view.get(key)) is not None and value_hash(value) == owned[key]}

    def is_mine(key: Key) -> bool:
        current = view.get(key)
        return key in owned and current is not None and value_hash(current) == owned[key]

    service_key = ("tool-service", service_id)
    service_refused = False
    for key, value in desired.items():
        current = view.get(key)
        holder = owners.get(key)
        if holder == service_id:
            holder = None
        if service_refused and key[0] == "tool":
            plan.conflicts.append(Finding(key[1], STATIC, f"tool-service/{service_id} is a static item with another value; static wins"))
            continue
        if is_mine(key) or (current is None and holder is None):
            if current != value:
                plan.writes[key] = value
                if key[0] == "tool":
                    plan.registered.append(key[1])
            plan.owned[key] = value_hash(value)
        elif current == value and holder is None:
            continue  # a static item that already says exactly this: use it, never own it
        else:
            # The service key comes first in `desired`: once it is refused, so is every
            # tool (each reported on its own; the service key itself names no tool).
            service_refused = key == service_key
            if not service_refused:
                plan.conflicts.append(_refusal(key, holder, (kept or {}).get(key) if holder is not None else None))

    for key in owned:
        if key in plan.owned:
            continue
        current = view.get(key)
        if current is not None and value_hash(current) == owned[key]:
            plan.writes[key] = None
            if key[0] == "tool":
                plan.removed.append(key[1])
        # else: absent already, or an operator changed it: it is theirs now

    rec_key = record_key(service_id)
    if record is None:
        if view.get(rec_key) is not None:
            plan.writes[rec_key] = None
    else:
        plan.record = record.model_copy(update={"owned": {key_text(k): h for k, h in sorted(plan.owned.items())}})
        value = plan.record.to_value()
        if view.get(rec_key) != value:
            plan.writes[rec_key] = value
    return plan


def apply_plan(view: MutableMapping[Key, str | None], owners: MutableMapping[Key, str], plan: Plan, previously_owned: Iterable[Key]) -> None:
    """Fold a plan into the batch's working view, so later plans see its claims."""
    for key, value in plan.writes.items():
        view[key] = value
    for key in previously_owned:
        if owners.get(key) == plan.service:
            del owners[key]
    for key in plan.owned:
        owners[key] = plan.service


def combine(original: Mapping[Key, str | None], view: Mapping[Key, str | None], plans: Iterable[Plan]) -> tuple[
    list[tuple[str, str, str]], list[tuple[str, str]], list[tuple[str, str, str | None]]
]:
    """One transaction for a batch: final values, guarded by the values originally read.

    The store applies puts before deletes, so a key one plan deletes and a
    later plan claims must travel as one put: hence final values, per key.
    """
    touched: list[Key] = []
    for plan in plans:
        for key in plan.writes:
            if key not in touched:
                touched.append(key)
    puts: list[tuple[str, str, str]] = []
    deletes: list[tuple[str, str]] = []
    expect: list[tuple[str, str, str | None]] = []
    for key in touched:
        before, after = original.get(key), view.get(key)
        if before == after:
            continue
        expect.append((key[0], key[1], before))
        if after is None:
            deletes.append(key)
        else:
            puts.append((key[0], key[1], after))
    return puts, deletes, expect
