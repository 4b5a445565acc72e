"""A `state` namespace that keeps no history: the broker deletes the log under the replicas, and they must notice.

Apache Pulsar keeps what readers read only for the namespace's retention; a
namespace made without deploy/pulsar-init.sh has none. Here history is
deleted as the broker deletes it there: a topic reload closes the log's
ledger (`unload`, what a broker restart or a bundle move does) and the
retention check drops every closed ledger nobody holds (`trim`, what the
broker runs every two minutes). On the same steps a namespace with unlimited
retention loses nothing, which shows the deletion is the broker's doing.
A replica starting on such a log stops with one line naming the namespace
and the fix, rather than serve a store that lost writes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from apache_pulsar import ApachePulsar
from support import atoolreg, eventually
from support.replicas import REPLICATED_KINDS, Cluster, replicated_settings

from discovery.errors import KeyMismatch, LogIncomplete
from discovery.replicas import Election, GroupKey, LogEntry, ReplicatedLog
from discovery.replicas.core.wholeness import Wholeness
from discovery.store.replicated import ReplicatedStore
from toolservice_base import ConfigClient, Settings, open_transport
from toolservice_base.transport import Transport

pytestmark = pytest.mark.timeout(120)

LOG = "persistent://t/state/config-log"


class Items:
    """A state machine: a dict of what the entries put."""

    def __init__(self) -> None:
        self.items: dict[str, Any] = {}

    def apply(self, entry: LogEntry) -> None:
        self.items.update(entry.payload)

    def snapshot(self) -> Iterable[Any]:
        return ([key, value] for key, value in sorted(self.items.items()))

    def restore(self, version: int, items: Iterable[Any]) -> None:
        self.items = {key: value for key, value in items}


def assert_says_retention(line: str, namespace: str) -> None:
    """The one line: the namespace, that it keeps no history, and the command that fixes it."""
    assert "\n" not in line, line
    assert f"the namespace {namespace} keeps no history" in line, line
    assert f"pulsar-admin namespaces set-retention {namespace} --size -1 --time -1" in line, line


# --- the decision, without a broker ---------------------------------------------------------------------------------


def test_entries_that_follow_the_state_are_whole_and_one_above_it_means_entries_were_deleted() -> None:
    check = Wholeness(LOG)
    assert check.applying(0, 1, 0) is None and check.applying(1, 2, 1) is None
    assert check.applying(2, 5, 2) is None, "versions may skip: what counts is the version an entry follows"
    assert check.applying(5, 6, None) is None, "an entry of an older writer names nothing: taken as it comes"
    assert check.applying(7, 9, 6) is None, "a writer behind the state (stale, deposed) is no gap"
    found = check.applying(0, 31, 30)
    assert found is not None and found.lost and found.namespace == "t/state"
    assert (
        "lacks its entries after version 0 (up to version 30)" in found.line
        and "toolreg store import --force" in found.line
    )
    assert_says_retention(found.line, "t/state")


def test_after_a_snapshot_its_own_entry_must_come_first() -> None:
    kept = Wholeness(LOG, snapshot_version=20)
    kept.met(20)
    assert kept.applying(20, 21, 20) is None and kept.at_end() is None

    history_gone = Wholeness(LOG, snapshot_version=20)
    history_gone.met(21)
    said = history_gone.applying(20, 21, 20)
    assert said is not None and not said.lost, "the snapshot still holds what was deleted: whole, but say it"
    assert "up to version 20" in said.line
    assert_says_retention(said.line, "t/state")
    assert history_gone.applying(21, 22, 21) is None, "said once"

    writes_gone = Wholeness(LOG, snapshot_version=20)
    writes_gone.met(31)
    lost = writes_gone.applying(20, 31, 30)
    assert lost is not None and lost.lost and "after version 20 (up to version 30)" in lost.line

    unknown = Wholeness(LOG, snapshot_version=20)
    unknown.met(31)
    older = unknown.applying(20, 31, None)
    assert older is not None and older.lost and "may be gone" in older.line

    nothing_after = Wholeness(LOG, snapshot_version=20)
    found = nothing_after.at_end()
    assert found is not None and found.lost and "nor any entry after it" in found.line
    stale_only = Wholeness(LOG, snapshot_version=20)
    stale_only.met(12)
    found = stale_only.at_end()
    assert found is not None and found.lost


def test_a_log_that_ends_below_what_a_replica_applied_lost_entries() -> None:
    check = Wholeness(LOG)
    assert check.behind(10, 10, "a") is None and check.behind(12, 10, "a") is None
    found = check.behind(0, 10, "a")
    assert found is not None and found.lost and "replica a has applied version 10, but the log" in found.line


# --- a gap in what a reader meets: in-process, on Apache Pulsar and in memory --------------------------------------


@pytest.fixture(params=REPLICATED_KINDS)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return replicated_settings(request, tmp_path)


@pytest.fixture
async def stack(settings: Settings) -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as opened:
        yield opened


async def client(stack: AsyncExitStack, settings: Settings) -> Transport:
    return await stack.enter_async_context(await open_transport(settings))


def entry(version: int, previous: int | None) -> dict[str, Any]:
    return {"format": 1, "version": version, "previous": previous, "term": 1, "payload": {f"k{version}": version}}


async def test_a_log_whose_first_entry_follows_a_later_version_is_refused_at_start(
    stack: AsyncExitStack, settings: Settings
) -> None:
    transport = await client(stack, settings)
    writer = await transport.exclusive_publisher(transport.topics.state_log, "fence")
    for version in (31, 32):  # what is left once the broker deleted versions 1 to 30
        await writer.send(entry(version, version - 1))
    state = Items()
    with pytest.raises(LogIncomplete) as refused:
        await ReplicatedLog(await client(stack, settings), state).__aenter__()
    assert "after version 0 (up to version 30)" in str(refused.value)
    assert_says_retention(str(refused.value), f"{settings.topicspace}/state")
    assert refused.value.namespace == f"{settings.topicspace}/state" and state.items == {}, (
        "nothing of the rest is applied"
    )


async def test_a_follower_meeting_a_gap_stops_there(stack: AsyncExitStack, settings: Settings) -> None:
    transport = await client(stack, settings)
    writer = await transport.exclusive_publisher(transport.topics.state_log, "fence")
    await writer.send(entry(1, 0))
    state = Items()
    log = await stack.enter_async_context(ReplicatedLog(await client(stack, settings), state))
    await writer.send(entry(2, 1))
    await eventually(lambda: log.version == 2)
    await writer.send(entry(5, 4))  # 3 and 4 are not in the log
    await writer.send(entry(6, 5))
    await eventually(lambda: log.failure is not None)
    assert isinstance(log.failure, LogIncomplete) and "after version 2 (up to version 4)" in str(log.failure)
    await asyncio.sleep(0.3)
    assert state.items == {"k1": 1, "k2": 2}, "nothing is applied past the gap"
    with pytest.raises(LogIncomplete):
        await log.catch_up()


# --- history the broker really deletes: Apache Pulsar, a `state` namespace with and without retention ---------------


@pytest.fixture
def space(apache_pulsar: ApachePulsar, tenant: str) -> Settings:
    return Settings(
        pulsar_url=apache_pulsar.url,
        broker="apache-pulsar",
        topicspace=tenant,
        auth_token=apache_pulsar.token,
        operation_timeout=3,
    )


@pytest.fixture
async def opened(space: Settings) -> AsyncIterator[AsyncExitStack]:
    """What a test keeps open to the end, closed before its tenant is deleted."""
    async with AsyncExitStack() as stack:
        yield stack


def state_without_retention(apache: ApachePulsar, tenant: str) -> None:
    """`<tenant>/state` made anew as `pulsar-admin namespaces create` makes it: no retention (the broker's default,
    none)."""
    apache.delete_namespace(f"{tenant}/state")
    apache.admin("PUT", f"namespaces/{tenant}/state")


def reload_topic(apache: ApachePulsar, topic: str) -> None:
    """The broker closes the topic's ledger and opens a new one: what a broker restart or a bundle move does."""
    apache.admin("PUT", f"persistent/{topic.removeprefix('persistent://')}/unload")


