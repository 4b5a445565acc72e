"""One connection to an MCP server, through the official MCP SDK's client: from the handshake to its end.

The server is a command spoken to over stdio (`McpCommand`: started and
stopped as the SDK does, several requests written at once: `stdio`) or a
streamable-HTTP endpoint (`McpUrl`, with headers such as `Authorization`).
The SDK client negotiates the protocol: a server of the 2026-07-28
revision is spoken to in it (its tool changes heard on a
`subscriptions/listen` stream, whose drop also tells that the server went;
liveness asked with `server/discover`), an older one with the handshake
(`initialize`; `notifications/tools/list_changed`; `ping`).

The session does all of that; a command's `tools/call` spoken with the
handshake goes past it (`direct`: one line to the transport's writer, the
answer taken off its reader by id), the session's per-request machinery
being most of the sidecar's time per call.

What the server may ask of its client it cannot have here: the sidecar
declares no sampling, elicitation or roots capability (a server that checks
offers the tools that can work without them), and a server that asks anyway
gets the SDK's refusal ("Sampling not supported"), which reaches the tool's
caller through the server's answer. The server's log messages
(`notifications/message`) and a command's stderr become events of this
process's log (`mcp.server_log`, `mcp.server_stderr`); they never reach
stdout.

Every failure to reach or understand the server is one `McpServerError` line.
An HTTP server's messages are read within `max_message` bytes (`bounded`):
one larger fails the request it answers, saying so, and nothing more of it
is read.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import Subscription, SubscriptionLost
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import RootModel, ValidationError

from .. import tracing
from ..errors import McpServerError, ToolError
from ..logs import get_logger
from ..tasks import cancel_and_wait
from .bounded import DEFAULT_MAX_MESSAGE, BoundedReads
from .direct import DirectCalls
from .results import RevisionResults
from .stdio import command_streams

log = get_logger("toolservice_base.mcp_service")

MAX_PAGES = 100
"""`tools/list` pages followed at most: a server whose cursor never ends cannot hold the sidecar."""
MAX_LISTED = 4096
"""Tools listed at most, all pages together; past that the listing is refused (one service offers at most 256)."""
MAX_STDERR_LINE = 4096
"""Characters of one line of a command's stderr kept in the log."""
HTTP_TIMEOUT = 30.0
HTTP_READ_TIMEOUT = 300.0
"""The SDK's own defaults for an HTTP client: a server may hold a response stream open for minutes."""


@dataclass(frozen=True)
class McpCommand:
    """An MCP server that is a command, spoken to over its stdin and stdout (stdio).

    It gets the SDK's safe environment (`HOME`, `PATH`, `USER`, ... but none
    of this process's secrets, such as `PULSAR_AUTH_TOKEN`) plus `env`."""

    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def __str__(self) -> str:
        return " ".join([self.command, *self.args])


@dataclass(frozen=True)
class McpUrl:
    """An MCP server at a streamable-HTTP endpoint (`http://127.0.0.1:3001/mcp`), sent `headers` on every request."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.url


McpServer = McpCommand | McpUrl


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside an exception group (anyio's task groups wrap what failed in them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _why(exc: BaseException, server: McpServer) -> str:
    """What went wrong reaching `server`, in words an operator can act on."""
    leaf = _leaf(exc)
    if isinstance(leaf, httpx2.HTTPStatusError):
        return _refusal(leaf.response)
    if isinstance(leaf, httpx2.HTTPError):
        return f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__
    if isinstance(leaf, MCPError):
        if leaf.code == types.CONNECTION_CLOSED and isinstance(server, McpCommand):
            return "the command ended before it answered (what it printed on stderr is logged as mcp.server_stderr)"
        return f"{leaf.message} (MCP error {leaf.code})"
    if isinstance(leaf, FileNotFoundError) and isinstance(server, McpCommand):
        return f"no such command {server.command!r}"
    if isinstance(leaf, OSError):
        return leaf.strerror or str(leaf)
    return f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__


def _announces_changes(capabilities: types.ServerCapabilities) -> bool:
    """Whether a server says it tells of changes to its tool list (`tools.listChanged`)."""
    return capabilities.tools is not None and bool(capabilities.tools.list_changed)


def unwrapped(exc: BaseException) -> BaseException:
    """The `McpServerError` inside an exception group, if there is one (anyio's task groups wrap what fails in
    them); else `exc` itself."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = unwrapped(inner)
            if isinstance(found, McpServerError):
                return found
    return exc


