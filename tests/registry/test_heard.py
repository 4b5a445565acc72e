"""A standby's ear (`HeardLeases`): what it keeps of the announcements, and how a takeover's leases start from it.

The ear runs on a real broker (pulsar-lite); the lease rules it feeds are
pure and tested with the clock passed in.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from support import eventually
from support.registry import announcement

from discovery.registry import heard as heard_module
from discovery.registry.heard import HeardLeases
from discovery.registry.leases import LeaseTable
from toolservice_base.transport import Publisher, Transport

A = ("default", "svc")


@pytest.fixture
async def ear(connection: Transport) -> AsyncIterator[HeardLeases]:
    listening = HeardLeases(connection, capacity=3, receiver_queue=1000)
    await listening.start()
    yield listening
    await listening.stop()


@pytest.fixture
async def descriptors(connection: Transport) -> AsyncIterator[Publisher]:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    yield publisher
    await publisher.close()


async def test_an_instance_heard_from_ends_one_of_its_ttls_after_its_last_message(
    ear: HeardLeases, descriptors: Publisher
) -> None:
    await descriptors.send(announcement(kind="heartbeat", instance="svc-1", ttl=5.0).to_json())
    await eventually(lambda: len(ear) == 1)
    now = time.monotonic()
    found = ear.restore_expiry("svc-1", "default", 30.0, now)
    assert found is not None
    ends, last_seen = found
    assert now + 4.5 < ends <= now + 5.0  # its own ttl (5 s), from when it spoke: not the record's 30 s from now
    assert last_seen is not None and abs(last_seen - time.time()) < 2


async def test_an_instance_never_heard_ends_one_ttl_after_listening_began(ear: HeardLeases) -> None:
    since = ear.listening_since
    assert since is not None
    now = since + 10.0
    assert ear.restore_expiry("gone-1", "default", 3.0, now) == (
        since + 3.0,
        None,
    )  # ran out 7 s ago: gone at the first sweep
    assert ear.restore_expiry("gone-1", "default", 30.0, now) == (since + 30.0, None)


async def test_what_was_heard_never_gives_more_than_a_ttl_of_grace(ear: HeardLeases, descriptors: Publisher) -> None:
    await descriptors.send(announcement(kind="heartbeat", instance="svc-1", ttl=600.0).to_json())
    await eventually(lambda: len(ear) == 1)
    now = time.monotonic()
    assert ear.restore_expiry("svc-1", "default", 2.0, now) == (
        pytest.approx(now + 2.0),
        pytest.approx(time.time(), abs=2),
    )


async def test_a_message_for_another_workspace_does_not_vouch_for_the_recorded_one(
    ear: HeardLeases, descriptors: Publisher
) -> None:
    await descriptors.send(announcement(kind="heartbeat", instance="svc-1", workspace="elsewhere").to_json())
    await eventually(lambda: len(ear) == 1)
    found = ear.restore_expiry("svc-1", "default", 3.0, time.monotonic())
    assert found is not None and found[1] is None  # as if never heard


async def test_garbage_is_ignored_and_made_up_ids_cannot_grow_the_table_past_its_capacity(
    ear: HeardLeases, descriptors: Publisher
) -> None:
    await descriptors.send(b"\xff not json")
    await descriptors.send(b'{"kind": "heartbeat", "instance": "../../etc"}')
    for number in range(10):
        await descriptors.send(announcement(kind="heartbeat", instance=f"made-up-{number}", ttl=60.0).to_json())
    await eventually(lambda: len(ear) == 3)
    await descriptors.send(
        announcement(kind="heartbeat", instance="made-up-0", ttl=60.0).to_json()
    )  # a known one still renews
    before = ear.restore_expiry("made-up-0", "default", 60.0, time.monotonic())
    assert len(ear) == 3 and before is not None and before[1] is not None
    assert ear.restore_expiry("made-up-9", "default", 60.0, time.monotonic()) == (
        pytest.approx(ear.listening_since + 60.0),
        None,
    )


async def test_a_stopped_ear_vouches_for_nothing_and_forgets_what_it_heard(
    ear: HeardLeases, descriptors: Publisher
) -> None:
    await descriptors.send(announcement(kind="heartbeat", instance="svc-1").to_json())
    await eventually(lambda: len(ear) == 1)
    await ear.stop()
    assert ear.listening_since is None and ear.restore_expiry("svc-1", "default", 3.0, time.monotonic()) is None
    await ear.start()
    assert len(ear) == 0 and ear.listening_since is not None


async def test_after_a_gap_in_listening_nothing_runs_out_before_one_ttl_from_its_end(
    ear: HeardLeases,
    descriptors: Publisher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Heartbeats lost while the ear could not hear (disconnected, or the process frozen) must not read as silence."""
    await descriptors.send(announcement(kind="heartbeat", instance="svc-1", ttl=3.0).to_json())
    await eventually(lambda: len(ear) == 1)
    first = ear.listening_since
    monkeypatch.setattr(heard_module, "CHECK_EVERY", 0.05)
    await ear.stop()
    await ear.start()  # the watch loop runs at the patched pace from here
    await descriptors.send(announcement(kind="heartbeat", instance="svc-1", ttl=3.0, sequence=2).to_json())
    await eventually(lambda: len(ear) == 1)
    assert ear._subscription is not None
    monkeypatch.setattr(type(ear._subscription), "connected", property(lambda self: False))
    await eventually(lambda: ear.listening_since is None, timeout=2)  # deaf: a takeover now starts cold
    monkeypatch.undo()
    await eventually(lambda: ear.listening_since is not None, timeout=2)
    since = ear.listening_since
    assert since is not None and first is not None and since > first
    found = ear.restore_expiry("svc-1", "default", 3.0, since + 10.0)
    assert found is not None and found[0] == pytest.approx(since + 3.0)  # counted from when it could hear again


def test_a_lease_restored_from_what_was_heard_is_live_and_ends_when_heard_says() -> None:
    leases = LeaseTable()
    lease = leases.restore("i", A, ttl=3.0, now=10.0, digest="d", heard=(11.0, 1234.5))
    assert lease.state == "live" and lease.last_seen == 1234.5 and not lease.grace
    assert leases.sweep(10.9).expired == []
    assert [gone.instance for gone in leases.sweep(11.0).expired] == ["i"]  # not at 13.0, where grace would end


def test_a_lease_never_heard_stays_in_grace_but_ends_when_listening_says() -> None:
    leases = LeaseTable()
    lease = leases.restore("i", A, ttl=3.0, now=10.0, digest="d", heard=(8.0, None))
    assert lease.state == "grace" and lease.last_seen is None
    assert [gone.instance for gone in leases.sweep(10.0).expired] == ["i"]
