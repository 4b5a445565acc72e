"""What one replica says of itself: its role, and the status it publishes once a second, as sent and as read back.

`membership` publishes this replica's status and collects the group's; the
record is here on its own because more than the membership reads it: `toolreg
replicas` lists what it hears without joining, the election takes `Role` and
tells `RoleChange`s, a store names a rival by `describe`. A status is a hint,
never authority (see `membership`): reading one bounds every field and refuses
one that is malformed or out of range (`Malformed`), and a status in a newer
format is skipped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .records import Malformed, counter, moment, text

Role = Literal["active", "standby"]
ROLES: tuple[Role, ...] = ("active", "standby")
STATUS_FORMAT = 1
"""Format of a status message; a status in a newer format is skipped (it is only a view)."""
STATUS_KIND = "status"
"""What a status's MAC says it is (`groupkey`)."""
STORE_KINDS = ("replicated", "sqlite")
"""What a config store's status says it is (`ReplicaStatus.store`)."""


@dataclass(frozen=True)
class RoleChange:
    """One change of role, as `Election.changes()` yields it."""

    role: Role
    term: int
    reason: str
    at: float
    """When (seconds since the epoch)."""


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
    store: str = ""
    """What kind of config store it is (`replicated`, `sqlite`); empty for other groups (and older replicas)."""
    heard: float = field(default=0.0, compare=False)
    """When this view last heard it (this process's monotonic clock): what expiry and the takeover rule go by."""
    verified: bool = field(default=False, compare=False)
    """Its MAC checked under the group key: a replica's own word. False without a key (a hint, as every status)."""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
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
        if self.store:
            wire["store"] = self.store
        return wire

    def probing(self) -> dict[str, Any]:
        """The status as a newcomer sends it while it looks around: every member that hears it answers at once."""
        return {**self.to_wire(), "probe": True}

    @classmethod
    def parse(cls, data: bytes, heard: float, *, verified: bool = False) -> "ReplicaStatus":
        """The status in a message; `Malformed` (saying why) if it is not one this version reads."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise Malformed("not JSON") from None
        if not isinstance(raw, dict):
            raise Malformed("not a JSON object")
        if counter(raw, "format", default=0) > STATUS_FORMAT:
            raise Malformed("a status in a newer format")
        role = raw.get("role")
        if role not in ROLES:
            raise Malformed(f"role {str(role)[:20]!r} is neither active nor standby")
        store = text(raw, "store", default="")
        if store and store not in STORE_KINDS:
            raise Malformed(f"store {store[:20]!r} is not a store kind")
        return cls(
            id=text(raw, "id"),
            group=text(raw, "group"),
            role=role,
            pid=counter(raw, "pid"),
            host=text(raw, "host"),
            version=counter(raw, "version"),
            since=moment(raw, "since"),
            term=counter(raw, "term", default=0),
            settings=text(raw, "settings", default=""),
            each=_setting_digests(raw.get("settings-each")),
            store=store,
            heard=heard,
            verified=verified,
        )

    @classmethod
    def from_wire(cls, data: bytes, heard: float) -> "ReplicaStatus | None":
        """The status in a message, or None if it is not one (for a reader that only lists what it hears)."""
        try:
            return cls.parse(data, heard)
        except Malformed:
            return None


def is_question(data: bytes) -> bool:
    """Whether a status is a newcomer's question (`Membership.look_around`): cheap, on bytes already parsed once."""
    return b'"probe":true' in data


def describe(status: ReplicaStatus) -> str:
    """A replica in a few words, for a line that names it: `sqlite store pid 12 on host-a (id ...)`."""
    what = f"{status.store} store" if status.store else f"{status.group} replica"
    return f"{what} {status.id} (pid {status.pid} on {status.host}, {status.role})"


def _setting_digests(raw: object) -> tuple[tuple[str, str], ...]:
    """A status's per-setting digests, bounded as every field of a record is: only for naming what differs."""
    if not isinstance(raw, dict):
        return ()
    return tuple(sorted((str(name)[:64], str(digest)[:128]) for name, digest in list(raw.items())[:64]))
