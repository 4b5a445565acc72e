"""What a process holding a token with produce rights on `state` can forge, and what the replicas do with it.

Each test is one forgery from a hostile pass on Apache Pulsar 4.0.8: a status
claiming a newer term, a lock marker out of range, a log entry or a snapshot
written through a fencing producer, the lock taken and held. The replicas run
in this process, each on a connection of its own (Apache Pulsar, a fresh
tenant per test, and the in-memory transport); the forger has a connection of
its own too, and uses only what the transport offers any client.

The promise: a status is a hint (no step-down, no exit, no advice to
restore); a record the replicas cannot authenticate (group key) or parse is
skipped and logged with its producer, never applied and never a crash; an
active that loses its lock stops acknowledging writes within its grace; and
the group keeps serving throughout.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from support import atoolreg, eventually
from support.replicas import REPLICATED_KINDS, Group, fencing_producer, replicated_settings

from discovery.replicas import GroupKey
from discovery.store.replicated import ReplicatedStore
from toolservice_base import ConfigClient, Settings
from toolservice_base.errors import ConfigError, RequestTimeout

pytestmark = pytest.mark.timeout(180)

GRACE = 2.0
IN_FLIGHT = 0.25
"""Seconds by which the test's view of a change of role may trail it (a poll, a broker hop, a turn of the loop on a
loaded machine): far less than the gap without a writer (the takeover's 2 s), in which an old active that kept
serving would acknowledge a write every 50 ms."""
"""`Election`'s `lost_lock_grace`: how long an active may go on acknowledging writes without its lock."""


@pytest.fixture(params=REPLICATED_KINDS)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return replicated_settings(request, tmp_path)


@pytest.fixture
async def group(settings: Settings) -> AsyncIterator[Group]:
    async with AsyncExitStack() as stack:
        yield Group(settings, stack)


async def client_of(group: Group) -> ConfigClient:
    client = ConfigClient(await group.connection(), timeout=2)
    await client.start()
    group.stack.push_async_callback(client.close)
    return client


async def put(client: ConfigClient, key: str, value: str, timeout: float = 30.0) -> int:
    """An operator's retrying write: acknowledged once, with its version (a failover may refuse the first tries)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await client.put([("note", key, value)])
            except (RequestTimeout, ConfigError):
                await asyncio.sleep(0.1)


async def serving(group: Group) -> ReplicatedStore:
    """The one replica serving the store, once there is exactly one."""

    def one() -> ReplicatedStore | None:
        actives = [r for r in group.replicas if r.role == "active" and r.service is not None]
        return actives[0] if len(actives) == 1 else None

    found: ReplicatedStore = await eventually(one, timeout=30)
    return found


def healthy(*replicas: ReplicatedStore) -> list[str]:
    """Why each replica that is not doing its part is not (empty: every one is)."""
    return [f"{r.replica_id}: {r.readiness()}" for r in replicas if r.readiness() is not None]


def refused(caplog: pytest.LogCaptureFixture, kind: str) -> list[str]:
    """The `state.record_refused` lines logged for records of `kind`."""
    lines = [record.getMessage() for record in caplog.records]
    return [line for line in lines if "state.record_refused" in line and f"'kind': '{kind}'" in line]


@asynccontextmanager
async def forging_statuses(group: Group, **claim: object) -> AsyncIterator[None]:
    """A forger publishing a status five times a second for as long as the block runs."""
    forger = await group.connection()
    members = await forger.publisher(forger.topics.state_members)
    status = {"format": 1, "id": "forger", "group": "config-store", "role": "active", "pid": 1, "host": "evil", **claim}

    async def forge() -> None:
        while True:
            await members.send({**status, "since": time.time()})
            await asyncio.sleep(0.2)

    task = asyncio.create_task(forge())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- statuses are hints ---------------------------------------------------------------------------------------------


async def test_a_forged_status_of_a_newer_term_moves_no_replica_and_stops_none(
    group: Group, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    a = await group.start("a")
    await eventually(lambda: a.service is not None, timeout=15)
    b, c = await group.start("b"), await group.start("c")
    client = await client_of(group)
    before = await put(client, "before", "1")
    async with forging_statuses(group, version=10**6, term=10**6, settings="x"):
        await asyncio.sleep(3)
        assert (a.role, b.role, c.role) == ("active", "standby", "standby") and healthy(a, b, c) == []
        assert await put(client, "after", "2") > before, "the active acknowledges writes as before"
        late = await group.start("d")  # it holds its log against the lock holder's status, never the forger's
        assert late.role == "standby" and healthy(late) == []
        if settings.broker == "apache-pulsar":
            listed = {row["id"]: row for row in await replicas_json(settings)}
            assert listed["forger"]["holds_lock"] is False and listed["a"]["holds_lock"] is True, listed
    assert "election.unconfirmed_claim" in caplog.text


async def replicas_json(settings: Settings) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    env.update(
        PULSAR_URL=settings.pulsar_url or "",
        PULSAR_AUTH_TOKEN=settings.auth_token or "",
        TOOLREG_TOPICSPACE=settings.topicspace,
        TOOLREG_LOG_LEVEL="error",
    )
    done = await atoolreg("replicas", "--json", "--listen", "1.5", env=env)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


async def test_a_group_key_drops_unsigned_statuses_from_the_view(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    key = GroupKey.generate()
    a = await group.start("a", key=key)
    await eventually(lambda: a.service is not None, timeout=15)
    b = await group.start("b", key=key)
    async with forging_statuses(group, version=5, term=9):
        await eventually(lambda: refused(caplog, "status"), timeout=5)
        await asyncio.sleep(0.5)
        assert {s.id for s in b.replicas()} == {"a", "b"} and all(s.verified for s in b.replicas() if s.id == "a")
    assert len(refused(caplog, "status")) <= 2, "logged once per producer (once by each replica), not per status"


# --- lock markers -----------------------------------------------------------------------------------------------------


async def test_a_marker_out_of_range_is_skipped_and_the_group_elects_and_serves_on(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    a = await group.start("a")
    await eventually(lambda: a.service is not None, timeout=15)
    b, c = await group.start("b"), await group.start("c")
    client = await client_of(group)
    await put(client, "before", "1")
    async with fencing_producer(group.settings, group.settings.topics.state_lock) as send:
        await send(b'{"term": 1e400, "replica": "forger"}')
        await send(b'{"term": -3}')
    # The lock is free again: a standby is handed it and reads the markers.
    await eventually(lambda: b.role == "active" or c.role == "active", timeout=15)
    await put(client, "after", "2")
    await eventually(lambda: not healthy(a, b, c), timeout=15, explain=lambda: healthy(a, b, c))
    active = await serving(group)
    late = await group.start("d")  # reads the markers at start too
    assert late.role == "standby" and healthy(late) == [] and (await serving(group)) is active
    assert len(refused(caplog, "marker")) >= 1


# --- log entries and snapshots, under a group key ---------------------------------------------------------------------


def write_payload(*puts: tuple[str, str, str]) -> dict[str, object]:
    return {"workspace": "default", "puts": [list(item) for item in puts], "deletes": []}


async def test_a_forged_log_entry_is_refused_and_the_group_serves_on_without_it(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    key = GroupKey.generate()
    a = await group.start("a", key=key)
    await eventually(lambda: a.service is not None, timeout=15)
    await group.start("b", key=key)
    client = await client_of(group)
    version = await put(client, "static", "the operator's")
    tool = json.dumps({"type": "tool-service", "name": "evil", "description": "x", "service": "svc"})
    entry = {"format": 1, "version": version + 1, "previous": version, "term": 1}
    async with fencing_producer(group.settings, group.settings.topics.state_log) as send:  # fences the active's writer
        await send({**entry, "payload": write_payload(("note", "static", "forged"), ("tool", "evil", tool))})
    await put(client, "after", "1")  # the group serves on (the fenced active stepped down; one was promoted)
    found = await client.get([("note", "static"), ("tool", "evil")])
    assert found == {("note", "static"): "the operator's"}
    later = await group.start("later", key=key)  # and a replica started afterwards never applies it either
    assert later.store is not None and later.store.get("default", [("tool", "evil")]) == []
    assert refused(caplog, "entry") and "unsigned" in " ".join(refused(caplog, "entry"))


async def test_a_forged_snapshot_is_never_restored(group: Group, caplog: pytest.LogCaptureFixture) -> None:
    key = GroupKey.generate()
    a = await group.start("a", key=key)
    await eventually(lambda: a.service is not None, timeout=15)
    client = await client_of(group)
    version = await put(client, "real", "yes")
    chunk = json.dumps([["default", "note", "forged", "yes"]]).encode()
    async with fencing_producer(group.settings, group.settings.topics.state_snapshot) as send:
        chunk_id = await send(chunk, {"kind": "chunk", "snapshot": "forged", "seq": "0", "previous": ""})
    manifest = {
        "format": 1,
        "snapshot": "forged",
        "version": version,
        "term": 1,
        "position": "",
        "first_chunk": base64.b64encode(chunk_id).decode(),
        "chunks": 1,
        "items": 1,
        "bytes": len(chunk),
        "sha256": hashlib.sha256(chunk).hexdigest(),  # self-computed: it checks
        "written_at": time.time(),
    }
    async with fencing_producer(group.settings, group.settings.topics.state_snapshot) as send:
        await send(manifest, {"kind": "manifest", "snapshot": "forged"})
    for name in ("b", "c"):  # a new replica, and one more after it: each replays the log instead
        joined = await group.start(name, key=key)
        assert joined.store is not None and joined.store.dump()[1] == [("default", "note", "real", "yes")]
    assert refused(caplog, "manifest")


# --- the lock, taken and held -----------------------------------------------------------------------------------------


async def test_an_active_whose_lock_is_taken_stops_acknowledging_within_its_grace_and_the_group_recovers(
    group: Group,
) -> None:
    """A forger takes the lock by fencing and holds it, writing nothing (the broker tells an idle holder nothing)."""
    a = await group.start("a", takeover_after=2.0)
    await eventually(lambda: a.service is not None, timeout=15)
    b = await group.start("b", takeover_after=2.0)
    client = await client_of(group)
    acks: list[tuple[float, int]] = []
    serving_at: list[tuple[float, str]] = []
    stop = asyncio.Event()

    async def write() -> None:
        n = 0
        while not stop.is_set():
            try:
                acks.append((time.monotonic(), await client.put([("note", f"w{n}", "x")])))
                n += 1
            except (RequestTimeout, ConfigError):
                pass
            await asyncio.sleep(0.05)

    async def watch() -> None:  # who is active, as it changes
        while not stop.is_set():
            now = ",".join(r.replica_id for r in (a, b) if r.role == "active")
            if not serving_at or serving_at[-1][1] != now:
                serving_at.append((time.monotonic(), now))
            await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(write()), asyncio.create_task(watch())]
    await eventually(lambda: len(acks) > 10, timeout=10)
    taken = time.monotonic()
    async with fencing_producer(group.settings, group.settings.topics.state_lock):  # taken, and held, saying nothing
        try:
            await eventually(lambda: any(at > taken and who == "" for at, who in serving_at), timeout=10)
            stepped_down = next(at for at, who in serving_at if at > taken and who == "")
            await eventually(lambda: any(at > stepped_down and who for at, who in serving_at), timeout=15)
            back = next(at for at, who in serving_at if at > stepped_down and who)
            await eventually(lambda: any(at > back for at, _ in acks), timeout=10)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    assert stepped_down - taken < GRACE + 0.5, f"the active served {stepped_down - taken:.1f}s without its lock"
    # The watcher sees each change of role up to a poll (and a turn of the loop) after it happened: an answer the old
    # active sent just before it stepped down may arrive after the step-down is seen, and the new active's first
    # answers before its promotion is. An acknowledgement counts as late only well inside the gap.
    gap = (stepped_down + IN_FLIGHT, back - IN_FLIGHT)
    late = [(round(at - stepped_down, 3), version) for at, version in acks if gap[0] < at < gap[1]]
    assert late == [], f"writes acknowledged while no replica held the lock (s after the step-down, version): {late}"
    assert back - taken < 2.0 + GRACE + 5, f"{back - taken:.1f}s without a writer"
    versions = [version for _, version in acks]
    assert versions == sorted(versions) and len(set(versions)) == len(versions), "a version went back or was reused"
