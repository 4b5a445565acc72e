"""Exclusive publishers and readers: what a log with one elected writer needs from the transport.

Each test runs on Apache Pulsar (the broker the replicated state is for, a
fresh tenant per test) and on the in-memory transport, which must behave the
same. pulsar-lite has no producer access modes (measured: two "exclusive"
producers both write, fencing fences nothing); the last tests hold it to
refusing them in one line.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import eventually
from support.replicas import REPLICATED_KINDS, replicated_settings

from discovery.broker import EmbeddedBroker
from toolservice_base import Settings, open_transport
from toolservice_base.errors import BrokerUnsupported, Fenced, ProducerBusy, TransportError
from toolservice_base.transport import EXCLUSIVE_MODES, Reader, Transport

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=REPLICATED_KINDS)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    """conftest's `settings`, on the brokers that can keep replicated state only."""
    return replicated_settings(request, tmp_path)


@pytest.fixture
async def other(settings: Settings) -> AsyncIterator[Transport]:
    """A second client: another replica, as the broker sees it."""
    conn = await open_transport(settings)
    yield conn
    await conn.close()


def topic_in_state(settings: Settings) -> str:
    return f"persistent://{settings.topicspace}/state/t-{uuid.uuid4().hex[:8]}"


async def read_all(reader: Reader) -> list[bytes]:
    """Everything until the end of the topic as it is now."""
    got = []
    while await reader.has_message_available():
        envelope = await reader.read_next(10)
        assert envelope is not None, "has_message_available said yes, but nothing came"
        got.append(envelope.data)
    return got


# --- exclusive publishers -------------------------------------------------------------------------------------------


async def test_exclusive_refuses_a_held_topic_until_its_holder_closes(
    connection: Transport, other: Transport, settings: Settings
) -> None:
    topic = topic_in_state(settings)
    holder = await connection.exclusive_publisher(topic, "exclusive")
    with pytest.raises(ProducerBusy) as refused:
        await other.exclusive_publisher(topic, "exclusive")
    assert refused.value.retriable and "\n" not in str(refused.value)
    assert await holder.send(b"still mine")
    await connection.close_publisher(holder)
    successor = await other.exclusive_publisher(topic, "exclusive")
    assert successor.connected and await successor.send(b"mine now")


async def test_wait_gets_the_topic_as_soon_as_the_holder_closes(
    connection: Transport, other: Transport, settings: Settings
) -> None:
    topic = topic_in_state(settings)
    holder = await connection.exclusive_publisher(topic, "exclusive")
    waiting = asyncio.ensure_future(other.exclusive_publisher(topic, "wait"))
    await asyncio.sleep(0.5)
    assert not waiting.done(), "a wait must not be granted while the holder lives"
    closed = time.monotonic()
    await connection.close_publisher(holder)
    waiter = await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - closed < 1.0
    assert waiter.mode == "wait" and await waiter.send(b"elected")


@pytest.mark.parametrize("holder_mode", ["exclusive", "fence"])
async def test_fence_takes_the_topic_from_a_live_holder_whose_sends_then_fail_for_good(
    connection: Transport, other: Transport, settings: Settings, holder_mode: str
) -> None:
    topic = topic_in_state(settings)
    holder = await connection.exclusive_publisher(topic, holder_mode)  # type: ignore[arg-type]
    await holder.send(b"before")
    fencer = await other.exclusive_publisher(topic, "fence")
    await fencer.send(b"fencer")
    for attempt in ("after", "again"):
        with pytest.raises(Fenced) as fenced:
            await holder.send(attempt.encode())
        assert not fenced.value.retriable and "\n" not in str(fenced.value) and "step down" in str(fenced.value)
    assert holder.fenced and not holder.connected
    await other.close_publisher(fencer)
    await asyncio.sleep(0.5)  # the topic is free again: a fenced producer must still not write
    with pytest.raises(Fenced):
        await holder.send(b"after the fencer left")
    reader = await other.reader(topic, "earliest")
    assert await read_all(reader) == [b"before", b"fencer"]


async def test_fence_fails_the_waiters_queued_behind_the_holder(
    connection: Transport, other: Transport, settings: Settings
) -> None:
    topic = topic_in_state(settings)
    await connection.exclusive_publisher(topic, "exclusive")
    waiting = asyncio.ensure_future(other.exclusive_publisher(topic, "wait"))
    await asyncio.sleep(0.3)
    fencer = await connection.exclusive_publisher(topic, "fence")
    with pytest.raises(ProducerBusy):
        await asyncio.wait_for(waiting, 5)
    assert await fencer.send(b"alone")


async def test_an_abandoned_wait_leaves_no_producer_holding_the_topic(
    connection: Transport, other: Transport, settings: Settings
) -> None:
    topic = topic_in_state(settings)
    holder = await connection.exclusive_publisher(topic, "exclusive")
    waiting = asyncio.ensure_future(other.exclusive_publisher(topic, "wait"))
    await asyncio.sleep(0.3)
    waiting.cancel()
    await connection.close_publisher(holder)

    async def free() -> bool:
        try:
            taken = await connection.exclusive_publisher(topic, "exclusive")
        except ProducerBusy:
            return False  # the abandoned wait was granted: it must be closed in a moment
        await connection.close_publisher(taken)
        return True

    await eventually(free, timeout=5, interval=0.1)