def apply_retention(apache: ApachePulsar, topic: str) -> None:
    """The broker's retention check, now: every closed ledger no subscription needs and retention does not keep is
    deleted."""
    apache.admin("POST", f"persistent/{topic.removeprefix('persistent://')}/trim")


async def writes(space: Settings, start: int, count: int, *, snapshot_after: int | None = None) -> dict[str, int]:
    """One replica's stint as the active one: it starts from the log, writes `count` entries, maybe a snapshot, and
    stops."""
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(await open_transport(space))
        state = Items()
        election = Election(transport, transport.topics.state_lock, f"writer-{start}")
        log = await stack.enter_async_context(ReplicatedLog(transport, state, election=election))
        await stack.enter_async_context(election)
        await log.wait_writable(10)
        for n in range(start, start + count):
            await log.append({f"k{n}": n})
            if n == snapshot_after:
                await log.write_snapshot()
        return dict(state.items)


def keys(first: int, last: int) -> dict[str, int]:
    return {f"k{n}": n for n in range(first, last + 1)}


@pytest.mark.apache_pulsar
@pytest.mark.parametrize("retention", ["unlimited", "none"])
async def test_history_the_broker_deleted_is_refused_in_one_line_where_retention_would_have_kept_it(
    apache_pulsar: ApachePulsar,
    tenant: str,
    space: Settings,
    opened: AsyncExitStack,
    retention: str,
) -> None:
    if retention == "none":
        state_without_retention(apache_pulsar, tenant)
    topic = space.topics.state_log
    await writes(space, 1, 30)
    reload_topic(apache_pulsar, topic)
    written = await writes(space, 31, 5)
    apply_retention(apache_pulsar, topic)
    state = Items()
    starting = ReplicatedLog(await client(opened, space), state)
    if retention == "unlimited":
        await opened.enter_async_context(starting)
        assert starting.version == 35 and state.items == written == keys(1, 35)
        return
    with pytest.raises(LogIncomplete) as refused:
        await starting.__aenter__()
    assert f"the log {topic} lacks its entries after version 0 (up to version 30)" in str(refused.value)
    assert_says_retention(str(refused.value), f"{tenant}/state")


