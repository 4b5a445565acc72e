"""The order in which a driver feeds the core through one look, written once for every driver.

A standby's look is not one call: the core may first ask for the lock's
markers to be read to their end (a status claims a newer term; the last
word before fencing), and only the look after that read decides. `Election`
and the simulator (`tests/simulation`) both walk `StandbyLook`, so the
simulator checks the very order the product runs, not a copy of it that
could drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .effects import ReadMarkers, Stop, TryLock, Wait

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
