"""Can the announcements be split between registries by service id? Key_Shared on a non-persistent topic, measured.

How the registry would shard (`FLEET.md`): every registry joins one
Key_Shared subscription on `tool-descriptors` and owns a fixed range of the
key hash (Sticky mode), and each announcement carries its service id as
its key, so one service's messages always reach the same registry. This
checks the broker half with bare pulsar-client, on either broker:

    python -m bench.key_shared --broker pulsar-lite|apache-pulsar

Two consumers take the hash ranges 0-32767 and 32768-65535 of one Key_Shared
subscription on a fresh non-persistent topic; a producer sends `messages`
messages keyed by `keys` service ids, then again without a key. Printed as
JSON: per consumer, messages and keys received, and the keys both received
(none, if the split is by key); then whether a third consumer asking for a
range that overlaps a taken one is refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import threading
from pathlib import Path
from typing import Any

import pulsar

from .quirks import ApacheBroker, LiteBroker, topic

SILENT = logging.getLogger("bench.key_shared")
"""pulsar-client's log, kept off stdout (the results go there): the refused consumer is expected and logs an error."""
SILENT.setLevel(logging.CRITICAL)

RANGES = ((0, 32767), (32768, 65535))
"""Sticky hash ranges of the two consumers: the broker's key hash space (0-65535) cut in two."""


def split(url: str, keyed: bool, messages: int = 20_000, keys: int = 2_000) -> dict[str, Any]:
    """One Key_Shared subscription, two consumers with a range each; who got which keys."""
    client = pulsar.Client(url, logger=SILENT, operation_timeout_seconds=10)
    try:
        name = topic("non-persistent", "tool-descriptors")
        consumers = [
            client.subscribe(
                name,
                "registries",
                consumer_type=pulsar.ConsumerType.KeyShared,
                receiver_queue_size=messages,
                consumer_name=f"shard-{n}",
                key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                    key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[span]
                ),
            )
            for n, span in enumerate(RANGES)
        ]
        producer = client.create_producer(
            name, batching_enabled=False, max_pending_messages=messages, block_if_queue_full=True
        )
        for number in range(messages):
            if keyed:
                producer.send_async(str(number).encode(), None, partition_key=f"svc-{number % keys}")
            else:
                producer.send_async(str(number).encode(), None)
        producer.flush()
        received: list[list[str]] = [[] for _ in consumers]

        def drain(index: int) -> None:
            while True:
                try:
                    message = consumers[index].receive(1500)
                except pulsar.Timeout:
                    return
                received[index].append(message.partition_key())
                consumers[index].acknowledge(message)

        threads = [threading.Thread(target=drain, args=(index,)) for index in range(len(consumers))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seen = [set(keys_of) for keys_of in received]
        return {
            "keyed": keyed,
            "sent": messages,
            "consumers": [
                {"range": list(span), "messages": len(got), "keys": len(keys_of)}
                for span, got, keys_of in zip(RANGES, received, seen)
            ],
            "keys_at_both": len(seen[0] & seen[1]),
        }
    finally:
        client.close()


def overlap(url: str) -> dict[str, Any]:
    """A second consumer asks for a range that overlaps the first one's: refused? (A standby cannot share its active's
    range.)"""
    client = pulsar.Client(url, logger=SILENT, operation_timeout_seconds=10)
    try:
        name = topic("non-persistent", "tool-descriptors")

        def join(span: tuple[int, int]) -> pulsar.Consumer:
            policy = pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[span])
            return client.subscribe(
                name, "registries", consumer_type=pulsar.ConsumerType.KeyShared, key_shared_policy=policy
            )

        join(RANGES[0])
        try:
            join((16384, 49151))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # pulsar-client's exceptions do not all derive from Exception
            return {"refused": True, "error": f"{type(exc).__name__}: {exc}"[:200]}
        return {"refused": False, "error": None}
    finally:
        client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.key_shared", description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=["pulsar-lite", "apache-pulsar"], required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="key-shared-") as scratch:
        broker = (LiteBroker if args.broker == "pulsar-lite" else ApacheBroker)(Path(scratch) / "broker")
        try:
            results = {
                "broker": broker.name,
                "by_service_id": split(broker.url, keyed=True),
                "without_key": split(broker.url, keyed=False),
                "overlapping_range": overlap(broker.url),
            }
        finally:
            broker.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
