"""What the registry keeps of what went away: withdrawn instances, and the names their services held.

Two promises outlive a departure, and a restart of the registry:

- **A withdrawn instance never comes back.** A real instance sends nothing
  after its withdraw, so anything naming it later is a replay of a captured
  message. The skew window makes such a message useless after at most
  `max_clock_skew` plus its ttl; until then the registry refuses it. The
  validator's sequence memory alone would be lost with the process, so the
  withdrawn instances are kept here, and in the store.
- **A name stays with its owner for one ttl after the owner goes.** A
  service restarting (withdraw, then a new instance) gets its tool names
  back, instead of finding them taken by another service that announced
  the same name in between. The tools are gone from the store meanwhile (no
  one serves them); only the claim is kept.

Both are one store item, `registry/departed` in the reserved workspace
`_toolreg` (stored, never announced to processors, so agents never reload
for it), rewritten when something is added. Bounded: an entry is dropped
when its time is up, and past `MAX_ENTRIES` the soonest due goes first.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from toolservice_base.schemas import canonical_json

from .keys import Key
from .leases import ServiceKey

DEPARTED_KEY: Key = ("registry", "departed")
"""In the reserved workspace `_toolreg`."""
MAX_ENTRIES = 4096
"""Withdrawn instances, and kept names, each: ~100 bytes an entry, so the item stays well under a message."""


class WithdrawnInstance(BaseModel):
    model_config = ConfigDict(frozen=True)

    service: str
    workspace: str
    sequence: int = Field(ge=0)
    until: float
    """Wall clock: anything from the instance is refused until then; after that it is stale anyway."""


class KeptName(BaseModel):
    model_config = ConfigDict(frozen=True)

    service: str
    until: float
    """Wall clock: the name is kept for `service` until then."""


class DepartedRecord(BaseModel):
    """The value of `_toolreg` `registry/departed`."""

    instances: dict[str, WithdrawnInstance] = Field(default_factory=dict)
    names: dict[str, dict[str, KeptName]] = Field(default_factory=dict)
    """workspace -> tool name -> who it is kept for."""


def _bounded(entries: dict[str, WithdrawnInstance] | dict[str, KeptName], limit: int) -> None:
    if len(entries) > limit:
        for name in sorted(entries, key=lambda n: entries[n].until)[: len(entries) - limit]:
            del entries[name]


class Departed:
    """Withdrawn instances and kept names, in memory and (when `dirty`) to be written to the store."""

    def __init__(self, limit: int = MAX_ENTRIES) -> None:
        self.limit = limit
        self.instances: dict[str, WithdrawnInstance] = {}
        self.names: dict[str, dict[str, KeptName]] = {}
        self.dirty = False
        """Something was added since the store item was last written."""
        self._next_due = float("inf")

    def withdrawn(self, instance: str, service: ServiceKey, sequence: int, until: float) -> None:
        self.instances[instance] = WithdrawnInstance(
            service=service.service, workspace=service.workspace, sequence=sequence, until=until
        )
        _bounded(self.instances, self.limit)
        self.dirty = True

    def keep(self, workspace: str, tools: Iterable[str], service: str, until: float) -> None:
        """`service` went: its `tools` stay its own until `until`."""
        kept = self.names.setdefault(workspace, {})
        for tool in tools:
            kept[tool] = KeptName(service=service, until=until)
            self._next_due = min(self._next_due, until)
        total = sum(len(names) for names in self.names.values())
        if total > self.limit:
            flat = sorted((k.until, ws, tool) for ws, names in self.names.items() for tool, k in names.items())
            for _, ws, tool in flat[: total - self.limit]:
                del self.names[ws][tool]
        self.dirty = True

    def claimed(self, workspace: str, tools: Iterable[str], service: str) -> None:
        """`service` is back and holds `tools` again: nothing to keep for it."""
        kept = self.names.get(workspace, {})
        for tool in tools:
            if tool in kept and kept[tool].service == service:
                del kept[tool]

    def kept(self, workspace: str, now: float) -> dict[str, KeptName]:
        """Names of `workspace` kept for a departed service at `now`."""
        return {tool: k for tool, k in self.names.get(workspace, {}).items() if k.until > now}

    @property
    def next_due(self) -> float:
        """When (wall clock) the next kept name is released; infinity when none is kept."""
        return self._next_due

    def prune(self, now: float) -> set[str]:
        """Forget what is due; returns the workspaces where a kept name was released (cheap when nothing is due)."""
        released: set[str] = set()
        if now >= self._next_due:
            self._next_due = float("inf")
            for workspace, names in self.names.items():
                for tool in [t for t, k in names.items() if k.until <= now]:
                    del names[tool]
                    released.add(workspace)
                self._next_due = min([self._next_due, *(k.until for k in names.values())])
            self.names = {ws: names for ws, names in self.names.items() if names}
        return released

    def to_value(self, now: float) -> str:
        instances = {i: w for i, w in self.instances.items() if w.until > now}
        self.instances = instances
        names = {ws: {t: k for t, k in kept.items() if k.until > now} for ws, kept in self.names.items()}
        record = DepartedRecord(instances=instances, names={ws: kept for ws, kept in names.items() if kept})
        return canonical_json(record.model_dump(mode="json"))

    def load(self, value: str | None, now: float) -> None:
        """What an earlier registry kept; entries whose time is up are dropped. Raises ValueError if unreadable."""
        if not value:
            return
        try:
            record = DepartedRecord.model_validate_json(value)
        except ValidationError as exc:
            raise ValueError(str(exc).splitlines()[0]) from None
        self.instances = {i: w for i, w in record.instances.items() if w.until > now}
        for workspace, kept in record.names.items():
            for tool, name in kept.items():
                if name.until > now:
                    self.keep(workspace, [tool], name.service, name.until)
        self.dirty = False
