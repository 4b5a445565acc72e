"""Each broker workaround of the transport, measured with bare pulsar-client, on either broker.

The transport carries workarounds found on pulsar-lite. Whether Apache Pulsar
needs each one is a measurement, not a guess: the same bare pulsar-client
script runs against both brokers, and the failure each workaround guards
against is counted.

    python -m bench.quirks --broker pulsar-lite|apache-pulsar [--only NAME ...] [--json FILE]

NAME is one of `MEASUREMENTS`. Every topic is fresh (a run id in its name) in
`public/default`, which both brokers have. Results print as JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
import pulsar.asyncio as pulsar_asyncio

from discovery.broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parent.parent
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
RUN = uuid.uuid4().hex[:8]
NS = "public/default"


def topic(kind: str, name: str) -> str:
    return f"{kind}://{NS}/{name}-{RUN}-{uuid.uuid4().hex[:6]}"


def is_timeout(exc: BaseException) -> bool:
    return type(exc).__name__ == "Timeout"


# --- brokers ---------------------------------------------------------------------------------------


class LiteBroker:
    """pulsar-lite, started the way the product starts it (toolservice_base.broker)."""

    name = "pulsar-lite"

    def __init__(self, data_dir: Path) -> None:
        self._broker = EmbeddedBroker(data_dir)
        self.url = self._broker.start()

    def stop(self) -> None:
        self._broker.stop()

    def start(self) -> None:
        self._broker.start(port=self._broker.port)


class ApacheBroker:
    """Apache Pulsar standalone (scripts/apache_pulsar.py), no authentication."""

    name = "apache-pulsar"

    def __init__(self, data_dir: Path) -> None:
        spec = importlib.util.spec_from_file_location("apache_pulsar", ROOT / "scripts" / "apache_pulsar.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["apache_pulsar"] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        self._broker = module.ApachePulsar(data_dir)
        self._broker.start()
        self.url = self._broker.url

    def stop(self) -> None:
        self._broker.stop(remove=False)

    def start(self) -> None:
        self._broker.start()


# --- shift_consumer_ids: two processes join one Shared subscription ---------------------------------


def child_shared(url: str, topic_name: str, subscription: str) -> None:
    """Join `subscription` (Shared), say how it went, then count what arrives after the parent's go."""
    client = pulsar.Client(url, logger=QUIET, operation_timeout_seconds=5)
    started = time.monotonic()
    try:
        consumer = client.subscribe(topic_name, subscription, consumer_type=pulsar.ConsumerType.Shared)
    except Exception as exc:  # noqa: BLE001 - reported, that is the measurement
        print(f"error {time.monotonic() - started:.3f} {exc}", flush=True)
        client.close()
        return
    print(f"ok {time.monotonic() - started:.3f}", flush=True)
    sys.stdin.readline()
    count = 0
    while True:
        try:
            consumer.acknowledge(consumer.receive(timeout_millis=1500))
            count += 1
        except Exception as exc:  # noqa: BLE001
            if is_timeout(exc):
                break
            raise
    print(f"received {count}", flush=True)
    client.close()


