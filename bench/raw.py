"""The physical limit: pulsar-client alone, no product code, on the same broker.

Each product figure is set beside what bare pulsar-client does with the same
messages on the same broker in the same run:

- `responder`: a request/response echo server in its own process (sync API:
  receive, send the answer with the request's `id`, acknowledge),
  `async-responder`, the same on pulsar.asyncio, `listener-responder`, the
  same on the client's `message_listener` (answering with `send_async` from the
  listener thread: no receive call, no event loop), and `loop-responder`, the
  listener handing each request to an event loop that answers (the least a
  service whose handlers run on a loop can do);
- `sequential_rtt` / `concurrent_rtt` / `listener_rtt`: the matching client
  sides; `listener_rtt` is an asyncio caller built on the client's
  `message_listener` and `send_async` callbacks, each completion handed to the
  loop with `call_soon_threadsafe`: the fastest a caller on an event loop gets
  from the bare client;
- `consumer`: a process that only receives and counts, the broker's raw consume
  rate (and CPU floor) for a topic; `async-consumer`, the same on pulsar.asyncio;
  `listener-consumer`, the same on a `message_listener`.

Run as `python -m bench.raw responder|async-responder|listener-responder|loop-responder URL REQ RESP` or
`python -m bench.raw consumer|async-consumer|listener-consumer URL TOPIC SECONDS`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pulsar
import pulsar.asyncio as pulsar_asyncio

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def _echo(request: bytes) -> bytes:
    """The answer every responder gives: the request's `arguments` text back, as a last response."""
    text = json.loads(json.loads(request)["arguments"])["text"]
    return json.dumps({"error": None, "response": text, "end_of_stream": True}).encode()


def _listen(client: pulsar.Client, request_topic: str, on_request: Callable[[Any, Any], None]) -> None:
    """Take requests on `on_request`, the client's message listener, and say the responder is ready."""
    client.subscribe(
        request_topic,
        f"raw-{uuid.uuid4().hex[:8]}",
        consumer_type=pulsar.ConsumerType.Exclusive,
        message_listener=on_request,
    )
    print("raw responder ready", flush=True)


def responder(url: str, request_topic: str, response_topic: str) -> None:
    """Echo every request's `arguments` text back in a response body, until SIGTERM."""
    client = pulsar.Client(url, logger=QUIET)
    producer = client.create_producer(response_topic, batching_enabled=False, max_pending_messages=20_000)
    consumer = client.subscribe(
        request_topic, f"raw-{uuid.uuid4().hex[:8]}", consumer_type=pulsar.ConsumerType.Exclusive
    )
    print("raw responder ready", flush=True)
    while True:
        message = consumer.receive()
        producer.send_async(_echo(message.data()), None, properties={"id": message.properties()["id"]})
        consumer.acknowledge(message)


async def async_responder(url: str, request_topic: str, response_topic: str) -> None:
    """`responder` on pulsar.asyncio: the floor for a service that, like ours, runs on an event loop."""
    client = pulsar_asyncio.Client(url, logger=QUIET)
    producer = await client.create_producer(response_topic, batching_enabled=False, max_pending_messages=20_000)
    consumer = await client.subscribe(
        request_topic, f"raw-{uuid.uuid4().hex[:8]}", consumer_type=pulsar.ConsumerType.Exclusive
    )
    print("raw responder ready", flush=True)
    while True:
        message = await consumer.receive()
        await producer.send(_echo(message.data()), properties={"id": message.properties()["id"]})
        await consumer.acknowledge(message)


