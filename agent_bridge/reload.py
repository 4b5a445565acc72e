"""The `ToolSet`'s reload machinery: watch the store's pushes, refetch, rebuild what changed, swap.

The whole set lives in one immutable `State`; a reload builds the next one
aside (`build`) and swaps it in with one assignment, so a call never sees half
a set. Pushes on the notify topic trigger reloads, batched on the leading
edge: when no reload is in flight, a push is acted on at once; the pushes
that arrive while one is in flight are all taken by one follow-up reload,
which reads the store as it is by then. So a lone change waits for nothing
and a burst costs a few reloads, with no timer anywhere. A periodic read of
the store's version catches a push that was lost.

A reload asks the store only what changed since the version the set holds
(its change feed): the changed items and the deletions, applied to the raw
items the set was built from, and only the tools they touch are built again.
The store answers `too-old` past its window, and a store without a feed
(TrustGraph's, an older release) does not know the question: then the reload
reads every tool, as it always did. A push from a store that went back in
versions (restored) also makes the next reload read everything. The snapshot
stays whole and current at the same cost: a change read by delta is one line
appended to its journal (`snapshot`).

`ToolSet` (in `toolset`) is the public face; it owns one `Reloader`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

from toolservice_base.configclient import ConfigClient, apply_changes, watch_config
from toolservice_base.errors import (
    AuthenticationFailed,
    BrokerUnreachable,
    ChangesUnavailable,
    ConfigError,
    TransportError,
)
from toolservice_base.logs import get_logger
from toolservice_base.names import openai_names
from toolservice_base.rpc import CallLimits
from toolservice_base.schemas import CHANGES_TOO_OLD, ConfigPush
from toolservice_base.tasks import cancel_and_wait, wait_event
from toolservice_base.transport import Subscription, Transport

from .build import TYPES, Built, Entry, Items, Touched, build, one_line
from .client import ToolServiceClient
from .impls import ToolFactory, registered_factories
from .snapshot import Deployment, SnapshotWriter

log = get_logger("agent_bridge.toolset")

STORE_ERRORS: tuple[type[Exception], ...] = (TransportError, ConfigError)

ChangeCallback = Callable[[list[str], list[str], list[str], int], Awaitable[None] | None]
SwapHook = Callable[[Mapping[str, Entry], Mapping[str, Entry]], Awaitable[None]]
"""Called with the old and the new set at each swap, before anyone is told of it (the search index is one)."""


@dataclass(frozen=True)
class State:
    version: int = 0
    source: str = "none"  # store | snapshot | static
    items: Items = field(default_factory=dict)
    """The raw items the set was built from (a delta is applied to them; the snapshot holds them)."""
    built: Built = field(default_factory=Built)

    @property
    def entries(self) -> Mapping[str, Entry]:
        return self.built.entries

    @property
    def problems(self) -> Mapping[str, str]:
        return self.built.problems

    @property
    def clients(self) -> Mapping[str, ToolServiceClient]:
        return self.built.clients

    @property
    def service_problems(self) -> Mapping[str, str]:
        return self.built.service_problems

    @cached_property
    def openai_names(self) -> dict[str, str]:
        """Tool name -> the name OpenAI accepts (see `toolservice_base.names`), worked out once per set."""
        return openai_names(self.entries)

    @cached_property
    def by_openai_name(self) -> dict[str, str]:
        """The other way, for the names that differ."""
        return {safe: name for name, safe in self.openai_names.items() if safe != name}


@dataclass(frozen=True)
class Change:
    added: list[str]
    removed: list[str]
    changed: list[str]
    version: int


class Tuning(Protocol):
    """What a `Reloader` reads of the `ToolSet` it serves (`ToolSet` is one), at the moment it needs it."""

    @property
    def workspace(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def poll_interval(self) -> float: ...
    @property
    def store_timeout(self) -> float: ...
    @property
    def close_timeout(self) -> float: ...
    @property
    def limits(self) -> CallLimits: ...
    @property
    def snapshot_path(self) -> Path: ...
    @property
    def deployment(self) -> Deployment: ...


class Reloader:
    """Keeps the `State` of one `ToolSet` in step with the config store.

    Reads its tuning (timeouts, poll interval, snapshot path, user) from the
    `ToolSet` it serves, at the moment it needs it.
    """

    def __init__(self, owner: Tuning, factories: Mapping[str, ToolFactory]) -> None:
        self._owner = owner
        self._factories = dict(factories)
        self.state = State()
        self.callbacks: list[ChangeCallback] = []
        self.swap_hooks: list[SwapHook] = []
        self.swapped = asyncio.Condition()
        """Notified after every swap (`ToolSet.wait_for` waits on it)."""
        self.runs = 0
        """Reloads the loop started, a push's or a lost push's (a version check that found nothing new is not one)."""
        self.waits: deque[float] = deque(maxlen=100)
        """Seconds from the first push of each recent reload being noted to the loop starting that reload, oldest
        first: nothing but a reload in flight (or a failing store's retry interval) should be in them."""
        self.last_push = 0
        """The version named by the latest push that concerned this workspace (0: none yet)."""
        self.full_reads = 0
        """Reads of every tool from the store (the first load, a store without a change feed, a reader past its
        window)."""
        self.delta_reads = 0
        """Reads of only what changed since the set's version."""
        self._feed = True
        """Whether to ask the store what changed (False once it said it has no change feed, until it restarts)."""
        self._whole = False
        """Set when the store went back in versions: the next reload reads everything."""
        self._snapshot: SnapshotWriter | None = None
        self._connection: Transport | None = None
        self._config: ConfigClient | None = None
        self._watch: Subscription | None = None
        self._task: asyncio.Task[None] | None = None
        self._first_read_task: asyncio.Task[tuple[int, Items]] | None = None
        self._dirty = asyncio.Event()
        self._noted: float | None = None
        self._lock = asyncio.Lock()
        self._retiring: dict[asyncio.Task[None], ToolServiceClient] = {}

    # --- lifecycle ---------------------------------------------------------

    async def load(self, connection: Transport, fallback: Callable[[BaseException], Awaitable[None]]) -> None:
        """The first load: from the store, or `fallback(error)` if it does not answer within `store_timeout`; a broker
        that refuses our token or role raises that refusal (no fallback hides it)."""
        owner = self._owner
        self._connection = connection
        self._config = ConfigClient(connection, workspace=owner.workspace, timeout=owner.store_timeout)
        # Not cancelled at the deadline: with the broker down, the subscribes inside take the
        # client's operation timeout; a late answer is applied by the loop instead. Held in
        # `_first_read_task` until its outcome is read, so that a failed start still reads it
        # (in `stop`) even when it ends while the fallback is being loaded.
        first = self._first_read_task = asyncio.create_task(
            self._first_read(), name=f"toolset-first-read:{owner.workspace}"
        )
        done, _ = await asyncio.wait({first}, timeout=owner.store_timeout)
        error = first.exception() if done else None
        if done:
            self._first_read_task = None
        if done and error is None:
            version, items = first.result()
            await self.apply(version, items, "store")
        elif error is not None and (not isinstance(error, STORE_ERRORS) or isinstance(error, AuthenticationFailed)):
            raise error  # a refused token or role is no store outage: a snapshot would hide it until someone acts
        else:
            down = await connection.unreachable()
            if down is not None:
                error = BrokerUnreachable(down)
            await fallback(error or TimeoutError(f"no answer from the config store within {owner.store_timeout:g}s"))

    async def _first_read(self) -> tuple[int, Items]:
        # Subscribe before the first read: a change between the two is then never missed.
        await self._ensure_watch()
        self.full_reads += 1
        return await self._fetch()

    def start(self) -> None:
        """Follow the store from now on (after `load`)."""
        self._task = asyncio.create_task(self._run(), name=f"toolset-reload:{self._owner.workspace}")

    async def stop(self) -> None:
        """Stop following, unsubscribe, and close every client once its in-flight calls end (up to `close_timeout`)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        first, self._first_read_task = self._first_read_task, None
        await cancel_and_wait(first)  # its outcome no longer matters: we are closing
        if self._watch is not None and self._connection is not None:
            await self._connection.unsubscribe(self._watch)
            self._watch = None
        if self._config is not None:
            await self._config.close()
            self._config = None
        if self._snapshot is not None:  # the last version is written before close returns
            await self._snapshot.close()
        state = self.state
        clients = [*state.clients.values(), *self._retiring.values()]
        waiting = [asyncio.create_task(c.close_when_idle()) for c in state.clients.values()] + list(self._retiring)
        if waiting:
            _, late = await asyncio.wait(waiting, timeout=self._owner.close_timeout)
            for cut in late:
                cut.cancel()
            if late:
                log.warning("toolset.close_forced", calls_cut=len(late))
        for client in clients:
            await client.close()

    # --- reloading -----------------------------------------------------------

    async def refresh(self) -> bool:
        """Read the store now and apply what changed; True if the set changed."""
        if self._watch is None:
            try:
                await self._ensure_watch()
            except TransportError as exc:
                log.warning("toolset.watch_failed", error=one_line(exc))
        async with self._lock:
            version, items, touched = await self._read()
            change = await self._apply_locked(version, items, "store", touched)
        if change is not None:
            await self._notify(change)
        return change is not None

    async def _ensure_watch(self) -> None:
        if self._watch is None:
            assert self._connection is not None
            self._watch = await watch_config(self._connection, self._on_push)

    async def _on_push(self, push: ConfigPush) -> None:
        if not push.changes:  # a store (re)started: it may have a change feed now
            self._feed = True
        if push.version < self.state.version and self.state.source == "store":
            self._whole = True  # the store went back (restored): its history is not the one the set followed
        if any(self._owner.workspace in push.changes.get(t, ()) for t in TYPES):
            self.last_push = push.version
            if self._noted is None:
                self._noted = time.monotonic()
            self._dirty.set()

    async def _read(self) -> tuple[int, Items, Touched | None]:
        """The store's items now: the set's items with what changed since its version applied, and the keys that
        changed; or every item (and None) when the store cannot say what changed."""
        state = self.state
        if state.source == "store" and self._feed and not self._whole:
            assert self._config is not None
            try:
                version, delta = await self._config.changes(state.version, TYPES, timeout=self._owner.store_timeout)
            except ChangesUnavailable as exc:
                if exc.code != CHANGES_TOO_OLD:
                    self._feed = False
                log.info("toolset.reading_everything", workspace=self._owner.workspace, reason=one_line(exc))
            else:
                self.delta_reads += 1
                changed = apply_changes({t: state.items.get(t, {}) for t in TYPES}, delta)
                return version, changed, {t: set(delta.get(t, {})) for t in TYPES}
        self._whole = False
        self.full_reads += 1
        version, items = await self._fetch()
        return version, items, None

    async def _fetch(self) -> tuple[int, Items]:
        assert self._config is not None
        # Only the two types, page by page at one version: unrelated items, however large, are never read.
        version, items = await self._config.read_types(TYPES, timeout=self._owner.store_timeout)
        return version, {t: items.get(t, {}) for t in TYPES}

    async def _run(self) -> None:
        """Reload at once on a push, and every `poll_interval` in case a push was lost.

        Leading-edge batching: a push that comes while a reload is in flight sets `_dirty` again,
        so the loop goes straight into one more reload when this one ends, taking every push that
        came meanwhile; there is no wait on a timer before a reload.
        """
        owner = self._owner
        retry_interval = min(1.0, owner.poll_interval)
        failing = False
        if self._first_read_task is not None:  # the store answered after start fell back
            try:
                version, items = await self._first_read_task
                await self.apply(version, items, "store")
            except STORE_ERRORS:
                failing = True
            finally:
                self._first_read_task = None
        while True:
            wait = retry_interval if failing or self.state.source != "store" else owner.poll_interval
            pushed = self._dirty.is_set()
            if not pushed:
                pushed = await wait_event(self._dirty, wait)
            self._dirty.clear()
            noted, self._noted = self._noted, None
            try:
                if not pushed and not failing and self.state.source == "store":
                    assert self._config is not None  # a periodic check: a cheap version read first
                    if await self._config.version(timeout=owner.store_timeout) == self.state.version:
                        continue
                self.runs += 1
                if noted is not None:
                    self.waits.append(time.monotonic() - noted)
                await self.refresh()
                failing = False
            except STORE_ERRORS as exc:
                if not failing:
                    log.warning(
                        "toolset.reload_failed",
                        error=one_line(exc),
                        keeping=self.state.version,
                        retry_in=retry_interval,
                    )
                failing = True
            except Exception:
                log.exception("toolset.reload_crashed", keeping=self.state.version)
                failing = True

    # --- the swap --------------------------------------------------------------

    async def apply(self, version: int, items: Items, source: str) -> None:
        """Make `items` (read at `version` from `source`: store, snapshot or static) the set, and tell the callbacks."""
        async with self._lock:
            change = await self._apply_locked(version, items, source)
        if change is not None:
            await self._notify(change)

    def _after_swap(self, old: State, built: Built) -> None:
        """Retire the clients no tool uses any more; say which services and tools are skipped anew, and why."""
        for service_id, client in old.clients.items():
            if built.clients.get(service_id) is not client:
                self._retire(client)
        workspace = self._owner.workspace
        for service_id, reason in built.service_problems.items():
            if old.service_problems.get(service_id) != reason:
                log.warning("tool_service.skipped", service=service_id, reason=reason, workspace=workspace)
        for name, reason in built.problems.items():
            if old.problems.get(name) != reason:
                log.warning("tool.skipped", tool=name, reason=reason, workspace=workspace)

    async def _apply_locked(
        self, version: int, items: Items, source: str, touched: Touched | None = None
    ) -> Change | None:
        """Build the next state beside the current one and swap it in; None if nothing changed. `touched`: the keys
        that changed since the current state, when the store said (only their tools are looked at)."""
        owner = self._owner
        old = self.state
        if source == "store" and old.source == "store" and version == old.version and not old.problems:
            return None
        started = time.perf_counter()
        assert self._connection is not None
        built: Built = await build(
            items,
            old.built,
            {**registered_factories(), **self._factories},
            connection=self._connection,
            workspace=owner.workspace,
            user=owner.user,
            limits=owner.limits,
            warm_up=owner.store_timeout,
            touched=touched,
        )
        new = State(version, source, items, built)
        self.state = new  # the one swap
        self._after_swap(old, built)
        # Saved with the swap, before anything awaits: `version` is visible from here on, and a caller that saw it
        # and closes the set at once (cancelling this task in a hook) must find it in the snapshot.
        if source == "store" and (version != old.version or old.source != "store"):
            self._save(old, new, touched)
        for hook in self.swap_hooks:
            await hook(old.entries, new.entries)
        async with self.swapped:
            self.swapped.notify_all()
        return self._change(old, new, started)

    def _save(self, old: State, new: State, touched: Touched | None) -> None:
        """Write the store's state to the snapshot (only what `touched` names when the one before was the store's
        too)."""
        owner = self._owner
        if self._snapshot is None:
            self._snapshot = SnapshotWriter(owner.snapshot_path, owner.deployment, owner.workspace)
        self._snapshot.save(old.version, new.version, new.items, touched if old.source == "store" else None)

    def _change(self, old: State, new: State, started: float) -> Change | None:
        """What the swap from `old` to `new` changed, logged (`toolset.loaded` the first time, then
        `toolset.reloaded`); None for the first load, or when no tool changed."""
        owner, source, version = self._owner, new.source, new.version
        added, removed, changed = _differences(old.entries, new.entries, new.built.examined)
        ms = round((time.perf_counter() - started) * 1000, 2)
        if old.source == "none":
            log.info(
                "toolset.loaded",
                workspace=owner.workspace,
                source=source,
                version=version,
                tools=len(new.entries),
                skipped=len(new.problems),
                ms=ms,
            )
            return None
        if added or removed or changed or source != old.source:
            log.info(
                "toolset.reloaded",
                workspace=owner.workspace,
                source=source,
                version=version,
                added=added,
                removed=removed,
                changed=changed,
                ms=ms,
            )
        return Change(added, removed, changed, version) if added or removed or changed else None

    def _retire(self, client: ToolServiceClient) -> None:
        """Close a client no tool uses any more, once its in-flight calls are done."""
        task = asyncio.create_task(client.close_when_idle(), name=f"retire:{client.service.id}")
        self._retiring[task] = client
        task.add_done_callback(lambda done: self._retiring.pop(done, None))

    async def _notify(self, change: Change) -> None:
        for callback in list(self.callbacks):
            try:
                result = callback(change.added, change.removed, change.changed, change.version)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("toolset.callback_failed", callback=getattr(callback, "__name__", repr(callback)))


def _differences(
    old: Mapping[str, Entry], new: Mapping[str, Entry], examined: frozenset[str] | None
) -> tuple[list[str], list[str], list[str]]:
    """The tools added, removed and changed from `old` to `new`, looking only at `examined` when given (a build from
    a delta carries every other entry over as it was)."""
    names = set(old) | set(new) if examined is None else examined
    added = sorted(n for n in names if n in new and n not in old)
    removed = sorted(n for n in names if n in old and n not in new)
    changed = sorted(n for n in names if n in old and n in new and new[n] is not old[n])
    return added, removed, changed
