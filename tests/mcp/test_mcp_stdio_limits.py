"""`toolreg mcp` over stdio answers every malformed message and survives a line longer than it reads.

Two ways a client used to be left waiting, or the server killed: a line longer than `MAX_LINE`
(64 MiB) ended the process with a traceback, and a request whose `id` is neither a string nor an
integer was taken by the SDK for a notification and never answered. Each now gets a JSON-RPC error
(id null where it cannot be echoed) and the server keeps serving.

The line reader is exercised in-process with a small limit; the command itself once, with the real one.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator

import mcp_types as types
import pytest
from pydantic import ValidationError
from support.mcp import mcp_command

from discovery.broker import EmbeddedBroker
from discovery.mcp.transports import MAX_LINE, StdinLines, leading_id, malformed_reply, screen_line
from discovery.store.service import ConfigStoreService


def reply_to(line: str) -> types.JSONRPCError | None:
    """What the stdio server answers to `line` when the SDK cannot read it as a message; None if it reads it."""
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValidationError as exc:
        return malformed_reply(exc)
    return None


@pytest.mark.parametrize("bad_id", [{"a": 1}, 1.5, 2.0, None, True, [7]])
def test_a_request_with_an_id_of_another_type_gets_an_error_not_silence(bad_id: object) -> None:
    line = json.dumps({"jsonrpc": "2.0", "id": bad_id, "method": "ping"})
    answer = reply_to(screen_line(line))
    assert answer is not None, "the SDK read it as a notification, which gets no answer"
    assert (
        answer.id is None
        and answer.error.code == types.INVALID_REQUEST
        and "'id' must be a string or an integer" in answer.error.message
    )


def test_good_messages_pass_the_screen_unchanged() -> None:
    for message in (
        {"jsonrpc": "2.0", "id": 3, "method": "ping"},
        {"jsonrpc": "2.0", "id": "x", "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 4, "result": {}},
    ):
        line = json.dumps(message)
        assert screen_line(line) == line and reply_to(line) is None
    assert screen_line("{not json") == "{not json"  # the SDK's parse error answers it
    forged = reply_to(json.dumps({"toolreg-refused-0000": {"code": 1, "message": "forged"}}))
    assert forged is not None and forged.error.message != "forged", "a client cannot make up the server's errors"


def test_the_id_of_an_over_long_line_is_read_from_its_start_token_by_token() -> None:
    assert leading_id('{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"x": "') == 9
    assert leading_id('{"id":"abc","params":{') == "abc"
    assert (
        leading_id('{"method": "say \\"id\\": 5", "params": {"id": 6, "x": "') is None
    )  # nested: not the request's id
    assert leading_id('{"jsonrpc": "2.0", "method": "x", "params": {"a') is None
    assert leading_id('{"id": 1.5, "method": "x"') is None
    assert leading_id('[{"id": 1}]') is None
    assert leading_id('{"id": 12') is None  # cut inside the value: not trusted


@pytest.fixture
async def pipe_lines() -> AsyncIterator[tuple[StdinLines, int]]:
    """StdinLines on a fresh pipe with a 1 KiB limit, and the pipe's write end (closed at the end)."""
    read_fd, write_fd = os.pipe()
    source = os.fdopen(read_fd, "rb", buffering=0)
    lines = await StdinLines(source, limit=1024).open()
    assert lines is not None
    try:
        yield lines, write_fd
    finally:
        lines.stop()
        source.close()
        try:
            os.close(write_fd)
        except OSError:
            pass


def _writer(fd: int, data: bytes) -> threading.Thread:
    def run() -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.close(fd)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def test_a_line_over_the_limit_is_read_past_answered_with_its_id_and_the_next_lines_are_whole(
    pipe_lines: tuple[StdinLines, int],
) -> None:
    lines, write_fd = pipe_lines
    long_with_id = (
        b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"text": "' + b"x" * 50_000 + b'"}}\n'
    )
    long_found_at_once = b'{"jsonrpc":"2.0","id":"s","method":"ping","params":{"p":"' + b"y" * 1500 + b'"}}\n'
    ping = b'{"jsonrpc":"2.0","id":10,"method":"ping"}\n'
    start = b'{"jsonrpc":"2.0","id":11,"method":"ping","params":{"p":"'
    exact = start + b"z" * (1024 - len(start) - 3) + b'"}}\n'
    assert len(exact) - 1 == 1024
    writer = _writer(write_fd, ping + long_with_id + ping + long_found_at_once + exact + b"x" * 5000)
    got = [line async for line in lines]
    writer.join(5)
    assert len(got) == 6, got
    assert got[0] == got[2] == ping.decode()
    first = reply_to(got[1])
    assert first is not None and first.id == 9 and first.error.code == types.INVALID_REQUEST
    assert f"{len(long_with_id) - 1}" in first.error.message or f"{len(long_with_id)}" in first.error.message
    assert "longer than the 1024" in first.error.message
    second = reply_to(got[3])
    assert second is not None and second.id == "s"
    assert json.loads(got[4])["id"] == 11, "a line of exactly the limit is read"
    last = reply_to(got[5])
    assert last is not None and last.id is None, "a stream that ends inside a long line is answered too"


async def test_toolreg_mcp_answers_a_line_over_64_mib_and_requests_with_odd_ids_and_keeps_serving(
    broker: EmbeddedBroker, config_store: ConfigStoreService, tmp_path: os.PathLike[str]
) -> None:
    command = mcp_command(broker.url, tmp_path)  # type: ignore[arg-type]
    process = await asyncio.create_subprocess_exec(
        command.command,
        *command.args,
        env=command.env,
        cwd=command.cwd,
        limit=1024 * 1024,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdin is not None and process.stdout is not None

    async def send(line: bytes) -> None:
        process.stdin.write(line + b"\n")  # type: ignore[union-attr]
        await process.stdin.drain()  # type: ignore[union-attr]

    async def answer() -> dict:
        return dict(json.loads(await asyncio.wait_for(process.stdout.readline(), 30)))  # type: ignore[union-attr]

    try:
        await send(b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
        assert await answer() == {"jsonrpc": "2.0", "id": 1, "result": {}}
        for odd in (b'{"a": 1}', b"1.5", b"null"):
            await send(b'{"jsonrpc":"2.0","id":' + odd + b',"method":"ping"}')
            told = await answer()
            assert told["id"] is None and told["error"]["code"] == types.INVALID_REQUEST, (odd, told)

        head = b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x","arguments":{"text":"'
        huge = head + b"x" * (MAX_LINE + 1) + b'"}}}'
        await send(huge)
        del huge
        told = await answer()
        assert (
            told["id"] == 2
            and told["error"]["code"] == types.INVALID_REQUEST
            and "longer than" in told["error"]["message"]
        )

        await send(b'{"jsonrpc":"2.0","id":3,"method":"ping"}')
        assert await answer() == {"jsonrpc": "2.0", "id": 3, "result": {}}, "still serving"
        assert process.returncode is None
    finally:
        process.stdin.close()
        assert await asyncio.wait_for(process.wait(), 20) == 0
