"""The order in which a driver feeds the core through one look, written once for every driver.

A standby's look is not one call: the core may first ask for the lock's
markers to be read to their end (a status claims a newer term; the last
word before fencing), and only the look after that read decides. Taking the
lock is not one call either: granted, the markers read to their end, the
next term's marker written through the lock, and only then active. `Election`
and the simulator (`tests/simulation`) both walk `StandbyLook` and
`Promotion`, so the simulator checks the very order the product runs, not a
copy of it that could drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .effects import Mode, Promote, ReadMarkers, Stop, TryLock, Wait, WriteMarker

if TYPE_CHECKING:
    from .replica import ReplicaCore

Look = Callable[[], Wait | ReadMarkers | TryLock | Stop]
"""One call of `ReplicaCore.standby_look` with the driver's clock and what its membership heard."""


class StandbyLook:
    """One standby look as every driver carries it out.

    Iterate it: at each `ReadMarkers` it yields, read the lock's markers to
    their end (`ReplicaCore.on_markers_read`), and it looks again. Once the
    iteration ends, `decision` is what the look came to: wait, take the lock
    in a mode, or stop.
    """

    def __init__(self, look: Look) -> None:
        self._look = look
        self.decision: Wait | TryLock | Stop = Wait()

    def __iter__(self) -> Iterator[ReadMarkers]:
        decision = self._look()
        while isinstance(decision, ReadMarkers):
            yield decision
            decision = self._look()
        self.decision = decision


class Promotion:
    """Taking the lock the broker granted, as every driver carries it out.

    Iterate it: at the `ReadMarkers` it yields, read the lock's markers to
    their end; at the `WriteMarker`, write that marker through the lock. A
    driver whose read or write failed calls `failed` (a standby again) and
    stops. Once the iteration ends, `stop` is the core's refusal (a key that
    is not the group's: the replica stops), else `promoted` makes it active.
    The marker is asked for only after the read: its term must be above every
    term written before, and only the lock's holder can know that.
    """

    def __init__(self, core: ReplicaCore, mode: Mode) -> None:
        self._core = core
        self._mode = mode
        self.stop: Stop | None = None
        self.marker: WriteMarker | None = None

    def __iter__(self) -> Iterator[ReadMarkers | WriteMarker]:
        granted = self._core.granted(self._mode)
        if isinstance(granted, Stop):
            self.stop = granted
            return
        yield granted
        self.marker = self._core.promotion_marker()
        yield self.marker

    def failed(self) -> None:
        self._core.promotion_failed()

    def promoted(self, now: float) -> Promote:
        """Our marker is on the lock: active from `now`."""
        assert self.marker is not None, "promoted before the marker was written"
        return self._core.on_promoted(self.marker.term, now)
