"""The registry page's live feed: one snapshot loop per process while anyone watches, sent to every viewer as
server-sent events (`/events`).

Viewers cost the registry little and boundedly: each snapshot is encoded once, into one buffer every viewer is
sent; a heartbeat is no change (the instances' last-heard times, and the tools' calls/s, errors/s and p95 the
heartbeats carried, go out as a small `heartbeats` event, at most once a second); a viewer is sent only the
newest state, never a queue of old ones; at most `MAX_VIEWERS` streams are open (the next gets 503). Requests
for the page itself share the snapshot being built when they come (`PageFeed.refresh`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from discovery.errors import RegistryUnavailable
from discovery.registry.overview import InstanceView, RegistrySnapshot, ToolView
from discovery.registry.protocol import PendingChange
from discovery.registry.search import search_key
from discovery.shown import UNSAFE, shown_data
from toolservice_base.errors import ConfigError, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.search import Match

__all__ = [
    "BEATS_INTERVAL",
    "KEEPALIVE",
    "MAX_VIEWERS",
    "TICK",
    "UNAVAILABLE",
    "EventStream",
    "PageFeed",
    "SnapshotSource",
    "beats_of",
    "instance_key",
    "pending_key",
    "problem_of",
    "snapshot_json",
    "tool_key",
]

log = get_logger("discovery.web")


class SnapshotSource(Protocol):
    """What the page reads: a registry's `Overview`, or whichever registry is active now (replicas)."""

    async def snapshot(self) -> RegistrySnapshot: ...

    async def search(self, query: str, limit: int, among: RegistrySnapshot) -> list[Match]: ...


UNAVAILABLE = (ConfigError, TransportError, RegistryUnavailable)
"""What keeps a snapshot from being built for now: the store not answering, or no registry here (a standby replica)."""

TICK = 0.25
"""Seconds between snapshots while anyone watches: the page is at most this much behind the registry."""
KEEPALIVE = 15.0
"""Seconds between comments on an idle event stream, so proxies keep it open and a gone viewer is noticed."""
MAX_VIEWERS = 32
"""Open `/events` streams per process, at most; the next viewer gets 503 until one leaves."""
BEATS_INTERVAL = 1.0
"""Seconds between `heartbeats` events at most: the page's bars move by themselves between them."""


def instance_key(instance: InstanceView) -> str:
    """How the page names an instance in `heartbeats` events (and the meter's `data-instance`)."""
    return f"{instance.workspace}/{instance.service}/{instance.id}"


def tool_key(tool: ToolView) -> str:
    """How the page names a tool in `heartbeats` events, in its row's `data-tool` and in `/search.json`."""
    return search_key(tool.workspace, tool.name)


def pending_key(change: PendingChange) -> str:
    """How the page names a held definition change in `heartbeats` events (and its row's `data-key`)."""
    return f"{change.workspace}/{change.tool}"


CHANGE_EXCLUDES: dict[str, Any] = {
    "at": True,
    "instances": {"__all__": {"last_seen"}},
    "pending": {"__all__": {"last_seen"}},
    "tools": {"__all__": {"usage"}},
}
"""What a change is not: the build time, the last-heard times of instances and of the instances offering a held
definition, and the tools' traffic (it moves with every heartbeat of a busy service)."""
Beats = tuple[dict[str, float | None], dict[str, float], dict[str, list[float | None]]]
"""What a `heartbeats` event carries: last-heard times of instances and of held changes, and the tools' traffic."""


def beats_of(snapshot: RegistrySnapshot) -> Beats:
    """The parts of `snapshot` that heartbeats move; the traffic as `[calls/s, errors/s, p95 ms]` by `tool_key`, known
    ones only."""
    return (
        {instance_key(i): i.last_seen for i in snapshot.instances},
        {pending_key(p): p.last_seen for p in snapshot.pending},
        {tool_key(t): [u.calls_per_s, u.errors_per_s, u.p95_ms] for t in snapshot.tools if (u := t.usage) is not None},
    )


