"""A client that vanishes in the middle of a call over streamable HTTP gives its call up at the service.

Over stdio a client that goes away ends its connection, and with it every call it made: the
service hears a cancel and frees the call's slot. Over HTTP the session outlives its connections,
so a dropped response stream must do the same, or a service with a few slots fills up with calls
nobody waits for. The client here is the official SDK's, in a process of its own, killed with
SIGKILL mid-call (it sends nothing on its way out); the server is `McpFront` + `http_server` on a
pulsar-lite broker, in the test's event loop, with a service of two slots and no backlog, so a
third call while two are held is refused `busy` at once.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from support import eventually
from support.mcp import ERAS, Era, http_session, text_of

from agent_bridge import ToolSet
from discovery.mcp.server import McpFront
from discovery.mcp.transports import http_server
from discovery.registry.service import Registry
from toolservice_base import DynamicToolService, Settings

CLIENT = Path(__file__).with_name("vanishing_client.py")


class TwoSlots(DynamicToolService):
    """`hang` never returns, `hold` returns when the test lets it, `ping` at once; two calls at a time, none waiting."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "two-slots"}
    tools: ClassVar[list[dict[str, Any]]] = [
        {"name": "hang", "description": "Never returns"},
        {"name": "hold", "description": "Returns once released"},
        {"name": "ping", "description": "Answers at once"},
    ]
    max_in_flight = 2
    max_backlog = 0

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.release = asyncio.Event()

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = "") -> str:
        if tool == "ping":
            return "pong"
        self.started.append(tool)
        try:
            if tool == "hold":
                await self.release.wait()
                return "released"
            await asyncio.Event().wait()
            return "never"
        except asyncio.CancelledError:
            self.cancelled.append(tool)
            raise


@pytest.fixture
async def service(settings: Settings, registry: Registry) -> AsyncIterator[TwoSlots]:
    svc = TwoSlots(settings=settings)
    await svc.start()
    yield svc
    svc.release.set()
    await svc.stop()


@pytest.fixture
async def endpoint(settings: Settings, service: TwoSlots) -> AsyncIterator[str]:
    async with ToolSet(settings=settings) as tools:
        await eventually(lambda: {"hang", "hold", "ping"} <= set(tools.names()), timeout=10)
        async with http_server(McpFront(tools), "127.0.0.1", 0) as url:
            yield url


async def _vanishing_call(url: str, era: Era, tool: str) -> asyncio.subprocess.Process:
    """A client process whose call of `tool` is in flight (it said so); the caller kills it."""
    client = await asyncio.create_subprocess_exec(
        sys.executable, str(CLIENT), url, era, tool, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    assert client.stdout is not None
    said = await asyncio.wait_for(client.stdout.readline(), 30)
    assert said == b"calling\n", said + await client.stdout.read()
    return client


@pytest.mark.parametrize("era", ERAS)
async def test_a_client_killed_mid_call_frees_its_slot_and_a_connected_client_is_unaffected(
    era: Era, endpoint: str, service: TwoSlots
) -> None:
    async with http_session(endpoint, era) as (session, _):
        held = asyncio.create_task(session.call_tool("hold", {}))  # a client that stays: its call must go on
        try:
            await eventually(lambda: service.started == ["hold"])
            vanishing = await _vanishing_call(endpoint, era, "hang")
            await eventually(lambda: service.started == ["hold", "hang"])
            refused = await session.call_tool("ping", {})  # both slots held, no backlog
            assert refused.is_error and text_of(refused).startswith("busy"), text_of(refused)

            vanishing.send_signal(signal.SIGKILL)
            await vanishing.wait()
            await eventually(lambda: service.cancelled == ["hang"], timeout=3, explain=lambda: service.cancelled)
            assert text_of(await session.call_tool("ping", {})) == "pong"  # the slot is free again, at once

            assert not held.done()
            service.release.set()
            answer = await asyncio.wait_for(held, 5)
            assert not answer.is_error and text_of(answer) == "released"
            assert service.cancelled == ["hang"]
        finally:
            held.cancel()
