"""The replica group's rules, one by one, on the pure core: no broker, no clock but the one passed in."""

from __future__ import annotations

from discovery.errors import LogIncomplete
from discovery.replicas.core import (
    Acknowledge,
    Append,
    Apply,
    Confirmed,
    Heard,
    Lost,
    NotHolding,
    Promotion,
    ReadMarkers,
    ReplicaCore,
    Seen,
    StandbyLook,
    StepDown,
    Stop,
    TryLock,
    Wait,
    WriteMarker,
    WriteSnapshot,
    authenticate,
)
from discovery.replicas.groupkey import GroupKey
from discovery.replicas.records import sign

GROUP = GroupKey.generate(b"g" * 32)
OTHER = GroupKey.generate(b"o" * 32)


def entry_seen(reader: GroupKey | None, writer: GroupKey | None) -> Seen:
    data = b'{"version":1}'
    return authenticate(reader, sign(writer, "entry", "log", data), "entry", "log", data)


def active(core: ReplicaCore, now: float = 0.0) -> ReplicaCore:
    assert isinstance(core.first_attempt(), TryLock)
    core.granted("exclusive")
    core.on_markers_read(now)
    core.on_promoted(core.promotion_marker().term, now)
    core.on_caught_up(core.key.signing if core.key else None)
    return core


def test_a_replica_with_another_key_stops_before_it_competes_naming_both_keys() -> None:
    core = ReplicaCore("stranger", key=OTHER)
    core.saw(entry_seen(OTHER, GROUP), "log")
    stop = core.first_attempt()
    assert isinstance(stop, Stop) and stop.cause == "key"
    assert GROUP.signing in stop.reason and OTHER.signing in stop.reason and "group key mismatch" in stop.reason
    assert core.role == "stopped" and isinstance(core.standby_look(10.0, Heard()), Stop)


def test_a_replica_without_a_key_beside_a_keyed_group_stops_and_one_of_an_unkeyed_group_never_does() -> None:
    unkeyed = ReplicaCore("c")
    unkeyed.saw(entry_seen(None, GROUP), "log")
    assert isinstance(stop := unkeyed.first_attempt(), Stop) and "this replica has no group key" in stop.reason
    member = ReplicaCore("d")
    member.saw(entry_seen(None, None), "log")
    member.saw(entry_seen(None, OTHER), "log")  # a forger's signed record, after the group's own
    assert isinstance(member.first_attempt(), TryLock)


def test_a_keyed_replica_beside_an_unsigned_group_stops_and_a_member_never_stops_for_a_forgery() -> None:
    keyed = ReplicaCore("e", key=GROUP)
    keyed.saw(entry_seen(GROUP, None), "log")
    assert isinstance(stop := keyed.first_attempt(), Stop) and "unsigned" in stop.reason
    member = ReplicaCore("f", key=GROUP)
    member.saw(entry_seen(GROUP, GROUP), "log")
    member.saw(entry_seen(GROUP, OTHER), "log")
    member.saw(entry_seen(GROUP, None), "log")
    assert isinstance(member.first_attempt(), TryLock)


def standby(holder: str = "a") -> ReplicaCore:
    core = ReplicaCore("b", takeover_after=3.0, now=0.0)
    core.on_marker(holder, 1)
    core.on_markers_read(0.0)
    core.waiting(0.0)
    return core


def test_a_standby_fences_a_silent_holder_after_reading_the_markers_once_more() -> None:
    core = standby()
    heard = Heard({"a": 1.0}, 1.0, echo_at=4.5, hearing_since=0.5)
    assert isinstance(core.standby_look(4.5, heard), ReadMarkers)
    assert core.standby_look(4.5, heard) == TryLock("fence")


def test_a_standby_look_has_the_markers_read_each_time_the_core_asks_and_ends_on_what_it_decides() -> None:
    """The order every driver (`Election`, the simulator) feeds a look in, from one place: the fence comes only after
    the markers were read to their end, and reading them names the new holder, whose silence starts then."""
    core, heard, reads = standby(), Heard({"a": 1.0}, 1.0, echo_at=4.5, hearing_since=0.5), []
    look = StandbyLook(lambda: core.standby_look(4.5, heard))
    for asked in look:
        reads.append(asked)
        core.on_markers_read(4.5)
    assert len(reads) == 1 and look.decision == TryLock("fence")
    core = standby()
    look = StandbyLook(lambda: core.standby_look(4.5, heard))
    for _ in look:
        core.on_marker("c", 2)  # the markers name a newer holder, just heard of
        core.on_markers_read(4.5)
    assert isinstance(look.decision, Wait)


def test_a_promotion_reads_the_markers_before_it_asks_for_its_term_and_is_active_only_once_written() -> None:
    """`Promotion`, the order every driver takes the lock in: the marker's term is asked for after the markers were
    read to their end (a newer term read there moves it up), and the replica is active only once it was written."""
    core = ReplicaCore("a", now=0.0)
    assert isinstance(core.first_attempt(), TryLock)
    promotion, steps = Promotion(core, "exclusive"), []
    for step in promotion:
        steps.append(step)
        if isinstance(step, ReadMarkers):
            core.on_marker("b", 6)  # the lock's last marker, read now: term 6 was somebody's
            core.on_markers_read(1.0)
            assert core.role == "standby"
    assert [type(step) for step in steps] == [ReadMarkers, WriteMarker] and steps[1] == WriteMarker(7, "exclusive")
    assert promotion.stop is None and promotion.promoted(1.5).term == 7 and core.role == "active"

    stranger = ReplicaCore("stranger", key=OTHER)
    stranger.saw(entry_seen(OTHER, GROUP), "log")
    refused = Promotion(stranger, "fence")
    assert list(refused) == [] and isinstance(refused.stop, Stop) and refused.stop.cause == "key"


