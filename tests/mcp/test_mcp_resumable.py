"""`toolreg mcp --http` streams are resumable (SEP-1699): each opens with a priming event (an id, no data) and a
`retry`, every event has an id, and a client that lost its stream reconnects with `Last-Event-ID` and gets what
it missed. The event store behind it is bounded in count and bytes, and names events unguessably."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
from support import eventually

from agent_bridge import ToolSet
from discovery.mcp.events import BoundedEventStore
from discovery.mcp.server import McpFront
from discovery.mcp.transports import http_server
from discovery.registry.service import Registry
from toolservice_base import Settings
from toolservice_base.examples.calculator import CalculatorService

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
VERSION = "2025-11-25"


def message(number: int, size: int = 10) -> types.JSONRPCMessage:
    return types.JSONRPCNotification(
        jsonrpc="2.0", method="notifications/message", params={"n": number, "pad": "x" * size}
    )


async def replayed(store: BoundedEventStore, after: str) -> tuple[str | None, list[int]]:
    seen: list[int] = []

    async def send(event: object) -> None:
        seen.append(event.message.params["n"])  # type: ignore[attr-defined]

    return await store.replay_events_after(after, send), seen


async def test_the_store_replays_a_streams_later_events_and_forgets_the_oldest_past_its_bounds() -> None:
    store = BoundedEventStore(max_events=5, max_bytes=10_000, max_event_bytes=1000)
    first = await store.store_event("a", None)  # a priming event
    ids = [await store.store_event("a" if n % 2 == 0 else "b", message(n)) for n in range(4)]
    assert await replayed(store, first) == ("a", [0, 2]), "only its own stream's events, in order"
    assert await replayed(store, ids[1]) == ("b", [3])
    assert ids[0].split(".")[0] != ids[1].split(".")[0] and len(ids[0].split(".")[0]) == 24, "a random token a stream"
    assert await replayed(store, "guessed.0") == (None, [])
    big = await store.store_event("a", message(9, size=5000))  # numbered, not kept
    assert await replayed(store, big) == (None, [])
    for n in range(10, 20):
        await store.store_event("c", message(n))
    assert store.size == 5 and await replayed(store, first) == (None, []), "the oldest went first"
    heavy = BoundedEventStore(max_events=100, max_bytes=2000, max_event_bytes=1000)
    for n in range(10):
        await heavy.store_event("d", message(n, size=500))
    assert heavy.size <= 3


@pytest.fixture
async def endpoint(settings: Settings, registry: Registry, tmp_path: Path) -> AsyncIterator[str]:
    async with CalculatorService(settings=settings), ToolSet(settings=settings, data_dir=tmp_path) as tools:
        await tools.wait_for(lambda t: "calculate" in t, timeout=10)
        async with http_server(McpFront(tools), "127.0.0.1", 0) as url:
            yield url


def events(text: str) -> list[dict[str, str]]:
    found, current = [], {}
    for line in text.splitlines():
        if not line:
            if current:
                found.append(current)
            current = {}
            continue
        field, _, value = line.partition(":")
        current[field] = value.strip()
    return found + ([current] if current else [])


async def test_a_call_stream_is_primed_and_a_reconnecting_client_gets_the_answer_again(endpoint: str) -> None:
    async with httpx2.AsyncClient() as http:
        opened = await http.post(
            endpoint,
            headers=ACCEPT,
            content=json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": VERSION,
                        "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "1"},
                    },
                }
            ),
        )
        session = {**ACCEPT, "Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": VERSION}
        await http.post(
            endpoint, headers=session, content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        )
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "calculate", "arguments": {"expression": "6*7"}},
        }
        answered = await http.post(endpoint, headers=session, content=json.dumps(call))
        primed, *rest = events(answered.text)
        assert primed.get("id") and primed.get("data", "") == "" and primed.get("retry") == "1000", primed
        assert all(event.get("id") for event in rest)
        resumed = await eventually(lambda: _resume(http, endpoint, session, primed["id"]), timeout=5)
        assert json.loads(resumed["data"])["result"]["content"][0]["text"] == "42"


async def _resume(http: httpx2.AsyncClient, endpoint: str, session: dict[str, str], last: str) -> dict[str, str] | None:
    async with http.stream("GET", endpoint, headers={**session, "Last-Event-ID": last}, timeout=5) as replay:
        text = ""
        async for chunk in replay.aiter_text():
            text += chunk
            found = [e for e in events(text) if e.get("data", "").startswith("{")]
            if found:
                return found[0]
    return None
