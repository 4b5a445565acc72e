"""Replicas on the broker: one active elected by Apache Pulsar, standbys tailing a log.

In-process tests run on Apache Pulsar (a fresh tenant per test) and on the
in-memory transport, which must behave the same; each replica has a client
of its own. The tests that kill -9 or SIGSTOP a replica run it as a process
(`election_proc.py`) on Apache Pulsar.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from apache_pulsar import ApachePulsar
from support import eventually
from support.replicas import REPLICATED_KINDS, replicated_settings

from discovery.broker import EmbeddedBroker
from discovery.errors import NewerFormat, NotActive
from discovery.replicas import Election, LogEntry, Membership, ReplicatedLog, RoleChange
from toolservice_base import Settings, open_transport
from toolservice_base.errors import AuthenticationFailed, BrokerUnsupported, Fenced, TransportError
from toolservice_base.transport import Transport

pytestmark = pytest.mark.timeout(240)

HELPER = Path(__file__).with_name("election_proc.py")
ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 0.2
"""Membership heartbeats in these tests: five a second."""


@pytest.fixture(params=REPLICATED_KINDS)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """conftest's `settings`, on the brokers that can keep replicated state only."""
    return replicated_settings(request, tmp_path)


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[AsyncExitStack]:
    """What a test opened, closed before its broker's tenant is deleted (hence `settings` first)."""
    async with AsyncExitStack() as opened:
        yield opened


async def client(stack: AsyncExitStack, settings: Settings) -> Transport:
    """A replica's own connection to the broker."""
    return await stack.enter_async_context(await open_transport(settings))


class Items:
    """A state machine: a dict, and the versions in the order it applied them."""

    def __init__(self) -> None:
        self.items: dict[str, Any] = {}
        self.applied: list[int] = []
        self.version = 0

    def apply(self, entry: LogEntry) -> None:
        self.items.update(entry.payload)
        self.applied.append(entry.version)
        self.version = entry.version

    def snapshot(self) -> Iterable[Any]:
        return ([key, value] for key, value in sorted(self.items.items()))

    def restore(self, version: int, items: Iterable[Any]) -> None:
        self.items = {key: value for key, value in items}
        self.version = version


class Replica:
    """Membership, election and log of one replica, wired in the documented order, on its own client."""

    def __init__(
        self, name: str, election: Election, members: Membership | None, log: ReplicatedLog | None, state: Items
    ) -> None:
        self.name, self.election, self.members, self.log, self.state = name, election, members, log, state
        self.demotions: list[str] = []
        self.changes: list[RoleChange] = []


async def replica(
    stack: AsyncExitStack,
    settings: Settings,
    name: str,
    *,
    with_log: bool = True,
    with_membership: bool = True,
    state: Items | None = None,
    **options: Any,
) -> Replica:
    transport = await client(stack, settings)
    topics = transport.topics
    members = None
    if with_membership:
        members = await stack.enter_async_context(Membership(transport, name, "store", interval=INTERVAL))
    election = Election(transport, topics.state_lock, name, membership=members, **options)
    state = state or Items()
    log = None
    if with_log:
        log = await stack.enter_async_context(
            ReplicatedLog(transport, state, election=election, snapshot_every=100, chunk_bytes=2048)
        )
    made = Replica(name, election, members, log, state)

    async def demoted(reason: str) -> None:
        made.demotions.append(reason)

    election.add_listener(on_demoted=demoted)
    await stack.enter_async_context(election)
    return made


def actives(*replicas: Replica) -> list[str]:
    return [r.name for r in replicas if r.election.is_active]


# --- election -------------------------------------------------------------------------------------------------------


async def test_of_two_replicas_exactly_one_is_active(stack: AsyncExitStack, settings: Settings) -> None:
    a = await replica(stack, settings, "a", with_log=False)
    b = await replica(stack, settings, "b", with_log=False)
    await eventually(lambda: len(actives(a, b)) == 1)
    for _ in range(10):  # and it stays so
        await asyncio.sleep(0.1)
        assert len(actives(a, b)) == 1
    winner = a if a.election.is_active else b
    assert winner.election.term == 1
    members = a.members
    assert members is not None
    await eventually(
        lambda: [(s.id, s.role) for s in members.replicas()] == [("a", a.election.role), ("b", b.election.role)]
    )


