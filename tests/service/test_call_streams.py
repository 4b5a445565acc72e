"""A stream is bounded: in time as a whole, in its gaps, and in size; and a caller that gives up stops it.

`call_timeout` bounds the whole call, streams included; `idle_timeout` (off
unless set) bounds each gap between chunks; `max_answer_bytes` bounds what a
caller takes in. When the caller gives up for any reason (a timeout, too much
data, or simply leaving the loop), the service stops producing.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, ClassVar

import pytest
from support import eventually, static_items

from agent_bridge import AnswerTooLarge, CallLimits, RequestTimeout, ToolError, ToolServiceClient, ToolSet
from toolservice_base import ConfigClient, DynamicToolService, Settings, Transport
from toolservice_base.transport import MESSAGE_LIMIT

pytestmark = pytest.mark.contract


class Endless(DynamicToolService):
    """Streams 1 KB chunks forever (`endless`), or one chunk and then silence (`stall`)."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "endless", "config-params": [{"name": "mode"}]}
    tools: ClassVar[list[dict[str, Any]]] = [
        {"name": "endless", "description": "Never stops", "mode": "endless"},
        {"name": "stall", "description": "One chunk, then nothing", "mode": "stall"},
    ]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.produced = 0
        self.closed = 0

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> AsyncIterator[str]:
        try:
            if config.get("mode") == "stall":
                yield "first"
                await asyncio.sleep(60)
            while True:
                self.produced += 1
                yield "x" * 1000
                await asyncio.sleep(0.005)
        finally:
            self.closed += 1


async def stopped_producing(svc: Endless) -> None:
    """Wait until the service's generator has been closed and its count no longer moves."""
    await eventually(lambda: svc.closed >= 1, timeout=3)
    before = svc.produced
    await asyncio.sleep(0.3)
    assert svc.produced == before


async def test_call_timeout_bounds_a_whole_stream_and_the_service_stops_producing(
    settings: Settings, connection: Transport
) -> None:
    async with Endless(settings=settings, announce=False) as svc:
        client = ToolServiceClient(connection, svc.service_descriptor)
        started = time.monotonic()
        with pytest.raises(
            RequestTimeout, match="exceeded its total deadline of 1s while still streaming progress"
        ) as cut:
            await asyncio.wait_for(
                client.call("", {"mode": "endless"}, {}, CallLimits(timeout=1.0, max_answer_bytes=10**9)), 10
            )
        assert 0.9 < time.monotonic() - started < 2.0
        assert cut.value.received > 10 and f"({cut.value.received} progress messages received on " in str(cut.value)
        assert svc.produced > 10  # it was streaming all along: the bound is on the whole call, not on a gap
        await stopped_producing(svc)
        await client.close()


async def test_idle_timeout_bounds_the_gap_between_chunks(settings: Settings, connection: Transport) -> None:
    async with Endless(settings=settings, announce=False) as svc:
        client = ToolServiceClient(connection, svc.service_descriptor)
        received: list[str] = []
        started = time.monotonic()
        with pytest.raises(RequestTimeout, match="idle"):
            async with aclosing(
                client.stream("", {"mode": "stall"}, {}, CallLimits(timeout=10, idle_timeout=0.3))
            ) as chunks:
                async for chunk in chunks:
                    received.append(chunk)
        assert received == ["first"]
        assert time.monotonic() - started < 2
        await eventually(lambda: svc.closed == 1, timeout=3)
        await client.close()


async def test_an_answer_past_max_bytes_is_refused_and_the_service_stops(
    settings: Settings, connection: Transport
) -> None:
    async with Endless(settings=settings, announce=False) as svc:
        client = ToolServiceClient(connection, svc.service_descriptor)
        with pytest.raises(AnswerTooLarge) as caught:
            await client.call("", {"mode": "endless"}, {}, CallLimits(timeout=30, max_answer_bytes=50_000))
        assert isinstance(caught.value, ToolError) and caught.value.type == "answer-too-large"
        assert "50000 bytes" in str(caught.value)
        await stopped_producing(svc)  # long before the call's 30 s deadline: the caller told the service
        await client.close()


class Oversized(DynamicToolService):
    """Answers one text a little over the broker's message limit."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "oversized"}
    tools: ClassVar[list[dict[str, Any]]] = [{"name": "oversized", "description": "Too much at once"}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return "x" * (MESSAGE_LIMIT + 1000)


async def test_a_result_over_the_brokers_limit_is_told_to_the_caller_with_its_size_and_the_limit(
    settings: Settings, connection: Transport
) -> None:
    async with Oversized(settings=settings, announce=False) as svc:
        client = ToolServiceClient(connection, svc.service_descriptor)
        with pytest.raises(ToolError) as caught:
            await asyncio.wait_for(client.call("", {}, {}, CallLimits(timeout=30, max_answer_bytes=10**9)), 20)
        assert caught.value.type == "answer-too-large", caught.value
        told = re.search(r"the answer is (\d+) bytes, over the broker's message limit \((\d+) bytes", str(caught.value))
        assert told is not None, caught.value
        assert int(told[1]) > MESSAGE_LIMIT and int(told[2]) == MESSAGE_LIMIT
        await client.close()


async def test_leaving_a_stream_early_stops_the_service(settings: Settings, connection: Transport) -> None:
    async with Endless(settings=settings, announce=False) as svc:
        client = ToolServiceClient(connection, svc.service_descriptor)
        async with aclosing(client.stream("", {"mode": "endless"}, {}, 30)) as chunks:
            taken = 0
            async for _ in chunks:
                taken += 1
                if taken == 3:
                    break
        await stopped_producing(svc)
        assert svc.produced < 1000
        await client.close()


async def test_toolset_call_timeout_and_answer_size_bound_an_endless_tool(
    settings: Settings, connection: Transport, config_client: ConfigClient
) -> None:
    async with Endless(settings=settings, announce=False) as svc:
        await config_client.put(static_items(svc))
        async with ToolSet(connection=connection, settings=settings, limits=1.0, poll_interval=60) as tools:
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                await asyncio.wait_for(tools.invoke("endless"), 10)
            assert time.monotonic() - started < 2.0
            await stopped_producing(svc)
        async with ToolSet(
            connection=connection, settings=settings, limits=CallLimits(max_answer_bytes=20_000), poll_interval=60
        ) as tools:
            with pytest.raises(AnswerTooLarge):
                await asyncio.wait_for(tools.invoke("endless"), 10)
