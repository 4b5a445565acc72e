"""How a service comes up: its queues open at once, and nothing is announced before it can take requests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from support import eventually
from support.registry import descriptors

from toolservice_base import Announcer, Settings, Transport, TransportError
from toolservice_base.examples.echo import EchoService
from toolservice_base.schemas import Probe
from toolservice_base.transport import Envelope

pytestmark = pytest.mark.contract


async def heard(connection: Transport) -> list[dict[str, Any]]:
    """Every announcement on `tool-descriptors` from now on, parsed."""
    seen: list[dict[str, Any]] = []

    async def keep(message: Envelope) -> None:
        seen.append(json.loads(message.data))

    await connection.subscribe(connection.topics.tool_descriptors, keep)
    return seen


async def test_a_probe_before_the_first_announce_is_answered_by_that_announce_alone(connection: Transport) -> None:
    seen = await heard(connection)
    service, tools = descriptors("svc", ("t",))
    announcer = Announcer(connection, service, tools, ttl=30)
    probes = await connection.publisher(connection.topics.tool_probe)
    try:
        await announcer.open()
        await probes.send(Probe(reason="a registry started").to_json())
        await asyncio.sleep(0.3)
        assert seen == []  # the service may not take requests yet: an announce now would send callers nowhere
        await announcer.announce()
        await eventually(lambda: [m["kind"] for m in seen] == ["announce"])
        await probes.send(Probe(reason="a registry started").to_json())
        await eventually(
            lambda: [m["kind"] for m in seen] == ["announce", "announce"]
        )  # from now on, probes are answered
    finally:
        await announcer.stop()
    await eventually(lambda: seen[-1]["kind"] == "withdraw")


async def test_an_announcer_that_never_announced_withdraws_nothing(connection: Transport) -> None:
    seen = await heard(connection)
    service, tools = descriptors("svc", ("t",))
    announcer = Announcer(connection, service, tools, ttl=30)
    await announcer.open()
    await announcer.stop()
    await asyncio.sleep(0.3)
    assert seen == []


class _RefusedQueue:
    """A real connection on which subscribing to one topic is refused (a missing grant), noting what it opened and
    closed."""

    def __init__(self, connection: Transport, refused: str) -> None:
        self._connection = connection
        self._refused = refused
        self.opened: list[Any] = []
        self.closed: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    async def publisher(self, topic: str) -> Any:
        publisher = await self._connection.publisher(topic)
        self.opened.append(publisher)
        return publisher

    async def subscribe(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic == self._refused:
            raise TransportError(f"not allowed to consume on {topic}")
        subscription = await self._connection.subscribe(topic, *args, **kwargs)
        self.opened.append(subscription)
        return subscription

    async def unsubscribe(self, subscription: Any) -> None:
        self.closed.append(subscription)
        await self._connection.unsubscribe(subscription)

    async def close_publisher(self, publisher: Any) -> None:
        self.closed.append(publisher)
        await self._connection.close_publisher(publisher)


async def test_a_service_whose_start_fails_half_way_announces_nothing_and_closes_all_it_opened(
    settings: Settings,
    connection: Transport,
) -> None:
    seen = await heard(connection)
    service = EchoService(settings=settings, connection=connection)
    refusing = _RefusedQueue(connection, service.service_descriptor.request_queue)
    service._connection = refusing  # type: ignore[assignment]
    with pytest.raises(TransportError, match="not allowed"):
        await service.start()
    await asyncio.sleep(0.3)
    assert seen == []
    assert refusing.opened and sorted(map(id, refusing.closed)) == sorted(map(id, refusing.opened))


class _StalledSends:
    """A real connection whose sends on `tool-descriptors` wait (a broker gone away: a send waits for its timeout) until
    released."""

    def __init__(self, connection: Transport) -> None:
        self._connection = connection
        self.released = asyncio.Event()
        self.released.set()
        self.sent: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    async def publisher(self, topic: str) -> Any:
        real = await self._connection.publisher(topic)
        outer = self

        class Stalling:
            def __init__(self) -> None:
                self.topic = topic

            async def send(
                self, payload: Any, properties: dict[str, str] | None = None, *, key: str | None = None
            ) -> None:
                await outer.released.wait()
                outer.sent.append(json.loads(payload)["kind"])
                await real.send(payload, properties)

            @property
            def connected(self) -> bool:
                return outer.released.is_set()

            async def close(self) -> None:
                await real.close()

        return Stalling()


async def test_heartbeats_held_up_by_the_broker_are_not_piled_up_nor_warned_about_every_period(
    connection: Transport,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A heartbeat whose send waits outlives the next period: that one is skipped quietly, not queued, not warned
    about."""
    stalled = _StalledSends(connection)
    service, tools = descriptors("svc", ("t",))
    announcer = Announcer(stalled, service, tools, ttl=0.3)  # type: ignore[arg-type]
    await announcer.start()
    try:
        await eventually(lambda: stalled.sent.count("heartbeat") >= 2)
        stalled.released.clear()
        with caplog.at_level("WARNING", logger="apscheduler"):
            await asyncio.sleep(0.8)  # eight periods while one heartbeat waits
        assert [r.getMessage() for r in caplog.records if r.name.startswith("apscheduler")] == []
        before = stalled.sent.count("heartbeat")
        stalled.released.set()
        await asyncio.sleep(0.05)
        assert stalled.sent.count("heartbeat") - before <= 1  # the one that waited went out; no backlog of stale ones
        await eventually(lambda: stalled.sent.count("heartbeat") >= before + 3)  # and the beat goes on
    finally:
        stalled.released.set()
        await announcer.stop()