@pytest.mark.apache_pulsar
async def test_entries_after_the_last_snapshot_that_the_broker_deleted_are_refused(
    apache_pulsar: ApachePulsar,
    tenant: str,
    space: Settings,
    opened: AsyncExitStack,
) -> None:
    state_without_retention(apache_pulsar, tenant)
    await writes(space, 1, 30, snapshot_after=20)
    reload_topic(apache_pulsar, space.topics.state_log)
    await writes(space, 31, 5)
    apply_retention(apache_pulsar, space.topics.state_log)
    with pytest.raises(LogIncomplete) as refused:
        await ReplicatedLog(await client(opened, space), Items()).__aenter__()
    assert "lacks its entries after version 20 (up to version 30)" in str(refused.value)


@pytest.mark.apache_pulsar
async def test_history_deleted_behind_the_last_snapshot_is_said_and_the_whole_state_served(
    apache_pulsar: ApachePulsar,
    tenant: str,
    space: Settings,
    opened: AsyncExitStack,
) -> None:
    state_without_retention(apache_pulsar, tenant)
    await writes(space, 1, 20, snapshot_after=20)
    reload_topic(apache_pulsar, space.topics.state_log)
    written = await writes(space, 21, 5)
    apply_retention(apache_pulsar, space.topics.state_log)
    full = ReplicatedLog(await client(opened, space), Items(), use_snapshots=False)
    with pytest.raises(LogIncomplete):
        await full.__aenter__()  # versions 1 to 20 are gone from the log: only the snapshot still has them
    state = Items()
    log = await opened.enter_async_context(ReplicatedLog(await client(opened, space), state))
    assert log.version == 25 and state.items == written == keys(1, 25)
    assert log.history_deleted is not None and "up to version 20" in log.history_deleted
    assert_says_retention(log.history_deleted, f"{tenant}/state")


# --- the config store: a replica that joins, `toolreg up`, and the way back ----------------------------------------