def listener_responder(url: str, request_topic: str, response_topic: str) -> None:
    """`responder` on the client's message listener: each request answered from the listener thread, by the
    fastest path the client offers (the answer sent and the request acknowledged with no callback: a Python
    callback costs the GIL on the client's own threads)."""
    client = pulsar.Client(url, logger=QUIET)
    producer = client.create_producer(response_topic, batching_enabled=False, max_pending_messages=20_000)

    def on_request(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
        producer.send_async(_echo(message.data()), None, properties={"id": message.properties()["id"]})
        _acknowledge(consumer, message)

    _listen(client, request_topic, on_request)
    threading.Event().wait()


def loop_responder(url: str, request_topic: str, response_topic: str) -> None:
    """`listener-responder` for a service whose handlers run on an event loop, as every `DynamicToolService` does:
    the listener hands each request to the loop (`call_soon_threadsafe`), which answers with `send_async` (no
    callback). The least a loop-based service can do with the bare client: the floor for our service's side."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        client = pulsar.Client(url, logger=QUIET)
        producer = client.create_producer(response_topic, batching_enabled=False, max_pending_messages=20_000)

        def answer(message: pulsar.Message) -> None:  # on the loop
            producer.send_async(_echo(message.data()), None, properties={"id": message.properties()["id"]})

        def on_request(consumer: pulsar.Consumer, message: pulsar.Message) -> None:  # the listener thread
            loop.call_soon_threadsafe(answer, message)
            _acknowledge(consumer, message)

        _listen(client, request_topic, on_request)
        await loop.create_future()

    asyncio.run(serve())


def sequential_rtt(
    url: str, request_topic: str, response_topic: str, payload: bytes, count: int, warmup: int = 50
) -> list[float]:
    """`count` request/response round trips, one at a time, on the sync API; seconds each."""
    client = pulsar.Client(url, logger=QUIET)
    try:
        consumer = client.subscribe(response_topic, f"raw-rtt-{uuid.uuid4().hex[:8]}")
        producer = client.create_producer(request_topic, batching_enabled=False)
        samples: list[float] = []
        for number in range(warmup + count):
            request_id = uuid.uuid4().hex
            started = time.perf_counter()
            producer.send(payload, properties={"id": request_id})
            while True:
                message = consumer.receive(10_000)
                consumer.acknowledge(message)
                if message.properties().get("id") == request_id:
                    break
            if number >= warmup:
                samples.append(time.perf_counter() - started)
        return samples
    finally:
        client.close()


async def concurrent_rtt(
    url: str,
    request_topic: str,
    response_topic: str,
    payload: bytes,
    concurrency: int,
    seconds: float,
    max_calls: int | None = None,
) -> tuple[int, float, list[float]]:
    """Calls completed in `seconds` (or `max_calls`) by `concurrency` workers on pulsar.asyncio, no product code.

    Returns (calls, elapsed seconds, each call's latency in seconds).
    """
    client = pulsar_asyncio.Client(url, logger=QUIET)
    consumer = await client.subscribe(response_topic, f"raw-conc-{uuid.uuid4().hex[:8]}")
    producer = await client.create_producer(request_topic, batching_enabled=False, max_pending_messages=20_000)
    waiting: dict[str, asyncio.Future[None]] = {}

    async def receive_loop() -> None:
        while True:
            message = await consumer.receive()
            future = waiting.pop(message.properties().get("id", ""), None)
            if future is not None and not future.done():
                future.set_result(None)  # before the ack: the caller must not wait on it
            await consumer.acknowledge(message)

    receiver = asyncio.create_task(receive_loop())
    loop = asyncio.get_running_loop()
    for _ in range(50):  # until a first answer arrives: a fresh consumer's permits may not be at the broker yet
        request_id = uuid.uuid4().hex
        first = waiting[request_id] = loop.create_future()
        await producer.send(payload, properties={"id": request_id})
        try:
            await asyncio.wait_for(first, 0.2)
            break
        except TimeoutError:
            waiting.pop(request_id, None)
    stop_at = loop.time() + seconds
    done = 0
    latencies: list[float] = []
    limit = max_calls if max_calls is not None else float("inf")

    async def worker() -> None:
        nonlocal done
        while loop.time() < stop_at and done < limit:
            request_id = uuid.uuid4().hex
            future = waiting[request_id] = loop.create_future()
            t0 = time.perf_counter()
            await producer.send(payload, properties={"id": request_id})
            await asyncio.wait_for(future, 10)
            latencies.append(time.perf_counter() - t0)
            done += 1

    started = loop.time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = loop.time() - started
    receiver.cancel()
    try:
        await receiver
    except BaseException:
        pass
    await producer.flush()
    await producer.close()
    await consumer.close()
    await client.close()
    await asyncio.sleep(0.05)
    return done, elapsed, latencies


async def listener_rtt(
    url: str,
    request_topic: str,
    response_topic: str,
    payload: bytes,
    concurrency: int,
    seconds: float,
    max_calls: int | None = None,
    *,
    receipts: bool = True,
) -> tuple[int, float, list[float]]:
    """`concurrent_rtt` with the client's callbacks instead of pulsar.asyncio: answers come on a message listener,
    send receipts on `send_async`'s callback, each handed to the loop with `call_soon_threadsafe`.

    Each call awaits its send's receipt, then its answer, as a caller that reports a failed send must; with
    `receipts=False` it sends with no callback and awaits only its answer (the fastest path the client offers,
    which reports no failed send). Returns (calls, elapsed seconds, each call's latency in seconds).
    """
    loop = asyncio.get_running_loop()
    waiting: dict[str, asyncio.Future[None]] = {}

    def answered(request_id: str) -> None:
        future = waiting.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(None)

    def on_response(consumer: Any, message: Any) -> None:  # the listener thread
        loop.call_soon_threadsafe(answered, message.properties().get("id", ""))
        _acknowledge(consumer, message)

    def receipt(future: asyncio.Future[None], result: Any) -> None:
        if future.done():
            return
        if result == pulsar.Result.Ok:
            future.set_result(None)
        else:
            future.set_exception(RuntimeError(f"send failed: {result}"))

    def sent(future: asyncio.Future[None], result: Any, message_id: Any) -> None:  # an I/O thread
        loop.call_soon_threadsafe(receipt, future, result)

    client = pulsar.Client(url, logger=QUIET)
    try:
        await asyncio.to_thread(
            client.subscribe, response_topic, f"raw-listen-{uuid.uuid4().hex[:8]}", message_listener=on_response
        )
        producer = await asyncio.to_thread(
            client.create_producer, request_topic, batching_enabled=False, max_pending_messages=20_000
        )

        async def call() -> float:
            request_id = uuid.uuid4().hex
            answer = waiting[request_id] = loop.create_future()
            t0 = time.perf_counter()
            if receipts:
                accepted = loop.create_future()
                producer.send_async(payload, functools.partial(sent, accepted), properties={"id": request_id})
                await accepted
            else:
                producer.send_async(payload, None, properties={"id": request_id})
            await asyncio.wait_for(answer, 10)
            return time.perf_counter() - t0

        for _ in range(50):  # until a first answer arrives: a fresh consumer's permits may not be at the broker yet
            try:
                await asyncio.wait_for(call(), 0.2)
                break
            except TimeoutError:
                continue
        stop_at = loop.time() + seconds
        done = 0
        latencies: list[float] = []
        limit = max_calls if max_calls is not None else float("inf")

        async def worker() -> None:
            nonlocal done
            while loop.time() < stop_at and done < limit:
                latencies.append(await call())
                done += 1

        started = loop.time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = loop.time() - started
        await asyncio.to_thread(producer.flush)
        return done, elapsed, latencies
    finally:
        await asyncio.to_thread(client.close)


def consumer(url: str, topic: str, seconds: float) -> None:
    """Receive and acknowledge for `seconds` after the first message; print JSON {received, seconds}."""
    client = pulsar.Client(url, logger=QUIET)
    sub = client.subscribe(topic, f"raw-count-{uuid.uuid4().hex[:8]}", receiver_queue_size=1000)
    print("raw consumer ready", flush=True)
    count = _Count(seconds)
    while True:
        try:
            message = sub.receive(500)
        except pulsar.Timeout:
            if count.first is not None and time.perf_counter() - count.first > seconds:
                break
            continue
        sub.acknowledge(message)
        if count.tick():
            break
    count.report()
    client.close()


async def async_consumer(url: str, topic: str, seconds: float) -> None:
    """`consumer` on pulsar.asyncio: the floor for a process that, like the registry, runs on an event loop."""
    client = pulsar_asyncio.Client(url, logger=QUIET)
    sub = await client.subscribe(topic, f"raw-count-{uuid.uuid4().hex[:8]}", receiver_queue_size=1000)
    print("raw consumer ready", flush=True)
    count = _Count(seconds)
    while True:
        message = await sub.receive()
        # Acknowledged without awaiting the receipt, as the product's consumers do,
        # so both sides pay for the same crossings.
        sub._consumer.acknowledge_async(message._message, lambda result: None)
        if count.tick():
            break
    count.report()
    await client.close()


def listener_consumer(url: str, topic: str, seconds: float) -> None:
    """`consumer` on a message listener: the floor for a process that takes a stream on the client's callbacks."""
    client = pulsar.Client(url, logger=QUIET)
    count = _Count(seconds)
    finished = threading.Event()

    def on_message(consumer: Any, message: Any) -> None:
        _acknowledge(consumer, message)
        if count.tick():
            finished.set()

    client.subscribe(topic, f"raw-count-{uuid.uuid4().hex[:8]}", receiver_queue_size=1000, message_listener=on_message)
    print("raw consumer ready", flush=True)
    while not finished.wait(0.5):
        if count.first is not None and time.perf_counter() - count.first > seconds:
            break
    count.report()
    client.close()


def batch_consumer(url: str, topic: str, seconds: float, linger_ms: int = 20) -> None:
    """`consumer` taking what came in batches (`batch_receive`, at most `linger_ms` apart): no thread of the client
    is woken, nor the GIL taken, per message; what the registry's intake is built on."""
    client = pulsar.Client(url, logger=QUIET)
    sub = client.subscribe(
        topic,
        f"raw-count-{uuid.uuid4().hex[:8]}",
        receiver_queue_size=1000,
        batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(1000, 4 << 20, linger_ms),
    )
    print("raw consumer ready", flush=True)
    count = _Count(seconds)
    native = sub._consumer
    while True:
        messages = native.batch_receive()
        for message in messages:
            native.acknowledge_async(message, None)
            if count.tick():
                break
        else:
            if count.first is None or time.perf_counter() - count.first <= seconds:
                continue
        break
    count.report()
    client.close()


def _acknowledge(consumer: pulsar.Consumer, message: pulsar.Message) -> None:
    """Acknowledge without waiting and without a callback: the blocking `acknowledge` lets go of the GIL and must
    take it back (from an event loop's thread, in a process that has one), per message."""
    consumer._consumer.acknowledge_async(message._message, None)


class _Count:
    """Messages received, and the span from the first to the last; done `seconds` after the first."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.received = 0
        self.first: float | None = None
        self.last: float | None = None

    def tick(self) -> bool:
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last
        self.received += 1
        return self.last - self.first > self.seconds

    def report(self) -> None:
        span = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
        print(json.dumps({"received": self.received, "seconds": span}), flush=True)


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "responder":
        responder(*rest)
    elif command == "async-responder":
        asyncio.run(async_responder(*rest))
    elif command == "listener-responder":
        listener_responder(*rest)
    elif command == "loop-responder":
        loop_responder(*rest)
    elif command == "consumer":
        consumer(rest[0], rest[1], float(rest[2]))
    elif command == "async-consumer":
        asyncio.run(async_consumer(rest[0], rest[1], float(rest[2])))
    elif command == "listener-consumer":
        listener_consumer(rest[0], rest[1], float(rest[2]))
    elif command == "batch-consumer":
        batch_consumer(rest[0], rest[1], float(rest[2]))
    else:
        raise SystemExit(f"unknown command {command!r}")
