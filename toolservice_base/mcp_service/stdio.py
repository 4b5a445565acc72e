"""A command's stdin and stdout as the MCP SDK client's transport, with the requests waiting at once written together.

What the SDK's `stdio_client` does, and one thing more. The command runs in a
session of its own with the SDK's safe environment (`get_default_environment`)
plus its own variables; its stdout is read as newline-delimited JSON-RPC, each
line parsed as the SDK parses it (a line that is not a message reaches the
session as the error); leaving closes its stdin, gives it two seconds to exit,
then ends its process tree as the SDK does (`terminate_posix_process_tree`).

The one thing more: the SDK's writer makes one `write` to the pipe per
message, and each wakes the server. Under load the sidecar's requests come
several per turn of its loop (they arrive from the bus in batches), so the
writer here takes every message already waiting and writes them in one go:
at 32 calls in flight the pipe `write` was a fifth of the sidecar's busy time,
and the server read each request on its own. A message sent alone is written
at once, as before.

And the sidecar's own requests (`direct.DirectCalls`, given to
`command_streams`): their lines join the same writer, and the reader takes
their answers off the output, by id, before the session would see them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import TextIO

import anyio
import mcp_types as types
from anyio.abc import AsyncResource, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from .direct import DirectCalls

EXIT_GRACE = 2.0
"""Seconds a server has to exit once its stdin is closed, and again after SIGTERM, as the SDK gives it."""
FLUSH_GRACE = 0.5
"""Seconds the writer has, on leaving, to write what it was handed."""


Streams = tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
"""What the SDK's `Client` takes as a transport: the messages read, and where to send."""


@asynccontextmanager
async def command_streams(
    command: str,
    args: list[str],
    env: Mapping[str, str],
    cwd: str | None,
    errlog: TextIO,
    direct: DirectCalls | None = None,
) -> AsyncIterator[Streams]:
    """Start `command` and yield the session's (read, write) streams to it; stop it on leaving (see the module).

    `direct`, if given, sends its requests through the same writer and takes their answers off the reader, from
    the start until the connection ends. OSError if the command cannot be started."""
    process = await anyio.open_process(
        [command, *args], env=get_default_environment() | dict(env), stderr=errlog, cwd=cwd, start_new_session=True
    )
    read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)
    outbox = _Outbox()
    written = anyio.Event()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_read, process, read_in, direct)
        tasks.start_soon(_forward, write_out, outbox)
        tasks.start_soon(_write, process, outbox, write_out, read_in, written, direct)
        if direct is not None:
            direct.attach(outbox.put)
        try:
            yield read_out, write_in
        finally:
            with anyio.CancelScope(shield=True):
                if direct is not None:
                    direct.close()
                read_out.close()  # a reader waiting to deliver goes on to discard what the server still says
                write_in.close()
                with anyio.move_on_after(FLUSH_GRACE):
                    await written.wait()
                await _stop(process)
                for stream in (read_out, write_in, read_in, write_out):
                    await stream.aclose()
            tasks.cancel_scope.cancel()


class _Outbox:
    """Lines waiting for the writer, from the session (through `_forward`) and from `DirectCalls` (directly)."""

    __slots__ = ("closed", "lines", "ready")

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.ready = asyncio.Event()
        self.closed = False

    def put(self, line: bytes) -> None:
        self.lines.append(line)
        self.ready.set()

    def close(self) -> None:
        """Nothing more comes: the writer ends once what is waiting is written."""
        self.closed = True
        self.ready.set()


async def _read(
    process: Process, messages: MemoryObjectSendStream[SessionMessage | Exception], direct: DirectCalls | None
) -> None:
    """Each line of the server's stdout parsed, to `direct` if it is one of its answers, else to the session; once
    the session is gone, the rest discarded (a server blocked writing its output could not see its stdin close).
    The output's end ends the connection for `direct` too."""
    assert process.stdout is not None
    delivering = True
    held = b""
    try:
        async with messages:
            with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for chunk in process.stdout:
                    if not delivering:
                        continue
                    lines = (held + chunk).split(b"\n")
                    held = lines.pop()
                    for line in lines:
                        item = _parsed(line)
                        if direct is not None and direct.take(item, line):
                            continue
                        try:
                            await messages.send(item)
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            delivering = False
                            break
    finally:
        if direct is not None:
            direct.close()


def _parsed(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _forward(messages: MemoryObjectReceiveStream[SessionMessage], outbox: _Outbox) -> None:
    """Each message the session sends, as a line to the writer; the session's stream closed, the outbox too."""
    with suppress(anyio.ClosedResourceError):
        async with messages:
            async for message in messages:
                outbox.put(_line(message))
    outbox.close()


async def _write(
    process: Process,
    outbox: _Outbox,
    messages: MemoryObjectReceiveStream[SessionMessage],
    replies: MemoryObjectSendStream[SessionMessage | Exception],
    written: anyio.Event,
    direct: DirectCalls | None,
) -> None:
    """Every line waiting, in one write; on leaving, until none is left. A pipe that cannot be written ends the
    connection: the session's streams closed (it is told the connection ended, not left waiting for answers) and
    `direct` closed."""
    assert process.stdin is not None
    try:
        while True:
            if not outbox.lines:
                if outbox.closed:
                    return
                outbox.ready.clear()
                await outbox.ready.wait()
                continue
            lines, outbox.lines = outbox.lines, []
            await process.stdin.send(b"".join(lines))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        # The server may still run: the session is told the connection ended, not left waiting for answers.
        if direct is not None:
            direct.close()
        messages.close()
        await replies.aclose()
    finally:
        written.set()


def _line(message: SessionMessage) -> bytes:
    return message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"


async def _stop(process: Process) -> None:
    """Close its stdin, give it `EXIT_GRACE` to exit, then end its process tree (SIGTERM, then SIGKILL)."""
    assert process.stdin is not None and process.stdout is not None
    await _close(process.stdin)
    if not await _exited(process, EXIT_GRACE):
        await terminate_posix_process_tree(process, EXIT_GRACE)
        await _exited(process, EXIT_GRACE)
    await _close(process.stdout)


async def _exited(process: Process, timeout: float) -> bool:
    """Whether it exited within `timeout`, by its return code: `wait()` would also wait for the pipes to close,
    which a child that inherited them keeps open."""
    with anyio.move_on_after(timeout):
        while process.returncode is None:  # noqa: ASYNC110  (polled: nothing signals an exit without the pipes)
            await anyio.sleep(0.01)
    return process.returncode is not None


async def _close(stream: AsyncResource) -> None:
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.aclose()
