"""The simulator's broker model, held to the real broker: each rule it assumes and no other test pins, on Apache
Pulsar. (The exclusive producer's modes, fencing, and readers from a position are pinned by
tests/transport/test_exclusive_and_readers.py; `broker.py` names each rule.)"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
from apache_pulsar import ApachePulsar
from support import eventually

from toolservice_base import Settings, open_transport
from toolservice_base.errors import Fenced
from toolservice_base.transport import Envelope, Transport

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(120)]


@pytest.fixture
def settings(apache_pulsar: ApachePulsar, tenant: str, tmp_path: object) -> Settings:
    return Settings(
        pulsar_url=apache_pulsar.url,
        broker="apache-pulsar",
        topicspace=tenant,
        auth_token=apache_pulsar.token,
        operation_timeout=5,
    )


@pytest.fixture
async def two(settings: Settings) -> AsyncIterator[tuple[Transport, Transport]]:
    async with AsyncExitStack() as stack:
        one = await stack.enter_async_context(await open_transport(settings))
        other = await stack.enter_async_context(await open_transport(settings))
        yield one, other


async def test_an_idle_holder_fenced_off_the_lock_is_not_told_until_it_sends(
    two: tuple[Transport, Transport],
) -> None:
    """Why an active confirms its lock before it answers (`ReplicaCore.confirm`): the broker does not tell it."""
    one, other = two
    topic = f"{one.topics.state_lock}-{uuid.uuid4().hex[:6]}"
    holder = await one.exclusive_publisher(topic, "exclusive")
    await other.exclusive_publisher(topic, "fence")
    await asyncio.sleep(1.0)
    assert holder.connected and not holder.fenced, "the broker told an idle fenced holder after all"
    with pytest.raises(Fenced):
        await holder.send(b"after the fence")


async def test_a_request_a_consumer_never_finished_goes_to_another_consumer_once_the_first_is_gone(
    settings: Settings,
) -> None:
    """Why a request on its way to a deposed or killed active is answered by the next one (`Journal.made`)."""
    topic = f"non-persistent://{settings.topicspace}/request/model-{uuid.uuid4().hex[:6]}"
    topic = topic.replace("non-persistent://", "persistent://")
    first_got: list[bytes] = []
    second_got: list[bytes] = []
    never = asyncio.Event()

    async def hold(message: Envelope) -> None:
        first_got.append(message.data)
        await never.wait()  # taken, never finished: never acknowledged

    async def take(message: Envelope) -> None:
        second_got.append(message.data)

    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(await open_transport(settings))
        second = await stack.enter_async_context(await open_transport(settings))
        sender = await stack.enter_async_context(await open_transport(settings))
        await first.subscribe(topic, hold, subscription="model", shared=True)
        publisher = await sender.publisher(topic)
        await publisher.send(b"request")
        await eventually(lambda: first_got == [b"request"], timeout=20)
        await second.subscribe(topic, take, subscription="model", shared=True)
        await first.close()  # its connection gone, the request unacknowledged
        await eventually(lambda: second_got == [b"request"], timeout=30)