async def test_closing_the_active_promotes_the_standby_within_a_second(settings: Settings) -> None:
    async with AsyncExitStack() as first, AsyncExitStack() as second:
        a = await replica(first, settings, "a", with_log=False)
        await a.election.wait_active(10)
        b = await replica(second, settings, "b", with_log=False)
        await asyncio.sleep(0.5)
        assert actives(a, b) == ["a"]
        closed = time.monotonic()
        await first.aclose()
        await b.election.wait_active(1.0)
        took = time.monotonic() - closed
        assert took < 1.0 and b.election.term == 2, took


async def test_a_standby_fences_a_silent_active_after_takeover_after(stack: AsyncExitStack, settings: Settings) -> None:
    a = await replica(stack, settings, "a", with_log=False)
    await a.election.wait_active(10)
    b = await replica(stack, settings, "b", with_log=False, takeover_after=1.5)
    await asyncio.sleep(2.0)
    assert actives(a, b) == ["a"], "a live active (heard every 0.2 s) is never fenced"
    assert a.members is not None
    a.members.pause()  # a holds the lock, but the group no longer hears it: frozen, as far as anyone can tell
    silent = time.monotonic()
    await b.election.wait_active(10)
    took = time.monotonic() - silent
    assert 1.2 <= took < 5.0, took
    await eventually(lambda: not a.election.is_active, timeout=5)
    assert a.demotions and ("newer term" in a.demotions[-1] or "lost the lock" in a.demotions[-1]), a.demotions
    assert b.election.term > a.election.term


async def test_a_replica_hears_its_own_status_back_each_interval_and_not_once_it_stops_sending(
    stack: AsyncExitStack, settings: Settings
) -> None:
    """`heard_itself_at`: the proof a process hears the broker, which a lease sweep waits for (`Expiry`)."""
    members = await stack.enter_async_context(
        Membership(await client(stack, settings), "a", "store", interval=INTERVAL)
    )
    first = await eventually(lambda: members.heard_itself_at, timeout=5)
    await eventually(lambda: (members.heard_itself_at or 0) > first, timeout=INTERVAL * 10)
    members.pause()
    await asyncio.sleep(INTERVAL * 5)  # a status sent before the pause has come back
    last = members.heard_itself_at
    await asyncio.sleep(INTERVAL * 5)
    assert members.heard_itself_at == last, "heard again though nothing was sent"


async def test_a_fenced_active_steps_down_on_its_next_send_and_never_writes_again(
    stack: AsyncExitStack, settings: Settings
) -> None:
    """No heartbeats from `a` at all, and a long grace on its lock: only `Fenced` on a send can tell it it was
    deposed."""
    data = f"persistent://{settings.topicspace}/state/data"
    writers = {}
    a = await replica(stack, settings, "a", with_log=False, with_membership=False, lost_lock_grace=60)
    await a.election.wait_active(10)
    writers["a"] = await a.election.writer(data)
    await writers["a"].send(b"a1")
    b_transport = await client(stack, settings)
    b_members = await stack.enter_async_context(Membership(b_transport, "b", "store", interval=INTERVAL))
    b_election = Election(b_transport, b_transport.topics.state_lock, "b", membership=b_members, takeover_after=1.0)

    async def b_promoted() -> None:
        writers["b"] = await b_election.writer(data)

    b_election.add_listener(b_promoted)
    await stack.enter_async_context(b_election)
    await b_election.wait_active(10)
    await writers["b"].send(b"b1")
    assert a.election.is_active, "nothing told a yet"
    with pytest.raises(Fenced):
        await writers["a"].send(b"a2")
    await eventually(lambda: not a.election.is_active, timeout=2)
    assert a.demotions and "fenced" in a.demotions[-1]
    with pytest.raises(NotActive):
        await writers["a"].send(b"a3")
    with pytest.raises(NotActive):
        await a.election.writer(data)
    reader = await b_transport.reader(data, "earliest")
    seen = []
    while await reader.has_message_available():
        envelope = await reader.read_next(10)
        assert envelope is not None
        seen.append(envelope.data)
    assert seen == [b"a1", b"b1"]


async def test_role_changes_reach_the_iterator_in_order(stack: AsyncExitStack, settings: Settings) -> None:
    transport = await client(stack, settings)
    election = Election(transport, transport.topics.state_lock, "solo")
    seen: list[RoleChange] = []

    async def watch() -> None:
        async for change in election.changes():
            seen.append(change)

    watching = asyncio.ensure_future(watch())
    await asyncio.sleep(0)  # the iterator is listening from here on
    async with election:
        await election.wait_active(10)
    await asyncio.wait_for(watching, 5)  # it ends when the election stops
    assert [(c.role, c.term, c.reason) for c in seen] == [
        ("active", 1, "took the lock (exclusive)"),
        ("standby", 1, "closing"),
    ]


