"""The Pulsar transport on pulsar-client's listener threads and send callbacks: faults, flow control, shutdown.

Messages arrive on the client's own listener thread and send receipts on its
I/O threads; the transport hands both to the event loop. What must hold there,
on a real broker:

- a message the listener cannot read (a property that is not UTF-8, or any
  fault in the listener) is logged and acknowledged; the listener thread goes
  on and the next messages arrive;
- a stalled handler holds at most `receiver_queue` messages between the
  listener and the loop (the listener pauses, the client's own queue and the
  broker hold the rest), and nothing is lost once it moves again;
- both hold as well for a lingering subscription, whose messages the loop
  takes itself in batches, one look per linger under a steady stream, instead
  of a listener;
- a loop that ends with the transport open, with sends and messages still
  pending, leaves no thread, connection or abort behind, whether the loop ends
  through `asyncio.run` or is closed outright;
- a broker restart under 64 calls in flight loses no call (each ends, answered
  or with an error, within its timeout) and calls resume.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest
import structlog
from apache_pulsar import ApachePulsar
from support import eventually

from discovery.broker import EmbeddedBroker
from toolservice_base import RequestClient, Settings, Transport, TransportError, open_transport
from toolservice_base.errors import RequestTimeout
from toolservice_base.rpc import RequestServer
from toolservice_base.transport import Envelope
from toolservice_base.transport.pulsar import transport as pulsar_transport
from toolservice_base.transport.pulsar.batches import BatchedSubscription
from toolservice_base.transport.pulsar.subscription import PulsarSubscription

pytestmark = pytest.mark.brokers


def raw_client(settings: Settings) -> pulsar.Client:
    token = pulsar.AuthenticationToken(settings.auth_token) if settings.auth_token else None
    return pulsar.Client(
        settings.resolve_pulsar_url(), authentication=token, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


TAKERS = pytest.mark.parametrize(
    "linger", [0.0, 0.05], ids=["listener", "batches"]
)  # a lingering subscription is taken by the loop's own looks (`BatchedSubscription`)


@TAKERS
async def test_a_message_the_listener_cannot_read_is_logged_and_the_listener_goes_on(
    connection: Transport, settings: Settings, monkeypatch: pytest.MonkeyPatch, linger: float
) -> None:
    topic = connection.topics.tool_descriptors
    seen: list[bytes] = []

    async def keep(message: Envelope) -> None:
        seen.append(message.data)

    read = PulsarSubscription._envelope

    def faulty(self: PulsarSubscription, message: Any) -> Envelope:
        if message.data() == b"fault":
            raise RuntimeError("injected: the listener fails on this message")
        return read(self, message)

    monkeypatch.setattr(PulsarSubscription, "_envelope", faulty)
    subscription = await connection.subscribe(topic, keep, linger=linger)
    assert isinstance(subscription, BatchedSubscription) == bool(linger)
    client = raw_client(settings)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        with structlog.testing.capture_logs() as logs:
            # Another client may send a property that is not UTF-8: pulsar-client cannot turn it into a str.
            producer.send(b"not utf-8", properties={"id": b"\xff\xfe"})  # type: ignore[dict-item]
            producer.send(b"fault")
            for number in range(100):
                producer.send(f"after {number}".encode())
            await eventually(lambda: len(seen) == 100, timeout=10, explain=lambda: f"{len(seen)} of 100 arrived")
        assert seen == [f"after {number}".encode() for number in range(100)]
        unreadable = [entry for entry in logs if entry["event"] == "consumer.message_unreadable"]
        assert [(entry["topic"], entry["bytes"]) for entry in unreadable] == [(topic, 9), (topic, 5)]
        assert "UnicodeDecodeError" in unreadable[0]["error"] and "injected" in unreadable[1]["error"]
        assert all(entry["log_level"] == "error" for entry in unreadable)
    finally:
        client.close()


@TAKERS
async def test_a_stalled_handler_holds_at_most_its_receiver_queue_and_loses_nothing_once_it_moves(
    connection: Transport, linger: float
) -> None:
    # Persistent and Shared: what the listener (or the batches' thread) does not take stays with the broker, so every
    # message can be counted.
    topic = f"persistent://{connection.topics.topicspace}/request/stalled-handler"
    released = asyncio.Event()
    seen: list[bytes] = []

    async def slow(message: Envelope) -> None:
        await released.wait()
        seen.append(message.data)

    subscription = await connection.subscribe(
        topic, slow, subscription="stalled", shared=True, receiver_queue=50, linger=linger
    )
    assert isinstance(subscription, BatchedSubscription if linger else PulsarSubscription)
    publisher = await connection.publisher(topic)
    await asyncio.gather(*(publisher.send(f"{number}".encode()) for number in range(600)))
    deepest = 0
    for _ in range(20):  # a second with the handler stalled on the first message
        deepest = max(deepest, subscription.backlog)
        await asyncio.sleep(0.05)
    assert 0 < deepest <= 50, f"{deepest} messages waited between the listener and the loop"
    released.set()
    await eventually(lambda: len(seen) == 600, timeout=20, explain=lambda: f"{len(seen)} of 600 handled")
    assert seen == [f"{number}".encode() for number in range(600)]


async def test_sends_past_the_producers_queue_wait_for_a_slot_instead_of_failing(
    connection: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A queue of 16 in pulsar-client: without the awaited slot, the 17th pending send would fail ProducerQueueIsFull.
    monkeypatch.setattr(pulsar_transport, "PRODUCER_QUEUE", 16)
    topic = f"persistent://{connection.topics.topicspace}/request/back-pressure"
    seen: list[bytes] = []

    async def keep(message: Envelope) -> None:
        seen.append(message.data)

    await connection.subscribe(topic, keep, subscription="back-pressure", shared=True)
    publisher = await connection.publisher(topic)
    await asyncio.gather(*(publisher.send(f"{number}".encode()) for number in range(1000)))
    await eventually(lambda: len(seen) == 1000, timeout=20, explain=lambda: f"{len(seen)} of 1000 arrived")
    assert sorted(seen, key=int) == [f"{number}".encode() for number in range(1000)]


LOOP_ENDS = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    import psutil
    from toolservice_base import Settings, open_transport

    url, token, topicspace, broker, how, data_dir = sys.argv[1:7]
    settings = Settings(pulsar_url=url, auth_token=token or None, topicspace=topicspace, broker=broker,
                        data_dir=data_dir)
    port = int(url.rsplit(":", 1)[1])
    baseline = len(os.listdir("/proc/self/task"))

    async def handler(message):
        await asyncio.sleep(10)  # messages keep arriving while this one is being handled

    async def pending():
        transport = await open_transport(settings)
        topic = transport.topics.tool_descriptors
        await transport.subscribe(topic, handler)
        publisher = await transport.publisher(topic)
        sends = [asyncio.ensure_future(publisher.send(b"x" * 100)) for _ in range(500)]
        await asyncio.sleep(0)
        return transport, sends

    if how == "asyncio.run":
        async def main():
            global kept
            kept = await pending()  # returns with 500 sends and their receipts pending, the transport open
        asyncio.run(main())
    else:
        loop = asyncio.new_event_loop()
        kept = loop.run_until_complete(pending())
        loop.close()  # outright: nothing pending on it will ever run
    # Receipts and messages keep coming for a closed loop meanwhile; give the client up to 10 s to be gone.
    for _ in range(100):
        time.sleep(0.1)
        connections = [c for c in psutil.Process().net_connections() if c.raddr and c.raddr.port == port]
        threads = len(os.listdir("/proc/self/task"))
        if not connections and threads <= baseline + 1:
            break
    print(json.dumps({"baseline": baseline, "threads": threads, "connections": len(connections)}), flush=True)
    """
)


