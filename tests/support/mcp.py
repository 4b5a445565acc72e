"""Helpers for the MCP tests (imported as `mcp_support`): real SDK clients against `toolreg mcp`.

`Era` names the two ways a client speaks the protocol: `legacy` opens with
the `initialize` handshake (the SDK negotiates 2025-11-25) and is told of
changes by `notifications/tools/list_changed`; `modern` opens with
`server/discover` (2026-07-28) and is told on a `subscriptions/listen` stream.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import listen
from mcp.shared._httpx_utils import create_mcp_http_client

from support import toolreg_env

ROOT = Path(__file__).resolve().parents[2]
Era = Literal["legacy", "modern"]
ERAS: tuple[Era, ...] = ("legacy", "modern")
VERSION = {"legacy": "2025-11-25", "modern": "2026-07-28"}


class Changes:
    """Tool-list changes as this client's era delivers them, each stamped with its arrival time (monotonic)."""

    def __init__(self) -> None:
        self.arrivals: asyncio.Queue[float] = asyncio.Queue()
        self.stray: list[Any] = []  # anything else the server pushed: transport errors would land here
        self.listening = False  # 2026-07-28: counted from the listen stream (the SDK also tees its frames here)

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            if not self.listening:
                self.arrivals.put_nowait(time.monotonic())
        elif isinstance(message, Exception):
            self.stray.append(message)

    async def next(self, timeout: float = 5.0) -> float:
        """When the next change arrived; fails if none does within `timeout`."""
        try:
            return await asyncio.wait_for(self.arrivals.get(), timeout)
        except TimeoutError:
            raise AssertionError(f"no tools-changed notification within {timeout:g}s") from None

    async def none_within(self, seconds: float) -> None:
        try:
            arrived = await asyncio.wait_for(self.arrivals.get(), seconds)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected tools-changed notification at {arrived}")


@asynccontextmanager
async def opened(session: ClientSession, era: Era, changes: Changes) -> AsyncIterator[ClientSession]:
    """Open the session in `era` and start listening for changes the way that era does."""
    if era == "legacy":
        await session.initialize()
        yield session
        return
    await session.discover()
    changes.listening = True
    async with listen(session, tools_list_changed=True) as subscription:

        async def pump() -> None:
            async for _ in subscription:
                changes.arrivals.put_nowait(time.monotonic())

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(pump)
            try:
                yield session
            finally:
                tasks.cancel_scope.cancel()


def mcp_command(url: str, data_dir: Path, *args: str, **env: str) -> StdioServerParameters:
    """`toolreg mcp ARGS` as an MCP client spawns it (`python -m discovery.cli` is the `toolreg` script)."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "discovery.cli", "mcp", *args],
        env=toolreg_env(url, data_dir, **env),
        cwd=str(ROOT),
    )


@asynccontextmanager
async def stdio_session(
    url: str, data_dir: Path, era: Era, *args: str, errlog: Path | None = None, **env: str
) -> AsyncIterator[tuple[ClientSession, Changes]]:
    """A `ClientSession` on a `toolreg mcp` subprocess over stdio, opened in `era`."""
    changes = Changes()
    log = open(errlog or data_dir / "mcp-stderr.log", "a")
    async with AsyncExitStack() as stack:
        stack.callback(log.close)
        read, write = await stack.enter_async_context(
            stdio_client(mcp_command(url, data_dir, *args, **env), errlog=log)
        )
        session = await stack.enter_async_context(
            ClientSession(read, write, message_handler=changes.on_message, read_timeout_seconds=30)
        )
        await stack.enter_async_context(opened(session, era, changes))
        yield session, changes
    assert not changes.stray, f"the client saw transport errors (stdout not clean?): {changes.stray!r}"


@asynccontextmanager
async def http_session(
    endpoint: str, era: Era, token: str | None = None, auth: httpx2.Auth | None = None
) -> AsyncIterator[tuple[ClientSession, Changes]]:
    """A `ClientSession` on a streamable-HTTP endpoint, opened in `era`; `auth`: the SDK's OAuth flow, say."""
    changes = Changes()
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(create_mcp_http_client(headers=headers, auth=auth))
        read, write = await stack.enter_async_context(streamable_http_client(endpoint, http_client=http))
        session = await stack.enter_async_context(
            ClientSession(read, write, message_handler=changes.on_message, read_timeout_seconds=30)
        )
        await stack.enter_async_context(opened(session, era, changes))
        yield session, changes


async def list_all(session: ClientSession) -> tuple[list[types.Tool], int]:
    """Every tool, following `nextCursor`; also how many pages it took."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    pages = 0
    while True:
        result = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        pages += 1
        tools += result.tools
        cursor = result.next_cursor
        if cursor is None:
            return tools, pages


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


def static_tools(count: int, service: str = "bulk") -> list[tuple[str, str, str]]:
    """`count` hand-written tool items (and their service) as `(type, key, value)` for `ConfigClient.put`."""
    items = [
        (
            "tool-service",
            service,
            json.dumps(
                {
                    "id": service,
                    "request-queue": f"non-persistent://tg/request/{service}",
                    "response-queue": f"non-persistent://tg/response/{service}",
                }
            ),
        )
    ]
    for n in range(count):
        name = f"bulk.tool-{n:04d}"
        items.append(
            (
                "tool",
                name,
                json.dumps(
                    {
                        "type": "tool-service",
                        "name": name,
                        "description": f"Bulk tool number {n}",
                        "service": service,
                        "arguments": [{"name": "text", "type": "string", "description": "Anything"}],
                    }
                ),
            )
        )
    return items
