"""`McpToolService`: an MCP server's tools as one tool service on the bus, kept true to the server while it runs.

    async with McpToolService(McpCommand("npx", ("-y", "@modelcontextprotocol/server-everything"))) as service:
        await stop_requested.wait()

Its life is a series of *connections*. Each one connects to the server (the
SDK client: a command started, or an HTTP endpoint reached), lists its tools
(every page), and only then subscribes to the service's request queue and
announces the tools, as a `DynamicToolService` does, whose machinery it is:
each call on the queue becomes a `tools/call` to the server (its progress
notifications streamed as chunks, its result as the same content blocks and
structured content, `isError` as a tool error, and a caller's cancel or
deadline as MCP's cancellation). While connected it pings the server every
`ping_interval` and follows `notifications/tools/list_changed`: a listing
that differs is announced as a newer offer of the same instance, which the
registry merges (and holds, where definitions are pinned) like any other
change.

When the server stops answering (its command exited, a ping went
unanswered, the endpoint went away), the connection ends: its tools are
withdrawn, the queue is left, and the next connection is tried after a
back-off (0.5 s, doubling, at most `max_backoff`; a command is started
again). The first connection is `start()`'s: if it fails, nothing was
announced and `start()` raises `McpServerError` saying why.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..errors import McpServerError, ToolError
from ..logs import get_logger
from ..schemas import DEFAULT_TTL, ToolResult, check_name, descriptor_digest
from ..service import DEFAULT_CALL_TIMEOUT, DynamicToolService
from ..settings import Settings
from ..signing import load_private_key
from ..tasks import cancel_and_wait
from ..transport import Transport, open_transport
from .listing import Offer, Selection, offer_of, service_id_of
from .settings import SidecarSettings
from .upstream import McpServer, Upstream, unwrapped

log = get_logger("toolservice_base.mcp_service")

DEFAULT_TIMEOUT = 30.0
"""Seconds the server has to finish its handshake, list its tools, or answer a ping."""
FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0


class _McpTools(DynamicToolService):
    """One connection's tools on the bus: each call a `tools/call` to the server, through `upstream`."""

    upstream: Upstream
    mcp_names: dict[str, str]
    ask_now: asyncio.Event
    loop: asyncio.AbstractEventLoop
    """The loop it serves on, kept: on Python 3.11 each `get_running_loop()` is a `getpid()` system call, which the
    sidecar's profile showed on every call."""

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = "") -> Any:
        """One answer when the result comes before any progress notification (most calls: one response, not a
        result part and an empty last one); else a stream: each progress step a chunk as it comes (a line each: its
        message, or `done/total`), then the result. Leaving early (a deadline, the caller gone) cancels the call at
        the server."""
        steps = _Steps()
        call = self.loop.create_task(self.upstream.call(self.mcp_names.get(tool, tool), arguments, steps.progress))
        try:
            first = await steps.next(call)
            if first is None:
                return self._answer(call)
        except BaseException:
            await cancel_and_wait(call)
            raise
        return self._stream(call, steps, first)

    async def _stream(self, call: asyncio.Task[dict[str, Any]], steps: _Steps, first: str) -> AsyncIterator[Any]:
        """The progress steps as chunks, then the result; the call is cancelled at the server however this ends."""
        try:
            yield first + "\n"
            while (step := await steps.next(call)) is not None:
                yield step + "\n"
            answer = self._answer(call)
        finally:
            await cancel_and_wait(call)
        yield answer

    def _answer(self, call: asyncio.Task[dict[str, Any]]) -> ToolResult | str:
        """The finished call's result, or its error as a `ToolError`."""
        try:
            result = call.result()
        except ToolError as exc:
            if exc.type == "mcp-error":
                self.ask_now.set()  # a closed connection answers so too: is the server still there?
            raise
        if not result.get("isError") and (text := _plain_text(result)) is not None:
            return text
        answer = ToolResult.from_mcp(result)
        if result.get("isError"):
            raise ToolError("tool-error", answer.text or "the MCP server says the call failed")
        return answer


def _plain_text(result: dict[str, Any]) -> str | None:
    """The text of a result that is one plain text block (no annotations, no meta) and no structured content, else
    None. Most tools answer so; as a `str` the answer takes the service's text path, and its caller reads the same
    one text block, with no content blocks parsed, built and dumped on the way (measured in the sidecar's profile).
    """
    content = result.get("content")
    if result.get("structuredContent") is not None or not isinstance(content, list) or len(content) != 1:
        return None
    block = content[0]
    if not isinstance(block, dict) or block.keys() != {"type", "text"} or block["type"] != "text":
        return None
    text = block["text"]
    return text if isinstance(text, str) and text else None