@pytest.mark.parametrize("how", ["asyncio.run", "loop.close"])
async def test_a_loop_that_ends_with_the_transport_open_leaves_no_thread_or_connection_behind(
    settings: Settings, tmp_path: Path, how: str
) -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-c",
            LOOP_ENDS,
            settings.resolve_pulsar_url(),
            settings.auth_token or "",
            settings.topicspace,
            settings.broker,
            how,
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for sign in ("terminate called", "Traceback", "Event loop is closed"):
        assert sign not in done.stderr, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["connections"] == 0, found
    assert found["threads"] <= found["baseline"] + 1, found  # pulsar-client keeps one idle thread once a client closed


async def restart(settings: Settings, request: pytest.FixtureRequest) -> None:
    if settings.broker == "apache-pulsar":
        apache: ApachePulsar = request.getfixturevalue("apache_pulsar")
        await asyncio.to_thread(apache.restart)
    else:
        broker: EmbeddedBroker = request.getfixturevalue("broker")
        await asyncio.to_thread(broker.kill)
        await asyncio.sleep(1.0)  # down for a moment, as a crash is
        await asyncio.to_thread(broker.restart)


CALL_TIMEOUT = 5.0


@pytest.mark.timeout(600)  # the first Apache Pulsar test of a run waits for it to start, and a restart takes seconds
async def test_a_broker_restart_under_64_calls_in_flight_loses_nothing_and_calls_resume(
    connection: Transport, settings: Settings, request: pytest.FixtureRequest
) -> None:
    requests_queue = connection.topics.request_queue("restart-echo")
    responses_queue = connection.topics.response_queue("restart-echo")

    async def echo(message: Envelope, reply: Any) -> None:
        await reply({"echo": json.loads(message.data)["n"]})

    server_side = await open_transport(settings)  # the service has a connection of its own, as in its own process
    server = RequestServer(
        server_side, requests_queue, responses_queue, echo, subscription="restart-echo", cancellable=True
    )
    await server.start()
    client = await RequestClient(connection, requests_queue, responses_queue).start()
    outcomes: list[tuple[float, float, str]] = []
    stop = asyncio.Event()
    counter = iter(range(10**9))

    async def caller() -> None:
        while not stop.is_set():
            n = next(counter)
            started = time.monotonic()
            try:
                # Bounded from outside too: a call that outlives its own timeout by far has hung.
                answer = await asyncio.wait_for(client.request({"n": n}, timeout=CALL_TIMEOUT), CALL_TIMEOUT + 5)
                outcome = "ok" if answer == {"echo": n} else f"wrong answer {answer!r}"
            except (RequestTimeout, TransportError) as exc:
                outcome = type(exc).__name__
                await asyncio.sleep(0.2)
            except TimeoutError:
                outcome = "hung"
            outcomes.append((started, time.monotonic(), outcome))

    callers = [asyncio.create_task(caller()) for _ in range(64)]
    try:
        await eventually(lambda: sum(o == "ok" for _, _, o in outcomes) >= 640, timeout=30)
        went = time.monotonic()
        await restart(settings, request)
        back = time.monotonic()
        await eventually(
            lambda: sum(o == "ok" for s, _, o in outcomes if s > back) >= 640,
            timeout=60,
            explain=lambda: f"outcomes since the restart: {sorted({o for s, _, o in outcomes if s > back})}",
        )
    finally:
        stop.set()
        await asyncio.gather(*callers)
        await client.close()
        await server.stop()
        await server_side.close()
    kinds = {outcome for _, _, outcome in outcomes}
    print({kind: sum(o == kind for _, _, o in outcomes) for kind in kinds}, f"away {back - went:.1f}s")
    assert kinds <= {"ok", "RequestTimeout", "BrokerUnreachable", "TransportError"}, kinds
    assert all(ended - started <= CALL_TIMEOUT + 1.0 for started, ended, _ in outcomes), "a call outlived its timeout"
    during = [outcome for started, _, outcome in outcomes if went - CALL_TIMEOUT <= started <= back]
    assert during, "no call was in flight while the broker was away"
    first_ok = min(started for started, _, outcome in outcomes if started > back and outcome == "ok")
    after = [outcome for started, _, outcome in outcomes if started > first_ok]
    assert after and all(outcome == "ok" for outcome in after), sorted(set(after))  # once calls resume, all do


