"""The drivers' calls into the core, and the known bad variants the simulator must catch.

Each variant breaks one rule the way a plausible change would, and each is
run in `make test` and must fail the simulator's checks (`test_simulated_group.py`):

- `ack-without-log`: a write that announces nothing (a reserved workspace)
  acknowledged without its log entry: the store's bug of round five;
- `trust-status`: a status taken for the lock's word (an active steps down,
  a standby takes its holder, on a status's claim alone);
- `no-confirm`: an active answers and acknowledges without confirming its
  lock, after a freeze or a partition it did not notice;
- `count-own-freeze`: a standby counts the holder's silence up to now, not
  up to its own status's last echo, so its own freeze looks like the
  holder's silence;
- `apply-unsigned`: an entry applied without its group-key MAC checked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from discovery.replicas.core import (
    Acknowledge,
    Append,
    Apply,
    Confirmed,
    Ignore,
    NotHolding,
    ReadMarkers,
    Refuse,
    Seen,
    StepDown,
    Stop,
    TryLock,
    Wait,
    WriteMarker,
)

if TYPE_CHECKING:
    from .replica import SimReplica
    from .world import Request

VARIANTS = ("ack-without-log", "trust-status", "no-confirm", "count-own-freeze", "apply-unsigned")


class Variants:
    """The core's rules as the drivers call them, with at most one broken (`variant`)."""

    def __init__(self, variant: str | None = None) -> None:
        if variant is not None and variant not in VARIANTS:
            raise ValueError(f"no variant {variant!r}; one of {', '.join(VARIANTS)}")
        self.variant = variant

    def entry(self, replica: SimReplica, seen: Seen, body: dict[str, Any], at_snapshot: bool) -> Any:
        core = replica.core
        if self.variant == "apply-unsigned":
            seen = Seen("verified", seen.key_id)
        if not seen.accepted:
            return core.refused(seen, at_snapshot=at_snapshot)
        version, previous = body.get("version"), body.get("previous")
        if not isinstance(version, int) or not (previous is None or isinstance(previous, int)):
            return Refuse("not a log entry")
        decision: Apply | Ignore | Refuse | Stop = core.entry(seen, version, previous)
        return decision

    def standby_look(self, replica: SimReplica) -> Wait | ReadMarkers | TryLock | Stop:
        heard = replica.view()
        if self.variant == "count-own-freeze":
            heard = replace(heard, echo_at=replica.clock())
        if self.variant == "trust-status" and heard.claim is not None:
            replica.core.on_marker(*heard.claim)
        return replica.core.standby_look(replica.clock(), heard)

    def active_look(
        self, replica: SimReplica, connected: bool, claim: tuple[str, int] | None
    ) -> Wait | ReadMarkers | StepDown:
        if self.variant == "trust-status" and claim is not None and claim[1] > replica.core.term:
            return StepDown(f"a status of {claim[0]} claims term {claim[1]}")
        return replica.core.active_look(replica.clock(), connected, claim)

    def confirm(self, replica: SimReplica) -> Confirmed | NotHolding | WriteMarker:
        if self.variant == "no-confirm" and replica.core.role == "active":
            return Confirmed()
        return replica.core.confirm(replica.clock())

    def executed(self, replica: SimReplica, request: Request, moved: int | None) -> Acknowledge | Append | NotHolding:
        if self.variant == "ack-without-log" and request.reserved and moved is not None:
            return Acknowledge(moved)
        return replica.core.executed(moved)
