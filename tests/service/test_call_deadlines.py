"""A hanging tool costs its callers their own timeout, never the whole service.

The service gives every call a deadline: the caller's (its timeout travels in
the request's `timeout-ms` property) or the service's own limit, per service
or per tool, whichever comes first. At the deadline the call's work is
cancelled and its slot released, even if `invoke` ignores the cancellation; a
service whose slots and backlog are full answers `busy` at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import pytest
import structlog
from support import eventually

from agent_bridge import RequestTimeout, ToolError, ToolServiceClient
from toolservice_base import DynamicToolService, ServiceDefinitionError, Settings, Transport

pytestmark = pytest.mark.contract


class Stuck(DynamicToolService):
    """`hang` never returns; `ping` answers at once. Told apart by a config value, as a multi-tool service of old
    did."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "stuck", "config-params": [{"name": "mode"}]}
    tools: ClassVar[list[dict[str, Any]]] = [
        {"name": "hang", "description": "Never returns", "mode": "hang"},
        {"name": "ping", "description": "Answers at once", "mode": "ping"},
        {"name": "stubborn", "description": "Ignores cancellation for 3 s", "mode": "stubborn"},
    ]
    max_in_flight = 4

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.started = 0
        self.cancelled = 0

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        if config.get("mode") == "ping":
            return "pong"
        self.started += 1
        try:
            if config.get("mode") == "stubborn":
                until = time.monotonic() + 3
                while time.monotonic() < until:  # swallows every cancellation for 3 s
                    try:
                        await asyncio.sleep(until - time.monotonic())
                    except asyncio.CancelledError:
                        continue
                return "too late"
            await asyncio.Event().wait()
            return "never"
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


HANG = {"mode": "hang"}
PING = {"mode": "ping"}


async def test_calls_that_never_return_free_their_slots_at_the_callers_deadline(
    settings: Settings, connection: Transport
) -> None:
    async with Stuck(settings=settings, announce=False) as svc:
        client = ToolServiceClient(connection, svc.service_descriptor)
        # Six hanging calls on four slots: four run, two wait; all callers give up after 0.5 s.
        outcomes = await asyncio.gather(*(client.call("", HANG, {}, 0.5) for _ in range(6)), return_exceptions=True)
        assert all(isinstance(o, RequestTimeout) for o in outcomes), outcomes

        started = time.monotonic()
        assert await client.call("", PING, {}, 3) == "pong"
        assert time.monotonic() - started < 1.5  # the service is not saturated: its slots came back

        # The work nobody waited for was cancelled (a waiting call may get a slot in the moment before its deadline).
        await eventually(lambda: 4 <= svc.started == svc.cancelled <= 6, timeout=3)
        await client.close()


async def test_the_service_limit_ends_a_call_whose_caller_would_wait_longer(
    settings: Settings, connection: Transport
) -> None:
    class Limited(Stuck):
        call_timeout = 0.3

    async with Limited(settings=settings, announce=False) as svc:
        client = ToolServiceClient(connection, svc.service_descriptor)
        started = time.monotonic()
        with pytest.raises(ToolError) as caught:
            await client.call("", HANG, {}, 10)
        assert caught.value.type == "timeout"
        assert "0.3s" in caught.value.message
        assert time.monotonic() - started < 2
        await eventually(lambda: svc.cancelled == 1)
        await client.close()


async def test_a_per_tool_limit_overrides_the_service_limit(settings: Settings, connection: Transport) -> None:
    class PerTool(Stuck):
        call_timeout = 30.0
        tool_timeouts: ClassVar[dict[str, float]] = {"hang": 0.2}

    async with PerTool(settings=settings, announce=False) as svc:
        client = ToolServiceClient(connection, svc.service_descriptor)
        started = time.monotonic()
        with pytest.raises(ToolError, match="timeout"):
            await client.call("", HANG, {}, 10, tool="hang")
        assert time.monotonic() - started < 2
        await client.close()


def test_a_limit_for_a_tool_the_service_does_not_have_is_refused_at_definition() -> None:
    class Typo(Stuck):
        tool_timeouts: ClassVar[dict[str, float]] = {"hnag": 1.0}

    with pytest.raises(ServiceDefinitionError, match="hnag"):
        Typo(settings=Settings(pulsar_url="pulsar://unused:1"))


async def test_a_saturated_service_answers_busy_at_once(settings: Settings, connection: Transport) -> None:
    class Small(Stuck):
        max_in_flight = 1
        max_backlog = 1

    async with Small(settings=settings, announce=False) as svc:
        client = ToolServiceClient(connection, svc.service_descriptor)
        running = [asyncio.create_task(client.call("", HANG, {}, 20)) for _ in range(2)]  # one runs, one waits
        await eventually(lambda: svc.started == 1)
        await asyncio.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(ToolError) as caught:
            await client.call("", PING, {}, 5)
        assert caught.value.type == "busy"
        assert "retry" in caught.value.message
        assert time.monotonic() - started < 1
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

        async def answers() -> bool:
            try:
                return await client.call("", PING, {}, 1) == "pong"
            except ToolError:
                return False

        # The callers gave up: they told the service, which cancels their calls and answers again,
        # long before the 20 s those calls were given.
        await eventually(answers, timeout=3)
        assert svc.started == svc.cancelled
        await client.close()


async def test_a_slot_is_released_even_when_invoke_ignores_its_cancellation(
    settings: Settings, connection: Transport
) -> None:
    class One(Stuck):
        max_in_flight = 1

    with structlog.testing.capture_logs() as logs:
        async with One(settings=settings, announce=False) as svc:
            client = ToolServiceClient(connection, svc.service_descriptor)
            with pytest.raises(RequestTimeout):
                await client.call("", {"mode": "stubborn"}, {}, 0.3)
            started = time.monotonic()
            assert await client.call("", PING, {}, 5) == "pong"
            assert time.monotonic() - started < 2.5  # the grace after the deadline, not the 3 s the call goes on for
            await client.close()
    assert any(entry["event"] == "request.cancel_ignored" for entry in logs)
