"""`ToolSet`: the agent's tools, loaded from the config store and hot-reloaded.

    async with ToolSet(workspace="default") as tools:
        print(await tools.invoke("tell-joke", {"topic": "cats"}))

The whole set lives in one immutable `_State`; a reload builds the next one
aside and swaps it in with one assignment, so a call never sees half a set.
Pushes on the notify topic trigger reloads (debounced, so a burst is one
reload); a periodic read of the store's version catches a push that was lost.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Self

from toolservice_base.configclient import ConfigClient, watch_config
from toolservice_base.errors import (
    BadArguments,
    BridgeUnavailable,
    BrokerUnreachable,
    ConfigError,
    TransportError,
    UnknownToolError,
)
from toolservice_base.logs import get_logger
from toolservice_base.metrics import OTHER_TOOL
from toolservice_base.schemas import ConfigPush, check_name
from toolservice_base.settings import Settings
from toolservice_base.transport import Subscription, Transport, open_transport

from .build import TYPES, Built, Entry, Items, build, one_line
from .client import DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_ANSWER_BYTES, ToolServiceClient
from .impls import Tool, ToolFactory, arguments_schema, registered_factories
from .llm_names import openai_names
from .metrics import BridgeMetrics
from .snapshot import read_snapshot, snapshot_path, write_snapshot
from .static import StaticDirError, load_static_dir

log = get_logger("agent_bridge.toolset")

STORE_ERRORS: tuple[type[Exception], ...] = (TransportError, ConfigError)

ChangeCallback = Callable[[list[str], list[str], list[str], int], Awaitable[None] | None]


@dataclass(frozen=True)
class _State:
    version: int = 0
    source: str = "none"  # store | snapshot | static
    entries: Mapping[str, Entry] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)
    clients: Mapping[str, ToolServiceClient] = field(default_factory=dict)
    service_problems: Mapping[str, str] = field(default_factory=dict)

    @cached_property
    def openai_names(self) -> dict[str, str]:
        """Tool name -> the name OpenAI accepts (see `llm_names`), worked out once per set."""
        return openai_names(self.entries)

    @cached_property
    def by_openai_name(self) -> dict[str, str]:
        """The other way, for the names that differ."""
        return {safe: name for name, safe in self.openai_names.items() if safe != name}


@dataclass(frozen=True)
class _Change:
    added: list[str]
    removed: list[str]
    changed: list[str]
    version: int


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
        debounce: float = 0.03,
        store_timeout: float = 3.0,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        idle_timeout: float | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        close_timeout: float = 30.0,
        metrics: BridgeMetrics | None = None,
    ) -> None:
        """`call_timeout` bounds each whole call, a streamed answer included; `idle_timeout` (off unless
        given) also bounds each wait for the next chunk; `max_answer_bytes` bounds what one answer
        may bring in. Past a timeout a call raises `RequestTimeout`, past the size `AnswerTooLarge`,
        and the service is told to stop."""
        self.workspace = check_name(workspace, "workspace")
        self._settings = settings or Settings.from_env(data_dir=data_dir, pulsar_url=pulsar_url)
        self._pulsar_url = pulsar_url
        self._connection = connection
        self._own_connection = connection is None
        self.static_dir = Path(static_dir) if static_dir is not None else None
        self.snapshot_path = snapshot_path(Path(data_dir) if data_dir is not None else self._settings.data_dir, workspace)
        self._factories = dict(factories or {})
        self.user = user
        self.poll_interval = poll_interval
        self.debounce = debounce
        self.store_timeout = store_timeout
        self.call_timeout = call_timeout
        self.idle_timeout = idle_timeout
        self.max_answer_bytes = max_answer_bytes
        self.close_timeout = close_timeout
        self.metrics = metrics or BridgeMetrics.default()
        self._state = _State()
        self._config: ConfigClient | None = None
        self._watch: Subscription | None = None
        self._reloader: asyncio.Task[None] | None = None
        self._first_read_task: asyncio.Task[tuple[int, Items]] | None = None
        self._dirty = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self._swapped = asyncio.Condition()
        self._callbacks: list[ChangeCallback] = []
        self._retiring: dict[asyncio.Task[None], ToolServiceClient] = {}
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
            self._config = ConfigClient(self._connection, workspace=self.workspace, timeout=self.store_timeout)
            # Not cancelled at the deadline: with the broker down, the subscribes inside take the
            # client's operation timeout; a late answer is applied by the reloader instead. Held in
            # `_first_read_task` until its outcome is read, so that a failed start still reads it
            # (in `_shutdown`) even when it ends while the fallback is being loaded.
            first = self._first_read_task = asyncio.create_task(self._first_read(), name=f"toolset-first-read:{self.workspace}")
            done, _ = await asyncio.wait({first}, timeout=self.store_timeout)
            error = first.exception() if done else None
            if done:
                self._first_read_task = None
            if done and error is None:
                version, items = first.result()
                await self._apply(version, items, "store")
            elif error is not None and not isinstance(error, STORE_ERRORS):
                raise error
            else:
                down = await self._connection.unreachable()
                if down is not None:
                    error = BrokerUnreachable(down)
                await self._load_fallback(error or TimeoutError(f"no answer from the config store within {self.store_timeout:g}s"))
        except BaseException:
            await self._shutdown()
            raise
        self._reloader = asyncio.create_task(self._reload_loop(), name=f"toolset-reload:{self.workspace}")
        return self

    async def _first_read(self) -> tuple[int, Items]:
        # Subscribe before the first read: a change between the two is then never missed.
        await self._ensure_watch()
        return await self._fetch()

    async def close(self) -> None:
        """Stop watching, let in-flight calls finish (up to `close_timeout`), close everything."""
        if self._closed:
            return
        self._closed = True
        if self._reloader is not None:
            self._reloader.cancel()
            try:
                await self._reloader
            except (asyncio.CancelledError, Exception):
                pass
        await self._shutdown()
        log.info("toolset.closed", workspace=self.workspace, version=self.version)

    async def _shutdown(self) -> None:
        first, self._first_read_task = self._first_read_task, None
        if first is not None:
            first.cancel()
            try:
                await first
            except (asyncio.CancelledError, Exception):
                pass  # its outcome no longer matters: we are closing
        if self._watch is not None and self._connection is not None:
            await self._connection.unsubscribe(self._watch)
            self._watch = None
        if self._config is not None:
            await self._config.close()
            self._config = None
        clients = [*self._state.clients.values(), *self._retiring.values()]
        waiting = [asyncio.create_task(c.close_when_idle()) for c in self._state.clients.values()] + list(self._retiring)
        if waiting:
            _, late = await asyncio.wait(waiting, timeout=self.close_timeout)
            for task in late:
                task.cancel()
            if late:
                log.warning("toolset.close_forced", calls_cut=len(late))
        for client in clients:
            await client.close()
        if self._own_connection and self._connection is not None:
            await self._connection.close()

    # --- the set -------------------------------------------------------------

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

    def describe(self) -> list[dict[str, Any]]:
        """Name, description and JSON Schema of the arguments of each tool, by name."""
        entries = self._state.entries
        return [
            {"name": n, "description": entries[n].tool.description, "parameters": arguments_schema(entries[n].tool)}
            for n in sorted(entries)
        ]

    def as_openai_tools(self) -> list[dict[str, Any]]:
        """OpenAI function calling: `[{"type": "function", "function": {name, description, parameters}}]`.

        Names OpenAI would refuse (dots, over 64 characters) are given in a form
        it accepts (see `llm_names`); `invoke` takes either form.
        """
        names = self._state.openai_names
        return [{"type": "function", "function": {**spec, "name": names[spec["name"]]}} for spec in self.describe()]

    def as_mcp_tools(self) -> list[dict[str, Any]]:
        """MCP `tools/list`: `[{name, description, inputSchema}]`."""
        return [{"name": s["name"], "description": s["description"], "inputSchema": s["parameters"]} for s in self.describe()]

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
        return ((entry.tool.service or "", entry.tool.name) if entry is not None else ("", OTHER_TOOL))

    async def invoke(self, name: str, arguments: Mapping[str, Any] | None = None, user: str = "") -> str:
        """Call tool `name` (its own name or the one `as_openai_tools` gave it) and return the whole observation.

        The arguments are checked against the schema `describe()` advertises
        first (`BadArguments`, nothing sent). A streamed answer comes back as
        its chunks joined in order, with nothing between them. Raises
        `ToolError` if the service answered with an error (`BadArguments` and
        `AnswerTooLarge` are ToolErrors too), `RequestTimeout` past
        `call_timeout` (or `idle_timeout`), `UnknownToolError` for a name the
        set does not hold. Counted and timed per tool in the bridge's metrics.
        """
        with self.metrics.timed(*self._labels(name)):
            return await self._invoke(name, arguments, user)

    async def _invoke(self, name: str, arguments: Mapping[str, Any] | None, user: str) -> str:
        entry = self._lookup(name)
        args = dict(arguments or {})
        entry.arguments.check(args)
        impl = entry.impl
        call = getattr(impl, "call", None)
        if callable(call):
            result = await call(args, user=user or None)
        else:
            result = await impl.invoke(**args)
        return _as_text(result)

    def stream(self, name: str, arguments: Mapping[str, Any] | None = None, user: str = "") -> AsyncIterator[str]:
        """The observation chunk by chunk, as the service sends them: `async for chunk in tools.stream(...)`.

        Arguments are checked here, before the first chunk is asked for; the
        other errors are those of `invoke`, raised from the loop. Empty
        chunks are skipped, so `"".join` of the chunks is what `invoke`
        returns. A tool that cannot stream yields its whole answer once.
        `call_timeout` bounds the whole stream; leaving the loop early (use
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
        call_stream = getattr(entry.impl, "call_stream", None)
        if callable(call_stream):
            chunks: AsyncIterator[str] = call_stream(args, user=user or None)
            return self.metrics.timed_stream(*labels, chunks)
        return self.metrics.timed_stream(*labels, _single(entry.impl, args))

    # --- change notification -------------------------------------------------

    def on_change(self, callback: ChangeCallback) -> ChangeCallback:
        """Call `callback(added, removed, changed, version)` after each reload that changed the set."""
        self._callbacks.append(callback)
        return callback

    async def wait_for(self, predicate: Callable[[ToolSet], bool], timeout: float = 10.0) -> Self:
        """Wait until `predicate(self)` holds, checked now and after every reload; return the ToolSet itself.

        Past `timeout` seconds, `TimeoutError` with one line naming the
        version, source and tools the set holds (and the skipped ones). An
        exception raised by `predicate` propagates as is.
        """
        async with self._swapped:
            try:
                await asyncio.wait_for(self._swapped.wait_for(lambda: predicate(self)), timeout)
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
        if self._watch is None:
            try:
                await self._ensure_watch()
            except TransportError as exc:
                log.warning("toolset.watch_failed", error=one_line(exc))
        async with self._reload_lock:
            version, items = await self._fetch()
            change = await self._apply_locked(version, items, "store")
        if change is not None:
            await self._notify(change)
        return change is not None

    async def _ensure_watch(self) -> None:
        if self._watch is None:
            assert self._connection is not None
            self._watch = await watch_config(self._connection, self._on_push)

    async def _on_push(self, push: ConfigPush) -> None:
        if any(self.workspace in push.changes.get(t, ()) for t in TYPES):
            self._dirty.set()

    async def _fetch(self) -> tuple[int, Items]:
        assert self._config is not None
        # Only the two types, page by page at one version: unrelated items, however large, are never read.
        version, items = await self._config.read_types(TYPES, timeout=self.store_timeout)
        return version, {t: items.get(t, {}) for t in TYPES}

    async def _reload_loop(self) -> None:
        """Reload on pushes (after `debounce`), and every `poll_interval` in case a push was lost."""
        retry_interval = min(1.0, self.poll_interval)
        failing = False
        if self._first_read_task is not None:  # the store answered after start fell back
            try:
                version, items = await self._first_read_task
                await self._apply(version, items, "store")
            except STORE_ERRORS:
                failing = True
            finally:
                self._first_read_task = None
        while True:
            wait = retry_interval if failing or self._state.source != "store" else self.poll_interval
            pushed = True
            try:
                await asyncio.wait_for(self._dirty.wait(), wait)
                await asyncio.sleep(self.debounce)
            except TimeoutError:
                pushed = False
            self._dirty.clear()
            try:
                if not pushed and not failing and self._state.source == "store":
                    assert self._config is not None  # a periodic check: a cheap version read first
                    if await self._config.version(timeout=self.store_timeout) == self.version:
                        continue
                await self.refresh()
                failing = False
            except STORE_ERRORS as exc:
                if not failing:
                    log.warning("toolset.reload_failed", error=one_line(exc), keeping=self.version, retry_in=retry_interval)
                failing = True
            except Exception:
                log.exception("toolset.reload_crashed", keeping=self.version)
                failing = True

    async def _load_fallback(self, error: BaseException) -> None:
        snapshot = read_snapshot(self.snapshot_path, self.workspace)
        if snapshot is not None:
            log.warning("toolset.fallback", source="snapshot", path=str(self.snapshot_path), version=snapshot.version, error=one_line(error))
            await self._apply(snapshot.version, snapshot.items, "snapshot")
            return
        static_error = "no static_dir given"
        if self.static_dir is not None:
            try:
                items = load_static_dir(self.static_dir)
            except StaticDirError as exc:
                static_error = str(exc)
            else:
                log.warning("toolset.fallback", source="static", path=str(self.static_dir), error=one_line(error))
                await self._apply(0, items, "static")
                return
        if isinstance(error, BrokerUnreachable):
            what, fix = one_line(error), "start the broker or fix PULSAR_URL"
        else:
            what, fix = f"config store did not answer ({one_line(error)})", "start the config store (`toolreg up`)"
        raise BridgeUnavailable(
            f"{what}; no snapshot at {self.snapshot_path} and {static_error}: "
            f"{fix}, or pass static_dir=<dir with tool/*.json and tool-service/*.json>"
        )

    async def _apply(self, version: int, items: Items, source: str) -> None:
        async with self._reload_lock:
            change = await self._apply_locked(version, items, source)
        if change is not None:
            await self._notify(change)

    async def _apply_locked(self, version: int, items: Items, source: str) -> _Change | None:
        """Build the next state beside the current one and swap it in; None if nothing changed."""
        old = self._state
        if source == "store" and old.source == "store" and version == old.version and not old.problems:
            return None
        started = time.perf_counter()
        assert self._connection is not None
        built: Built = await build(
            items,
            old.entries,
            old.clients,
            {**registered_factories(), **self._factories},
            connection=self._connection,
            workspace=self.workspace,
            user=self.user,
            timeout=self.call_timeout,
            warm_up=self.store_timeout,
            idle_timeout=self.idle_timeout,
            max_answer_bytes=self.max_answer_bytes,
        )
        new = _State(version, source, built.entries, built.problems, built.clients, built.service_problems)
        self._state = new  # the one swap
        for service_id, client in old.clients.items():
            if built.clients.get(service_id) is not client:
                self._retire(client)
        for service_id, reason in built.service_problems.items():
            if old.service_problems.get(service_id) != reason:
                log.warning("tool_service.skipped", service=service_id, reason=reason, workspace=self.workspace)
        for name, reason in built.problems.items():
            if old.problems.get(name) != reason:
                log.warning("tool.skipped", tool=name, reason=reason, workspace=self.workspace)
        async with self._swapped:
            self._swapped.notify_all()

        added = sorted(set(new.entries) - set(old.entries))
        removed = sorted(set(old.entries) - set(new.entries))
        changed = sorted(n for n in set(new.entries) & set(old.entries) if new.entries[n] is not old.entries[n])
        if source == "store" and (version != old.version or old.source != "store"):
            await self._save_snapshot(version, items)
        ms = round((time.perf_counter() - started) * 1000, 2)
        if old.source == "none":
            log.info("toolset.loaded", workspace=self.workspace, source=source, version=version, tools=len(new.entries), skipped=len(new.problems), ms=ms)
            return None
        if added or removed or changed or source != old.source:
            log.info("toolset.reloaded", workspace=self.workspace, source=source, version=version, added=added, removed=removed, changed=changed, ms=ms)
        return _Change(added, removed, changed, version) if added or removed or changed else None

    def _retire(self, client: ToolServiceClient) -> None:
        """Close a client no tool uses any more, once its in-flight calls are done."""
        task = asyncio.create_task(client.close_when_idle(), name=f"retire:{client.service.id}")
        self._retiring[task] = client
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    async def _save_snapshot(self, version: int, items: Items) -> None:
        try:
            await asyncio.to_thread(write_snapshot, self.snapshot_path, self.workspace, version, items)
        except OSError as exc:
            log.warning("snapshot.write_failed", path=str(self.snapshot_path), error=str(exc))

    async def _notify(self, change: _Change) -> None:
        for callback in list(self._callbacks):
            try:
                result = callback(change.added, change.removed, change.changed, change.version)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("toolset.callback_failed", callback=getattr(callback, "__name__", repr(callback)))


def _as_text(value: Any) -> str:
    """The spec's rule for a non-string result: send `json.dumps` of it."""
    return value if isinstance(value, str) else json.dumps(value)


async def _single(impl: Tool, arguments: dict[str, Any]) -> AsyncIterator[str]:
    yield _as_text(await impl.invoke(**arguments))