def test_silence_counts_only_up_to_the_standbys_own_echo_and_only_while_it_could_hear() -> None:
    core = standby()
    # Frozen, or cut off inbound: it heard nothing since its own last echo, so nothing past it counts.
    assert isinstance(core.standby_look(30.0, Heard({"a": 1.0}, 1.0, echo_at=1.2, hearing_since=0.5)), Wait)
    # Its link back: its own status came back before the holder's next one; what it missed does not count.
    assert isinstance(core.standby_look(30.0, Heard({"a": 1.0}, 1.0, echo_at=29.9, hearing_since=29.9)), Wait)


def test_a_holder_first_named_by_the_markers_is_silent_only_from_when_it_was_read() -> None:
    core = standby("a")
    core.on_marker("c", 2)  # promoted a moment ago: it has not said a word yet
    core.on_markers_read(10.0)
    assert core.holder == "c"
    assert isinstance(core.standby_look(10.1, Heard({"a": 1.0}, 1.0, echo_at=10.1, hearing_since=0.5)), Wait)


def test_a_status_claiming_a_newer_term_only_makes_the_markers_read_again_at_most_once_a_second() -> None:
    core = active(ReplicaCore("a", now=0.0))
    assert core.active_look(5.0, True, ("ghost", 99)) == ReadMarkers("replica ghost claims term 99")
    core.on_markers_read(5.0)
    assert isinstance(core.active_look(5.5, True, ("ghost", 99)), Wait)
    assert core.role == "active"


def test_an_active_answers_within_the_grace_then_confirms_its_lock_and_steps_down_when_it_cannot() -> None:
    core = active(ReplicaCore("a", lost_lock_grace=2.0, now=0.0))
    assert isinstance(core.confirm(1.0), Confirmed)
    held = core.confirm(2.5)
    assert isinstance(held, WriteMarker) and held.held and held.within == 2.0
    assert isinstance(core.on_held(2.5, None), Confirmed) and isinstance(core.confirm(4.0), Confirmed)
    assert isinstance(core.confirm(5.0), WriteMarker)
    assert isinstance(core.on_held(5.0, "Fenced"), NotHolding)
    assert isinstance(core.active_look(5.1, True, None), StepDown)


def test_whatever_moved_the_version_is_appended_before_it_is_acknowledged() -> None:
    core = active(ReplicaCore("a", now=0.0))
    assert core.executed(None) == Acknowledge(0)
    assert core.executed(1) == Append(1, 0, core.term)
    assert core.on_appended(1, None) == Acknowledge(1)
    assert isinstance(core.on_appended(2, "timed out"), Lost)  # may or may not be in the log: it stops serving
    assert core.lost is not None and isinstance(core.executed(1), NotHolding)


def test_a_new_active_writes_a_snapshot_under_its_key_when_the_state_holds_records_under_another() -> None:
    rotated = GroupKey({**GROUP.secrets, **OTHER.secrets}, OTHER.signing)
    core = ReplicaCore("a", key=rotated, now=0.0)
    assert isinstance(core.entry(entry_seen(rotated, GROUP), 1, 0), Apply)
    core.applied(1)
    assert isinstance(core.first_attempt(), TryLock)
    core.granted("wait")
    core.on_markers_read(0.0)
    core.on_promoted(core.promotion_marker().term, 0.0)
    assert isinstance(core.on_caught_up(rotated.signing), WriteSnapshot)
    core.snapshot_written(rotated.signing)
    assert core.on_caught_up(rotated.signing) is None


def test_a_gap_left_by_entries_under_a_dropped_key_is_named_for_the_key_not_the_broker() -> None:
    dropped = GroupKey(dict(OTHER.secrets), OTHER.signing)  # the old key GROUP dropped from the file
    core = ReplicaCore("a", key=dropped, now=0.0)
    core.follow_log("log")
    assert isinstance(core.entry(entry_seen(dropped, OTHER), 1, 0), Apply)
    core.applied(1)
    core.entry(entry_seen(dropped, GROUP), 2, 1)  # refused: signed with the dropped key
    stop = core.entry(entry_seen(dropped, OTHER), 3, 2)
    assert isinstance(stop, Stop) and stop.cause == "key"
    assert GROUP.signing in stop.reason and "Put the dropped key back" in stop.reason and "retention" not in stop.reason


def test_a_replica_stopped_for_lost_entries_says_so_at_every_look_after_not_a_key_mismatch() -> None:
    core = ReplicaCore("a", now=0.0)
    core.follow_log("persistent://tg/state/config-log")
    core.saw(entry_seen(None, None), "log")
    stop = core.entry(entry_seen(None, None), 5, 3)  # follows version 3, which the state never had
    assert isinstance(stop, Stop) and stop.cause == "lost"
    assert core.standby_look(1.0, Heard()) == stop
    failure = core.failure(stop)
    assert isinstance(failure, LogIncomplete) and failure.namespace == "tg/state"