# --- the log --------------------------------------------------------------------------------------------------------


async def test_appended_entries_reach_a_standby_in_order(stack: AsyncExitStack, settings: Settings) -> None:
    a = await replica(stack, settings, "a")
    assert a.log is not None
    await a.log.wait_writable(10)
    b = await replica(stack, settings, "b")
    assert b.log is not None
    for n in range(1, 61):
        entry = await a.log.append({f"k{n}": n})
        assert entry.version == n and entry.message_id
    await eventually(lambda: b.state.version == 60)
    assert b.state.applied == list(range(1, 61))
    assert b.state.items == a.state.items
    with pytest.raises(NotActive):
        await b.log.append({"from": "a standby"})


async def test_the_version_never_goes_back_at_a_reader(stack: AsyncExitStack, settings: Settings) -> None:
    """Duplicates and stale entries (as a deposed writer or a resend might leave) are skipped; versions may skip."""
    transport = await client(stack, settings)
    writer = await transport.exclusive_publisher(transport.topics.state_log, "fence")
    for version in (1, 2, 2, 1, 5, 3, 6, 6, 4, 9):
        await writer.send({"format": 1, "version": version, "term": 1, "payload": {"last": version}})
    state = Items()
    log = await stack.enter_async_context(ReplicatedLog(await client(stack, settings), state))
    assert state.applied == [1, 2, 5, 6, 9] and log.version == 9 and state.items == {"last": 9}
    assert log.stats["ignored"] == 5
    await writer.send({"format": 1, "version": 7, "term": 1, "payload": {"last": 7}})
    await writer.send({"format": 1, "version": 10, "term": 1, "payload": {"last": 10}})
    await eventually(lambda: log.version == 10)
    assert state.applied == [1, 2, 5, 6, 9, 10]


async def test_a_takeover_sees_every_write_the_deposed_active_persisted(
    stack: AsyncExitStack, settings: Settings
) -> None:
    a = await replica(stack, settings, "a")
    assert a.log is not None and a.members is not None
    await a.log.wait_writable(10)
    b = await replica(stack, settings, "b", takeover_after=1.0)
    assert b.log is not None
    acknowledged: list[int] = []

    async def keep_writing() -> None:
        n = 0
        while True:
            n += 1
            try:
                entry = await a.log.append({f"a{n}": n})  # type: ignore[union-attr]
            except (Fenced, NotActive):
                return
            acknowledged.append(entry.version)

    writing = asyncio.ensure_future(keep_writing())
    await asyncio.sleep(0.5)
    a.members.pause()
    await b.log.wait_writable(10)
    await asyncio.wait_for(writing, 10)
    assert acknowledged, "a wrote before it was deposed"
    assert set(acknowledged) <= set(b.state.applied), "every acknowledged write survives the takeover"
    own = await b.log.append({"b": 1})
    assert own.version == b.state.applied[-2] + 1 > max(acknowledged)
    await eventually(lambda: a.state.version == own.version)
    assert a.state.items == b.state.items
    await eventually(lambda: not a.log.writable)  # fenced already; not writable once it learns it was deposed


async def test_a_start_from_the_snapshot_equals_a_full_replay(stack: AsyncExitStack, settings: Settings) -> None:
    a = await replica(stack, settings, "a")
    assert a.log is not None
    await a.log.wait_writable(10)
    for n in range(1, 251):
        await a.log.append({f"key-{n % 120}": {"n": n, "pad": "x" * 40}})
    await a.log.write_snapshot()
    for n in range(251, 271):
        await a.log.append({f"tail-{n}": n})
    manifest = a.log.manifest
    assert manifest is not None and manifest.version == 250 and manifest.chunks > 1 and manifest.items == 120
    from_snapshot, replayed = Items(), Items()
    started = await stack.enter_async_context(ReplicatedLog(await client(stack, settings), from_snapshot))
    full = await stack.enter_async_context(ReplicatedLog(await client(stack, settings), replayed, use_snapshots=False))
    assert from_snapshot.items == replayed.items == a.state.items
    assert started.version == full.version == 270
    assert started.stats["restored_items"] == 120 and started.stats["applied"] == 20, started.stats
    assert full.stats["applied"] == 270


