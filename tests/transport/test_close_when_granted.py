"""What the broker grants after its caller gave up is closed when it comes, never left holding a topic for nobody."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from typing import Any

import pytest
from apache_pulsar import ApachePulsar
from support import eventually

from toolservice_base import Settings, open_transport
from toolservice_base.tasks import close_when_granted


async def test_a_grant_that_comes_after_the_caller_left_is_closed_and_nothing_is_kept() -> None:
    loop = asyncio.get_running_loop()
    closed: list[str] = []

    async def close(value: str) -> None:
        closed.append(value)

    keep: set[asyncio.Future[Any]] = set()
    granted, failed, withdrawn = loop.create_future(), loop.create_future(), loop.create_future()
    for opening in (granted, failed, withdrawn):
        close_when_granted(opening, close, keep)
    assert keep == {granted, failed, withdrawn}  # held while open: the loop keeps only weak references
    granted.set_result("producer")
    failed.set_exception(RuntimeError("refused"))
    withdrawn.cancel()
    await eventually(lambda: not keep, timeout=2, interval=0.01)
    assert closed == ["producer"]  # only what was granted is closed; a refusal or a cancel has nothing to close
    failed.exception()


def publishers(apache: ApachePulsar, topic: str) -> list[Any]:
    path = topic.replace("://", "/")
    request = urllib.request.Request(
        f"{apache.admin_url}/admin/v2/{path}/stats", headers={"Authorization": f"Bearer {apache.token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        stats: dict[str, Any] = json.load(answer)
    return list(stats.get("publishers", []))


@pytest.mark.apache_pulsar
@pytest.mark.timeout(120)
async def test_a_producer_opened_for_a_caller_that_gave_up_is_closed_when_the_broker_grants_it(
    apache_pulsar: ApachePulsar, tenant: str
) -> None:
    settings = Settings(
        pulsar_url=apache_pulsar.url, broker="apache-pulsar", topicspace=tenant, auth_token=apache_pulsar.token
    )
    topic = f"persistent://{tenant}/state/gave-up-{uuid.uuid4().hex[:8]}"
    async with await open_transport(settings) as connection:
        kept = await connection.publisher(topic)  # the topic exists, and one producer is ours on purpose
        assert len(publishers(apache_pulsar, topic)) == 1
        for _ in range(5):
            opening = asyncio.ensure_future(connection.publisher(topic))
            await asyncio.sleep(0)  # the open is on its way to the broker: cancelling cannot withdraw it
            opening.cancel()
            with pytest.raises(asyncio.CancelledError):
                await opening
        await eventually(lambda: len(publishers(apache_pulsar, topic)) == 1, timeout=10, interval=0.1)
        await asyncio.sleep(1.0)
        assert len(publishers(apache_pulsar, topic)) == 1  # and none comes back later
        await kept.send(b"still ours")  # our own producer was never touched