class PageFeed:
    """One snapshot loop per process while anyone watches; every viewer is sent the same encoded bytes.

    A snapshot is sent when something in it changed other than the build
    time, the last-heard times (of instances, and of held definition
    changes) and the tools' traffic. Those alone (heartbeats) go out as a
    `heartbeats` event: `{"at": ..., "last_seen": {instance key: time}}`,
    with `"pending": {pending key: time}` while definition changes are held
    and `"usage": {tool key: [calls/s, errors/s, p95 ms]}` for the tools
    whose traffic is known (a tool left out is not known), at most every
    `BEATS_INTERVAL`. So an idle registry costs one memory walk
    per tick and no store reads, and a busy one does not resend its whole
    tool list to every viewer on every heartbeat.
    """

    def __init__(self, overview: SnapshotSource, *, tick: float = TICK, max_viewers: int = MAX_VIEWERS) -> None:
        self.overview = overview
        self.tick = tick
        self.max_viewers = max_viewers
        self.latest: RegistrySnapshot | None = None
        self.problem: str | None = None
        self.frame = b""
        """The newest snapshot as one server-sent event, encoded once for every viewer."""
        self.beats = b""
        """The newest `heartbeats` event, likewise."""
        self.problem_frame = b""
        self.snapshots = 0
        """How many snapshot frames were built: with `beats_sent`, what a test reads to see heartbeats are no change."""
        self.beats_sent = 0
        self._compare = ""
        self._last_seen: Beats = ({}, {}, {})
        self._beats_at = 0.0
        self._versions = (0, 0, 0)
        """(snapshot, beats, problem) frame versions: a viewer compares its own with these."""
        self._changed = asyncio.Event()
        """Set (and replaced by a fresh one) whenever a version moves."""
        self.viewers = 0
        self._task: asyncio.Task[None] | None = None
        self._building: asyncio.Task[RegistrySnapshot] | None = None

    async def refresh(self) -> RegistrySnapshot:
        """Build a snapshot now; tell viewers if it differs from the last (beyond heartbeats). Callers that come while
        one is being built share it: a hundred requests at once cost one snapshot."""
        building = self._building
        if building is None:
            building = self._building = asyncio.ensure_future(self._refresh())
            building.add_done_callback(self._built)
        return await asyncio.shield(building)  # a caller that gives up does not stop the others' snapshot

    def _built(self, task: asyncio.Task[RegistrySnapshot]) -> None:
        if self._building is task:
            self._building = None
        if not task.cancelled():
            task.exception()  # each caller was told; this only keeps asyncio from logging it as never retrieved

    async def current(self) -> RegistrySnapshot:
        """The newest snapshot: while the feed runs, the one it last built (at most a tick old: what the live page
        draws); else one built now."""
        if self._task is not None and self.latest is not None and self.problem is None:
            return self.latest
        return await self.refresh()

    async def _refresh(self) -> RegistrySnapshot:
        try:
            snapshot = await self.overview.snapshot()
        except UNAVAILABLE as exc:
            problem = problem_of(exc)
            if problem != self.problem:
                self.problem = problem
                self.problem_frame = _event("problem", problem)
                self._bump(problem=True)
            if self.latest is None:
                raise
            return self.latest
        compare = snapshot.model_dump_json(exclude=CHANGE_EXCLUDES)
        last_seen = beats_of(snapshot)
        self.latest = snapshot
        if compare != self._compare or self.problem is not None:
            self._compare, self.problem, self._last_seen = compare, None, last_seen
            self.frame = _event("snapshot", snapshot_json(snapshot))
            self.snapshots += 1
            self._bump(snapshot=True)
        elif last_seen != self._last_seen and time.monotonic() - self._beats_at >= BEATS_INTERVAL:
            self._last_seen, self._beats_at = last_seen, time.monotonic()
            beats: dict[str, Any] = {"at": snapshot.at, "last_seen": last_seen[0]}
            if last_seen[1]:
                beats["pending"] = last_seen[1]
            if last_seen[2]:
                beats["usage"] = last_seen[2]
            self.beats = _event("heartbeats", json.dumps(beats, separators=(",", ":")))
            self.beats_sent += 1
            self._bump(beats=True)
        return snapshot

    def _bump(self, *, snapshot: bool = False, beats: bool = False, problem: bool = False) -> None:
        shot, beat, prob = self._versions
        self._versions = (shot + snapshot, beat + beats, prob + problem)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except UNAVAILABLE:
                pass  # said once as a problem event; the next tick tries again
            except Exception:
                log.exception("page.snapshot_failed")
            await asyncio.sleep(self.tick)

    def join(self) -> bool:
        """Take a viewer's place (and start the loop for the first); False when `max_viewers` are watching."""
        if self.viewers >= self.max_viewers:
            return False
        self.viewers += 1
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="registry-page-feed")
        return True

    def leave(self) -> None:
        """Give a place back; the loop stops with the last viewer."""
        self.viewers = max(0, self.viewers - 1)
        if self.viewers == 0 and self._task is not None:
            self._task.cancel()
            self._task = None

    async def events(self, closing: asyncio.Event) -> AsyncIterator[bytes]:
        """Server-sent events for one viewer who has joined: the newest state each time it changes, and keep-alives.

        Never a backlog: a viewer still sending an old frame when several
        changes happen is sent only the newest afterwards.
        """
        seen = (-1, -1, -1)
        closed = asyncio.ensure_future(closing.wait())
        try:
            yield b"retry: 1000\n\n"
            while not closing.is_set():
                now = self._versions
                if now != seen:
                    shot, beat, prob = now
                    if shot != seen[0]:
                        if self.frame:
                            yield self.frame  # its last-heard times are current: older beats are moot
                    elif beat != seen[1] and self.beats:
                        yield self.beats
                    if prob != seen[2] and self.problem:
                        yield self.problem_frame
                    seen = now
                    continue
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    done, _ = await asyncio.wait(
                        {changed, closed}, timeout=KEEPALIVE, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    changed.cancel()
                if not done:
                    yield b": keep-alive\n\n"
        finally:
            closed.cancel()


_ESCAPES = ("\\u00", "\\b", "\\f", "\\r")
"""How the JSON encoder writes a control character but tab and newline (`\\u001b`, `\\r`); seeing one may be a false
alarm (an escaped backslash before `u00`), which costs only the slower, exact path."""


def _may_need_showing(text: str) -> bool:
    """Whether encoded JSON may hold a string `shown` would change. Substring checks first, a few milliseconds for
    10,000 tools; `UNSAFE` (about half the cost of encoding the snapshot) only when it holds more than ASCII."""
    if "\\" in text and any(escape in text for escape in _ESCAPES):  # most snapshots hold no backslash at all
        return True
    if text.isascii():
        return "\x7f" in text  # the one character of `UNSAFE` the encoder leaves raw in ASCII
    return UNSAFE.search(text) is not None


def snapshot_json(snapshot: RegistrySnapshot) -> str:
    """`snapshot` as the page's script is sent it: every string `shown`, so a control character or a bidi control
    in a tool's text reaches the page as a visible escape. The encoder's own output when nothing needs it (as good
    as always; re-encoding through Python costs ten times as much)."""
    text = snapshot.model_dump_json()
    if not _may_need_showing(text):
        return text
    return json.dumps(shown_data(snapshot.model_dump(mode="json")), ensure_ascii=False, separators=(",", ":"))


def _event(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data}\n\n".encode()


class EventStream(StreamingResponse):
    """The event stream of one viewer, whose place is given back however the response ends (even before it starts)."""

    def __init__(self, content: AsyncIterator[bytes], leave: Callable[[], None], headers: dict[str, str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._leave = leave

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._leave()


def problem_of(exc: Exception) -> str:
    if isinstance(exc, RegistryUnavailable):
        return str(exc)
    return f"the config store did not answer ({exc}); static tools and the version may be out of date"