async def store_writes(space: Settings, keys_: Iterable[str]) -> int:
    """A replica of the config store alone: active, it takes `keys_` (one write each), then stops; the last version."""
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(space))
        replica = await stack.enter_async_context(ReplicatedStore(connection, takeover_after=2.0))
        await eventually(lambda: replica.service is not None, timeout=15)
        config = ConfigClient(connection, timeout=5)
        await config.start()
        stack.push_async_callback(config.close)
        version = 0
        for key in keys_:
            version = await config.put([("note", key, key)])
        return version


@pytest.mark.apache_pulsar
async def test_a_replica_joining_an_active_whose_log_the_broker_deleted_refuses_in_one_line(
    apache_pulsar: ApachePulsar,
    tenant: str,
    space: Settings,
    opened: AsyncExitStack,
) -> None:
    """Nothing is left in the log to show a gap; the active replica's version, signed with the group key, shows the
    loss."""
    state_without_retention(apache_pulsar, tenant)
    key = GroupKey.generate()
    active = await opened.enter_async_context(
        ReplicatedStore(await client(opened, space), replica_id="a", takeover_after=2.0, key=key)
    )
    await eventually(lambda: active.service is not None, timeout=15)
    config = ConfigClient(await client(opened, space), timeout=5)
    await config.start()
    opened.push_async_callback(config.close)
    for n in range(5):
        version = await config.put([("note", f"n{n}", "x")])
    for topic in (space.topics.state_log, space.topics.state_snapshot):
        reload_topic(apache_pulsar, topic)
        apply_retention(apache_pulsar, topic)
    with pytest.raises(LogIncomplete) as refused:
        async with ReplicatedStore(await client(opened, space), replica_id="b", takeover_after=2.0, key=key):
            pass
    line = str(refused.value)
    assert f"replica a has applied version {version}, but the log {space.topics.state_log} ends at version 0" in line
    assert_says_retention(line, f"{tenant}/state")
    assert active.role == "active" and active.readiness() is None, "the active one, whole, serves on"

    # A replica without the key beside this keyed group takes no part: it stops in one line naming the mismatch,
    # and the active one serves on.
    with pytest.raises(KeyMismatch, match="group key mismatch: the group signs its records .* this replica has no"):
        await opened.enter_async_context(
            ReplicatedStore(await client(opened, space), replica_id="c", takeover_after=2.0)
        )
    assert active.role == "active" and active.readiness() is None


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed `toolreg` command says to its user (its JSON log lines on stderr aside); exit code 1."""
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    said = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("{")]
    assert len(said) == 1 and said[0].startswith("toolreg: "), done.stderr[-3000:]
    return said[0]


@pytest.mark.apache_pulsar
async def test_toolreg_up_on_a_log_that_lost_writes_exits_1_in_one_line_and_an_import_with_force_restores_the_store(
    apache_pulsar: ApachePulsar,
    tenant: str,
    space: Settings,
    tmp_path: Path,
) -> None:
    state_without_retention(apache_pulsar, tenant)
    early = await store_writes(space, ["early-1", "early-2", "early-3"])
    reload_topic(apache_pulsar, space.topics.state_log)
    version = await store_writes(space, ["late-1"])
    apply_retention(apache_pulsar, space.topics.state_log)
    cluster = Cluster(apache_pulsar, tenant, tmp_path)
    done = await atoolreg("up", "--store", "pulsar", "--metrics-port", "0", env=cluster.env("a"), timeout=60)
    line = one_line(done)
    assert f"lacks its entries after version 0 (up to version {early})" in line, line
    assert_says_retention(line, f"{tenant}/state")
    assert "ready in" not in done.stdout

    export = tmp_path / "export.json"
    export.write_text(json.dumps({"format": 1, "version": version, "items": [["default", "note", "restored", "yes"]]}))
    refused = await atoolreg("store", "import", str(export), env=cluster.env("cli"), timeout=60)
    assert "lacks its entries" in one_line(refused), (
        "without --force an import will not build on a log that lost writes"
    )
    imported = await atoolreg("store", "import", "--force", str(export), env=cluster.env("cli"), timeout=60)
    assert imported.returncode == 0, imported.stderr[-3000:]
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(space))
        replica = await stack.enter_async_context(ReplicatedStore(connection))
        assert replica.store is not None and replica.store.dump()[1] == [("default", "note", "restored", "yes")]
        assert replica.version > version, "the version carries on past what agents saw"
