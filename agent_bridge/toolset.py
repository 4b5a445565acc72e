"""`ToolSet`: the agent's tools, loaded from the config store and hot-reloaded.

    async with ToolSet(workspace="default") as tools:
        print(await tools.invoke("tell-joke", {"topic": "cats"}))

The whole set lives in one immutable state; a reload builds the next one
aside and swaps it in with one assignment, so a call never sees half a set.
Pushes on the notify topic trigger reloads, batched on the leading edge (a
lone push is reloaded at once; the pushes that come while a reload is in
flight make one follow-up reload); a periodic read of the store's version
catches a push that was lost. The machinery is in `reload`; this module is
the public face.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Any, Self

from toolservice_base.errors import (
    BadArguments,
    BridgeUnavailable,
    BrokerUnreachable,
    UnknownToolError,
)
from toolservice_base.logs import get_logger
from toolservice_base.metrics import OTHER_TOOL
from toolservice_base.rpc import DEFAULT_LIMITS, CallLimits
from toolservice_base.schemas import TextContent, ToolResult, check_name
from toolservice_base.schemas.content import merge
from toolservice_base.search import Health, Match, Ranker, ranker_for
from toolservice_base.search.settings import SearchSettings
from toolservice_base.settings import Settings
from toolservice_base.transport import Transport, open_transport

from .build import Entry, one_line
from .impls import Tool, ToolFactory
from .metrics import BridgeMetrics
from .reload import ChangeCallback, Reloader, State
from .search import ToolSearch
from .snapshot import Deployment, Snapshot, other_snapshots, read_snapshot, snapshot_path
from .specs import ToolSpec
from .static import StaticDirError, load_static_dir

log = get_logger("agent_bridge.toolset")


def _configured_ranker() -> Callable[[], Ranker]:
    """BM25 fused with the embedder the environment names (`SearchSettings`), read when no ranker is given."""
    search = SearchSettings.from_env()
    return ranker_for(search.embedder, search.embedder_key)


class ToolSet:
    """The current tools of one workspace, kept in step with the config store."""

    def __init__(
        self,
        pulsar_url: str | None = None,
        workspace: str = "default",
        *,
        settings: Settings | None = None,
        connection: Transport | None = None,
        static_dir: str | Path | None = None,
        data_dir: str | Path | None = None,
        factories: Mapping[str, ToolFactory] | None = None,
        user: str = "",
        poll_interval: float = 2.0,
        store_timeout: float = 3.0,
        limits: CallLimits | float = DEFAULT_LIMITS,
        close_timeout: float = 30.0,
        metrics: BridgeMetrics | None = None,
        ranker: Callable[[], Ranker] | None = None,
    ) -> None:
        """`limits` bound each call through the set (`CallLimits`, or a number: the whole call's timeout):
        `timeout` the whole call, a streamed answer included (30 s by default); `idle_timeout` (off unless
        given) each wait for the next chunk; `max_answer_bytes` what one answer may bring in. Past a timeout
        a call raises `RequestTimeout`, past the size `AnswerTooLarge`, and the service is told to stop.
        `ranker` makes the ranker `search` uses (by default BM25 fused with the embedder
        `TOOLREG_SEARCH_EMBEDDER` names, `SearchSettings`; a ranker of your own goes behind the same `Ranker`
        interface)."""
        self.workspace = check_name(workspace, "workspace")
        self._settings = settings or Settings.from_env(data_dir=data_dir, pulsar_url=pulsar_url)
        self._pulsar_url = pulsar_url
        self._connection = connection
        self._own_connection = connection is None
        self.static_dir = Path(static_dir) if static_dir is not None else None
        self.data_dir = Path(data_dir) if data_dir is not None else self._settings.data_dir
        """Where the last-known-good snapshots are kept (`snapshot_path`)."""
        self.snapshot: Snapshot | None = None
        """The snapshot this set was loaded from, when the store did not answer at start (None otherwise): which file,
        how old and of which deployment it is (`Snapshot.describe()`), for a caller to tell its user."""
        self.user = user
        self.poll_interval = poll_interval
        self.store_timeout = store_timeout
        self.limits = CallLimits.of(limits)
        """The bounds of each call through this set (`CallLimits`)."""
        self.close_timeout = close_timeout
        self.metrics = metrics or BridgeMetrics.default()
        self._reload = Reloader(self, factories or {})
        self._search = ToolSearch(ranker or _configured_ranker())
        self._reload.swap_hooks.append(self._search.swap)
        self._closed = False

    # --- lifecycle ---------------------------------------------------------

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> Self:
        """Load from the store, or a fallback if it does not answer within `store_timeout`; then watch."""
        try:
            if self._connection is None:
                self._connection = await open_transport(self._settings, url=self._pulsar_url)
            await self._reload.load(self._connection, self._load_fallback)
        except BaseException:
            await self._shutdown()
            raise
        self._reload.start()
        return self

    async def close(self) -> None:
        """Stop watching, let in-flight calls finish (up to `close_timeout`), close everything."""
        if self._closed:
            return
        self._closed = True
        await self._shutdown()
        log.info("toolset.closed", workspace=self.workspace, version=self.version)

    async def _shutdown(self) -> None:
        await self._reload.stop()
        await self._search.close()
        if self._own_connection and self._connection is not None:
            await self._connection.close()

    @property
    def deployment(self) -> Deployment:
        """The broker and topicspace this set's tools come from (once started: as its connection reaches them)."""
        if self._connection is not None:
            return Deployment.of(self._connection.url, self._connection.topics.topicspace)
        url = self._pulsar_url or self._settings.resolve_pulsar_url()
        return Deployment.of(url, self._settings.topicspace)

    @property
    def snapshot_path(self) -> Path:
        """This set's last-known-good snapshot: one per deployment and workspace, under `data_dir`."""
        return snapshot_path(self.data_dir, self.workspace, self.deployment)

    # --- the set -------------------------------------------------------------

    @property
    def _state(self) -> State:
        return self._reload.state

    @property
    def version(self) -> int:
        """The config version applied (for a snapshot, the version it was taken at; static files: 0)."""
        return self._state.version

    @property
    def source(self) -> str:
        """Where the current set came from: `store`, `snapshot` or `static`."""
        return self._state.source

    @property
    def problems(self) -> dict[str, str]:
        """Tools skipped, by name, each with a one-line reason."""
        return dict(self._state.problems)

    def names(self) -> list[str]:
        return sorted(self._state.entries)

    def get(self, name: str) -> Tool | None:
        entry = self._state.entries.get(name)
        return None if entry is None else entry.impl

    def __contains__(self, name: object) -> bool:
        return name in self._state.entries

    def __len__(self) -> int:
        return len(self._state.entries)

    def describe(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Name, description and JSON Schema of the arguments of each tool, by name, and the `digest` of its definition.

        `parameters` is the tool's input schema as its service declared it (the same bytes after
        canonical JSON), or the one derived from its flat arguments. A tool that says more has
        `title`, `annotations` (MCP's hints, camelCase as MCP spells them) and `output_schema`.
        `digest` is the sha256 the registry pins (`toolreg up --pin-definitions`) and `toolreg tools`
        shows: of the tool's description, arguments, config values, title, annotations and schemas,
        and its service's queues and params, as this set holds them
        (`toolservice_base.schemas.tools.definition_digest`).

        `names`: only these tools, in this order (a name the set does not hold is left out), as `search` ranks them.
        """
        return [spec.as_dict() for spec in self.specs(names)]

    def specs(self, names: Iterable[str] | None = None) -> list[ToolSpec]:
        """`describe`, typed: each tool's `ToolSpec`, by name or in the order of `names`, which shows it to OpenAI
        (`to_openai`), to MCP (`to_mcp`) or as a dict (`as_dict`)."""
        state = self._state
        entries, openai = state.entries, state.openai_names
        chosen = sorted(entries) if names is None else [n for n in names if n in entries]
        return [ToolSpec.of(n, openai[n], entries[n]) for n in chosen]

    # --- search --------------------------------------------------------------

    async def search(self, query: str, limit: int = 10) -> list[Match]:
        """The `limit` tools that best match `query`, best first: by what their names, titles, descriptions and
        arguments mean and the words they share with the query (`toolservice_base.search.hybrid`), adjusted by
        health (`toolservice_base.search.health`): a tool the registry reports `held` or
        `unavailable` is never returned; one failing most of its calls ranks below a healthy one that matches as
        well. Health comes from this set's own calls, and from `report_health` if the application feeds it.

        `describe([m.name for m in matches])` gives their definitions. The index is built in a worker thread when
        the first search asks for it (the embedder loaded, each tool embedded: seconds for 10,000 tools, while the
        event loop runs on; a set that is never searched never builds one, nor imports numpy), then fed at every
        reload with what changed. `BadQuery` (one line, at once) for a query with no words, one over
        `MAX_QUERY_CHARS`, or a limit outside 1 to `MAX_LIMIT`.
        """
        return await self._search.search(query, limit, self._state.entries)

    def report_health(self, reports: Mapping[str, Health]) -> None:
        """What the registry says of each tool (its status; its failure share over every caller), replacing the last
        report: `search` ranks by it. A tool left out is not known to the registry."""
        self._search.reported = dict(reports)

    def health(self, name: str) -> Health:
        """What `search` knows of one tool's health: its own calls' failure share, and the registry's report."""
        return self._search.health(name)

    def as_openai_tools(self) -> list[dict[str, Any]]:
        """OpenAI function calling: `[{"type": "function", "function": {name, description, parameters}}]`.

        Names OpenAI would refuse (dots, over 64 characters) are given in a form
        it accepts (see `toolservice_base.names`); `invoke` takes either form.
        """
        return [spec.to_openai() for spec in self.specs()]

    def as_mcp_tools(self) -> list[dict[str, Any]]:
        """MCP `tools/list`: `[{name, description, inputSchema}]`, with `title`, `annotations` and `outputSchema`
        for the tools that have them."""
        return [spec.to_mcp() for spec in self.specs()]

    # --- calls ---------------------------------------------------------------

    def _lookup(self, name: str) -> Entry:
        if self._closed:
            raise RuntimeError("this ToolSet is closed; open a new one")
        state = self._state
        entry = state.entries.get(name)
        if entry is None:
            entry = state.entries.get(state.by_openai_name.get(name, ""))
        if entry is not None:
            return entry
        if name in state.problems:
            raise UnknownToolError(f"tool {name!r} was skipped: {state.problems[name]}")
        known = ", ".join(sorted(state.entries)) or "none"
        raise UnknownToolError(f"no tool named {name!r} in workspace {self.workspace!r}; available: {known}")

    def _labels(self, name: str) -> tuple[str, str]:
        """(service, tool) for the metrics: the set's own names only, `(other)` for a tool it does not hold."""
        state = self._state
        entry = state.entries.get(name) or state.entries.get(state.by_openai_name.get(name, ""))
        return (entry.tool.service or "", entry.tool.name) if entry is not None else ("", OTHER_TOOL)

    async def invoke(self, name: str, arguments: Mapping[str, Any] | None = None, user: str = "") -> str:
        """Call tool `name` (its own name or the one `as_openai_tools` gave it) and return the whole observation.

        The arguments are checked against the schema `describe()` advertises
        first (`BadArguments`, nothing sent). A streamed answer comes back as
        its chunks joined in order, with nothing between them. Raises
        `ToolError` if the service answered with an error (`BadArguments` and
        `AnswerTooLarge` are ToolErrors too), `RequestTimeout` past
        `limits.timeout` (or `limits.idle_timeout`), `UnknownToolError` for a name the
        set does not hold. Counted and timed per tool in the bridge's metrics.
        """
        labels = self._labels(name)
        with self.metrics.timed(*labels), self._search.outcomes.counting(labels[1]):
            return await self._invoke(name, arguments, user)

    async def _invoke(self, name: str, arguments: Mapping[str, Any] | None, user: str) -> str:
        entry = self._lookup(name)
        args = dict(arguments or {})
        entry.arguments.check(args)
        told = entry.calls_for_user
        if told is not None:
            result = await told.call(args, user=user or None)
        else:
            result = await entry.impl.invoke(**args)
        return _as_text(result)

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None, user: str = "") -> ToolResult:
        """Call tool `name` and return the whole result as typed values: its content blocks (text, images, audio,
        resources, resource links) and structured content. A text answer is one `TextContent`; a streamed one,
        its parts merged (`ToolResult.text` is then what `invoke` returns). Raises as `invoke` does."""
        parts: list[ToolResult] = []
        async with aclosing(self.parts(name, arguments, user)) as each:  # type: ignore[type-var]
            async for part in each:
                parts.append(part)
        return merge(parts)

    def parts(self, name: str, arguments: Mapping[str, Any] | None = None, user: str = "") -> AsyncIterator[ToolResult]:
        """The result part by part as the service sends them, each a `ToolResult` (see `call`); checked, counted
        and bounded as `stream` is."""
        labels = self._labels(name)
        try:
            entry = self._lookup(name)
            args = dict(arguments or {})
            entry.arguments.check(args)
        except (UnknownToolError, BadArguments) as exc:
            self.metrics.failed(*labels, exc)
            raise
        rich = entry.parts_for_user
        if rich is not None:
            parts: AsyncIterator[ToolResult] = rich.call_parts(args, user=user or None)
        else:
            parts = _as_parts(self._chunks(entry, args, user))
        return self.metrics.timed_stream(*labels, self._search.outcomes.counted(labels[1], parts))

    def _chunks(self, entry: Entry, args: dict[str, Any], user: str) -> AsyncIterator[str]:
        streams = entry.streams_for_user
        if streams is not None:
            chunks: AsyncIterator[str] = streams.call_stream(args, user=user or None)
            return chunks
        return _single(entry.impl, args)

    def stream(self, name: str, arguments: Mapping[str, Any] | None = None, user: str = "") -> AsyncIterator[str]:
        """The observation chunk by chunk, as the service sends them: `async for chunk in tools.stream(...)`.

        Arguments are checked here, before the first chunk is asked for; the
        other errors are those of `invoke`, raised from the loop. Empty
        chunks are skipped, so `"".join` of the chunks is what `invoke`
        returns. A tool that cannot stream yields its whole answer once.
        `limits.timeout` bounds the whole stream; leaving the loop early (use
        `contextlib.aclosing` to leave at once) tells the service to stop.
        Counted and timed per tool in the bridge's metrics, from the first read to the last chunk.
        """
        labels = self._labels(name)
        try:
            entry = self._lookup(name)
            args = dict(arguments or {})
            entry.arguments.check(args)
        except (UnknownToolError, BadArguments) as exc:
            self.metrics.failed(*labels, exc)
            raise
        return self.metrics.timed_stream(
            *labels, self._search.outcomes.counted(labels[1], self._chunks(entry, args, user))
        )

    # --- change notification -------------------------------------------------

    def on_change(self, callback: ChangeCallback) -> ChangeCallback:
        """Call `callback(added, removed, changed, version)` after each reload that changed the set."""
        self._reload.callbacks.append(callback)
        return callback

    async def wait_for(self, predicate: Callable[[ToolSet], bool], timeout: float = 10.0) -> Self:
        """Wait until `predicate(self)` holds, checked now and after every reload; return the ToolSet itself.

        Past `timeout` seconds, `TimeoutError` with one line naming the
        version, source and tools the set holds (and the skipped ones). An
        exception raised by `predicate` propagates as is.
        """
        swapped = self._reload.swapped
        async with swapped:
            try:
                await asyncio.wait_for(swapped.wait_for(lambda: predicate(self)), timeout)
            except TimeoutError:
                problems = f"; skipped: {', '.join(sorted(self._state.problems))}" if self._state.problems else ""
                raise TimeoutError(
                    f"ToolSet condition not met within {timeout:g}s (version {self.version}, source {self.source}, "
                    f"tools: {', '.join(self.names()) or 'none'}{problems})"
                ) from None
        return self

    # --- loading -------------------------------------------------------------

    async def refresh(self) -> bool:
        """Read the store now and apply what changed; True if the set changed."""
        return await self._reload.refresh()

    async def _load_fallback(self, error: BaseException) -> None:
        deployment = self.deployment
        snapshot = read_snapshot(self.snapshot_path, deployment, self.workspace)
        if snapshot is not None:
            log.warning(
                "toolset.fallback",
                source="snapshot",
                path=str(snapshot.path),
                version=snapshot.version,
                age_s=round(max(0.0, time.time() - snapshot.saved_at), 1),
                deployment=str(deployment),
                error=one_line(error),
            )
            self.snapshot = snapshot
            await self._reload.apply(snapshot.version, snapshot.items, "snapshot")
            return
        static_error = "no static_dir given"
        if self.static_dir is not None:
            try:
                items = load_static_dir(self.static_dir)
            except StaticDirError as exc:
                static_error = str(exc)
            else:
                log.warning("toolset.fallback", source="static", path=str(self.static_dir), error=one_line(error))
                await self._reload.apply(0, items, "static")
                return
        if isinstance(error, BrokerUnreachable):
            what, fix = one_line(error), "start the broker or fix PULSAR_URL"
        else:
            what, fix = f"config store did not answer ({one_line(error)})", "start the config store (`toolreg up`)"
        others = other_snapshots(self.data_dir, self.workspace, deployment)
        unused = (
            f" (not used, being of another deployment: {'; '.join(f'{o.path.name}, {o.deployment}' for o in others)})"
            if others
            else ""
        )
        raise BridgeUnavailable(
            f"{what}; no snapshot of workspace {self.workspace!r} for {deployment} at {self.snapshot_path}{unused} and"
            f" {static_error}: {fix}, or pass static_dir=<dir with tool/*.json and tool-service/*.json>"
        )


async def _as_parts(chunks: AsyncIterator[str]) -> AsyncIterator[ToolResult]:
    """Text chunks (a tool type that knows no rich results) as parts, each one text block."""
    try:
        async for chunk in chunks:
            if chunk:
                yield ToolResult(content=(TextContent(text=chunk),))
    finally:
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()


def _as_text(value: Any) -> str:
    """The spec's rule for a non-string result: send `json.dumps` of it."""
    return value if isinstance(value, str) else json.dumps(value)


async def _single(impl: Tool, arguments: dict[str, Any]) -> AsyncIterator[str]:
    yield _as_text(await impl.invoke(**arguments))