# --- readers --------------------------------------------------------------------------------------------------------


async def test_a_reader_starts_after_or_at_a_message_id_a_send_returned(
    connection: Transport, settings: Settings
) -> None:
    topic = topic_in_state(settings)
    writer = await connection.exclusive_publisher(topic, "exclusive")
    ids = [await writer.send(f"m{n}".encode()) for n in range(4)]
    assert all(isinstance(i, bytes) and i for i in ids) and len(set(ids)) == 4
    assert await read_all(await connection.reader(topic, "earliest")) == [b"m0", b"m1", b"m2", b"m3"]
    assert await read_all(await connection.reader(topic, ids[1])) == [b"m2", b"m3"]
    assert await read_all(await connection.reader(topic, ids[1], inclusive=True)) == [b"m1", b"m2", b"m3"]
    assert await read_all(await connection.reader(topic, ids[3])) == []
    first = await (await connection.reader(topic, "earliest")).read_next(10)
    assert first is not None and first.message_id and first.topic == topic
    assert await read_all(await connection.reader(topic, first.message_id)) == [b"m1", b"m2", b"m3"]


async def test_latest_reads_the_last_message_then_what_follows(connection: Transport, settings: Settings) -> None:
    topic = topic_in_state(settings)
    assert not await (await connection.reader(topic, "latest")).has_message_available(), (
        "an empty topic has no last message"
    )
    writer = await connection.exclusive_publisher(topic, "exclusive")
    for n in range(3):
        await writer.send(f"m{n}".encode())
    reader = await connection.reader(topic, "latest")
    assert await reader.has_message_available()
    last = await reader.read_next(10)
    assert last is not None and last.data == b"m2"
    assert not await reader.has_message_available()
    await writer.send(b"m3")
    following = await reader.read_next(10)
    assert following is not None and following.data == b"m3"


async def test_a_read_that_times_out_or_is_cancelled_loses_nothing(connection: Transport, settings: Settings) -> None:
    """pulsar.asyncio's own reader loses the message a cancelled read was waiting for, and answers
    has_message_available False while a pending read holds it; catching up would stop one short."""
    topic = topic_in_state(settings)
    writer = await connection.exclusive_publisher(topic, "exclusive")
    reader = await connection.reader(topic, "earliest")
    started = time.monotonic()
    assert await reader.read_next(0.3) is None
    assert 0.25 < time.monotonic() - started < 2.0
    pending = asyncio.ensure_future(reader.read_next(5))
    await asyncio.sleep(0.2)
    pending.cancel()
    await writer.send(b"kept")
    await asyncio.sleep(0.3)  # by now the abandoned read has the message
    assert await reader.has_message_available()
    kept = await reader.read_next(5)
    assert kept is not None and kept.data == b"kept"
    assert not await reader.has_message_available()
    for n in range(50):
        await writer.send(str(n).encode())
    assert await read_all(reader) == [str(n).encode() for n in range(50)]


async def test_a_non_persistent_topic_can_have_an_exclusive_publisher_too(
    connection: Transport, other: Transport, settings: Settings
) -> None:
    topic = f"non-persistent://{settings.topicspace}/state/t-{uuid.uuid4().hex[:8]}"
    await connection.exclusive_publisher(topic, "exclusive")
    with pytest.raises(ProducerBusy):
        await other.exclusive_publisher(topic, "exclusive")


# --- what pulsar-lite refuses -----------------------------------------------------------------------------------------


async def test_pulsar_lite_refuses_exclusive_publishers_and_latest_readers_in_one_line(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    lite = Settings(data_dir=tmp_path / "data", pulsar_url=broker.url, broker="pulsar-lite")
    async with await open_transport(lite) as conn:
        assert not conn.capabilities.replicated_state
        assert "replicated_state" not in conn.capabilities.enabled(), "a feature, not a workaround"
        topic = "persistent://tg/state/lock"
        for mode in EXCLUSIVE_MODES:
            with pytest.raises(BrokerUnsupported) as refused:
                await conn.exclusive_publisher(topic, mode)
            assert "needs Apache Pulsar" in str(refused.value) and "\n" not in str(refused.value)
            assert not refused.value.retriable
        with pytest.raises(BrokerUnsupported):
            await conn.reader(topic, "latest")
        publisher = await conn.publisher(topic)
        await publisher.send(b"m0")
        earliest = await conn.reader(topic, "earliest")  # what pulsar-lite does have still works
        first = await earliest.read_next(5)
        assert first is not None and first.data == b"m0" and first.message_id


async def test_capabilities_say_which_brokers_keep_replicated_state(connection: Transport, settings: Settings) -> None:
    assert connection.capabilities.replicated_state


@pytest.mark.apache_pulsar
async def test_a_missing_namespace_is_named_with_what_creates_it(apache_pulsar: ApachePulsar, tenant: str) -> None:
    space = Settings(
        pulsar_url=apache_pulsar.url, broker="apache-pulsar", topicspace=tenant, auth_token=apache_pulsar.token
    )
    async with await open_transport(space) as conn:
        with pytest.raises(TransportError) as missing:
            await conn.exclusive_publisher(f"persistent://{tenant}/nostate/lock", "exclusive")
    line = str(missing.value)
    assert f"{tenant}/nostate" in line and "deploy/pulsar-init.sh" in line and "\n" not in line
