"""The MCP face of one workspace's live `ToolSet`: tools/list, tools/call and change notifications.

    front = McpFront(tools, include=["calc*"])
    await front.server.run(read_stream, write_stream, front.server.create_initialization_options())

Built on the official SDK's low-level `Server`: the SDK speaks the protocol
(every version from 2024-11-05 to 2026-07-28, both eras, the transports);
this module only answers its requests from the `ToolSet`. Transports are in
`transports`, the command in `discovery.cli.mcp`.

Change notifications reach each client the way its protocol version expects:

- 2026-07-28 clients open `subscriptions/listen` streams; the SDK's
  `ListenHandler` serves them from a `SubscriptionBus` we publish to.
- Clients on a handshake version get `notifications/tools/list_changed` on
  their connection. The SDK has no broadcast for those, so each connection's
  `notifications/initialized` handler stays subscribed to the same bus for
  as long as the connection lives (the SDK cancels it when the client goes)
  and forwards each event.

Both are published from the `ToolSet`'s change callback, in the same step as
the swap, and only when the listing a client would see actually changed.
Nothing waits on a timer: a change is notified at once, and on a handshake
connection the changes that come while a notification is being sent make
one more, sent when it is done (`forward_changes`); the `ToolSet`'s reloads
are batched the same way.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from importlib import metadata
from typing import Any

import anyio
import mcp_types as types
from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ServerEvent,
    SubscriptionBus,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError

from agent_bridge import BadArguments, RequestTimeout, ToolError, ToolSet, UnknownToolError
from toolservice_base import TransportError
from toolservice_base.logs import get_logger
from toolservice_base.schemas import TextContent, ToolResult, json_literals
from toolservice_base.schemas.audit import Outcome
from toolservice_base.schemas.content import merge

from . import search as surface
from .auth.gate import INSUFFICIENT_SCOPE_META, RETRY_AFTER_META, Gate
from .auth.policy import Caller, Rights
from .listing import DIGEST_META, Listing, ToolFilter, mcp_names_of

log = get_logger("discovery.mcp")

PAGE_SIZE = 100
"""Tools per tools/list page; a longer list is paged with `nextCursor`."""
LIST_TTL_MS = 1000
"""`ttlMs` on tools/list (2026-07-28): a client that does not listen for changes refetches within a second."""
MAX_VIEWS = 256
"""Listings kept per set of rights (the access policy's rules that apply to a caller); past it they are built anew."""


def _version() -> str:
    try:
        return metadata.version("tool-discovery")
    except metadata.PackageNotFoundError:
        return "0"


MAX_PROGRESS_MESSAGE = 1000
"""Characters of a part's text rendering sent as a progress message (a part may be a megabyte of text)."""


def _progress_message(part: ToolResult) -> str:
    text = part.text
    return text if len(text) <= MAX_PROGRESS_MESSAGE else text[: MAX_PROGRESS_MESSAGE - 1] + "…"


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _mcp_result(result: ToolResult) -> types.CallToolResult:
    """A `ToolResult` as MCP's `CallToolResult`: the same blocks, and the structured content. One plain text block
    (most answers) is built as it is, not dumped to JSON and read back."""
    content = result.content
    if result.structured is None and len(content) == 1:
        block = content[0]
        if type(block) is TextContent and not block.model_extra:
            return types.CallToolResult(content=[types.TextContent(type="text", text=block.text)])
    return types.CallToolResult.model_validate(result.to_mcp())


async def forward_changes(bus: SubscriptionBus, notify: Callable[[], Awaitable[None]]) -> None:
    """Call `notify()` for the tool changes published on `bus`, until cancelled; batched on the leading edge.

    A change that comes when no notification is in flight is notified at once. Those that come
    while one is in flight make exactly one more, sent as soon as it ends: a client refetches the
    whole list, so one notification says them all. Nothing waits on a timer.
    """
    # A buffer of one: the pending follow-up. Further changes find it full and are already in it.
    send, receive = anyio.create_memory_object_stream[ServerEvent](1)

    def deliver(event: ServerEvent) -> None:
        if isinstance(event, ToolsListChanged):
            try:
                send.send_nowait(event)
            except anyio.WouldBlock:
                pass  # a follow-up is already pending: it covers this change too

    unsubscribe = bus.subscribe(deliver)
    try:
        async with receive:
            async for _ in receive:
                await notify()
    finally:
        unsubscribe()
        send.close()


class _ToolServer(Server[Any]):
    """The SDK's low-level server, declaring `tools.listChanged` on every handshake path.

    The streamable-HTTP session manager builds the initialize result from
    `create_initialization_options()` with no arguments, so the default has to carry it.
    """

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions
        )


