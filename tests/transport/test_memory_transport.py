"""The in-memory transport keeps Pulsar's delivery semantics where a test of a service can tell the difference."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from support import eventually

from toolservice_base.transport import (
    Envelope,
    MemoryBroker,
    MemoryTransport,
    SubscribeOptions,
    SubscriptionOptions,
)
from toolservice_base.transport.memory import MemorySubscription

SENT = [str(n).encode() for n in range(6)]


async def _one_stalled_of_two(transport: MemoryTransport, topic: str, second: list[bytes]) -> MemorySubscription:
    """Two consumers of one Shared subscription, six messages sent; the first never finishes its first message."""

    async def stalls(message: Envelope) -> None:
        await asyncio.Event().wait()

    async def keeps(message: Envelope) -> None:
        second.append(message.data)

    stalled = await transport.subscribe(topic, stalls, subscription="work", shared=True)
    await transport.subscribe(topic, keeps, subscription="work", shared=True)
    publisher = await transport.publisher(topic)
    for data in SENT:
        await publisher.send(data)
    await eventually(lambda: len(second) == 3)  # round robin: the stalled consumer holds the other three
    return stalled


async def test_what_a_closed_consumer_of_a_persistent_topic_had_not_handled_goes_to_the_others() -> None:
    transport, second = MemoryBroker().transport(), []
    stalled = await _one_stalled_of_two(transport, "persistent://tg/request/work", second)
    await stalled.close()
    await eventually(lambda: sorted(second) == SENT)  # the one it was handling, and the two it had not begun
    await transport.close()


async def test_on_a_non_persistent_topic_they_are_lost_as_on_pulsar() -> None:
    transport, second = MemoryBroker().transport(), []
    stalled = await _one_stalled_of_two(transport, "non-persistent://tg/request/work", second)
    await stalled.close()
    await asyncio.sleep(0.05)
    assert sorted(second) == [b"1", b"3", b"5"]
    await transport.close()


async def test_every_transport_takes_the_subscribe_options_declared_once_and_refuses_an_unknown_one() -> None:
    """`SubscribeOptions` (the keywords) and `SubscriptionOptions` (their defaults) name the same options, and a
    transport reads them from there: an option it does not know is a TypeError, not silently ignored."""
    assert set(SubscribeOptions.__annotations__) == {field.name for field in dataclasses.fields(SubscriptionOptions)}
    assert SubscriptionOptions.of({}) == SubscriptionOptions()
    transport = MemoryBroker().transport()

    async def handler(message: Envelope) -> None:
        pass

    with pytest.raises(TypeError, match="exclusive"):
        await transport.subscribe("persistent://tg/request/x", handler, exclusive=True)  # type: ignore[call-arg]
    await transport.close()
