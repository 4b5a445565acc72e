"""pulsar-lite's `shift_consumer_ids` workaround: joining a Shared subscription without colliding on a consumer id.

pulsar-lite keys a Shared subscription's consumers by the client-local consumer
id, which every client counts from 0, so the second process to join collides
("Consumer 0 already exists"). Before each attempt, a random number of ids is
used up on a throwaway topic, and a collision (a timeout on the short-timeout
client this runs on) is retried. On only for pulsar-lite (`Capabilities`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pulsar
import pulsar.asyncio as pulsar_asyncio

from .errors import broker_errors
from .subscription import subscribe_listening

ID_SHIFT_RANGE = 64
SHARED_ATTEMPTS = 6


async def subscribe_shifted(
    client: pulsar_asyncio.Client,
    topic: str,
    name: str,
    receiver_queue: int,
    listener: Callable[[Any, Any], None] | None,
    shift_subscription: str,
    batches: Any = None,
) -> Any:
    """A Shared consumer of `name` on `topic` with `listener` (None: received, in `batches`), its id shifted first;
    up to `SHARED_ATTEMPTS` tries."""
    last: BaseException | None = None
    for attempt in range(1, SHARED_ATTEMPTS + 1):
        await shift_consumer_id(client, topic, shift_subscription)
        with broker_errors(
            log="consumer.shared_subscribe_retry", level="warning", topic=topic, subscription=name, attempt=attempt
        ) as subscribing:
            return await subscribe_listening(
                client, topic, name, pulsar.ConsumerType.Shared, receiver_queue, listener, batches
            )
        last = subscribing.error
    assert last is not None
    raise last


async def shift_consumer_id(client: pulsar_asyncio.Client, topic: str, subscription: str) -> None:
    """Use up a random number of consumer ids on a throwaway topic in `topic`'s namespace.

    All on one Shared `subscription`, named once per transport: pulsar-lite keeps every subscription
    name a topic ever had, for good (about 16 KiB each, measured; unsubscribing frees nothing), and a
    name per throwaway consumer cost it 0.5 MB per service start. One name per process cannot collide
    with another process's consumers, and within the process the consumer ids differ.
    """
    count = random.randrange(ID_SHIFT_RANGE)
    if not count:
        return
    _, _, rest = topic.partition("://")
    tenant_ns = "/".join(rest.split("/")[:2])
    throwaway = f"non-persistent://{tenant_ns}/consumer-id-shift"
    results = await asyncio.gather(
        *(
            client.subscribe(throwaway, subscription, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1)
            for _ in range(count)
        ),
        return_exceptions=True,
    )
    await asyncio.gather(
        *(c.close() for c in results if isinstance(c, pulsar_asyncio.Consumer)), return_exceptions=True
    )
