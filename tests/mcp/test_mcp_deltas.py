"""The MCP front follows a change by what changed: its listing stays the one the whole set gives, and each change a
client can see is notified once."""

from __future__ import annotations

import json
import random
from typing import Any

from support import eventually

from agent_bridge import ToolSet
from discovery.mcp.server import Listing, McpFront
from toolservice_base import ConfigClient, Settings, Transport


def service(settings: Settings) -> tuple[str, str, str]:
    queue = f"non-persistent://{settings.topicspace}/response/mcp-deltas"
    body = {"id": "s", "request-queue": queue.replace("response", "request"), "response-queue": queue}
    return ("tool-service", "s", json.dumps(body))


def tool(name: str, revision: int) -> tuple[str, str, str]:
    body = {"type": "tool-service", "name": name, "service": "s", "description": f"{name}, revision {revision}"}
    return ("tool", name, json.dumps(body))


def shown(listing: Listing) -> list[dict[str, Any]]:
    return [t.model_dump() for t in listing.tools]


async def test_the_listing_follows_random_changes_as_the_whole_set_would_list_it_and_notifies_once_per_change(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    rng = random.Random(7)
    names = [f"tool-{n:02d}" for n in range(30)] + ["dotted.name", "other.dotted"]  # dots: MCP names of their own
    await config_client.put([service(settings)] + [tool(n, 0) for n in names[:10]])
    async with ToolSet(connection=connection, settings=settings, poll_interval=60) as tools:
        front = McpFront(tools, exclude=["tool-0[0-4]"])
        published: list[Any] = []
        publish = front.bus.publish

        async def counted(event: Any) -> None:
            published.append(event)
            await publish(event)

        front.bus.publish = counted  # type: ignore[method-assign]
        for step in range(120):
            name = rng.choice(names)
            visible = not name.startswith("tool-0") or name[6] > "4"
            before = shown(front.listing())
            if name in tools and rng.random() < 0.4:
                version = await config_client.delete([("tool", name)])
            else:
                version = await config_client.put([tool(name, rng.randint(0, 2))])
            await tools.wait_for(lambda t, v=version: t.version == v)  # type: ignore[misc]
            whole = shown(Listing.of(tools, front.filter))  # the callbacks run just after the swap: wait for the front
            await eventually(lambda w=whole: shown(front.listing()) == w, timeout=5)  # type: ignore[misc]
            expected = 1 if visible and whole != before else 0
            await eventually(lambda e=expected: len(published) >= e, timeout=5)  # type: ignore[misc]
            assert len(published) == expected, f"step {step}: {name}, {len(published)} notifications"
            published.clear()