def _refusal(response: httpx2.Response) -> str:
    status = response.status_code
    hint = "; give its credentials with --header, say 'Authorization=Bearer TOKEN'" if status in (401, 403) else ""
    return f"it answered HTTP {status} {response.reason_phrase} to {response.request.method}{hint}"


class _StderrRelay:
    """A command's stderr, line by line, as `mcp.server_stderr` events of this process's log."""

    def __init__(self, server: McpCommand) -> None:
        self._server = server
        read_fd, write_fd = os.pipe()
        self._read = os.fdopen(read_fd, "rb", buffering=0)
        self.write = cast(TextIO, os.fdopen(write_fd, "w"))
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        reader = asyncio.StreamReader(limit=MAX_STDERR_LINE * 4)
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self._read)
        self._task = asyncio.create_task(self._relay(reader), name="mcp-stderr")

    async def _relay(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # a line longer than the reader's limit: what it holds so far
                line = await reader.read(MAX_STDERR_LINE)
            if not line:
                return
            text = line.decode(errors="replace").rstrip()
            if text:
                log.info("mcp.server_stderr", server=self._server.command, line=text[:MAX_STDERR_LINE])

    def spawned(self) -> None:
        """The command has its own copy of the pipe now: ours goes, so the relay ends when the command does."""
        self.write.close()

    async def close(self) -> None:
        if not self.write.closed:
            self.write.close()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 1.0)
            except TimeoutError:
                await cancel_and_wait(self._task)
        self._read.close()


async def _server_log(params: types.LoggingMessageNotificationParams) -> None:
    log.info("mcp.server_log", level=params.level, source=params.logger, data=params.data)


