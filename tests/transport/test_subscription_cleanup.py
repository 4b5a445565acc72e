"""What a closed subscription leaves at the broker: an exclusive one nothing, a shared one its backlog.

Every exclusive subscription is one process's own (a client's reply queue, a service instance's
cancel queue, a registry's intake). On a persistent topic (a tool service may declare persistent
queues) a subscription only closed stays at the broker and keeps every later message for a
consumer that never comes back; so closing one deletes it. A shared subscription is a service's,
across its instances and restarts: what arrives while no instance runs waits for the next one.
"""

from __future__ import annotations

import uuid

import pytest
from support import eventually

from toolservice_base import Settings, Transport
from toolservice_base.transport import Envelope

pytestmark = pytest.mark.contract


class Inbox:
    def __init__(self) -> None:
        self.seen: list[bytes] = []

    async def __call__(self, message: Envelope) -> None:
        self.seen.append(message.data)


async def _left_then_rejoined(connection: Transport, settings: Settings, *, shared: bool) -> list[bytes]:
    """Subscribe, close, publish `meanwhile`, subscribe again by the same name: what the second one receives
    up to `sentinel` (published once it is there)."""
    topic = f"persistent://{settings.topicspace}/request/t-{uuid.uuid4().hex[:8]}"
    name = f"sub-{uuid.uuid4().hex[:8]}"
    first = await connection.subscribe(topic, Inbox(), subscription=name, shared=shared)
    await connection.unsubscribe(first)
    publisher = await connection.publisher(topic)
    await publisher.send(b"meanwhile")
    inbox = Inbox()
    await connection.subscribe(topic, inbox, subscription=name, shared=shared)
    await publisher.send(b"sentinel")
    await eventually(lambda: b"sentinel" in inbox.seen, timeout=10)
    return inbox.seen


async def test_a_closed_exclusive_subscription_is_deleted_and_keeps_nothing(
    connection: Transport, settings: Settings
) -> None:
    assert b"meanwhile" not in await _left_then_rejoined(connection, settings, shared=False)


async def test_a_closed_shared_subscription_keeps_what_came_for_its_next_consumer(
    connection: Transport, settings: Settings
) -> None:
    assert (await _left_then_rejoined(connection, settings, shared=True))[:2] == [b"meanwhile", b"sentinel"]
