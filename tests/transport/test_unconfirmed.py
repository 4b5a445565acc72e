"""Sends that do not wait for the broker's receipt, and handlers that run inline: what must still hold.

`Publisher.send(..., confirm=False)` returns once the client holds the
message; on Pulsar the send goes with no callback and one *cover* settles a
loop turn's sends (`transport.pulsar.publisher`). Back-pressure and failures
are kept: past the producer's queue a send waits for a slot, and a send the
broker never takes is reported to its `on_failure` with the transport's error
(or logged). An inline handler (`subscribe(..., inline=True)`) gets every
message in order, on the loop, and one that raises costs only that message.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
from support import eventually

from discovery.broker import EmbeddedBroker
from toolservice_base import RequestClient, Settings, Transport, TransportError, open_transport
from toolservice_base.errors import BrokerUnreachable, RequestTimeout, TransportClosed
from toolservice_base.transport import LARGE_MESSAGE, Envelope
from toolservice_base.transport.pulsar import transport as pulsar_transport

pytestmark = pytest.mark.contract


async def test_unconfirmed_sends_past_the_producers_queue_wait_for_a_slot_and_all_arrive(
    connection: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A queue of 16 in pulsar-client: a send past it that did not wait would be dropped without a word (no callback).
    monkeypatch.setattr(pulsar_transport, "PRODUCER_QUEUE", 16)
    topic = f"persistent://{connection.topics.topicspace}/request/unconfirmed"
    seen: list[bytes] = []

    async def keep(message: Envelope) -> None:
        seen.append(message.data)

    await connection.subscribe(topic, keep, subscription="unconfirmed", shared=True)
    publisher = await connection.publisher(topic)
    failures: list[TransportError] = []
    for number in range(1000):
        await publisher.send(f"{number}".encode(), confirm=False, on_failure=failures.append)
    await eventually(lambda: len(seen) == 1000, timeout=30, explain=lambda: f"{len(seen)} of 1000 arrived")
    assert seen == [f"{number}".encode() for number in range(1000)]
    assert failures == []


async def test_an_unconfirmed_send_on_a_closed_producer_or_over_64_kib_fails_at_once(connection: Transport) -> None:
    topic = connection.topics.request_queue("unconfirmed-refused")
    publisher = await connection.publisher(topic)
    large = b"x" * (LARGE_MESSAGE + 1)
    await publisher.send(large, confirm=False)  # confirmed underneath: it would have raised had the broker refused it
    await connection.close_publisher(publisher)
    with pytest.raises(TransportClosed):
        await publisher.send(b"late", confirm=False)


def _lite(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    """A pulsar-lite of the test's own, which it may kill: the broker never takes what is sent then."""
    return Settings(data_dir=tmp_path / "data", pulsar_url=broker.url, broker="pulsar-lite")


async def test_an_unconfirmed_send_the_broker_never_takes_is_reported_to_its_on_failure(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pulsar_transport, "SEND_TIMEOUT_MS", 1000)
    connection = await open_transport(_lite(broker, tmp_path))
    try:
        publisher = await connection.publisher(connection.topics.request_queue("never-taken"))
        await publisher.send(b"first")  # the producer is up
        await asyncio.to_thread(broker.kill)
        failures: list[TransportError] = []
        with structlog.testing.capture_logs() as logs:
            await publisher.send(b"watched", confirm=False, on_failure=failures.append)
            await publisher.send(b"unwatched", confirm=False)
            await eventually(lambda: failures, timeout=10, explain=lambda: "on_failure was never called")
            await eventually(lambda: any(entry["event"] == "producer.send_failed" for entry in logs), timeout=5)
        assert isinstance(failures[0], BrokerUnreachable), failures
    finally:
        await connection.close()


async def test_a_call_whose_request_the_broker_never_takes_fails_with_the_transports_error(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pulsar_transport, "SEND_TIMEOUT_MS", 1000)
    connection = await open_transport(_lite(broker, tmp_path))
    try:
        queues = connection.topics.request_queue("gone"), connection.topics.response_queue("gone")
        client = await RequestClient(connection, *queues).start()
        await asyncio.to_thread(broker.kill)
        started = time.monotonic()
        with pytest.raises(TransportError) as raised:
            await client.request({"n": 1}, timeout=20)
        assert not isinstance(raised.value, RequestTimeout), raised.value
        assert time.monotonic() - started < 10, "the call waited for its own timeout instead of the send's failure"
        await client.close()
    finally:
        await connection.close()


async def test_an_inline_handler_gets_every_message_in_order_and_one_that_raises_costs_only_its_message(
    connection: Transport,
) -> None:
    topic = connection.topics.request_queue("inline")
    seen: list[bytes] = []

    def keep(message: Envelope) -> None:
        if message.data == b"fault":
            raise RuntimeError("injected: the handler fails on this message")
        seen.append(message.data)

    await connection.subscribe(topic, keep, inline=True)
    publisher = await connection.publisher(topic)
    with structlog.testing.capture_logs() as logs:
        await publisher.send(b"fault")
        sends: list[Any] = [publisher.send(f"{number}".encode(), confirm=False) for number in range(500)]
        for send in sends:
            await send
        await eventually(lambda: len(seen) == 500, timeout=20, explain=lambda: f"{len(seen)} of 500 arrived")
    assert seen == [f"{number}".encode() for number in range(500)]
    assert [entry["event"] for entry in logs if entry["log_level"] == "error"] == ["consumer.handler_failed"]