async def test_a_snapshot_cut_short_falls_back_to_the_complete_one_before(
    stack: AsyncExitStack, settings: Settings
) -> None:
    a = await replica(stack, settings, "a")
    assert a.log is not None
    await a.log.wait_writable(10)
    for n in range(1, 31):
        await a.log.append({f"k{n}": n})
    complete = await a.log.write_snapshot()
    await a.log.append({"k31": 31})
    # A writer deposed in the middle of its next snapshot leaves a chunk and no manifest (its chunks name the one
    # before).
    raw = await (await client(stack, settings)).exclusive_publisher(a.log.snapshot_topic, "fence")
    previous = base64.b64encode(complete.message_id).decode()
    await raw.send(b'[["k1",1]]', {"kind": "chunk", "snapshot": "cut-short", "seq": "0", "previous": previous})
    state = Items()
    log = await stack.enter_async_context(ReplicatedLog(await client(stack, settings), state))
    assert log.manifest is not None and log.manifest.snapshot == complete.snapshot
    assert log.version == 31 and state.items == a.state.items and log.stats["applied"] == 1


async def test_a_log_in_a_newer_format_is_refused_in_one_line(stack: AsyncExitStack, settings: Settings) -> None:
    transport = await client(stack, settings)
    writer = await transport.exclusive_publisher(transport.topics.state_log, "fence")
    await writer.send({"format": 1, "version": 1, "term": 1, "payload": {"a": 1}})
    await writer.send({"format": 2, "version": 2, "term": 1, "payload": {"a": 2}})
    with pytest.raises(NewerFormat) as refused:
        await ReplicatedLog(await client(stack, settings), Items()).__aenter__()
    line = str(refused.value)
    assert "newer version" in line and "upgrade" in line and "\n" not in line


async def test_a_follower_meeting_a_newer_format_stops_there(stack: AsyncExitStack, settings: Settings) -> None:
    transport = await client(stack, settings)
    writer = await transport.exclusive_publisher(transport.topics.state_log, "fence")
    await writer.send({"format": 1, "version": 1, "term": 1, "payload": {"a": 1}})
    state = Items()
    log = await stack.enter_async_context(ReplicatedLog(await client(stack, settings), state))
    await writer.send({"format": 2, "version": 2, "term": 1, "payload": {"a": 2}})
    await writer.send({"format": 1, "version": 3, "term": 1, "payload": {"a": 3}})
    await eventually(lambda: log.failure is not None)
    assert isinstance(log.failure, NewerFormat)
    await asyncio.sleep(0.3)
    assert state.applied == [1], "nothing is applied past an entry it cannot read"
    with pytest.raises(NewerFormat):
        await log.catch_up()


# --- refusals, one line each ----------------------------------------------------------------------------------------


@pytest.mark.apache_pulsar
async def test_a_missing_state_namespace_is_named(apache_pulsar: ApachePulsar, tenant: str) -> None:
    apache_pulsar.admin("DELETE", f"namespaces/{tenant}/state?force=true")
    space = Settings(
        pulsar_url=apache_pulsar.url, broker="apache-pulsar", topicspace=tenant, auth_token=apache_pulsar.token
    )
    async with await open_transport(space) as transport:
        for opening in (
            Election(transport, transport.topics.state_lock, "a").__aenter__(),
            ReplicatedLog(transport, Items()).__aenter__(),
        ):
            with pytest.raises(TransportError) as missing:
                await opening
            line = str(missing.value)
            assert f"{tenant}/state" in line and "deploy/pulsar-init.sh" in line and "\n" not in line


@pytest.mark.apache_pulsar
async def test_a_role_without_produce_permission_is_told_to_get_it(apache_pulsar: ApachePulsar, tenant: str) -> None:
    role = f"reader-{uuid.uuid4().hex[:6]}"
    apache_pulsar.admin("POST", f"namespaces/{tenant}/state/permissions/{role}", ["consume"])
    space = Settings(
        pulsar_url=apache_pulsar.url,
        broker="apache-pulsar",
        topicspace=tenant,
        auth_token=apache_pulsar.mint_token(role),
    )
    async with await open_transport(space) as transport:
        with pytest.raises(AuthenticationFailed) as refused:
            await Election(transport, transport.topics.state_lock, "a").__aenter__()
    line = str(refused.value)
    assert f"{tenant}/state" in line and "produce" in line and "\n" not in line


