"""What the core tells its drivers to do: one value per decision, carried out by whoever holds the I/O.

A driver never decides: it reads the effect the core answered and does
exactly that (opens the lock in a mode, reads the markers, writes a marker,
steps down, stops, applies or refuses an entry, acknowledges). The
simulator carries out the same effects against its model of the broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["exclusive", "wait", "fence"]
"""How the lock is taken: free only (`exclusive`), next in line (`wait`), from whoever holds it (`fence`)."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do until the next look."""


@dataclass(frozen=True, slots=True)
class ReadMarkers:
    """Read the lock's markers to the topic's end, then look again (`ReplicaCore.on_markers_read`)."""

    why: str


@dataclass(frozen=True, slots=True)
class TryLock:
    """Ask the broker for the lock in `mode`."""

    mode: Mode


@dataclass(frozen=True, slots=True)
class WriteMarker:
    """Write a marker of `term` through the lock: a promotion, or (`held`) a confirmation within `within` seconds."""

    term: int
    mode: Mode
    held: bool = False
    within: float = 0.0


@dataclass(frozen=True, slots=True)
class Promote:
    """This replica holds the lock in `term`: open the writers (fencing the deposed one's), read the log to its end,
    then serve."""

    term: int


@dataclass(frozen=True, slots=True)
class StepDown:
    """Stop acting as active: revoke the writers first (nothing is written from here on), then the rest."""

    reason: str


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop for good, in this one line: nothing this replica can do will make it right. `cause`: its key is not the
    group's (`key`), or its state would lack entries the log lost (`lost`)."""

    reason: str
    cause: Literal["key", "lost"] = "key"


@dataclass(frozen=True, slots=True)
class Confirmed:
    """The lock is held, as confirmed within the grace: the state may be answered from, the write acknowledged."""


@dataclass(frozen=True, slots=True)
class NotHolding:
    """This replica may not answer or acknowledge (standby, deposed, or its lock unconfirmed): why."""

    reason: str


@dataclass(frozen=True, slots=True)
class Apply:
    """Apply the entry: its version is above the state's and nothing before it is missing. `note`: history the broker
    deleted that the snapshot still holds (nothing lost yet), for the driver to log."""

    version: int
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Ignore:
    """Skip the entry: at or below the state's version (a duplicate, a stale one, our own read back)."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Skip the record and log it: it cannot be authenticated, or is not one of ours."""

    reason: str


@dataclass(frozen=True, slots=True)
class Append:
    """Write the entry of `version` (following `previous`, in `term`) through the log's writer."""

    version: int
    previous: int
    term: int


@dataclass(frozen=True, slots=True)
class Acknowledge:
    """The write is in the log: answer it."""

    version: int


@dataclass(frozen=True, slots=True)
class Lost:
    """The write may or may not be in the log: answer an error, stop serving and rebuild from the log."""

    reason: str


@dataclass(frozen=True, slots=True)
class WriteSnapshot:
    """Write the whole state as a snapshot now: why."""

    why: str


Effect = (
    Wait
    | ReadMarkers
    | TryLock
    | WriteMarker
    | Promote
    | StepDown
    | Stop
    | Confirmed
    | NotHolding
    | Apply
    | Ignore
    | Refuse
    | Append
    | Acknowledge
    | Lost
    | WriteSnapshot
)
