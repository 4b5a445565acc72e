"""One replica's rules, as a state machine: what it read and the time in, the effect its drivers carry out.

`ReplicaCore` holds everything the group's safety rests on for one replica
(its role and term, the lock's newest marker, when its lock was last
confirmed, the version of its state, what the records it read say of its
key) and nothing else: no await, no clock, no broker. Each method is told
what happened and `now` (monotonic seconds, the driver's clock or the
simulator's) and answers an effect (`effects`). The drivers are `Election`
(the lock and its markers), `ReplicatedLog` (entries, appends, snapshots),
`Membership` (statuses) and the store service around each request; the
simulator (`tests/simulation`) drives this same class.

Each rule is written once, here, with the failure it prevents.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from discovery.errors import KeyMismatch, LogIncomplete, ReplicationError

from ..groupkey import GroupKey
from .effects import (
    Acknowledge,
    Append,
    Apply,
    Confirmed,
    Ignore,
    Lost,
    Mode,
    NotHolding,
    Promote,
    ReadMarkers,
    Refuse,
    StepDown,
    Stop,
    TryLock,
    Wait,
    WriteMarker,
    WriteSnapshot,
)
from .keys import KeyWitness, Seen
from .wholeness import Finding, Wholeness

__all__ = ["RECHECK", "Heard", "ReplicaCore"]

RECHECK = 1.0
"""Seconds between two reads of the markers prompted by statuses: a status may be forged, and come often."""

CoreRole = Literal["standby", "active", "stopped"]


@dataclass(frozen=True)
class Heard:
    """What this replica's membership heard, as of a look: who said it was active and when (monotonic), when its own
    status last came back, and the highest term another replica claims to be active in."""

    active_at: dict[str, float] = field(default_factory=dict)
    any_active_at: float | None = None
    echo_at: float | None = None
    claim: tuple[str, int] | None = None
    hearing_since: float | None = None
    """The first of this replica's own statuses heard back without a gap since (its link in, or its process, was
    down before): silence before it was not heard, so it does not count."""


class ReplicaCore:
    """The rules of one replica of a group, from its start to its stop (one per generation of a replica)."""

    def __init__(
        self,
        replica_id: str,
        *,
        lock_topic: str = "the lock",
        log_topic: str = "the log",
        takeover_after: float = 10.0,
        lost_lock_grace: float = 2.0,
        key: GroupKey | None = None,
        now: float = 0.0,
        require_whole: bool = True,
    ) -> None:
        if takeover_after <= 0:
            raise ValueError(f"takeover_after must be positive, got {takeover_after}")
        self.replica_id = replica_id
        self.lock_topic = lock_topic
        self.log_topic = log_topic
        self.takeover_after = takeover_after
        self.lost_lock_grace = lost_lock_grace
        self.key = key
        self.require_whole = require_whole
        self.role: CoreRole = "standby"
        self.term = 0
        """The term this replica is active in; the last one it held while standby (0: never)."""
        self.marker_term = 0
        """The highest term the lock's markers name, as read."""
        self.holder: str | None = None
        """The replica the marker of that term names."""
        self.markers_read_at = float("-inf")
        self.standby_since = now
        self.patience = takeover_after
        self.mode: Mode | None = None
        self.confirmed_at = float("-inf")
        self.lost: str | None = None
        """Why this active replica must step down (fenced on a send, an append that may have failed)."""
        self.stopped: Stop | None = None
        """Why this replica stopped for good (the effect answered then, again at every look after)."""
        self._disconnected_at: float | None = None
        self._fence_next = False
        self._new_holder = False
        self.holder_seen_at = float("-inf")
        """When this replica learned of the holder the newest marker names (its silence counts from then at most)."""
        self.witness = KeyWitness(key)
        # --- the log ---
        self.version = 0
        """The version of the last entry applied (or of the snapshot restored)."""
        self.caught_up = False
        """Active and read to the log's end since it took the lock: only then may it append."""
        self.wholeness = Wholeness(log_topic)
        self.refused_by_key: Counter[str] = Counter()
        """Entries refused since the last one applied because of their key (by key id, `?` unsigned): what a gap
        after them is named for."""
        self.signers: set[str | None] = set()
        """Keys the state's records since its last snapshot were signed with (None: unsigned)."""

    # --- what every record read is ---------------------------------------------------------

    def saw(self, seen: Seen, topic: str) -> None:
        """A record read from a state topic, authenticated (`keys.authenticate`): evidence of whose key is the
        group's."""
        self.witness.saw(seen, topic)

    def key_mismatch(self) -> Stop | None:
        """Stop, never compete, when the records read say this replica's key is not the group's (`KeyWitness`)."""
        why = self.witness.mismatch()
        return None if why is None else self._stop(why)

    def _stop(self, reason: str, cause: Literal["key", "lost"] = "key") -> Stop:
        self.role, self.stopped = "stopped", Stop(reason, cause)
        return self.stopped

    def failure(self, stop: Stop) -> ReplicationError:
        """The error a driver stops with for `stop`, whichever driver met it: its key (`KeyMismatch`) or lost entries
        (`LogIncomplete`, naming the namespace whose retention is the fix)."""
        if stop.cause == "key":
            return KeyMismatch(stop.reason)
        return LogIncomplete(stop.reason, namespace=self.wholeness.namespace)

    # --- the lock's markers -----------------------------------------------------------------

    def on_marker(self, replica: str, term: int) -> None:
        """A marker read (authenticated): terms only grow, so the highest names the holder."""
        if term > self.marker_term:
            self._new_holder = True
        if term >= self.marker_term:
            self.marker_term, self.holder = term, replica

    def on_markers_read(self, now: float) -> None:
        """The markers were read to the topic's end at `now`; a holder first named in them is heard of from now."""
        self.markers_read_at = now
        if self._new_holder:
            self._new_holder, self.holder_seen_at = False, now

    def _claim(self, now: float, claim: tuple[str, int] | None) -> ReadMarkers | None:
        """A status claiming a term above the newest marker's only makes this replica read the markers again, at most
        once a `RECHECK`: a status is a hint (anyone who may produce on the topic can claim anything), the markers
        are the lock's own word."""
        if claim is None or claim[1] <= self.marker_term or now - self.markers_read_at < RECHECK:
            return None
        return ReadMarkers(f"replica {claim[0]} claims term {claim[1]}")

    # --- standby: when to take the lock -----------------------------------------------------

    def waiting(self, jitter: float) -> None:
        """A wait for the lock begins; `jitter` in [0, 1) s (the driver's random draw) so two standbys seldom fence
        at once."""
        self.patience = self.takeover_after + jitter * min(1.0, self.takeover_after / 10)

    def silent_for(self, now: float, heard: Heard) -> float:
        """Seconds the lock's holder (the newest marker's replica, else any active) has been silent since this replica
        became a standby, up to its own status's last echo.

        Up to the echo, not to `now`: statuses come in order, so a replica
        that cannot hear the broker (partitioned one way) or was frozen
        itself has heard nothing since its own last echo either, and counts
        no silence it could not have heard. Counted from `now`, a standby
        resumed from a SIGSTOP fenced a healthy active at once.

        And from the start of its current run of echoes (`hearing_since`):
        statuses lost while it could not hear are not the holder's silence.
        Without it, a standby whose link in came back heard its own status
        before the active's next one and fenced a healthy active (found by
        the simulator: an inbound cut of 3.4 s, a takeover 0.3 s after it healed).

        And from when it learned of the holder (`holder_seen_at`): a holder
        promoted a moment ago has not said a word yet. Counted from earlier, a
        standby that read the new holder's marker as the last word before
        fencing the old one fenced the new one at once, and the new one,
        confirmed at its promotion, answered reads from a state the next
        active had already moved past (found by the simulator: two standbys
        fencing a frozen active 10 ms apart, a stale read 0.5 s later).

        And none before its first echo (`echo_at` None): a standby that never
        heard itself since it became one cannot tell the holder's silence from
        its own deafness. Counted to `now`, a standby whose link out was cut
        when it stepped down, then frozen, fenced a healthy active the moment
        it thawed, and one whose link in was cut next fenced one as soon as its
        link out came back (found by the simulator; the deposed active answered
        a stale read within its grace).
        """
        holder = self.holder if self.holder != self.replica_id else None
        heard_at = heard.any_active_at if holder is None else heard.active_at.get(holder)
        if heard.echo_at is None:
            return 0.0
        until = heard.echo_at
        since = max(heard_at or 0.0, self.standby_since, self.holder_seen_at, heard.hearing_since or float("-inf"))
        return until - since

    def standby_look(self, now: float, heard: Heard) -> Wait | ReadMarkers | TryLock | Stop:
        """A standby's look while it waits for the lock.

        - a key that is not the group's: stop, never fence (`key_mismatch`);
        - a status claiming a newer term: read the markers (`_claim`);
        - the holder silent past the patience: read the markers once more
          (the holder may have changed), then, still silent, fence. A frozen
          active keeps its exclusive producer at the broker for about a
          minute; without this the group would wait that long.
        """
        if self.stopped is not None:
            return self.stopped
        if (stop := self.key_mismatch()) is not None:
            return stop
        if (read := self._claim(now, heard.claim)) is not None:
            return read
        if self.silent_for(now, heard) <= self.patience:
            self._fence_next = False
            return Wait()
        if not self._fence_next:
            self._fence_next = True
            return ReadMarkers("the last word before fencing: the holder may have changed")
        self._fence_next = False
        return TryLock("fence")

    # --- taking the lock -------------------------------------------------------------------

    def first_attempt(self) -> TryLock | Stop:
        """At start: a free lock is ours at once, unless what was read already says our key is not the group's."""
        if (stop := self.key_mismatch()) is not None:
            return stop
        return TryLock("exclusive")

    def granted(self, mode: Mode) -> ReadMarkers | Stop:
        """The broker handed us the lock: read its markers to the end before writing ours, so our term is above every
        term written before (exact now: nobody else can write there)."""
        if (stop := self.key_mismatch()) is not None:
            return stop
        self.mode = mode
        return ReadMarkers("taking the lock")

    def promotion_marker(self) -> WriteMarker:
        """The marker that makes us active: the next term, so terms only grow whatever the clocks say."""
        assert self.mode is not None
        return WriteMarker(self.marker_term + 1, self.mode)

    def on_promoted(self, term: int, now: float) -> Promote:
        """Our marker of `term` is on the lock: active from now, confirmed as of now."""
        self.term, self.marker_term, self.holder = term, term, self.replica_id
        self.role, self.lost, self.confirmed_at, self._disconnected_at = "active", None, now, None
        self.caught_up = False
        return Promote(term)

    def promotion_failed(self) -> None:
        """The marker could not be written (fenced the moment it was granted, say): a standby again."""
        self.mode = None

    def on_caught_up(self, signing: str | None) -> WriteSnapshot | None:
        """The new active has read the log to its end behind its writer: it may append now.

        And if the state holds records signed with another key than the one
        it signs with (a rotation's step 2), it writes a snapshot under its
        own key at once. Without it, dropping the old key (step 3) left every
        replica refusing the entries only that key had signed, with no
        snapshot covering them: each stopped, and the store was down.
        """
        self.caught_up = True
        others = {signer for signer in self.signers if signer != signing}
        if self.key is None or not others:
            return None
        named = ", ".join(sorted(s or "unsigned" for s in others))
        return WriteSnapshot(f"the state holds records signed with {named}; this replica signs with {signing}")

    # --- active: when to step down ------------------------------------------------------

    def active_look(
        self, now: float, lock_connected: bool, claim: tuple[str, int] | None
    ) -> Wait | ReadMarkers | StepDown:
        """An active's look: step down on the first sign it was deposed.

        - `deposed` was called (a send met `Fenced`, an append may have failed);
        - its lock disconnected for the grace: a `wait`-mode lock at once
          (fenced, it would queue again and be handed the lock back, epoch and
          all, once the new holder leaves: measured), an `exclusive` or
          `fence` one after `lost_lock_grace` (a broker restart: it holds the
          lock again only if nobody took it meanwhile);
        - a marker of a newer term;
        - a status claiming a newer term: read the markers (`_claim`).
        """
        if self.lost is not None:
            return StepDown(self.lost)
        grace = 0.0 if self.mode == "wait" else self.lost_lock_grace
        if lock_connected:
            self._disconnected_at = None
        elif self._disconnected_at is None:
            self._disconnected_at = now
        if self._disconnected_at is not None and now - self._disconnected_at >= grace:
            return StepDown(f"lost the lock on {self.lock_topic} (fenced, or disconnected for {grace:g}s)")
        if self.marker_term > self.term:
            return StepDown(
                f"replica {self.holder} holds the lock in a newer term ({self.marker_term} > {self.term}), as its"
                f" marker on {self.lock_topic} says"
            )
        return self._claim(now, claim) or Wait()

    def deposed(self, reason: str) -> bool:
        """A sign this active was deposed, from a driver (a send met `Fenced`); whether it is news (then the driver
        revokes its writers at once, before anything else)."""
        if self.role != "active" or self.lost is not None:
            return False
        self.lost = reason
        return True

    def stepped_down(self, now: float) -> None:
        """It stepped down: a standby from `now`, whose silence counting starts again."""
        if self.role == "active":
            self.role = "standby"
        self.mode, self.caught_up, self.standby_since, self._disconnected_at = None, False, now, None

    @property
    def holding(self) -> bool:
        return self.role == "active" and self.lost is None

    # --- answering and acknowledging ------------------------------------------------------

    def confirm(self, now: float) -> Confirmed | NotHolding | WriteMarker:
        """Before it answers from its state or acknowledges a write: is the lock still ours?

        A holder fenced off its lock is not told so by the broker until it
        sends (a fenced idle producer stays "connected"), and a replica cut off
        and replaced meanwhile would answer from a state the new active has
        moved past. So a confirmation older than the grace is renewed by a
        `held` marker the lock must take within the grace; at most one per
        grace while it writes, none while idle.
        """
        if not self.holding or self.mode is None:
            return NotHolding(f"replica {self.replica_id} does not hold {self.lock_topic}; it acknowledges no write")
        if now - self.confirmed_at < self.lost_lock_grace:
            return Confirmed()
        return WriteMarker(self.term, self.mode, held=True, within=self.lost_lock_grace)

    def on_held(self, started: float, why: str | None) -> Confirmed | NotHolding:
        """The `held` marker sent at `started` was taken (None) or not (why): confirmed as of `started`, or
        deposed."""
        if why is None and self.holding:
            self.confirmed_at = max(self.confirmed_at, started)
            return Confirmed()
        reason = why or "stepped down meanwhile"
        self.deposed(f"lost the lock on {self.lock_topic}: {reason}")
        return NotHolding(
            f"replica {self.replica_id} lost the lock on {self.lock_topic}: {reason}; it acknowledges none"
        )

    def executed(self, moved: int | None) -> Acknowledge | Append | NotHolding:
        """A request ran against the local state; `moved`: the version it made, if it changed anything.

        Acknowledged means in the log: whatever moved the version is appended
        before it is answered, announced or not. The store once logged only
        writes that made a push, so a write to a reserved workspace (the
        registry's own records, `__template__`) was acknowledged, then lost at
        a failover, and the version went back. What changed nothing is
        answered at once.
        """
        if moved is None:
            return Acknowledge(self.version)
        return self.may_append(moved)

    def may_append(self, version: int | None = None) -> Append | NotHolding:
        """An entry may be written only by the active replica, caught up behind its writer, at a version above its
        state's: so nothing can follow what a deposed writer persisted but ours, and versions never go back."""
        if not self.holding or not self.caught_up:
            return NotHolding(
                f"this replica is not the active one of {self.log_topic} (or is still catching up); write through the"
                " active one"
            )
        next_version = self.version + 1 if version is None else version
        if next_version <= self.version:
            raise ValueError(f"version {next_version} is not above the log's {self.version}")
        return Append(next_version, self.version, self.term)

    def on_appended(self, version: int, why: str | None) -> Acknowledge | Lost:
        """The append of `version` returned (None) or failed (why).

        Acknowledged means in the log: a write is answered only once the
        broker persisted its entry. One that failed may or may not be there (a
        timeout), and the local state already holds it: the replica stops
        serving and rebuilds from the log, and the client retries.
        """
        if why is None:
            return Acknowledge(version)
        reason = f"the write was not acknowledged by the replicated log ({why}); retry, the active replica will answer"
        self.deposed(reason)
        return Lost(reason)

    # --- applying the log ---------------------------------------------------------------

    def follow_log(self, topic: str, *, require_whole: bool = True) -> None:
        """The log this replica's state follows; `require_whole=False` only for a writer about to replace the whole
        state (an import with `--force`), never for a replica that serves it."""
        self.log_topic, self.require_whole = topic, require_whole
        self.wholeness = Wholeness(topic)

    def restored(self, version: int, position: bytes | None, signer: str | None) -> None:
        """A snapshot of `version` was restored; the reader starts at its entry (`position`, inclusive) if it has
        one."""
        self.version = version
        self.wholeness = Wholeness(self.log_topic, version if position else None)
        self.signers = {signer}

    def snapshot_written(self, signer: str | None) -> None:
        self.signers = {signer}

    def refused(self, seen: Seen, *, at_snapshot: bool = False) -> Refuse:
        """A record of the log that cannot be authenticated: refused, never applied, remembered by key (so a gap it
        leaves is named for its key, not blamed on the broker). `at_snapshot`: it is the snapshot's own entry, where
        the reader starts: met, so its absence is not taken for deleted history."""
        self.refused_by_key[seen.key_id or "?"] += 1
        if at_snapshot:
            self.wholeness.met(self.version)
        return Refuse(seen.reason)

    def entry(self, seen: Seen, version: int, previous: int | None) -> Apply | Ignore | Refuse | Stop:
        """An entry read from the log (parsed; `seen`: its authentication).

        - not authenticated: refused (logged), never applied, and remembered
          by key, so a gap it leaves is named for its key, not blamed on the
          broker;
        - at or below the state's version: ignored (duplicates, stale ones,
          our own read back), so the version never goes back;
        - one whose `previous` is above the state, or that follows a
          snapshot's entry the broker no longer holds: the entries between are
          gone, and a replica never serves a state without them (`Stop`).
        """
        if not seen.accepted:
            return self.refused(seen)
        self.wholeness.met(version)
        if version <= self.version:
            return Ignore()
        finding = self.wholeness.applying(self.version, version, previous)
        if finding is not None and (stop := self.found(finding)) is not None:
            return stop
        self.refused_by_key.clear()
        self.signers.add(seen.key_id)
        return Apply(version, finding.line if finding is not None else None)

    def applied(self, version: int) -> None:
        self.version = max(self.version, version)

    def found(self, finding: Finding) -> Stop | None:
        """What a wholeness finding means: a loss stops a replica that serves (`require_whole`); history the
        snapshot still holds is only said (the driver logs it)."""
        if not finding.lost or not self.require_whole:
            return None
        if self.refused_by_key:
            keys = ", ".join(sorted(k for k in self.refused_by_key if k != "?")) or "no key (unsigned)"
            return self._stop(
                f"the log {self.log_topic} holds entries this replica cannot authenticate (signed with {keys}) where"
                f" its state needs them, and no snapshot it can read covers them: a group key was dropped before a"
                " snapshot under the new one was written. Put the dropped key back in the key file (a file may hold"
                " two), start the replicas, and drop it again once `toolreg replicas` shows an active replica"
                " started with the new signing key"
            )
        return self._stop(finding.line, "lost")
