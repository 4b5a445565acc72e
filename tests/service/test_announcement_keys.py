"""Every announcement carries its service as the message key, so the broker can keep a service's messages together.

A registry sharded by service (`bench/FLEET.md`) reads `tool-descriptors` on a `Key_Shared` subscription:
the broker gives each consumer a range of key hashes, and every message of one key to the same consumer.
That only works if the key is on the wire; this is checked with pulsar-client's own `Key_Shared` consumers.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict

import pulsar
import pytest
from support.registry import descriptors

from toolservice_base import Announcer, Settings, Transport

pytestmark = pytest.mark.brokers

SERVICES = 20
"""Each lands in one of two hash ranges: all twenty in one range by chance is a one in half a million event."""
RANGES = [(0, 32767), (32768, 65535)]


async def test_a_services_messages_all_carry_its_key_and_go_to_one_key_shared_consumer(
    settings: Settings, connection: Transport
) -> None:
    auth = {"authentication": pulsar.AuthenticationToken(settings.auth_token)} if settings.auth_token else {}
    assert settings.pulsar_url is not None
    client = pulsar.Client(settings.pulsar_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), **auth)
    topic = connection.topics.tool_descriptors
    consumers = [
        client.subscribe(
            topic,
            "sharded-registry",
            consumer_type=pulsar.ConsumerType.KeyShared,
            key_shared_policy=pulsar.ConsumerKeySharedPolicy(
                key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=[span]
            ),
        )
        for span in RANGES
    ]
    announcers = []
    for n in range(SERVICES):
        service, tools = descriptors(f"svc-{n}", ("t",))
        for instance in range(2):
            announcers.append(
                Announcer(connection, service, tools, ttl=30, workspace="ws", instance=f"svc-{n}-{instance}")
            )
    try:
        await asyncio.gather(*(announcer.start() for announcer in announcers))
        await asyncio.gather(
            *(announcer.stop() for announcer in announcers)
        )  # a withdraw each: two messages per instance
        keys: list[dict[str, int]] = [defaultdict(int), defaultdict(int)]

        def drain(index: int) -> None:
            while True:
                try:
                    message = consumers[index].receive(2000)
                except pulsar.Timeout:
                    return
                keys[index][message.partition_key()] += 1
                consumers[index].acknowledge(message)

        threads = [threading.Thread(target=drain, args=(index,)) for index in range(2)]
        for thread in threads:
            thread.start()
        await asyncio.to_thread(lambda: [thread.join() for thread in threads])
    finally:
        client.close()
    assert sorted({*keys[0], *keys[1]}) == sorted(f"ws/svc-{n}" for n in range(SERVICES))
    assert not set(keys[0]) & set(keys[1]), "a service's messages went to both consumers"
    assert keys[0] and keys[1], keys  # the broker did split by key: both consumers have services
    assert all(count == 4 for got in keys for count in got.values())  # announce and withdraw of both instances
