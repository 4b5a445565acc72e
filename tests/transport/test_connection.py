"""The one Pulsar layer, on a real broker: what it promises beyond pulsar-client."""

from __future__ import annotations

import asyncio

from toolservice_base import Settings, open_transport
from toolservice_base.transport import Envelope

SMALL = "non-persistent://tg/test/small"
LARGE = "non-persistent://tg/test/large"


async def test_large_messages_on_a_bulk_subscription_cost_no_small_message(settings: Settings) -> None:
    """Without the bulk connection, pulsar-lite dropped 2 to 19 of these 3,000 small
    messages (8 runs); config reads and registry listings rely on this lane."""
    small_seen: set[bytes] = set()
    large_seen = 0

    async def on_small(message: Envelope) -> None:
        small_seen.add(message.data)

    async def on_large(message: Envelope) -> None:
        nonlocal large_seen
        large_seen += 1

    async with await open_transport(settings) as receiver, await open_transport(settings) as sender:
        await receiver.subscribe(SMALL, on_small)
        await receiver.subscribe(LARGE, on_large, bulk=True)
        small, large = await sender.publisher(SMALL), await sender.publisher(LARGE)

        async def send_large() -> None:
            for _ in range(300):
                await large.send(b"x" * 300_000)
                await asyncio.sleep(0.002)

        flood = asyncio.create_task(send_large())
        for i in range(3000):
            await small.send(b"%d" % i)
        await flood
        for _ in range(100):
            if len(small_seen) == 3000 and large_seen == 300:
                break
            await asyncio.sleep(0.05)

    assert len(small_seen) == 3000, f"{3000 - len(small_seen)} small messages lost"
    # The large lane itself is a non-persistent topic: a message arriving while its own connection is
    # still busy writing the previous 300 KB can be dropped (seen: 1 of 300, on a loaded 2-core machine).
    # That is why large tool answers are streamed in parts; this test is about the small ones.
    assert large_seen >= 295, f"{300 - large_seen} of 300 large messages lost"


def test_pulsar_client_lines_reach_python_logging_only_while_someone_listens() -> None:
    """A Python logger costs every message a call into Python (measured: 2.5x the registry's CPU per heartbeat)."""
    import logging

    import pulsar

    from toolservice_base.transport.pulsar import CLIENT_LOG, client_logger

    level = CLIENT_LOG.level
    try:
        CLIENT_LOG.setLevel(logging.CRITICAL)  # what an application that did not ask for debug logs has
        assert isinstance(client_logger(), pulsar.FileLogger)
        CLIENT_LOG.setLevel(logging.WARNING)  # what configure_logging("debug") sets
        assert client_logger() is CLIENT_LOG
    finally:
        CLIENT_LOG.setLevel(level)