async def test_under_a_steady_stream_a_lingering_subscription_takes_messages_together_and_after_quiet_at_once(
    connection: Transport,
) -> None:
    topic = connection.topics.tool_descriptors
    handled: dict[bytes, float] = {}

    def keep(message: Envelope) -> None:
        handled[message.data] = time.monotonic()

    await connection.subscribe(topic, keep, inline=True, linger=1.0)
    publisher = await connection.publisher(topic)

    async def sent_and_handled(data: bytes) -> float:
        sent = time.monotonic()
        await publisher.send(data)
        await eventually(lambda: data in handled, timeout=10, explain=lambda: f"{data!r} never handled")
        return handled[data] - sent

    # The first two come after a quiet spell: each at once. They came within the linger of each other, so the loop
    # looks by itself from now on, every second here, and the third waits for its look instead of a wake-up.
    assert await sent_and_handled(b"first") < 0.5
    assert await sent_and_handled(b"second") < 0.5
    assert 0.2 < await sent_and_handled(b"third") < 3.0
    await asyncio.sleep(2.5)  # a look found nothing: the stream is quiet
    assert await sent_and_handled(b"after a quiet spell") < 0.5


async def test_a_lingering_subscription_takes_a_steady_stream_in_one_look_per_linger_and_closes_cleanly(
    connection: Transport,
) -> None:
    topic = connection.topics.tool_descriptors
    seen: list[bytes] = []

    async def keep(message: Envelope) -> None:
        seen.append(message.data)

    threads = threading.active_count()
    subscription = await connection.subscribe(topic, keep, linger=0.1)
    assert isinstance(subscription, BatchedSubscription)
    publisher = await connection.publisher(topic)
    started = time.monotonic()
    for number in range(200):  # a message every 5 ms for a second
        await publisher.send(f"{number}".encode())
        await asyncio.sleep(0.005)
    await eventually(lambda: len(seen) == 200, timeout=10, explain=lambda: f"{len(seen)} of 200 arrived")
    took = time.monotonic() - started
    assert seen == [f"{number}".encode() for number in range(200)]
    # The first came at once; the rest were taken by the loop's looks, about one per 0.1 s (not one per message).
    assert 0 < subscription.looks <= took / 0.1 + 3, (subscription.looks, took)
    assert threading.active_count() == threads  # no thread of its own
    # Closed while a receive waits in pulsar-client: that receive ends (AlreadyClosed) and nothing is left behind.
    await asyncio.sleep(0.3)  # a look found nothing: quiet, a receive waits
    await connection.unsubscribe(subscription)
    await connection.subscribe(topic, keep, linger=0.1)
    await connection.close()  # closed with a lingering subscription still open
    assert threading.active_count() <= threads
