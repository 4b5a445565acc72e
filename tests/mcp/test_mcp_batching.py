"""The MCP front's list_changed notifications are batched on the leading edge: a lone change is
notified at once, the changes that come while a notification is being sent make exactly one more."""

from __future__ import annotations

import asyncio
import time

from mcp.server.subscriptions import InMemorySubscriptionBus, ToolsListChanged
from support import eventually

from discovery.mcp.server import forward_changes


async def test_a_lone_change_is_notified_at_once_and_a_burst_during_a_notification_is_one_more() -> None:
    bus = InMemorySubscriptionBus()
    sent: list[float] = []
    gate = asyncio.Event()

    async def notify() -> None:
        sent.append(time.monotonic())
        if len(sent) == 1:
            await gate.wait()  # the first notification stays in flight until the test lets it go

    forwarding = asyncio.create_task(forward_changes(bus, notify))
    try:
        await asyncio.sleep(0)  # its first step subscribes
        changed = time.monotonic()
        await bus.publish(ToolsListChanged())
        await eventually(lambda: sent, timeout=2)
        assert sent[0] - changed < 0.01, f"notified {(sent[0] - changed) * 1000:.1f} ms after the change"

        for _ in range(20):  # all while the first notification is in flight
            await bus.publish(ToolsListChanged())
        await asyncio.sleep(0.05)
        assert len(sent) == 1
        gate.set()
        await eventually(lambda: len(sent) == 2, timeout=2)
        await asyncio.sleep(0.05)  # room for a notification too many to show
        assert len(sent) == 2

        await bus.publish(ToolsListChanged())  # nothing in flight again: at once
        await eventually(lambda: len(sent) == 3, timeout=2)
    finally:
        forwarding.cancel()
        await asyncio.gather(forwarding, return_exceptions=True)
