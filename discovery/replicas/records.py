"""Reading what others wrote on a state topic: parsed defensively, checked against the group key, refused out loud.

Every record a replica reads (a status, a lock marker, a log entry, a
snapshot's manifest or chunk) came from the broker, and the broker takes
whatever a role with produce permission sends. So each is parsed with
bounds (a term of `1e400` is a float, not a term), checked against the group
key when there is one, and a record that fails is skipped and logged: once
per producer and reason (a flood of forgeries is one line, not a million),
never a crash.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from toolservice_base.logs import get_logger
from toolservice_base.transport import Envelope

from .core.keys import Seen, authenticate
from .groupkey import MAC_PROPERTY, GroupKey

log = get_logger("discovery.replicas")

MAX_COUNTER = 2**63 - 1
"""The largest version or term a record may carry (what SQLite and every reader can hold)."""
MAX_TEXT = 256
"""The longest id, host or name a record may carry."""
SAID_CAPACITY = 1024
"""(producer, kind, reason) triples remembered as already logged; the oldest are forgotten past it."""


class Malformed(ValueError):
    """A record that is not what its topic carries: the message says which field and why."""


def counter(raw: dict[str, Any], name: str, *, default: int | None = None, low: int = 0) -> int:
    """A whole number in [low, 2**63): JSON ints only (not bools, not floats, not strings)."""
    value = raw.get(name, default)
    if value is None:
        raise Malformed(f"no {name!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{name!r} is {type(value).__name__}, not a whole number")
    if not low <= value <= MAX_COUNTER:
        raise Malformed(f"{name!r} is {value}, outside [{low}, 2**63)")
    return value


def moment(raw: dict[str, Any], name: str, *, default: float | None = None) -> float:
    """A finite number (seconds since the epoch, say)."""
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Malformed(f"{name!r} is not a finite number")
    return float(value)


def text(raw: dict[str, Any], name: str, *, default: str | None = None, limit: int = MAX_TEXT) -> str:
    value = raw.get(name, default)
    if not isinstance(value, str) or len(value) > limit:
        raise Malformed(f"{name!r} is not a string of at most {limit} characters")
    return value


def sign(key: GroupKey | None, kind: str, topic: str, data: bytes, *context: str) -> dict[str, str]:
    """The properties that carry a record's MAC (none without a key)."""
    return {} if key is None else {MAC_PROPERTY: key.tag(kind, topic, data, *context)}


Observer = Callable[[Seen, str], None]
"""Told every record's authentication and its topic (`ReplicaCore.saw`: whose key is the group's)."""


class RecordCheck:
    """What one reader does with the records of one topic: authenticate them, and say once what it refused."""

    def __init__(self, topic: str, key: GroupKey | None, observer: Observer | None = None) -> None:
        self.topic = topic
        self.key = key
        self.observer = observer
        """Told each record's verdict (set by whoever owns the replica's rules)."""
        self.refused = 0
        """Records refused so far (malformed, out of range, unsigned or forged)."""
        self._said: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def authenticate(self, envelope: Envelope, kind: str, *context: str) -> Seen:
        """The record's verdict under the group key (`core.keys.authenticate`), told to the observer."""
        seen = authenticate(self.key, envelope.properties, kind, self.topic, envelope.data, *context)
        if self.observer is not None:
            self.observer(seen, self.topic)
        return seen

    def forgery(self, envelope: Envelope, kind: str, *context: str) -> str | None:
        """Why the record cannot be authenticated under the group key; None if it can, or if there is no key."""
        seen = self.authenticate(envelope, kind, *context)
        return None if seen.accepted else seen.reason

    def refuse(self, envelope: Envelope, kind: str, reason: str) -> None:
        """Skip the record: logged the first time this producer sends this kind of refusal."""
        self.refused += 1
        producer = envelope.producer or "unknown"
        said = (producer, kind, reason.split(" (")[0])
        if said in self._said:
            self._said.move_to_end(said)
            return
        self._said[said] = None
        if len(self._said) > SAID_CAPACITY:
            self._said.popitem(last=False)
        log.error(
            "state.record_refused",
            topic=self.topic,
            kind=kind,
            producer=producer,
            reason=reason,
            data=envelope.data[:120].decode(errors="replace"),
            note="skipped: only replicas write on the state topics (forged, or by a replica with another group key)",
        )