class Upstream:
    """The SDK client of one MCP server, entered once (`async with`) and left in the same task."""

    def __init__(
        self,
        server: McpServer,
        *,
        timeout: float,
        on_tools_changed: Callable[[], None],
        client_version: str = "",
        max_message: int = DEFAULT_MAX_MESSAGE,
    ) -> None:
        self.server = server
        self.timeout = timeout
        self.max_message = max_message
        """Bytes one message of an HTTP server may hold (`bounded`); a larger one fails the request it answers."""
        self._on_tools_changed = on_tools_changed
        self._client_version = client_version
        self._client: Client | None = None
        self._stack = AsyncExitStack()
        self.name: str | None = None
        """The server's own name (`serverInfo.name`)."""
        self.modern = False
        """Whether the connection speaks a 2026-07-28-era protocol (no handshake, no ping)."""
        self.lost = asyncio.Event()
        """Set when the connection is known to be gone (a `subscriptions/listen` stream dropped); `why` says how."""
        self.why = ""
        self._refused: httpx2.Response | None = None
        """The last HTTP error status the endpoint answered: the SDK turns it into a bare JSON-RPC error."""
        self._direct: DirectCalls | None = None
        """`tools/call` past the session, on a command's transport spoken to with the handshake (`_send_call`)."""
        self._results = RevisionResults.of(None)
        """What a `tools/call` result must be under the negotiated revision, as the session holds it (`_send_call`)."""

    async def _handle(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._on_tools_changed()
        elif isinstance(message, Exception):
            log.warning("mcp.transport_error", server=str(self.server), error=_why(message, self.server))

    async def __aenter__(self) -> Upstream:
        async with AsyncExitStack() as stack:
            transport, relay = await self._transport(stack)
            client = Client(
                transport,
                mode="auto",
                cache=None,
                message_handler=self._handle,
                logging_callback=_server_log,
                client_info=types.Implementation(name="toolreg-announce", version=self._client_version or "0"),
            )
            try:
                async with asyncio.timeout(self.timeout):
                    await stack.enter_async_context(client)
            except TimeoutError:
                raise McpServerError(
                    f"the MCP server {self.server} did not finish its handshake (initialize) within {self.timeout:g} s"
                ) from None
            except Exception as exc:
                why = _why(exc, self.server) if self._refused is None else _refusal(self._refused)
                raise McpServerError(f"cannot connect to the MCP server {self.server}: {why}") from None
            finally:
                if relay is not None:
                    relay.spawned()
            self._client = client
            info = client.server_info
            self.name = info.name if info is not None else None
            self.modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
            if self.modern:  # its requests carry the session's own `_meta` stamp: they go through the session
                self._direct = None
            self._results = RevisionResults.of(client.protocol_version)
            if self.modern and _announces_changes(client.server_capabilities):
                await self._listen(stack, client)
            self._stack = stack.pop_all()
        return self

    async def _transport(self, stack: AsyncExitStack) -> tuple[Any, _StderrRelay | None]:
        """The SDK transport to the server, opened on `stack`: a command's stdio, its stderr relayed to the log (the
        relay too), or an HTTP client whose reads are bounded and whose error statuses are kept (`_answered`)."""
        if isinstance(self.server, McpCommand):
            relay = _StderrRelay(self.server)
            stack.push_async_callback(relay.close)
            await relay.start()
            self._direct = DirectCalls()
            streams = command_streams(
                self.server.command, list(self.server.args), self.server.env, self.server.cwd, relay.write, self._direct
            )
            return streams, relay
        http = httpx2.AsyncClient(
            headers=dict(self.server.headers),
            timeout=httpx2.Timeout(HTTP_TIMEOUT, read=HTTP_READ_TIMEOUT),
            event_hooks={"response": [self._answered, BoundedReads(self.max_message)]},
        )
        stack.push_async_callback(http.aclose)
        return streamable_http_client(self.server.url, http_client=http, max_sse_event_size=self.max_message), None

    async def _answered(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self._refused = response

    async def _listen(self, stack: AsyncExitStack, client: Client) -> None:
        """Hear a modern server's tool changes on a `subscriptions/listen` stream (and its drop as the server gone)."""
        try:
            async with asyncio.timeout(self.timeout):
                subscription = await stack.enter_async_context(client.listen(tools_list_changed=True))
        except Exception as exc:
            raise McpServerError(
                f"the MCP server {self.server} refused to tell of tool changes (subscriptions/listen): "
                f"{_why(exc, self.server)}"
            ) from None
        task = asyncio.create_task(self._heard(subscription), name="mcp-listen")
        stack.push_async_callback(cancel_and_wait, task)

    async def _heard(self, subscription: Subscription) -> None:
        try:
            async for _ in subscription:
                self._on_tools_changed()
            self.why = self._gone(f"the MCP server {self.server} ended its subscriptions/listen stream")
        except SubscriptionLost as exc:
            self.why = self._gone(f"the MCP server {self.server} dropped its subscriptions/listen stream ({exc})")
        except Exception as exc:
            self.why = f"the MCP server {self.server}'s subscriptions/listen stream failed: {_why(exc, self.server)}"
        self.lost.set()

    def _gone(self, otherwise: str) -> str:
        """Why the stream ended, as the operator would say it: a command's stream ends when its process does (its
        output closes with it; the SDK's stdio client keeps the process, and so its exit code, to itself)."""
        if isinstance(self.server, McpCommand):
            return f"the MCP server process ({self.server}) exited: its output closed"
        return otherwise

    async def __aexit__(self, *exc: object) -> None:
        self._client = None
        await self._stack.aclose()

    @property
    def client(self) -> Client:
        if self._client is None:
            raise McpServerError(f"the MCP server {self.server} is not connected")
        return self._client

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool the server lists, its pages followed (bounded), each a `Tool` as JSON."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(self.timeout):
                for _ in range(MAX_PAGES):
                    page = await self.client.list_tools(cursor=cursor)
                    tools += [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools]
                    if len(tools) > MAX_LISTED:
                        raise McpServerError(
                            f"the MCP server {self.server} lists more than {MAX_LISTED} tools; one service offers at "
                            "most 256: announce part of them (--only/--exclude)"
                        )
                    cursor = page.next_cursor
                    if cursor is None:
                        return tools
        except TimeoutError:
            raise McpServerError(
                f"the MCP server {self.server} did not list its tools within {self.timeout:g} s"
            ) from None
        except McpServerError:
            raise
        except Exception as exc:
            raise McpServerError(
                f"the MCP server {self.server} could not list its tools: {_why(exc, self.server)}"
            ) from None
        raise McpServerError(f"the MCP server {self.server}'s tool list did not end after {MAX_PAGES} pages")

    async def ping(self) -> None:
        """Return once the server answers a ping; McpServerError if it does not within the timeout."""
        try:
            async with asyncio.timeout(self.timeout):
                if self.modern:  # 2026-07-28 has no ping; its cheapest request is discover
                    await self.client.session.send_discover(self.client.protocol_version)
                else:
                    await self.client.session.send_ping()
        except TimeoutError:
            raise McpServerError(
                f"the MCP server {self.server} did not answer a ping within {self.timeout:g} s"
            ) from None
        except McpServerError:
            raise
        except Exception as exc:
            raise McpServerError(
                f"the MCP server {self.server} did not answer a ping: {_why(exc, self.server)}"
            ) from None

    async def call(self, name: str, arguments: dict[str, Any], progress: ProgressFnT) -> dict[str, Any]:
        """`tools/call`, its result as JSON (`isError` included). Cancelling the caller cancels the call at the
        server (`notifications/cancelled`). ToolError when the server answers with a protocol error.

        Sent by `_send_call` (past the session, on a command spoken to with the handshake) and the result kept as
        the JSON checked against the negotiated revision: `Client.call_tool` would parse it into a `CallToolResult`
        again and this would dump it back, two more passes over every answer. What `Client.call_tool` adds is
        kept where it can apply: the output schema checked against structured content; on a 2026-07-28 connection
        the re-listing and one resend after `HEADER_MISMATCH`, and a call the server asks to be made again with its
        state (input it needs from a client, which the sidecar declares it cannot give, is an `mcp-error`)."""
        session = self.client.session
        try:
            try:
                result = await self._send_call(name, arguments, progress)
            except MCPError as exc:
                if exc.code != types.HEADER_MISMATCH or not self.modern:
                    raise
                return await self._call_through_client(name, arguments, progress)  # it re-lists and resends
            if result.get("resultType", "complete") != "complete":
                state = result.get("requestState")
                if result.get("resultType") == "input_required" and not result.get("inputRequests") and state:
                    # Only to be called again with its state: `Client.call_tool` drives that, from this state.
                    return await self._call_through_client(name, arguments, progress, str(state))
                raise ToolError(
                    "mcp-error",
                    f"tool {name!r} of the MCP server asked for input ({result['resultType']}), "
                    "which the sidecar cannot give",
                )
            if not result.get("isError"):
                # What `validate_tool_result` reads of a result: its structured content, and whether it has any.
                shell = (
                    types.CallToolResult.model_construct(structured_content=result["structuredContent"])
                    if "structuredContent" in result
                    else _UNSTRUCTURED
                )
                await session.validate_tool_result(name, shell)
        except MCPError as exc:
            raise ToolError("mcp-error", f"{exc.message} (MCP error {exc.code})") from None
        except RuntimeError as exc:  # the SDK checks structured content against the tool's output schema
            raise ToolError("bad-result", f"tool {name!r} of the MCP server: {exc}") from None
        except ValidationError as exc:  # the result is outside the negotiated revision's schema
            raise ToolError("bad-result", self._results.outside_schema(name, exc)) from None
        return result

    async def _send_call(self, name: str, arguments: dict[str, Any], progress: ProgressFnT) -> dict[str, Any]:
        """`tools/call` sent, its result checked against the negotiated revision's schema as the session's
        `send_request` checks it (negative `ttlMs` floored, later revisions' keys dropped) and kept as that JSON.

        On a command spoken to with the handshake the request goes past the session (`direct`: a third of the
        sidecar's loop thread was the session's dispatcher, per request), unless tracing is on: the session's
        dispatcher makes the request's span and carries its trace context in `_meta`. A 2026-07-28 connection's
        requests carry the session's own stamp, and an HTTP server's go through its transport: both by the session.
        """
        direct = self._direct
        if direct is None or tracing.tracer() is not None:
            request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))
            return (await self.client.session.send_request(request, _AsChecked, progress_callback=progress)).root
        raw = await direct.request("tools/call", {"name": name, "arguments": arguments}, progress)
        return self._results.checked(raw)

    async def _call_through_client(
        self, name: str, arguments: dict[str, Any], progress: ProgressFnT, state: str | None = None
    ) -> dict[str, Any]:
        """`tools/call` by the SDK's `Client.call_tool` (from `state`, if given), for what only it drives: its result
        parsed into a `CallToolResult` and dumped back to JSON."""
        called = await self.client.call_tool(name, arguments, progress_callback=progress, request_state=state)
        dumped: dict[str, Any] = called.model_dump(by_alias=True, mode="json", exclude_none=True)
        return dumped


_UNSTRUCTURED = types.CallToolResult.model_construct()
"""The shell of every result without structured content: `validate_tool_result` only reads it, and building one per
call was 2.7 % of the sidecar's loop thread once the rest of the call had gone."""


class _AsChecked(RootModel[dict[str, Any]]):
    """A result kept as the JSON object `send_request` checked it to be (against the negotiated revision's schema):
    its top level copied, nothing in it parsed again."""
