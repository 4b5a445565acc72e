"""`toolreg mcp --http` (streamable HTTP), driven by the official SDK's `ClientSession` in both protocol
eras, plus raw HTTP where a well-behaved client cannot go (no token, malformed JSON-RPC).

The server runs as the command an operator starts (`toolreg mcp --http 127.0.0.1:0 --token-file F`),
except where a test must see inside it (when the ToolSet applied a change, whether a call is still
in flight): those run `McpFront` + `http_server` in the test's own event loop."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from support import eventually, toolreg_env
from support.mcp import ERAS, VERSION, Era, http_session, list_all, static_tools, text_of

from agent_bridge import ToolSet
from discovery.broker import EmbeddedBroker
from discovery.mcp.server import McpFront
from discovery.mcp.transports import http_server
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, DynamicToolService, Settings
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService

TOKEN = "correct horse battery staple"
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
async def announced(
    settings: Settings, registry: Registry, config_client: ConfigClient
) -> AsyncIterator[list[DynamicToolService]]:
    services = [cls(settings=settings) for cls in (CalculatorService, CountdownService)]
    for service in services:
        await service.start()
    await eventually(lambda: _listed(config_client, {"calculate", "countdown"}), timeout=10)
    yield services
    for service in services:
        await service.stop()


async def _listed(client: ConfigClient, names: set[str]) -> bool:
    return names <= set(await client.list("tool"))


@pytest.fixture
async def endpoint(broker: EmbeddedBroker, config_store: ConfigStoreService, tmp_path: Path) -> AsyncIterator[str]:
    """`toolreg mcp --http 127.0.0.1:0 --token-file F` as its own process; the URL it printed."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with open(tmp_path / "mcp.log", "ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "discovery.cli",
            "mcp",
            "--http",
            "127.0.0.1:0",
            "--token-file",
            str(token_file),
            env=toolreg_env(broker.url, tmp_path / "mcp"),
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
        )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("mcp ") and "(bearer token required)" in line, line
        yield line.split()[1]
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0


def _sse_messages(response: httpx2.Response) -> list[dict]:
    if response.headers.get("content-type", "").startswith("application/json"):
        return [response.json()]
    return [
        json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()
    ]


async def test_without_the_token_there_is_401_and_no_tool_list(
    announced: list[DynamicToolService], endpoint: str
) -> None:
    listing = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    initialize = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        }
    )
    async with httpx2.AsyncClient() as http:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Basic {TOKEN}"},
            {"Authorization": TOKEN},
        ):
            for body in (initialize, listing):
                refused = await http.post(endpoint, content=body, headers={**ACCEPT, **headers})
                assert refused.status_code == 401, (headers, refused.text)
                assert refused.headers["www-authenticate"].startswith("Bearer")
                assert "calculate" not in refused.text
        allowed = await http.post(endpoint, content=initialize, headers={**ACCEPT, "Authorization": f"Bearer {TOKEN}"})
        assert allowed.status_code == 200 and _sse_messages(allowed)[0]["result"]["protocolVersion"] == "2025-11-25"


@pytest.mark.parametrize("era", ERAS)
async def test_lists_calls_streams_and_reports_service_errors_over_http(
    era: Era, announced: list[DynamicToolService], endpoint: str
) -> None:
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async with http_session(endpoint, era, token=TOKEN) as (session, _):
        assert session.protocol_version == VERSION[era]
        assert session.server_capabilities is not None and session.server_capabilities.tools is not None
        assert session.server_capabilities.tools.list_changed is True
        assert [t.name for t in (await list_all(session))[0]] == ["calculate", "countdown"]
        assert text_of(await session.call_tool("calculate", {"expression": "2 ** 10"})) == "1024"
        streamed = await session.call_tool("countdown", {"start": 2}, progress_callback=on_progress)
        await eventually(lambda: len(progress) == 3, timeout=2)
        assert progress == ["2\n", "1\n", "0\n"] and text_of(streamed) == "2\n1\n0\n"
        failed = await session.call_tool("calculate", {"expression": "import os"})
        assert failed.is_error is True and text_of(failed).startswith("ExpressionError: ")


@pytest.mark.parametrize("era", ERAS)
async def test_a_service_started_after_connecting_is_notified_and_callable_and_its_end_too(
    era: Era, announced: list[DynamicToolService], endpoint: str, settings: Settings
) -> None:
    async with http_session(endpoint, era, token=TOKEN) as (session, changes):
        echo = EchoService(settings=settings)
        started = time.monotonic()
        await echo.start()
        try:
            assert await changes.next(timeout=5) - started < 1.0
            assert text_of(await session.call_tool("echo", {"text": "hot-plugged"})) == "hot-plugged"
        finally:
            stopped = time.monotonic()
            await echo.stop()  # what SIGTERM runs: withdraw, then stop
        assert await changes.next(timeout=5) - stopped < 1.0
        assert "echo" not in [t.name for t in (await list_all(session))[0]]


