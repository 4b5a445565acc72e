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
  the later one; so is a tool whose name collides with another tool's
  (`toolservice_base.names.name_keys`): the same once case, lookalike
  characters (UTS #39 confusables), invisible ones and separators are folded
  away (`TELL-JOKE`, `tell_joke`, `tеll-joke` beside `tell-joke`), or the same
  client-visible name (`client_name`: what MCP and OpenAI-style clients call
  it, `acme.search` -> `acme_search`). So a client's call never reaches
  another tool than the one it listed, and a model is never shown a lookalike
  of a tool beside it. Ownership is recorded in the store, so the same holder
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
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from toolservice_base.names import client_name, name_keys
from toolservice_base.schemas import (
    ToolDescriptor,
    ToolServiceDescriptor,
    canonical_json,
)
from toolservice_base.schemas.tools import definition_digest

from .keys import Key
from .owners import OwnerLayer

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
    signer: str | None = None
    """Key id that signed the announce, under a trust policy; None otherwise."""
    answer_key: str | None = None
    """The public key of `signer` (base64), written into the service's item as `answer-key` so callers check that
    the service's answers are signed with it; None: none written, whatever the announcement said."""

    @cached_property
    def digests(self) -> dict[str, str]:
        """Tool name -> digest of its definition as this offer gives it (`definition_digest`)."""
        return {tool.name: definition_digest(tool, self.service) for tool in self.tools}

    @cached_property
    def by_name(self) -> dict[str, ToolDescriptor]:
        return {tool.name: tool for tool in self.tools}

    def tool(self, name: str) -> ToolDescriptor | None:
        return self.by_name.get(name)

    def items(self) -> dict[Key, str]:
        """The spec's items, values exactly the descriptors' wire JSON; service first."""
        service = self.service
        if service.answer_key != self.answer_key:  # the registry's word on the key, never the service's own
            service = service.model_copy(update={"answer_key": self.answer_key})
        items: dict[Key, str] = {("tool-service", service.id): service.to_json()}
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
            name,
            holder,
            f"tool/{name} is kept for service {holder!r} until {until}: it went less than its ttl ago, and may be"
            " restarting",
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
    _claim(plan, view, owners, _desired(view, owned, record, offer), owned, kept or {})
    _release(plan, view, owned)
    _write_record(plan, view, record)
    return plan


def _desired(
    view: Mapping[Key, str | None], owned: Mapping[Key, str], record: OwnershipRecord | None, offer: Offer | None
) -> dict[Key, str]:
    """The items the service should have: its offer's; with no offer, those it owns still holding what it wrote."""
    if record is None:
        return {}
    if offer is not None:
        return offer.items()
    return {key: value for key in owned if (value := view.get(key)) is not None and value_hash(value) == owned[key]}


def _claim(
    plan: Plan,
    view: Mapping[Key, str | None],
    owners: Mapping[Key, str],
    desired: Mapping[Key, str],
    owned: Mapping[Key, str],
    kept: Mapping[Key, float],
) -> None:
    """Take each desired key the rules allow (writing it if it differs); refuse the others as conflicts."""
    service_id = plan.service
    service_key = ("tool-service", service_id)
    service_refused = False
    for key, value in desired.items():
        current = view.get(key)
        holder = owners.get(key)
        if holder == service_id:
            holder = None
        if service_refused and key[0] == "tool":
            plan.conflicts.append(
                Finding(key[1], STATIC, f"tool-service/{service_id} is a static item with another value; static wins")
            )
            continue
        mine = key in owned and current is not None and value_hash(current) == owned[key]
        if mine or (current is None and holder is None):
            if key[0] == "tool" and not mine:
                first = _client_names(view, owners).first(key[1], service_id, owned)
                if first is not None:
                    plan.conflicts.append(_client_refusal(key[1], first[0], first[1], kept.get(("tool", first[0]))))
                    continue
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
                plan.conflicts.append(_refusal(key, holder, kept.get(key) if holder is not None else None))


class ClientNames:
    """Each name key (`name_keys`: folded names, client-visible ones) -> the tools of a batch's working state that
    have it.

    Indexes every tool key in `owners` (held or kept by a service) and every
    tool item in `view` (static ones among them). It only grows: `apply_plan`
    adds what a plan claims, and `first` checks each name it finds against
    the state as it is now, so a name released since is no longer in the way.
    Built once per batch (`_client_names`), so planning many services costs
    one pass over the workspace's tools, not one per service; over the
    registry's `OwnerLayer`, not even that: it starts from the index the
    registry keeps, and adds only the batch's own keys.
    """

    def __init__(self, view: Mapping[Key, str | None], owners: Mapping[Key, str]) -> None:
        self.view, self.owners = view, owners
        self.names: dict[str, set[str]] = {}
        self.base: Mapping[str, set[str]] = {}
        own: Mapping[Key, str] = owners
        if isinstance(owners, OwnerLayer):  # its index knows the names of every key but the batch's own
            self.base, own = owners.names, owners.changed
        for key in own:
            if key[0] == "tool":
                self.add(key[1])
        for key, value in view.items():
            if key[0] == "tool" and value is not None:
                self.add(key[1])
        self.size = len(owners)
        """`len(owners)` when last in step: a caller that changed `owners` other than by `apply_plan` gets a new
        index."""

    def add(self, name: str) -> None:
        for name_key in name_keys(name):
            self.names.setdefault(name_key, set()).add(name)

    def first(self, name: str, service_id: str, owned: Mapping[Key, str]) -> tuple[str, str | None] | None:
        """The other tool whose name collides with `name` (`name_keys`), and its holder (None: a static item); or
        None."""
        colliding: set[str] = set()
        for name_key in name_keys(name):
            colliding |= self.names.get(name_key, set()) | self.base.get(name_key, set())
        for other in sorted(colliding):
            if other == name:
                continue
            key = ("tool", other)
            holder = self.owners.get(key)
            if holder is not None:
                if holder != service_id:
                    return other, holder
                continue
            value = self.view.get(key)
            if value is not None and not (key in owned and value_hash(value) == owned[key]):
                return other, None
        return None


_INDEX: list[ClientNames] = []
"""The index of the batch being planned: the writer plans a workspace's services one after another over one
`view` and one `owners`, and `apply_plan` keeps the index in step with what each plan claims."""


def _client_names(view: Mapping[Key, str | None], owners: Mapping[Key, str]) -> ClientNames:
    if not _INDEX or _INDEX[0].view is not view or _INDEX[0].owners is not owners or _INDEX[0].size != len(owners):
        _INDEX[:] = [ClientNames(view, owners)]
    return _INDEX[0]


def _client_refusal(name: str, other: str, holder: str | None, kept_until: float | None) -> Finding:
    """`name` would be listed to clients under the name they already call `other` by, or one a reader could take
    for it: the first keeps it."""
    shown = client_name(name)
    if shown == client_name(other):
        said = (
            f"tool/{name} would be listed to MCP and OpenAI clients as {shown!r}, the name they already call tool"
            f" {other!r}"
        )
        whose = " by (a static item)" if holder is None else f" of service {holder!r} by"
    else:
        said = (
            f"tool/{name} looks like tool {other!r} to MCP and OpenAI clients (names are compared ignoring case,"
            " lookalike characters, spaces and separators)"
        )
        whose = ", a static item" if holder is None else f" of service {holder!r}"
    if holder is None:
        return Finding(name, STATIC, f"{said}{whose}; static wins")
    if kept_until is not None:
        until = time.strftime("%H:%M:%S UTC", time.gmtime(kept_until))
        return Finding(
            name,
            holder,
            f"{said}{whose}, kept for it until {until}: it went less than its ttl ago, and may be restarting",
        )
    return Finding(name, holder, f"{said}{whose}; the tool that had the name first keeps it")


def _release(plan: Plan, view: Mapping[Key, str | None], owned: Mapping[Key, str]) -> None:
    """Delete the keys it owned and no longer claims, where they still hold what it wrote."""
    for key in owned:
        if key in plan.owned:
            continue
        current = view.get(key)
        if current is not None and value_hash(current) == owned[key]:
            plan.writes[key] = None
            if key[0] == "tool":
                plan.removed.append(key[1])
        # else: absent already, or an operator changed it: it is theirs now


def _write_record(plan: Plan, view: Mapping[Key, str | None], record: OwnershipRecord | None) -> None:
    """The ownership record: deleted with the service, else rewritten when what it says changed."""
    rec_key = record_key(plan.service)
    if record is None:
        if view.get(rec_key) is not None:
            plan.writes[rec_key] = None
        return
    plan.record = record.model_copy(update={"owned": {key_text(k): h for k, h in sorted(plan.owned.items())}})
    value = plan.record.to_value()
    if view.get(rec_key) != value:
        plan.writes[rec_key] = value


def apply_plan(
    view: MutableMapping[Key, str | None], owners: MutableMapping[Key, str], plan: Plan, previously_owned: Iterable[Key]
) -> None:
    """Fold a plan into the batch's working view, so later plans see its claims."""
    before = len(owners)
    for key, value in plan.writes.items():
        view[key] = value
    for key in previously_owned:
        if owners.get(key) == plan.service:
            del owners[key]
    for key in plan.owned:
        owners[key] = plan.service
    if _INDEX and _INDEX[0].owners is owners and _INDEX[0].view is view and _INDEX[0].size == before:
        for key in plan.owned:
            if key[0] == "tool":
                _INDEX[0].add(key[1])
        _INDEX[0].size = len(owners)


def combine(
    original: Mapping[Key, str | None], view: Mapping[Key, str | None], plans: Iterable[Plan]
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]], list[tuple[str, str, str | None]]]:
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