def shift_consumer_ids(url: str, trials: int = 10, messages: int = 100) -> dict[str, Any]:
    failures, errors, split = 0, set(), []
    for _ in range(trials):
        name = topic("non-persistent", "shift")
        children = []
        for _ in range(2):
            child = subprocess.Popen(
                [sys.executable, "-m", "bench.quirks", "child-shared", url, name, "svc"],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            children.append((child, child.stdout.readline().strip()))  # type: ignore[union-attr]
        for _, line in children:
            if line.startswith("error"):
                failures += 1
                errors.add(line.split(" ", 2)[2][:80])
        client = pulsar.Client(url, logger=QUIET)
        producer = client.create_producer(name, batching_enabled=False)
        for i in range(messages):
            producer.send(b"%d" % i)
        client.close()
        counts = []
        for child, line in children:
            out, _ = child.communicate("go\n", timeout=30)
            counts.append(int(out.split()[-1]) if line.startswith("ok") else None)
        split.append(counts)
    return {
        "trials": trials,
        "second_joiner_failed": failures,
        "errors": sorted(errors),
        "received_per_consumer": split,
    }


# --- confirm_subscription_receives / resend_on_silence: a message sent the moment a consumer subscribes ---


def subscribe_then_send(url: str, trials: int = 500, shared: bool = False) -> dict[str, Any]:
    """Subscribe, and as soon as subscribe() returns another client publishes: is the message lost?"""
    consumers, producers = pulsar.Client(url, logger=QUIET), pulsar.Client(url, logger=QUIET)
    kind = pulsar.ConsumerType.Shared if shared else pulsar.ConsumerType.Exclusive
    lost, gaps = 0, []
    started = time.monotonic()
    for i in range(trials):
        name = topic("non-persistent", "confirm")
        producer = producers.create_producer(name, batching_enabled=False)
        consumer = consumers.subscribe(name, "s", consumer_type=kind)
        subscribed = time.monotonic()
        producer.send(b"%d" % i)
        gaps.append(time.monotonic() - subscribed)
        try:
            consumer.receive(timeout_millis=1000)
        except Exception as exc:  # noqa: BLE001
            if not is_timeout(exc):
                raise
            lost += 1
        producer.close()
        consumer.close()
    consumers.close()
    producers.close()
    gaps.sort()
    return {
        "trials": trials,
        "lost": lost,
        "subscription": "Shared" if shared else "Exclusive",
        "send_done_after_subscribe_ms_p50": round(gaps[len(gaps) // 2] * 1000, 3),
        "seconds": round(time.monotonic() - started, 1),
    }


# --- separate_bulk_connection: small messages beside 300 KB ones on one connection ---------------------


def bulk_connection(
    url: str, small: int = 20_000, large_every: float = 0.1, large_size: int = 300_000, separate: bool = False
) -> dict[str, Any]:
    """Count small messages lost while 300 KB ones arrive on the same (or, `separate`, another) connection.

    The two producers have clients of their own too, so nothing is lost on the publishing side.
    """
    receiver = pulsar.Client(url, logger=QUIET)
    bulk_receiver = pulsar.Client(url, logger=QUIET) if separate else receiver
    small_topic, large_topic = topic("non-persistent", "small"), topic("non-persistent", "large")
    seen: set[bytes] = set()
    large_seen = [0]

    def on_small(consumer: Any, message: Any) -> None:
        seen.add(message.data())
        consumer.acknowledge(message)

    def on_large(consumer: Any, message: Any) -> None:
        large_seen[0] += 1
        consumer.acknowledge(message)

    receiver.subscribe(small_topic, "s", message_listener=on_small)
    bulk_receiver.subscribe(large_topic, "l", message_listener=on_large)
    sender, large_sender = pulsar.Client(url, logger=QUIET), pulsar.Client(url, logger=QUIET)
    small_producer = sender.create_producer(small_topic, batching_enabled=False)
    large_producer = large_sender.create_producer(large_topic, batching_enabled=False, max_pending_messages=5000)
    done = threading.Event()
    large_sent = [0]

    def flood() -> None:
        payload = b"x" * large_size
        while not done.is_set():
            large_producer.send(payload)
            large_sent[0] += 1
            time.sleep(large_every)

    thread = threading.Thread(target=flood)
    thread.start()
    started = time.monotonic()
    for i in range(small):
        small_producer.send(b"%d" % i)
    elapsed = time.monotonic() - started
    done.set()
    thread.join()
    deadline = time.monotonic() + 5
    while (len(seen) < small or large_seen[0] < large_sent[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for client in {id(c): c for c in (receiver, bulk_receiver, sender, large_sender)}.values():
        client.close()
    return {
        "small_sent": small,
        "small_lost": small - len(seen),
        "large_sent": large_sent[0],
        "large_lost": large_sent[0] - large_seen[0],
        "large_every_s": large_every,
        "connections": 2 if separate else 1,
        "send_seconds": round(elapsed, 2),
    }


# --- close_grace: exit right after closing the client ---------------------------------------------------


async def child_close(url: str, topic_name: str, grace: float, clients: int = 1) -> None:
    """What a product process does last: receives pending and cancelled, everything closed, then exit.

    `clients=3` is the product's shape: a main, a Shared and a bulk client, each
    with a consumer acknowledged through the native callback path.
    """
    opened = [pulsar_asyncio.Client(url, logger=QUIET) for _ in range(clients)]
    producer = await opened[0].create_producer(topic_name, batching_enabled=False)
    consumers = [await c.subscribe(topic_name, f"c-{uuid.uuid4().hex[:8]}") for c in opened]
    await producer.send(b"x")
    for consumer in consumers:
        message = await consumer.receive()
        if clients == 1:
            await consumer.acknowledge(message)
        else:
            consumer._consumer.acknowledge_async(message._message, lambda result: None)  # noqa: SLF001
    pending = [asyncio.ensure_future(c.receive()) for c in consumers]
    await asyncio.sleep(0)
    for task in pending:
        task.cancel()
    await producer.flush()
    await producer.close()
    for consumer in consumers:
        await consumer.close()
    for c in opened:
        await c.close()
    if grace:
        await asyncio.sleep(grace)


def close_grace(url: str, runs: int = 40) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for clients in (1, 3):
        for grace in (0.0, 0.05):
            codes: dict[str, int] = {}
            for _ in range(runs):
                # persistent: the one message each consumer waits for must not be lost to the subscribe race
                argv = [
                    sys.executable,
                    "-m",
                    "bench.quirks",
                    "child-close",
                    url,
                    topic("persistent", "close"),
                    str(grace),
                    str(clients),
                ]
                try:
                    code = str(subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60).returncode)
                except subprocess.TimeoutExpired:
                    code = "hung"
                codes[code] = codes.get(code, 0) + 1
            result[f"clients_{clients}_grace_{int(grace * 1000)}ms"] = {
                "runs": runs,
                "exit_codes": codes,
                "crashed": runs - codes.get("0", 0),
            }
    return result


# --- acks: the public async acknowledge against the private fast path ----------------------------------------


def redeliveries(url: str, name: str) -> int:
    """Messages the subscription hands out again: acknowledged ones must not come back.

    A sync client with a receive timeout: a cancelled asyncio receive() leaves a
    native callback behind (a trap of its own), so it is not used here.
    """
    client = pulsar.Client(url, logger=QUIET)
    consumer = client.subscribe(name, "s", consumer_type=pulsar.ConsumerType.Shared)
    count = 0
    while True:
        try:
            consumer.receive(timeout_millis=2000)
            count += 1
        except Exception as exc:  # noqa: BLE001
            if not is_timeout(exc):
                raise
            break
    client.close()
    return count


async def acknowledgements(url: str, count: int = 2000) -> dict[str, Any]:
    client = pulsar_asyncio.Client(url, logger=QUIET)
    result = {}
    for way in ("public", "private"):
        name = topic("persistent", f"ack-{way}")
        producer = await client.create_producer(name, batching_enabled=False, max_pending_messages=count)
        consumer = await client.subscribe(name, "s", consumer_type=pulsar.ConsumerType.Shared)
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(count)))
        failed = [0]

        def done(status: object, failed: list[int] = failed) -> None:
            if status != pulsar.Result.Ok:
                failed[0] += 1

        started = time.monotonic()
        for _ in range(count):
            message = await consumer.receive()
            if way == "public":
                await consumer.acknowledge(message)
            else:
                consumer._consumer.acknowledge_async(message._message, done)  # noqa: SLF001 - the path measured
        seconds = time.monotonic() - started
        await consumer.close()
        redelivered = redeliveries(url, name)
        result[way] = {
            "messages": count,
            "receive_and_ack_us_per_message": round(seconds / count * 1e6, 1),
            "failed_acks": failed[0],
            "redelivered_after_resubscribe": redelivered,
        }
        await producer.close()
    await client.close()
    await asyncio.sleep(0.05)
    return result


# --- Exclusive refused: does the refusal cost the client its connection? --------------------------------


def exclusive_refused(url: str) -> dict[str, Any]:
    client = pulsar.Client(url, logger=QUIET, operation_timeout_seconds=5)
    held, other = topic("non-persistent", "excl"), topic("non-persistent", "other")
    first = client.subscribe(held, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    bystander = client.subscribe(other, "b", consumer_type=pulsar.ConsumerType.Exclusive)
    own_producer = client.create_producer(other, batching_enabled=False)
    sender = pulsar.Client(url, logger=QUIET)
    to_first = sender.create_producer(held, batching_enabled=False)
    sending = threading.Event()
    sent = [0]

    def keep_sending() -> None:
        while not sending.is_set():
            to_first.send(b"%d" % sent[0])
            sent[0] += 1
            time.sleep(0.01)

    feeder = threading.Thread(target=keep_sending)
    feeder.start()
    time.sleep(0.2)
    started = time.monotonic()
    try:
        client.subscribe(held, "s", consumer_type=pulsar.ConsumerType.Exclusive)
        refusal = "accepted?!"
    except Exception as exc:  # noqa: BLE001
        refusal = f"{type(exc).__name__}: {exc}"
    refused_after = time.monotonic() - started
    started = time.monotonic()
    own_producer.send(b"after")
    send_after = time.monotonic() - started
    time.sleep(1.0)
    sending.set()
    feeder.join()
    messages = sent[0]

    def drain(consumer: Any) -> int:
        count = 0
        while True:
            try:
                consumer.receive(timeout_millis=1000)
                count += 1
            except Exception as exc:  # noqa: BLE001
                if is_timeout(exc):
                    return count
                raise

    result = {
        "refusal": refusal,
        "refused_after_s": round(refused_after, 3),
        "same_client_send_after_refusal_s": round(send_after, 3),
        "first_consumer_received": f"{drain(first)}/{messages}",
        "bystander_received": f"{drain(bystander)}/1",
    }
    sender.close()
    client.close()
    return result


# --- reconnect after a broker restart (and what non-persistent loses meanwhile) -------------------------


def restart(broker: LiteBroker | ApacheBroker, interval: float = 0.01, after: float = 5.0) -> dict[str, Any]:
    client = pulsar.Client(broker.url, logger=QUIET, operation_timeout_seconds=30)
    name = topic("non-persistent", "restart")
    received: dict[int, float] = {}
    client.subscribe(name, "s", message_listener=lambda c, m: received.setdefault(int(m.data()), time.monotonic()))
    producer = client.create_producer(name, batching_enabled=False, send_timeout_millis=2000, block_if_queue_full=False)
    acked: dict[int, float] = {}
    failed = [0]
    counter = [0]

    def send() -> None:
        i = counter[0]
        counter[0] += 1

        def callback(result: Any, _: Any) -> None:
            if result == pulsar.Result.Ok:
                acked[i] = time.monotonic()
            else:
                failed[0] += 1

        try:
            producer.send_async(b"%d" % i, callback)
        except Exception:  # noqa: BLE001 - queue full while disconnected: counted as failed
            failed[0] += 1

    stop_at = time.monotonic() + 1.0
    while time.monotonic() < stop_at:
        send()
        time.sleep(interval)
    before = counter[0]
    went = time.monotonic()
    stopper = threading.Thread(target=lambda: (broker.stop(), broker.start()))
    stopper.start()
    while stopper.is_alive():
        send()
        time.sleep(interval)
    ready = time.monotonic()
    end = ready + after
    while time.monotonic() < end:
        send()
        time.sleep(interval)
    time.sleep(2)
    after_restart = [i for i in acked if i >= before]
    first_ok = min((acked[i] for i in after_restart if acked[i] > ready), default=None)
    first_rx = min((t for t in received.values() if t > ready), default=None)
    lost = [i for i in acked if i not in received]
    client.close()
    return {
        "outage_s": round(ready - went, 2),
        "first_send_acked_after_ready_s": round(first_ok - ready, 3) if first_ok else None,
        "first_receipt_after_ready_s": round(first_rx - ready, 3) if first_rx else None,
        "sent_from_stop_on": counter[0] - before,
        "acked": len(after_restart),
        "send_failed": failed[0],
        "acked_but_never_received_during_outage": sum(1 for i in lost if acked[i] <= ready),
        "acked_but_never_received_after_ready": sum(1 for i in lost if acked[i] > ready),
    }


MEASUREMENTS: dict[str, Callable[..., Any]] = {
    "shift_consumer_ids": lambda b: shift_consumer_ids(b.url),
    "confirm_subscription_receives": lambda b: subscribe_then_send(b.url),
    "resend_on_silence": lambda b: subscribe_then_send(b.url, shared=True),
    "separate_bulk_connection": lambda b: {
        "one_connection": [bulk_connection(b.url)["small_lost"] for _ in range(3)],
        "separate_connections": [bulk_connection(b.url, separate=True)["small_lost"] for _ in range(3)],
        "one_connection_large_every_2ms": [
            bulk_connection(b.url, small=3000, large_every=0.002)["small_lost"] for _ in range(3)
        ],
        "separate_connections_large_every_2ms": [
            bulk_connection(b.url, small=3000, large_every=0.002, separate=True)["small_lost"] for _ in range(3)
        ],
    },
    "close_grace": lambda b: close_grace(b.url),
    "acknowledge": lambda b: asyncio.run(acknowledgements(b.url)),
    "exclusive_refused": lambda b: exclusive_refused(b.url),
    "restart": restart,
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child-shared":
        return child_shared(*argv[1:4])
    if argv and argv[0] == "child-close":
        return asyncio.run(child_close(argv[1], argv[2], float(argv[3]), int(argv[4])))
    parser = argparse.ArgumentParser(prog="python -m bench.quirks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=["pulsar-lite", "apache-pulsar"], required=True)
    parser.add_argument("--only", nargs="*", choices=list(MEASUREMENTS), default=list(MEASUREMENTS))
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quirks-") as scratch:
        broker = (LiteBroker if args.broker == "pulsar-lite" else ApacheBroker)(Path(scratch) / "broker")
        results: dict[str, Any] = {
            "broker": broker.name,
            "pulsar_client": pulsar.__version__ if hasattr(pulsar, "__version__") else "?",
        }
        try:
            for name in args.only:
                started = time.monotonic()
                print(f"quirks: {name} on {broker.name}", file=sys.stderr, flush=True)
                results[name] = MEASUREMENTS[name](broker)
                print(
                    f"quirks: {name}: {json.dumps(results[name])} ({time.monotonic() - started:.0f}s)",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            broker.stop()
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