async def test_pulsar_lite_is_refused_with_one_line_saying_apache_pulsar_is_needed(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    lite = Settings(data_dir=tmp_path / "data", pulsar_url=broker.url, broker="pulsar-lite")
    async with await open_transport(lite) as transport:
        for opening in (
            Election(transport, transport.topics.state_lock, "a").__aenter__(),
            ReplicatedLog(transport, Items()).__aenter__(),
        ):
            with pytest.raises(BrokerUnsupported) as refused:
                await opening
            assert "needs Apache Pulsar" in str(refused.value) and "\n" not in str(refused.value)


# --- replicas as processes: kill -9 and SIGSTOP
# -------------------------------------------------------------------------


class Process:
    """`election_proc.py` as a child process, its JSON lines collected as they come."""

    def __init__(self, apache: ApachePulsar, tenant: str, name: str, takeover_after: float = 10.0) -> None:
        command = [
            sys.executable,
            str(HELPER),
            apache.url,
            tenant,
            name,
            "--token",
            apache.token or "",
            "--takeover-after",
            str(takeover_after),
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.append(json.loads(line))

    @property
    def role(self) -> str | None:
        roles = [e["role"] for e in self.events if e["event"] == "role"]
        return roles[-1] if roles else None

    def stepped_down(self) -> int | None:
        """The index of the first event saying it went from active to standby."""
        was_active = False
        for index, event in enumerate(self.events):
            if event["event"] == "role":
                if event["role"] == "active":
                    was_active = True
                elif was_active:
                    return index
        return None

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def processes(tenant: str) -> Iterator[list[Process]]:
    """Replica processes, killed before their tenant is deleted."""
    started: list[Process] = []
    yield started
    for process in started:
        process.stop()


@pytest.fixture
async def in_test(tenant: str) -> AsyncIterator[AsyncExitStack]:
    """What the process tests open in this process, closed before their tenant is deleted."""
    async with AsyncExitStack() as opened:
        yield opened


@pytest.mark.apache_pulsar
async def test_kill_9_of_the_active_process_promotes_the_standby_at_once(
    apache_pulsar: ApachePulsar, tenant: str, processes: list[Process], in_test: AsyncExitStack
) -> None:
    active = Process(apache_pulsar, tenant, "proc")
    processes.append(active)
    await eventually(lambda: active.role == "active", timeout=60)
    space = Settings(
        pulsar_url=apache_pulsar.url, broker="apache-pulsar", topicspace=tenant, auth_token=apache_pulsar.token
    )
    standby = await replica(in_test, space, "in-test", with_log=False)
    await asyncio.sleep(0.5)
    assert not standby.election.is_active
    killed = time.monotonic()
    active.process.kill()
    await standby.election.wait_active(5)
    assert time.monotonic() - killed < 1.0, "the broker hands the lock over when the holder's connection dies"


@pytest.mark.apache_pulsar
async def test_a_frozen_active_is_fenced_and_once_resumed_steps_down_without_writing(
    apache_pulsar: ApachePulsar, tenant: str, processes: list[Process], in_test: AsyncExitStack
) -> None:
    frozen = Process(apache_pulsar, tenant, "proc")
    processes.append(frozen)
    await eventually(lambda: frozen.role == "active", timeout=60)
    await eventually(lambda: any(e["event"] == "wrote" for e in frozen.events), timeout=10)
    space = Settings(
        pulsar_url=apache_pulsar.url, broker="apache-pulsar", topicspace=tenant, auth_token=apache_pulsar.token
    )
    data = f"persistent://{tenant}/state/proc-data"
    writers = {}
    standby_transport = await client(in_test, space)
    members = await in_test.enter_async_context(Membership(standby_transport, "in-test", "store", interval=INTERVAL))
    election = Election(
        standby_transport, standby_transport.topics.state_lock, "in-test", membership=members, takeover_after=2.0
    )

    async def promoted() -> None:
        writers["mine"] = await election.writer(data)

    election.add_listener(promoted)
    await in_test.enter_async_context(election)
    await asyncio.sleep(1.0)
    assert not election.is_active
    os.kill(frozen.process.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    await election.wait_active(15)
    assert 1.5 < time.monotonic() - stopped < 8.0
    await writers["mine"].send(b"the new active")
    os.kill(frozen.process.pid, signal.SIGCONT)
    await eventually(lambda: frozen.stepped_down() is not None, timeout=10)
    await asyncio.sleep(1.0)
    stepped_down = frozen.stepped_down()
    assert stepped_down is not None
    assert not [e for e in frozen.events[stepped_down:] if e["event"] == "wrote"], "a deposed active never writes again"
    assert [e for e in frozen.events if e["event"] == "demoted"], "and says why it stepped down"
    reader = await standby_transport.reader(data, "earliest")
    seen = []
    while await reader.has_message_available():
        envelope = await reader.read_next(10)
        assert envelope is not None
        seen.append(envelope.data)
    assert seen[-1] == b"the new active", "nothing of the frozen one's lands after the takeover"
    assert election.is_active
