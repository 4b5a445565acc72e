"""`toolreg mcp --http` under sessions opened and abandoned: they expire when idle, are capped, memory stays bounded.

A client that opens a session (initialize) and never comes back used to cost
the server its session until the SDK's 30-minute idle timeout, up to 10,000
of them: measured, 2,000 abandoned sessions took a server from 97 to 176 MB.
Now a session idle for `TOOLREG_MCP_SESSION_IDLE` seconds (5 minutes by
default) is closed, and past `TOOLREG_MCP_MAX_SESSIONS` open ones (1,000) a
new one is refused with 503 until one ends. The server runs as the command an
operator starts; a client opens 10,000 sessions and abandons each.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
from support import eventually, toolreg_env

from discovery.broker import EmbeddedBroker
from discovery.store.service import ConfigStoreService

pytestmark = pytest.mark.timeout(180)

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "gone", "version": "1"}},
    }
)
IDLE, CAP, ABANDONED = 2.0, 200, 10_000


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
async def server(
    broker: EmbeddedBroker, config_store: ConfigStoreService, tmp_path: Path
) -> AsyncIterator[tuple[str, int]]:
    """`toolreg mcp --http 127.0.0.1:0` with a short idle timeout and a small cap; its URL and pid."""
    env = toolreg_env(
        broker.url, tmp_path / "mcp", TOOLREG_MCP_SESSION_IDLE=str(IDLE), TOOLREG_MCP_MAX_SESSIONS=str(CAP)
    )
    with open(tmp_path / "mcp.log", "ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "discovery.cli", "mcp", "--http", "127.0.0.1:0", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=log,
        )  # fmt: skip
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("mcp "), line
        yield line.split()[1], process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)


async def open_session(http: httpx2.AsyncClient, url: str) -> tuple[int, str | None]:
    """Initialize and walk away: the status, and the session id the server gave."""
    response = await http.post(url, content=INITIALIZE, headers=ACCEPT)
    return response.status_code, response.headers.get("mcp-session-id")


async def test_abandoned_sessions_expire_when_idle_are_capped_and_memory_stays_bounded(
    server: tuple[str, int],
) -> None:
    url, pid = server
    limits = httpx2.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx2.AsyncClient(timeout=10, limits=limits) as http:
        status, first = await open_session(http, url)
        assert status == 200 and first
        before = rss_mb(pid)
        statuses: Counter[int] = Counter()
        for start in range(0, ABANDONED, 500):
            batch = await asyncio.gather(*(open_session(http, url) for _ in range(start, start + 500)))
            statuses.update(status for status, _ in batch)
        grown = rss_mb(pid) - before
        assert set(statuses) <= {200, 503} and statuses[503] > 0, statuses
        # the first session, idle since, is gone: its client is told to start again (404 per the MCP spec)
        await asyncio.sleep(IDLE + 1)
        again = await http.post(url, content=INITIALIZE, headers={**ACCEPT, "mcp-session-id": first})
        assert again.status_code == 404, again.status_code
        # and once the abandoned ones expired, a new client gets a session at once
        assert (await eventually(lambda: open_session(http, url), timeout=IDLE * 3))[0] == 200
    assert grown < 40, f"{ABANDONED} abandoned sessions grew the server by {grown:.0f} MB ({statuses})"
