"""The lock's markers: what the holder of a lock writes through it, and what every replica reads back.

A replica that takes the lock writes a marker with the next term (so terms only
grow, whatever the clocks say) and, while it acknowledges writes, a `held`
marker now and then (`Election.confirm`). Only the lock's holder can write
there (an exclusive producer holds the topic), so the newest marker names the
active replica (`holder`): whose silence lets a standby fence the lock, and
who `toolreg replicas` says holds it.

A marker is read like any record of a state topic (`records`): one that is
malformed or out of range (`{"term": 1e400}`), or not signed with the group
key when there is one, is skipped and logged once per producer.

Two measured facts shape how the active uses them:

- a holder fenced off its lock is not told so by the broker until it sends
  (Apache Pulsar 4.0.8: a fenced idle producer stays "connected"). So before
  the log acknowledges a write the active confirms its lock (`confirm`): a
  `held` marker through it when the last confirmation is older than its
  grace, bounded by the same grace; at most one such marker per grace while
  it writes, none while idle;
- statuses (`Membership`) are hints: a status claiming a newer term only
  makes a replica read the markers again (`ReplicaCore`, at most once a
  second however often it is heard); a claim they do not bear out is logged
  once and changes nothing (`unconfirmed`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from toolservice_base.logs import get_logger
from toolservice_base.tasks import retrieve_outcome
from toolservice_base.transport import Envelope, ExclusiveMode, ExclusivePublisher, Reader, Transport, encode

from .core import ReplicaCore
from .groupkey import GroupKey
from .records import Malformed, RecordCheck, counter, sign, text

__all__ = ["MARKER_KIND", "Markers", "lock_holder"]

MARKER_KIND = "marker"
"""What a lock marker's MAC says it is (`groupkey`)."""
READ_TIMEOUT = 10.0
"""How long reading a marker may take once the broker said one is there."""

log = get_logger("discovery.replicas.election")


def _parse(marker: Envelope) -> tuple[str, int]:
    """(replica, term) of a marker; `Malformed` (or a JSON error) if it is not one."""
    raw = json.loads(marker.data)
    if not isinstance(raw, dict):
        raise Malformed("not a JSON object")
    return text(raw, "replica"), counter(raw, "term", low=1)


class Markers:
    """The I/O of one lock's markers: read them (into the replica's core), write ours, confirm the lock with one.

    What they say (the highest term, the replica it names) is the core's
    (`ReplicaCore.on_marker`): this only reads, authenticates and writes.
    """

    def __init__(self, topic: str, key: GroupKey | None, core: ReplicaCore) -> None:
        self.topic = topic
        self.key = key
        self.core = core
        self._check = RecordCheck(topic, key, core.saw)
        self._claims_said: set[tuple[str, int]] = set()

    async def read(self, reader: Reader) -> int:
        """Read `reader` (on the lock topic) to its end; the highest term. Exact once the lock is held."""
        while await reader.has_message_available():
            marker = await reader.read_next(READ_TIMEOUT)
            if marker is not None:
                self.take(marker)
        self.core.on_markers_read(time.monotonic())
        return self.core.marker_term

    def take(self, marker: Envelope) -> None:
        forged = self._check.forgery(marker, MARKER_KIND)
        if forged is not None:
            self._check.refuse(marker, MARKER_KIND, forged)
            return
        try:
            replica, term = _parse(marker)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            self._check.refuse(marker, MARKER_KIND, f"malformed marker: {exc}")
            return
        self.core.on_marker(replica, term)

    async def write(
        self, lock: ExclusivePublisher, replica: str, term: int, mode: ExclusiveMode, *, held: bool = False
    ) -> None:
        """Write a marker through the lock; `held`: a confirmation (`Election.confirm`), not a promotion."""
        marker: dict[str, Any] = {"term": term, "replica": replica, "mode": mode, "since": time.time()}
        if held:
            marker["held"] = True
        data = encode(marker)
        await lock.send(data, sign(self.key, MARKER_KIND, self.topic, data))

    async def confirm(self, lock: ExclusivePublisher, replica: str, term: int, grace: float) -> str | None:
        """Send a `held` marker through `lock` within `grace` seconds; None if the broker took it, else why not.

        A marker the broker has not taken by then is left to fail when the lock
        is closed (stepping down closes it): retrieved then, never logged.
        """
        sending = asyncio.ensure_future(self.write(lock, replica, term, lock.mode, held=True))
        done, _ = await asyncio.wait({sending}, timeout=grace)
        if not done:
            sending.add_done_callback(retrieve_outcome)
            return f"the broker did not take a marker within {grace:g}s"
        failure = sending.exception()
        return None if failure is None else str(failure)

    def unconfirmed(self, claim: tuple[str, int] | None, replica: str) -> None:
        """A status's claim the markers, just read, do not bear out: logged once per claim, and nothing changes."""
        if claim is None or claim[1] <= self.core.marker_term or claim in self._claims_said:
            return
        self._claims_said.add(claim)
        log.warning(
            "election.unconfirmed_claim",
            lock=self.topic,
            replica=replica,
            claimed_by=claim[0],
            claimed_term=claim[1],
            marker_term=self.core.marker_term,
            note="a status is a hint: the lock's markers do not bear it out, so nothing changes",
        )


async def lock_holder(transport: Transport, lock_topic: str, key: GroupKey | None) -> tuple[str, int] | None:
    """The replica the last marker on `lock_topic` names, and its term; None if there is none (or it does not check).

    For a view of the group (`toolreg replicas`): which status claiming to be
    active is the lock's holder. Reads one message, at the topic's end.
    """
    reader = await transport.reader(lock_topic, "latest", inclusive=True)
    try:
        if not await reader.has_message_available():
            return None
        marker = await reader.read_next(READ_TIMEOUT)
    finally:
        await transport.close_reader(reader)
    if marker is None or RecordCheck(lock_topic, key).forgery(marker, MARKER_KIND) is not None:
        return None
    try:
        return _parse(marker)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
