"""`tools/call` to a command server sent past the SDK's session (`mcp_service.direct`), and what the session still does.

The sidecar writes a stdio server's `tools/call` itself and takes the answer off the pipe by id; the SDK's session
keeps the handshake, the listing, pings and the rest. Each test holds it to what the session's own path does, which
is still taken with tracing on (the session makes the request's span): the same results (plain, `isError`,
structured, a protocol error, a result outside the revision's schema), the same progress, the same error when the
server dies; a caller that stops waiting cancels at the server; its ids never meet the session's. Against
`@modelcontextprotocol/server-everything` from npm, and a server scripted line by line (`scripted_server.py`) for
what no well-behaved server does.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from support.mcp_sidecar import everything

from toolservice_base import ToolError, tracing
from toolservice_base.mcp_service.upstream import McpCommand, Upstream

SCRIPTED = Path(__file__).with_name("scripted_server.py")
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("echo", {"message": "hi"}),  # one text block
    ("get-structured-content", {"location": "Chicago"}),  # structured content, checked against its output schema
    ("get-resource-reference", {"resourceType": "Text", "resourceId": 1.5}),  # isError
    ("no-such-tool", {}),  # isError too, from this server
    ("trigger-long-running-operation", {"duration": 0.2, "steps": 2}),  # progress, then the result
]


@asynccontextmanager
async def connected(command: list[str]) -> AsyncIterator[Upstream]:
    server = McpCommand(command[0], tuple(command[1:]))
    async with Upstream(server, timeout=30, on_tools_changed=lambda: None) as upstream:
        yield upstream


@contextmanager
def through_the_session() -> Iterator[None]:
    """Tracing on: the call goes through the SDK session's dispatcher, which makes its span."""
    provider = TracerProvider()
    tracing.use_tracer_provider(provider)
    try:
        yield
    finally:
        tracing.use_tracer_provider(None)
        provider.shutdown()


class Steps:
    def __init__(self) -> None:
        self.seen: list[tuple[float, float | None, str | None]] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.seen.append((progress, total, message))


async def outcome(upstream: Upstream, name: str, arguments: dict[str, Any]) -> tuple[Any, list[Any]]:
    """A call's result (or its ToolError's type and message) and the progress it reported."""
    steps = Steps()
    try:
        result: Any = await upstream.call(name, arguments, steps)
    except ToolError as exc:
        result = ("ToolError", exc.type, exc.message)
    await asyncio.sleep(0.05)  # a progress step still on its way would be seen
    return result, steps.seen


def seen(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.02)


async def test_results_progress_and_errors_are_the_sessions_own() -> None:
    server = everything().command("stdio")
    async with connected(server) as upstream:
        direct = [await outcome(upstream, name, arguments) for name, arguments in CALLS]
    with through_the_session():
        async with connected(server) as upstream:
            session = [await outcome(upstream, name, arguments) for name, arguments in CALLS]
    assert direct == session
    plain, structured, failed, unknown, progressed = direct
    assert plain == ({"content": [{"type": "text", "text": "Echo: hi"}]}, [])
    assert {"temperature", "humidity"} <= structured[0]["structuredContent"].keys()
    assert failed[0]["isError"] is True and "Must be a finite positive integer" in failed[0]["content"][0]["text"]
    assert unknown[0]["isError"] is True and "not found" in unknown[0]["content"][0]["text"]
    assert progressed[1] == [(1.0, 2.0, None), (2.0, 2.0, None)]
    assert progressed[0]["content"][0]["text"].startswith("Long running operation completed")


