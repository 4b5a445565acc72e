"""`toolreg mcp` over stdio, driven by the official SDK's `ClientSession` as a desktop client would:
it spawns `python -m discovery.cli mcp` against the test's broker, in both protocol eras
(2025-11-25 by the handshake, 2026-07-28 by `server/discover`)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from support import eventually, toolreg_env
from support.mcp import ERAS, VERSION, Era, list_all, mcp_command, static_tools, stdio_session, text_of

from discovery.broker import EmbeddedBroker
from discovery.mcp.server import PAGE_SIZE
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, DynamicToolService, Settings
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.joke import JokeService

EXAMPLES = ("calculate", "countdown", "tell-joke")


@pytest.fixture
async def announced(
    settings: Settings, registry: Registry, config_client: ConfigClient
) -> AsyncIterator[list[DynamicToolService]]:
    """Three example services that announced themselves, merged into the store by the registry."""
    services = [cls(settings=settings) for cls in (JokeService, CalculatorService, CountdownService)]
    for service in services:
        await service.start()
    await eventually(lambda: _has(config_client, EXAMPLES), timeout=10)
    yield services
    for service in services:
        await service.stop()


async def _has(client: ConfigClient, names: tuple[str, ...]) -> bool:
    return set(names) <= set(await client.list("tool"))


@pytest.fixture
def mcp_dir(tmp_path: Path) -> Path:
    path = tmp_path / "mcp"
    path.mkdir()
    return path


@pytest.mark.parametrize("era", ERAS)
async def test_lists_and_calls_the_example_tools_and_a_service_error_is_an_is_error_result(
    era: Era, broker: EmbeddedBroker, mcp_dir: Path, announced: list[DynamicToolService]
) -> None:
    async with stdio_session(broker.url, mcp_dir, era) as (session, _):
        assert session.protocol_version == VERSION[era]
        assert session.server_capabilities is not None and session.server_capabilities.tools is not None
        assert session.server_capabilities.tools.list_changed is True

        tools, _ = await list_all(session)
        assert [t.name for t in tools] == sorted(EXAMPLES)
        calculate = next(t for t in tools if t.name == "calculate")
        assert calculate.input_schema == {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The arithmetic expression"}},
            "required": ["expression"],
            "additionalProperties": False,
        }

        assert text_of(await session.call_tool("calculate", {"expression": "(2 + 3) * 4"})) == "20"
        joke = await session.call_tool("tell-joke", {"topic": "brokers"})
        assert joke.is_error is False and "brokers" in text_of(joke)

        failed = await session.call_tool("calculate", {"expression": "1 / 0"})  # the service raised
        assert failed.is_error is True and text_of(failed) == "ExpressionError: division by zero"


@pytest.mark.parametrize("era", ERAS)
async def test_a_streaming_tool_sends_each_chunk_as_progress_then_the_whole_text(
    era: Era, broker: EmbeddedBroker, mcp_dir: Path, announced: list[DynamicToolService]
) -> None:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async with stdio_session(broker.url, mcp_dir, era) as (session, _):
        result = await session.call_tool("countdown", {"start": 3}, progress_callback=on_progress)
        await eventually(lambda: len(progress) == 4, timeout=2)
        assert progress == [(1.0, "3\n"), (2.0, "2\n"), (3.0, "1\n"), (4.0, "0\n")]
        assert text_of(result) == "3\n2\n1\n0\n" and result.is_error is False

        quiet = await session.call_tool("countdown", {"start": 1})  # no progress token: no progress sent
        assert text_of(quiet) == "1\n0\n" and len(progress) == 4


@pytest.mark.parametrize("era", ERAS)
async def test_unknown_tools_and_timeouts_are_one_line_protocol_errors_and_bad_arguments_an_is_error_result(
    era: Era, broker: EmbeddedBroker, mcp_dir: Path, announced: list[DynamicToolService], config_client: ConfigClient
) -> None:
    # A hand-wired tool whose service is not running: its call can only time out.
    await config_client.put(
        [
            (
                "tool-service",
                "ghost",
                json.dumps(
                    {
                        "id": "ghost",
                        "request-queue": "non-persistent://tg/request/ghost",
                        "response-queue": "non-persistent://tg/response/ghost",
                    }
                ),
            ),
            ("tool", "haunt", json.dumps({"name": "haunt", "description": "Never answers", "service": "ghost"})),
        ]
    )
    async with stdio_session(broker.url, mcp_dir, era, "--call-timeout", "0.5") as (session, _):
        with pytest.raises(MCPError) as unknown:
            await session.call_tool("no-such-tool", {})
        assert unknown.value.error.code == types.INVALID_PARAMS
        assert "unknown tool 'no-such-tool'" in unknown.value.error.message

        # Input validation errors go back to the model as a tool result it can correct its call from (SEP-1303).
        missing = await session.call_tool("calculate", {})
        assert missing.is_error is True
        assert (
            text_of(missing) == "bad arguments: tool 'calculate': argument 'expression' is missing (required, string)"
        )
        wrong_type = await session.call_tool("countdown", {"start": "three"})
        assert wrong_type.is_error is True and text_of(wrong_type).endswith(
            "argument 'start': 'three' is not of type 'integer'"
        )
        null = await session.call_tool("countdown", {"start": None})  # JSON's spelling, not Python's `None`
        assert null.is_error is True and text_of(null).endswith("argument 'start': null is not of type 'integer'")
        for result in (missing, wrong_type, null):
            assert "\n" not in text_of(result)

        started = time.monotonic()
        with pytest.raises(MCPError) as timeout:
            await session.call_tool("haunt", {})
        assert timeout.value.error.code == types.REQUEST_TIMEOUT
        assert "timed out" in timeout.value.error.message and time.monotonic() - started < 5

        for error in (unknown, timeout):
            assert "\n" not in error.value.error.message
        assert text_of(await session.call_tool("calculate", {"expression": "6*7"})) == "42"  # still serving


@pytest.mark.parametrize("era", ERAS)
async def test_a_service_started_later_is_notified_and_callable_and_its_sigterm_is_notified_too(
    era: Era, broker: EmbeddedBroker, mcp_dir: Path, announced: list[DynamicToolService], tmp_path: Path
) -> None:
    async with stdio_session(broker.url, mcp_dir, era) as (session, changes):
        assert "echo" not in [t.name for t in (await list_all(session))[0]]

        service = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "discovery.cli",
            "serve",
            "toolservice_base.examples.echo:EchoService",
            env=toolreg_env(broker.url, tmp_path / "echo"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            announced_at = await _logged(service, "service.announced")
            notified_at = await changes.next(timeout=5)
            assert notified_at - announced_at < 1.0, f"notified {notified_at - announced_at:.3f}s after the announce"

            assert "echo" in [t.name for t in (await list_all(session))[0]]
            assert text_of(await session.call_tool("echo", {"text": "no reconnect needed"})) == "no reconnect needed"

            signalled_at = time.monotonic()
            service.send_signal(signal.SIGTERM)
            removed_at = await changes.next(timeout=5)
            assert removed_at - signalled_at < 1.0, f"notified {removed_at - signalled_at:.3f}s after SIGTERM"
            assert await asyncio.wait_for(service.wait(), 10) == 0
            assert "echo" not in [t.name for t in (await list_all(session))[0]]
        finally:
            if service.returncode is None:
                service.kill()
                await service.wait()


async def _logged(process: asyncio.subprocess.Process, event: str, timeout: float = 20) -> float:
    """When `process` logged `event` (read from its JSON log lines as they come)."""
    assert process.stdout is not None
    async with asyncio.timeout(timeout):
        while line := await process.stdout.readline():
            if f'"event": "{event}"' in line.decode(errors="replace"):
                return time.monotonic()
    raise AssertionError(f"the process exited ({process.returncode}) before logging {event}")


@pytest.mark.parametrize("era", ERAS)
async def test_a_thousand_tools_are_listed_completely_through_pagination(
    era: Era, broker: EmbeddedBroker, mcp_dir: Path, config_store: ConfigStoreService, config_client: ConfigClient
) -> None:
    await config_client.put(static_tools(1000))
    async with stdio_session(broker.url, mcp_dir, era) as (session, _):
        tools, pages = await list_all(session)
        names = [t.name for t in tools]
        assert len(names) == 1000 and len(set(names)) == 1000
        # Dots are not in the names LLM APIs accept: the MCP names are the ones as_openai_tools gives.
        assert names == sorted(f"bulk_tool-{n:04d}" for n in range(1000))
        assert pages == -(-1000 // PAGE_SIZE)
        again, _ = await list_all(session)
        assert [t.name for t in again] == names  # the same order every time

        with pytest.raises(MCPError) as bad_cursor:
            await session.list_tools(params=types.PaginatedRequestParams(cursor="not-a-cursor"))
        assert bad_cursor.value.error.code == types.INVALID_PARAMS and "cursor" in bad_cursor.value.error.message


async def test_tools_and_exclude_choose_what_one_agent_sees_and_hear_only_of_its_changes(
    broker: EmbeddedBroker,
    mcp_dir: Path,
    announced: list[DynamicToolService],
    settings: Settings,
    config_client: ConfigClient,
) -> None:
    async with stdio_session(broker.url, mcp_dir, "legacy", "--tools", "c*", "tell-*", "--exclude", "countdown") as (
        session,
        changes,
    ):
        assert [t.name for t in (await list_all(session))[0]] == ["calculate", "tell-joke"]
        with pytest.raises(MCPError, match="unknown tool 'countdown'"):
            await session.call_tool("countdown", {"start": 1})

        from toolservice_base.examples.echo import EchoService

        echo = EchoService(settings=settings)  # not matched by --tools: the list this agent sees does not change
        await echo.start()
        try:
            await eventually(lambda: _has(config_client, ("echo",)), timeout=5)
            await changes.none_within(1.0)
        finally:
            await echo.stop()
        await announced[0].stop()  # the joke service: tell-joke is this agent's, so it hears of it
        await changes.next(timeout=5)
        assert [t.name for t in (await list_all(session))[0]] == ["calculate"]


async def test_a_workspace_of_its_own_with_a_dotted_name_given_in_the_form_llm_apis_accept(
    broker: EmbeddedBroker,
    mcp_dir: Path,
    announced: list[DynamicToolService],
    config_client: ConfigClient,
    settings: Settings,
) -> None:
    calculator = next(s for s in announced if isinstance(s, CalculatorService)).service_descriptor
    await config_client.put(
        [  # wired by hand in workspace `research`, to the running calculator's queues
            ("tool-service", "calculator", calculator.model_dump_json(by_alias=True, exclude_none=True)),
            (
                "tool",
                "math.calc",
                json.dumps(
                    {
                        "name": "math.calc",
                        "description": "Arithmetic",
                        "service": "calculator",
                        "arguments": [{"name": "expression", "type": "string", "description": "Sum"}],
                    }
                ),
            ),
        ],
        workspace="research",
    )
    async with stdio_session(broker.url, mcp_dir, "legacy", "--workspace", "research") as (session, _):
        assert [t.name for t in (await list_all(session))[0]] == ["math_calc"]
        assert text_of(await session.call_tool("math_calc", {"expression": "6*7"})) == "42"


async def test_nothing_but_protocol_reaches_stdout_even_when_pulsar_client_logs(
    broker: EmbeddedBroker, mcp_dir: Path, announced: list[DynamicToolService]
) -> None:
    """pulsar-client's own log lines (shown at debug level) go to stderr; on stdout they would corrupt the wire."""
    command = mcp_command(broker.url, mcp_dir)
    process = await asyncio.create_subprocess_exec(
        command.command,
        *command.args,
        env={**command.env, "TOOLREG_LOG_LEVEL": "debug"},
        cwd=command.cwd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdin.write(
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",'
        b'"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}\n'
    )
    await process.stdin.drain()
    first = json.loads(await asyncio.wait_for(process.stdout.readline(), 20))
    assert first["id"] == 1 and first["result"]["protocolVersion"] == "2025-11-25"

    port = broker.port
    broker.stop()  # pulsar-client now logs its reconnection failures
    try:
        await asyncio.sleep(1.5)
        process.stdin.close()
        out, err = await asyncio.wait_for(process.communicate(), 20)
    finally:
        broker.start(port=port)  # back, so the fixtures' clients can say goodbye
    assert b"pulsar_client" in err and (b"Failed to establish connection" in err or b"ClientConnection" in err), err[
        -2000:
    ]
    for line in out.splitlines():
        json.loads(line)  # every byte on stdout is a JSON-RPC message


async def test_malformed_json_rpc_gets_an_error_and_the_server_keeps_serving(
    broker: EmbeddedBroker, mcp_dir: Path, announced: list[DynamicToolService]
) -> None:
    command = mcp_command(broker.url, mcp_dir)
    process = await asyncio.create_subprocess_exec(
        command.command,
        *command.args,
        env=command.env,
        cwd=command.cwd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdin is not None and process.stdout is not None

    async def exchange(line: bytes) -> dict:
        process.stdin.write(line + b"\n")
        await process.stdin.drain()
        return json.loads(await asyncio.wait_for(process.stdout.readline(), 20))

    try:
        not_json = await exchange(b'{"jsonrpc": "2.0", "id": 1, "method": ')
        assert not_json == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": types.PARSE_ERROR, "message": not_json["error"]["message"]},
        }
        not_rpc = await exchange(b'{"jsonrpc": "2.0", "id": 7, "method": 42}')
        assert not_rpc["id"] == 7 and not_rpc["error"]["code"] == types.INVALID_REQUEST
        # The oldest version the SDK still negotiates, from a client that speaks raw JSON-RPC.
        init = await exchange(
            b'{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"2024-11-05",'
            b'"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}'
        )
        assert init["result"]["protocolVersion"] == "2024-11-05"
        assert init["result"]["capabilities"]["tools"] == {"listChanged": True}
        process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        bad_params = await exchange(b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":17}}')
        assert bad_params["id"] == 3 and bad_params["error"]["code"] == types.INVALID_PARAMS
        # Arguments the tool's schema refuses are a tool result on the oldest version too, as the SDK's own MCPServer
        # answers.
        bad_arguments = await exchange(
            b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"countdown","arguments":{"start":null}}}'
        )
        assert bad_arguments["id"] == 5 and bad_arguments["result"]["isError"] is True
        assert bad_arguments["result"]["content"][0]["text"].endswith("argument 'start': null is not of type 'integer'")
        listed = await exchange(b'{"jsonrpc":"2.0","id":4,"method":"tools/list"}')
        assert [t["name"] for t in listed["result"]["tools"]] == sorted(EXAMPLES)

        await announced[0].stop()  # the joke service leaves: this 2024-11-05 client is told so
        told = json.loads(await asyncio.wait_for(process.stdout.readline(), 5))
        assert told == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    finally:
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 20)


async def test_sigterm_ends_the_server_promptly_while_the_client_holds_stdin_open(
    broker: EmbeddedBroker, mcp_dir: Path, config_store: ConfigStoreService
) -> None:
    command = mcp_command(broker.url, mcp_dir)
    process = await asyncio.create_subprocess_exec(
        command.command,
        *command.args,
        env=command.env,
        cwd=command.cwd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    await process.stdin.drain()
    assert json.loads(await asyncio.wait_for(process.stdout.readline(), 20)) == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {},
    }
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 10) == 0
    assert time.monotonic() - signalled < 3
    assert b"toolset.closed" in await process.stderr.read()  # it shut down, it was not killed
