"""The replica group's rules as one pure state machine (`ReplicaCore`), and the effects its drivers carry out.

No await, no clock, no broker in here: `Election`, `ReplicatedLog`,
`Membership` and the store service feed it what they read, with the time,
and do what it answers. Because it is pure, a deterministic simulator runs
the very same rules over thousands of schedules of faults a minute
(`tests/simulation`), and any failing seed replays step by step.
"""

from .effects import (
    Acknowledge,
    Append,
    Apply,
    Confirmed,
    Effect,
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
from .keys import KeyWitness, Seen, Verdict, authenticate
from .replica import RECHECK, Heard, ReplicaCore
from .turns import Promotion, StandbyLook
from .wholeness import Finding, Wholeness

__all__ = [
    "RECHECK",
    "Acknowledge",
    "Append",
    "Apply",
    "Confirmed",
    "Effect",
    "Finding",
    "Heard",
    "Ignore",
    "KeyWitness",
    "Lost",
    "Mode",
    "NotHolding",
    "Promote",
    "ReadMarkers",
    "Refuse",
    "ReplicaCore",
    "Seen",
    "Promotion",
    "StandbyLook",
    "StepDown",
    "Stop",
    "TryLock",
    "Verdict",
    "Wait",
    "Wholeness",
    "WriteMarker",
    "WriteSnapshot",
    "authenticate",
]