class McpFront:
    """Serves `tools` (filtered by `include`/`exclude`) as an MCP server; tells clients of every change."""

    def __init__(
        self,
        tools: ToolSet,
        *,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        user: str = "",
        page_size: int = PAGE_SIZE,
        search: bool = False,
        gate: Gate | None = None,
        explain_unknown: Callable[[str], Awaitable[str | None]] | None = None,
    ) -> None:
        """`search`: list only `search_tools` and `call_tool` (`discovery.mcp.search`) in front of the live tools.
        `explain_unknown(name)`: one line on why a name tools/list does not give is not there (a tool held by
        pinning, say), or None; what a call by that name is then answered with."""
        self.tools = tools
        self.search = search
        self.explain_unknown = explain_unknown
        self.filter = ToolFilter(tuple(include), tuple(exclude))
        self.user = user
        self.page_size = page_size
        self.gate = gate if gate is not None else Gate(tools.workspace)
        self._views: dict[Rights, Listing] = {}
        """Each set of rights' view of the current listing; emptied when the listing changes, bounded."""
        self.bus = InMemorySubscriptionBus()
        self._listing = Listing.of(tools, self.filter)
        self._announced = self._listing
        self._surface = Listing(tools=list(surface.SURFACE), own_names={}) if search else None
        self.listen = ListenHandler(self.bus)
        self.server = _ToolServer(
            "toolreg",
            version=_version(),
            title="Tool registry",
            instructions=(
                f"The live tools of workspace {tools.workspace!r}: tool services announce themselves and this list "
                "follows them; a change is notified (tools/list_changed, or the tools event on subscriptions/listen)."
            ),
            cache_hints={"tools/list": CacheHint(ttl_ms=LIST_TTL_MS, scope="private")},
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_subscriptions_listen=self.listen,
        )
        self.server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self._follow_changes
        )
        tools.on_change(self._on_change)

    def listing(self) -> Listing:
        return self._listing

    def close(self) -> None:
        """End every `subscriptions/listen` stream gracefully (the client sees the stream's result)."""
        self.listen.close()

    # --- change notification -------------------------------------------------

    async def _on_change(self, added: list[str], removed: list[str], changed: list[str], version: int) -> None:
        step = None
        if self._announced is self._listing:  # the listing follows the change alone
            step = self._listing.updated(self.tools, self.filter, [*added, *removed, *changed])
        if step is not None:
            listing, shown = step
        else:
            listing = Listing.of(self.tools, self.filter)
            shown = not listing.same_as(self._announced)
        self._listing = listing
        self._views = {}
        if self._surface is not None or not shown:  # the search surface never changes
            self._announced = listing
            return
        self._announced = listing
        log.info(
            "mcp.tools_changed",
            version=version,
            tools=len(listing.tools),
            added=added,
            removed=removed,
            changed=changed,
        )
        await self.bus.publish(ToolsListChanged())

    async def _follow_changes(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        """Forward tool changes to a handshake-era connection until it closes (the SDK then cancels this)."""
        client = ctx.session.client_params.client_info.name if ctx.session.client_params else "?"
        log.info("mcp.client_initialized", protocol=ctx.protocol_version, client=client)
        await forward_changes(self.bus, ctx.session.send_tool_list_changed)

    # --- requests ------------------------------------------------------------

    def _input_schema(self, name: str) -> Mapping[str, Any] | None:
        tool = (self._surface and self._surface.tool(name)) or self._listing.tool(name)
        return None if tool is None else tool.input_schema

    def visible(self, caller: Caller) -> Listing:
        """What `caller` sees of the current listing: the tools its rights allow."""
        rights = self.gate.rights(caller)
        if rights.everything:
            return self._listing
        view = self._views.get(rights)
        if view is None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            view = self._views[rights] = self._listing.visible_to(rights)
        return view

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        log.debug("mcp.list_tools", protocol=ctx.protocol_version, cursor=params.cursor if params is not None else None)
        listing = self._surface or self.visible(self.gate.caller(ctx.request))
        return listing.page(params.cursor if params is not None else None, self.page_size)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        """Who calls, may it, is it too fast; then the call; each one recorded (`mcp.call`, and the audit topic)."""
        started = time.monotonic()
        caller = self.gate.caller(ctx.request)
        resolved = await self._resolve(caller, params.name, dict(params.arguments or {}))
        if isinstance(resolved, types.CallToolResult):
            return resolved
        name, arguments = resolved
        listing = self._listing
        tool = listing.tool(name)
        digest = tool.meta.get(DIGEST_META) if tool is not None and tool.meta else None

        def record(outcome: Outcome, detail: str = "") -> None:
            self.gate.trail.record(caller, name, outcome, started, digest=digest, detail=detail, arguments=arguments)

        own_name = listing.own_names.get(name)
        if own_name is None:
            record("unknown_tool")
            raise await self._unknown(caller, name)
        if not self.gate.rights(caller).allows(own_name, name):
            text, scopes = self.gate.denial(caller, name, own_name)
            record("denied", text)
            meta = {INSUFFICIENT_SCOPE_META: {"error": "insufficient_scope", "scope": scopes}}
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True, _meta=meta)
        wait = self.gate.wait(caller)
        if wait > 0:
            limiter = self.gate.limiter
            assert limiter is not None
            text = f"rate_limited: at most {limiter.rate:g} calls per second per caller; retry after {wait:.3f} s"
            record("rate_limited", text)
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)],
                is_error=True,
                _meta={RETRY_AFTER_META: max(0.001, round(wait, 3))},
            )
        try:
            result, outcome, detail = await self._invoke(ctx, name, own_name, arguments, caller)
        except MCPError as exc:
            record("timeout" if exc.error.code == types.REQUEST_TIMEOUT else "failed", exc.error.message)
            raise
        record(outcome, detail)
        return result

    async def _unknown(self, caller: Caller, name: str) -> MCPError:
        """The error for a call of a tool the set does not hold: why, when the front can say (`explain_unknown`) and
        the caller may call that tool (a caller is told only of a tool it may call); else where the live tools are."""
        allowed = self.gate.rights(caller).allows(name)
        why = await self.explain_unknown(name) if self.explain_unknown is not None and allowed else None
        if why is not None:
            return MCPError(types.INVALID_PARAMS, why)
        found = (
            "search_tools finds the live tools"
            if self._surface
            else f"tools/list names the {len(self.visible(caller).tools)} tools there are"
        )
        return MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}: {found}")

    async def _resolve(
        self, caller: Caller, name: str, arguments: dict[str, Any]
    ) -> types.CallToolResult | tuple[str, dict[str, Any]]:
        """The tool a call is for and its arguments; with the search surface, `search_tools` answered here (over the
        tools `caller` may call) and `call_tool` unwrapped."""
        if self._surface is None or name not in (surface.SEARCH, surface.CALL):
            return name, arguments
        if name == surface.SEARCH:
            visible = self.visible(caller)
            return await surface.search_result(self.tools, visible.by_name(), mcp_names_of(visible), arguments)
        called, inner = arguments.get("name"), arguments.get("arguments") or {}
        if not isinstance(called, str) or not isinstance(inner, dict):
            return surface.refusal(f"{surface.CALL} takes a tool's name (text) and its arguments (an object)")
        if called not in self._listing.own_names:
            return surface.refusal(f"no live tool named {called!r}; {surface.SEARCH} finds the tools there are")
        return called, inner

    async def _invoke(
        self, ctx: ServerRequestContext[Any], name: str, own_name: str, arguments: dict[str, Any], caller: Caller
    ) -> tuple[types.CallToolResult, Outcome, str]:
        """Call the tool through the `ToolSet`; its result, how it ended, and the error in one line if any.

        The service is told who calls (the request's `user`): `--user` when given, else an OAuth caller's subject.
        """
        log.debug("mcp.call_tool", protocol=ctx.protocol_version, tool=name)
        user = self.user or (caller.subject if caller.authenticated else "")
        parts: list[ToolResult] = []
        try:
            async with aclosing(self.tools.parts(own_name, arguments, user=user)) as stream:  # type: ignore[type-var]
                async for part in stream:
                    parts.append(part)
                    # A no-op unless the client sent a progress token.
                    await ctx.session.report_progress(len(parts), None, _progress_message(part))
        except BadArguments as exc:  # checked by the ToolSet against this very input schema, before sending
            # A tool execution error, not -32602: the model sees it and can correct its call (SEP-1303). On every
            # protocol version, as the SDK's own MCPServer does; no version requires a protocol error here.
            log.info("mcp.bad_arguments", tool=name, argument=exc.argument)
            text = f"bad arguments: {json_literals(exc.message)}"
            return (
                types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True),
                ("bad_arguments"),
                text,
            )
        except ToolError as exc:
            log.info("mcp.tool_failed", tool=name, error=str(exc))
            text = f"{exc.type}: {exc.message}"
            return (
                types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True),
                ("tool_error"),
                text,
            )
        except UnknownToolError as exc:  # removed between the lookup and the call
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}: {one_line(exc)}") from None
        except RequestTimeout as exc:
            raise MCPError(types.REQUEST_TIMEOUT, f"tool {name!r} timed out: {one_line(exc)}") from None
        except TransportError as exc:
            log.warning("mcp.call_failed", tool=name, error=one_line(exc))
            raise MCPError(types.INTERNAL_ERROR, f"tool {name!r} could not be called: {one_line(exc)}") from None
        return _mcp_result(merge(parts) if parts else ToolResult(content=(TextContent(text=""),))), "ok", ""