async def test_its_ids_never_meet_the_sessions_while_both_are_in_flight(tmp_path: Path) -> None:
    ids = tmp_path / "seen"
    async with connected([sys.executable, str(SCRIPTED), str(ids)]) as upstream:
        calls = [upstream.call("whoami", {}, Steps()) for _ in range(40)]
        lists = [upstream.list_tools() for _ in range(5)]
        pings = [upstream.ping() for _ in range(5)]
        answered = await asyncio.gather(*calls, *lists, *pings)
        told = [json.loads(result["content"][0]["text"]) for result in answered[:40]]
        assert all(isinstance(told_id, str) and told_id.startswith("toolreg-") for told_id in told)
        assert len(set(told)) == 40
        assert all(
            [tool["name"] for tool in listed]
            == ["whoami", "wait", "garble", "garble-answer", "malformed", "refuse", "die"]
            for listed in answered[40:45]
        )
        assert [line.split()[1] for line in seen(ids)] == [json.dumps(told_id) for told_id in told]
    with through_the_session():
        async with connected([sys.executable, str(SCRIPTED), str(ids)]) as upstream:
            result = await upstream.call("whoami", {}, Steps())
    assert isinstance(json.loads(result["content"][0]["text"]), int)  # the session's own ids are numbers


async def test_a_call_given_up_is_cancelled_at_the_server(tmp_path: Path) -> None:
    said = tmp_path / "seen"
    async with connected([sys.executable, str(SCRIPTED), str(said)]) as upstream:
        call = asyncio.create_task(upstream.call("wait", {}, Steps()))
        await until(lambda: len(seen(said)) == 1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        with pytest.raises(TimeoutError):  # a deadline gives it up the same way
            await asyncio.wait_for(upstream.call("wait", {}, Steps()), 0.3)
        await until(lambda: len(seen(said)) == 4)
        first, second = (line.split()[1] for line in seen(said) if line.startswith("call "))
        assert f"cancelled {first} caller cancelled" in seen(said)
        assert f"cancelled {second} caller cancelled" in seen(said)
        assert (await upstream.call("whoami", {}, Steps()))["content"]  # and it goes on


async def test_a_server_that_dies_fails_every_waiting_call_with_the_sessions_error(tmp_path: Path) -> None:
    async def dying() -> list[Any]:
        async with connected([sys.executable, str(SCRIPTED), str(tmp_path / "seen")]) as upstream:
            waiting = [asyncio.create_task(outcome(upstream, "wait", {})) for _ in range(3)]
            await until(lambda: len(seen(tmp_path / "seen")) >= 3)
            died = await outcome(upstream, "die", {})
            after = await outcome(upstream, "whoami", {})
            return [*(await asyncio.gather(*waiting)), died, after]

    direct = await dying()
    (tmp_path / "seen").unlink()
    with through_the_session():
        session = await dying()
    closed = (("ToolError", "mcp-error", "Connection closed (MCP error -32000)"), [])
    assert direct == session == [closed] * 5


async def test_lines_that_are_no_message_do_not_end_the_connection(tmp_path: Path) -> None:
    async with connected([sys.executable, str(SCRIPTED), str(tmp_path / "seen")]) as upstream:
        garbled = await upstream.call("garble", {}, Steps())
        assert garbled["content"][0]["text"] == "answered after a line of garbage"
        started = time.monotonic()
        with pytest.raises(ToolError) as caught:  # its id is readable: the call fails now, not at its deadline
            await upstream.call("garble-answer", {}, Steps())
        assert caught.value.type == "mcp-error" and "(MCP error -32700)" in caught.value.message
        assert time.monotonic() - started < 5
        assert json.loads((await upstream.call("whoami", {}, Steps()))["content"][0]["text"]).startswith("toolreg-")
        await upstream.ping()


OUTSIDE_SCHEMA = "tool 'malformed' of the MCP server answered a result MCP 2025-11-25 does not allow: content: Input"


@pytest.mark.parametrize(
    ("tool", "refusal"),
    [
        ("refuse", ("mcp-error", "not today (MCP error -32602)")),  # a JSON-RPC error
        ("malformed", ("bad-result", f"{OUTSIDE_SCHEMA} should be a valid list")),  # outside the revision's schema
    ],
)
async def test_a_refused_or_malformed_answer_is_the_same_tool_error(
    tmp_path: Path, tool: str, refusal: tuple[str, str]
) -> None:
    command = [sys.executable, str(SCRIPTED), str(tmp_path / "seen")]
    async with connected(command) as upstream:
        direct = await outcome(upstream, tool, {})
    with through_the_session():
        async with connected(command) as upstream:
            session = await outcome(upstream, tool, {})
    assert direct == session == (("ToolError", *refusal), [])