@pytest.mark.parametrize("era", ERAS)
async def test_a_thousand_tools_page_through_over_http(era: Era, endpoint: str, config_client: ConfigClient) -> None:
    async with http_session(endpoint, era, token=TOKEN) as (session, changes):
        await config_client.put(static_tools(1000))  # hand-written items are followed live too
        await changes.next(timeout=5)
        tools, pages = await list_all(session)
        assert len({t.name for t in tools}) == 1000 and pages > 1
        first = await session.list_tools()
        if era == "modern":  # cache hints exist from 2026-07-28 on
            assert first.ttl_ms == 1000 and first.cache_scope == "private"


async def test_malformed_json_rpc_gets_an_error_and_the_session_keeps_serving(
    announced: list[DynamicToolService], endpoint: str
) -> None:
    auth = {**ACCEPT, "Authorization": f"Bearer {TOKEN}"}
    async with httpx2.AsyncClient() as http:
        opened = await http.post(
            endpoint,
            headers=auth,
            content=json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "1"},
                    },
                }
            ),
        )
        session = {**auth, "Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}
        await http.post(
            endpoint, headers=session, content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
        )

        garbage = await http.post(endpoint, headers=session, content=b'{"jsonrpc": "2.0", "id": 2, "method": ')
        assert garbage.status_code == 400 and garbage.json()["error"]["code"] == types.PARSE_ERROR
        bad_params = await http.post(
            endpoint,
            headers=session,
            content=json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": 17}}),
        )
        assert _sse_messages(bad_params)[0]["error"]["code"] == types.INVALID_PARAMS

        listed = await http.post(
            endpoint, headers=session, content=json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        )
        assert [t["name"] for t in _sse_messages(listed)[0]["result"]["tools"]] == ["calculate", "countdown"]

        modern = await http.post(endpoint, headers={**auth, "Mcp-Protocol-Version": "2026-07-28"}, content=b"{nope")
        assert modern.status_code == 400 and modern.json()["error"]["code"] == types.PARSE_ERROR
    async with http_session(endpoint, "modern", token=TOKEN) as (client, _):
        assert text_of(await client.call_tool("calculate", {"expression": "1 + 1"})) == "2"


# --- in the test's own event loop: what can only be seen from inside ------------


@pytest.fixture
async def served(
    settings: Settings, announced: list[DynamicToolService]
) -> AsyncIterator[tuple[ToolSet, list[float], str]]:
    """A ToolSet, the moments it applied each change, and an HTTP endpoint serving it."""
    async with ToolSet(settings=settings) as tools:
        applied: list[float] = []
        tools.on_change(lambda *change: applied.append(time.monotonic()))  # registered first: runs before the server's
        front = McpFront(tools)
        async with http_server(front, "127.0.0.1", 0) as url:
            yield tools, applied, url


@pytest.mark.parametrize("era", ERAS)
async def test_clients_are_told_within_100_ms_of_the_toolset_applying_a_change(
    era: Era, served: tuple[ToolSet, list[float], str], settings: Settings
) -> None:
    tools, applied, url = served
    async with http_session(url, era) as (session, changes):
        for _ in range(3):
            echo = EchoService(settings=settings)
            await echo.start()
            added = await changes.next(timeout=5)
            assert "echo" in tools and added - applied[-1] < 0.1, f"{(added - applied[-1]) * 1000:.1f} ms"
            await echo.stop()
            removed = await changes.next(timeout=5)
            assert "echo" not in tools and removed - applied[-1] < 0.1, f"{(removed - applied[-1]) * 1000:.1f} ms"


@pytest.mark.parametrize("era", ERAS)
async def test_a_cancelled_call_stops_waiting_for_the_service(
    era: Era, served: tuple[ToolSet, list[float], str]
) -> None:
    tools, _, url = served
    countdown = tools.get("countdown")
    in_flight = lambda: countdown.client.in_flight  # type: ignore[union-attr]  # noqa: E731
    async with http_session(url, era) as (session, _):
        first_chunk = anyio.Event()

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            first_chunk.set()

        async with anyio.create_task_group() as tasks:
            # 200 numbers, 10 ms apart: the service streams for 2 s, whatever the caller does.
            tasks.start_soon(lambda: session.call_tool("countdown", {"start": 200}, progress_callback=on_progress))
            with anyio.fail_after(5):
                await first_chunk.wait()
            assert in_flight() == 1
            cancelled = time.monotonic()
            tasks.cancel_scope.cancel()
        await eventually(lambda: in_flight() == 0, timeout=1)
        assert time.monotonic() - cancelled < 0.5
        assert text_of(await session.call_tool("calculate", {"expression": "3 * 3"})) == "9"