class _Steps:
    """One call's progress steps, and the one wait for the next step or the call's end.

    A plain future woken from the progress callback or the call's done callback: the wait of most calls (the
    result, no progress) costs no task of its own, no `asyncio.wait` and no queue (the sidecar's per-call profile
    showed each of them)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[str] = deque()
        self._waiter: asyncio.Future[None] | None = None

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """The SDK's progress callback: one step, a line."""
        self._items.append(message or (f"{progress:g}/{total:g}" if total else f"{progress:g}"))
        self._wake()

    def _wake(self, _: object = None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self, call: asyncio.Task[Any]) -> str | None:
        """The next progress step, if one comes (or came) before the call ends; None once it ended with none left."""
        if self._items:
            return self._items.popleft()
        if call.done():
            return None
        self._waiter = call.get_loop().create_future()
        call.add_done_callback(self._wake)
        try:
            await self._waiter
        finally:
            call.remove_done_callback(self._wake)
            self._waiter = None
        return self._items.popleft() if self._items else None


class McpToolService:
    """An MCP server brought into the fleet: its tools announced as one tool service, its calls answered by it.

    `server` is an `McpCommand` (stdio) or an `McpUrl` (streamable HTTP).
    The service id is `service_id`, or the server's own name made one
    (`mcp-servers/everything` gives `mcp-servers-everything`). `include` and
    `exclude` choose tools by their MCP names (shell patterns). `ttl`,
    `workspace`, `signing_key`, `version` and `call_timeout` are a
    `DynamicToolService`'s. `max_message` bounds one message of an HTTP
    server (default `SidecarSettings.max_message`: TOOLREG_MCP_MAX_MESSAGE, else the broker's limit). Start and
    stop it with `async with`, or `start()`/`stop()` (say on an `AsyncExitStack`).
    """

    def __init__(
        self,
        server: McpServer,
        *,
        service_id: str | None = None,
        settings: Settings | None = None,
        connection: Transport | None = None,
        ttl: float = DEFAULT_TTL,
        workspace: str = "default",
        signing_key: Ed25519PrivateKey | str | Path | None = None,
        version: str = "",
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        timeout: float = DEFAULT_TIMEOUT,
        ping_interval: float | None = None,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        max_backoff: float = MAX_BACKOFF,
        max_message: int | None = None,
    ) -> None:
        if service_id is not None:
            check_name(service_id, "service id")
        self.server = server
        self.settings = settings or Settings.from_env()
        self._connection = connection
        self._service_id = service_id
        self.ttl = ttl
        self.workspace = workspace
        key_source = signing_key if signing_key is not None else self.settings.signing_key_file
        self.signing_key = load_private_key(key_source) if isinstance(key_source, (str, Path)) else key_source
        self.version = version
        self.call_timeout = call_timeout
        self.timeout = timeout
        self.ping_interval = ping_interval if ping_interval is not None else min(ttl / 3, 5.0)
        self.selection = Selection(tuple(include), tuple(exclude))
        self.max_backoff = max_backoff
        self.max_message = max_message or SidecarSettings.from_env().max_message
        """Bytes one message of an HTTP MCP server may hold (TOOLREG_MCP_MAX_MESSAGE; default the broker's limit)."""
        self.offer: Offer | None = None
        """What is announced now: None while the server is away."""
        self.connections = 0
        """Connections that reached the point of announcing, the first included."""
        self._up = False
        self._task: asyncio.Task[None] | None = None
        self._stack = AsyncExitStack()

    @property
    def service_id(self) -> str | None:
        return self.offer.service.id if self.offer is not None else self._service_id

    async def start(self) -> None:
        """Connect, list and announce; McpServerError (nothing announced, nothing left open) if that fails."""
        async with AsyncExitStack() as stack:
            if self._connection is None:
                self._connection = await open_transport(self.settings)
                stack.push_async_callback(self._forget_connection)
            first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._supervise(first), name="mcp-sidecar")
            stack.push_async_callback(self._stop_task)
            await asyncio.shield(first)
            self._stack = stack.pop_all()

    async def stop(self) -> None:
        """Withdraw the tools, leave the queue, close the server's connection (a command is stopped)."""
        await self._stack.aclose()

    async def __aenter__(self) -> McpToolService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _stop_task(self) -> None:
        await cancel_and_wait(self._task)

    async def _forget_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    async def _supervise(self, first: asyncio.Future[None]) -> None:
        """Connections one after another, with a back-off between them, until cancelled."""
        backoff = FIRST_BACKOFF
        while True:
            try:
                try:
                    await self._connected(first)
                except BaseExceptionGroup as group:
                    raise unwrapped(group) from None
            except McpServerError as exc:
                if not first.done():
                    first.set_exception(exc)
                    return
                log.warning("mcp.server_lost", server=str(self.server), error=str(exc), retry_in=backoff)
            except BaseException as exc:
                if not first.done():
                    first.set_exception(exc if isinstance(exc, Exception) else McpServerError("stopped"))
                raise
            # A connection that had announced starts the back-off afresh; one that never got so far doubles it.
            backoff = FIRST_BACKOFF if self._up else min(backoff * 2, self.max_backoff)
            self._up = False
            await asyncio.sleep(backoff)

    async def _connected(self, first: asyncio.Future[None]) -> None:
        """One connection: connect, list, announce, then follow the server until it is lost (McpServerError)."""
        changed = asyncio.Event()
        async with Upstream(
            self.server, timeout=self.timeout, on_tools_changed=changed.set, max_message=self.max_message
        ) as upstream:
            offer = self._offer_of(await upstream.list_tools(), upstream)
            service = self._service_for(offer, upstream)
            try:
                async with service:
                    self.offer, self._up = offer, True
                    self.connections += 1
                    log.info(
                        "mcp.announced",
                        server=str(self.server),
                        service=offer.service.id,
                        tools=len(offer.tools),
                        listed=offer.listed,
                        instance=service.instance,
                    )
                    if not first.done():
                        first.set_result(None)
                    await self._follow(upstream, service, changed)
            finally:
                self.offer = None

    def _offer_of(self, listed: list[dict[str, Any]], upstream: Upstream) -> Offer:
        assert self._connection is not None
        service_id = self._service_id or service_id_of(upstream.name)
        return offer_of(listed, service_id, self._connection.topics, self.selection)

    def _service_for(self, offer: Offer, upstream: Upstream) -> _McpTools:
        kind = type(
            "McpTools",
            (_McpTools,),
            {
                "descriptor": offer.service.to_wire(),
                "tools": [tool.to_wire() for tool in offer.tools],
                "version": self.version,
            },
        )
        service = kind(
            settings=self.settings,
            connection=self._connection,
            ttl=self.ttl,
            workspace=self.workspace,
            signing_key=self.signing_key,
            call_timeout=self.call_timeout,
        )
        assert isinstance(service, _McpTools)
        service.upstream, service.mcp_names, service.ask_now = upstream, dict(offer.mcp_names), asyncio.Event()
        service.loop = asyncio.get_running_loop()
        return service

    async def _follow(self, upstream: Upstream, service: _McpTools, changed: asyncio.Event) -> None:
        """Ping the server, and announce its tools again when it says they changed; return never, raise when lost."""
        while True:
            waits = [changed.wait(), service.ask_now.wait(), upstream.lost.wait()]
            tasks = [asyncio.ensure_future(waiting) for waiting in waits]
            try:
                await asyncio.wait(tasks, timeout=self.ping_interval, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    await cancel_and_wait(task)
            if upstream.lost.is_set():
                raise McpServerError(upstream.why)
            if changed.is_set():
                changed.clear()
                await self._relist(upstream, service)
            else:
                service.ask_now.clear()
                await upstream.ping()

    async def _relist(self, upstream: Upstream, service: _McpTools) -> None:
        listed = await upstream.list_tools()  # a server that cannot list is lost: McpServerError
        try:
            offer = self._offer_of(listed, upstream)
        except McpServerError as exc:
            log.warning("mcp.listing_refused", server=str(self.server), error=str(exc), note="the last listing stays")
            return
        current = self.offer
        if current is not None and descriptor_digest(offer.service, offer.tools) == descriptor_digest(
            current.service, current.tools
        ):
            log.debug("mcp.tools_unchanged", server=str(self.server))
            return
        service.mcp_names = dict(offer.mcp_names)
        await service.offer([tool.to_wire() for tool in offer.tools])
        self.offer = offer
        log.info("mcp.tools_changed", server=str(self.server), service=offer.service.id, tools=len(offer.tools))
