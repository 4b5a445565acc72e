"""The registry page: tools, instances, conflicts, held definitions, rejections and replicas, live, on the registry's
HTTP port.

Its header says which registry it is (broker, topicspace, host, how long it
has run) and whether it checks signatures; a filter box (JavaScript) narrows
every table to the rows holding a piece of text.

`GET /` is complete HTML rendered here from `templates/page.html` (Jinja2
through Starlette's `Jinja2Templates`, autoescape on: tool descriptions and
rejection reasons come from the network), so it works with JavaScript off
(it then refreshes itself every few seconds). With JavaScript, `/page.js`
subscribes to `/events` (server-sent events) and redraws the tables from
each snapshot, as text, within a quarter of a second of a change. No build
step: the script and style are two files served as they are.

Viewers cost the registry little and boundedly: each snapshot is encoded
once, into one buffer every viewer is sent; a heartbeat is no change (the
instances' last-heard times, and the tools' calls/s, errors/s and p95 the
heartbeats carried, go out as a small `heartbeats` event, at most once a
second); a viewer is sent only the newest state, never a queue of
old ones; at most `MAX_VIEWERS` streams are open (the next gets 503); and a
viewer that stops reading is cut off by the HTTP server once its buffer is
full for `WRITE_TIMEOUT` seconds (`discovery.web.hardening`).

Read-only: every route is a GET that reads. On a loopback address the page
is open to this machine (the Host header must be exactly `localhost` or a
loopback IP literal, compared as a parsed name, never as a text prefix, so
another site cannot read it through DNS rebinding: `127.0.0.1.evil.example`
is refused). Bound anywhere else it requires the bearer token
`TOOLREG_HTTP_TOKEN`, compared in constant time:
`Authorization: Bearer <token>`, or open `/?token=<token>` once, which sets a
cookie (HttpOnly, SameSite=Strict) and redirects to `/`. Without the variable
the page is not served off loopback at all; health and metrics are unaffected.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any, Protocol

import jinja2
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.templating import Jinja2Templates
from starlette.types import Receive, Scope, Send

from discovery.errors import RegistryUnavailable
from discovery.registry.overview import InstanceView, RegistrySnapshot, ToolView
from discovery.registry.protocol import PendingChange
from toolservice_base.errors import ConfigError, TransportError
from toolservice_base.logs import get_logger
from toolservice_base.settings import Settings

from .access import TOKEN_ENV, PageAccess
from .health import HealthServer


class SnapshotSource(Protocol):
    """What the page reads: a registry's `Overview`, or whichever registry is active now (replicas)."""

    async def snapshot(self) -> RegistrySnapshot: ...


UNAVAILABLE = (ConfigError, TransportError, RegistryUnavailable)
"""What keeps a snapshot from being built for now: the store not answering, or no registry here (a standby replica)."""

log = get_logger("discovery.web")

TICK = 0.25
"""Seconds between snapshots while anyone watches: the page is at most this much behind the registry."""
KEEPALIVE = 15.0
"""Seconds between comments on an idle event stream, so proxies keep it open and a gone viewer is noticed."""
NO_SCRIPT_REFRESH = 5
MAX_VIEWERS = 32
"""Open `/events` streams per process, at most; the next viewer gets 503 until one leaves."""
BEATS_INTERVAL = 1.0
"""Seconds between `heartbeats` events at most: the page's bars move by themselves between them."""

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def instance_key(instance: InstanceView) -> str:
    """How the page names an instance in `heartbeats` events (and the meter's `data-instance`)."""
    return f"{instance.workspace}/{instance.service}/{instance.id}"


def tool_key(tool: ToolView) -> str:
    """How the page names a tool in `heartbeats` events (and its row's `data-tool`)."""
    return f"{tool.workspace}/{tool.name}"


def rate(value: float | None) -> str | None:
    """Calls or errors per second as the tools table shows them (page.js formats them alike); None: not known."""
    if value is None:
        return None
    if value == 0:
        return "0"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def millis(value: float | None) -> str | None:
    """A p95 as the tools table shows it (page.js formats it alike); None: not known."""
    if value is None:
        return None
    return f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"


def pending_key(change: PendingChange) -> str:
    """How the page names a held definition change in `heartbeats` events (and its row's `data-key`)."""
    return f"{change.workspace}/{change.tool}"


SHORT_DIGEST = 12
"""Hex digits of a digest the tables show (the whole one is the cell's title), as `toolreg tools` and `toolreg pending`
do."""


def short(digest: str) -> str:
    return digest[:SHORT_DIGEST]


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

    async def refresh(self) -> RegistrySnapshot:
        """Build a snapshot now; tell viewers if it differs from the last (beyond heartbeats)."""
        try:
            snapshot = await self.overview.snapshot()
        except UNAVAILABLE as exc:
            problem = _problem(exc)
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
            self.frame = _event("snapshot", snapshot.model_dump_json())
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


def _event(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data}\n\n".encode()


class _EventStream(StreamingResponse):
    """The event stream of one viewer, whose place is given back however the response ends (even before it starts)."""

    def __init__(self, content: AsyncIterator[bytes], leave: Callable[[], None], headers: dict[str, str]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._leave = leave

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._leave()


# --- the HTML, rendered from templates/page.html -------------------------------------


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


TEMPLATES = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.PackageLoader("discovery.web", "templates"),
        autoescape=True,  # every value, in text and in attributes; nothing in the template is marked safe
        undefined=jinja2.StrictUndefined,  # a misspelt name fails the render, not shows as nothing
        trim_blocks=False,
        auto_reload=False,
    )
)
TEMPLATES.env.globals.update(
    age=_age,
    instance_key=instance_key,
    pending_key=pending_key,
    tool_key=tool_key,
    short=short,
    rate=rate,
    millis=millis,
    refresh=NO_SCRIPT_REFRESH,
)
PAGE_TEMPLATE = "page.html"


def render(snapshot: RegistrySnapshot, problem: str | None = None) -> str:
    """The whole page for `snapshot`: complete without JavaScript, every value escaped."""
    return TEMPLATES.get_template(PAGE_TEMPLATE).render(s=snapshot, problem=problem)


# --- routes and access ------------------------------------------------------------


def _problem(exc: Exception) -> str:
    if isinstance(exc, RegistryUnavailable):
        return str(exc)
    return f"the config store did not answer ({exc}); static tools and the version may be out of date"


def _unavailable(exc: Exception) -> Response:
    """The first snapshot needs the store (static tools, version) and a registry; without them there is nothing honest
    to show."""
    if isinstance(exc, RegistryUnavailable):
        return JSONResponse({"error": str(exc)}, status_code=503)
    message = f"the config store did not answer ({exc}); the page shows once it does, is `toolreg up` running?"
    return JSONResponse({"error": message}, status_code=503)


def _viewers_full(most: int) -> Response:
    message = f"the registry page has {most} viewers already, the most it serves; close one or try again"
    return JSONResponse({"error": message}, status_code=503, headers={"Retry-After": "10"})


def _asset(name: str, media_type: str) -> Response:
    body = (resources.files("discovery.web") / "static" / name).read_bytes()
    return Response(
        body, media_type=media_type, headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
    )


def page_routes(
    overview: SnapshotSource, access: PageAccess, closing: asyncio.Event, feed: PageFeed | None = None
) -> list[BaseRoute]:
    """The page's routes, for `HealthServer.add_routes`; `feed` to share one (a test watching it)."""
    feed = feed if feed is not None else PageFeed(overview)

    async def index(request: Request) -> Response:
        login = access.login(request)
        if login is not None:
            return login
        found = await snapshot_for(request)
        if isinstance(found, Response):
            return found
        return TEMPLATES.TemplateResponse(
            request, PAGE_TEMPLATE, {"s": found, "problem": feed.problem}, headers=SECURITY_HEADERS
        )

    async def snapshot_json(request: Request) -> Response:
        found = await snapshot_for(request)
        if isinstance(found, Response):
            return found
        return Response(found.model_dump_json(), media_type="application/json", headers=SECURITY_HEADERS)

    async def snapshot_for(request: Request) -> RegistrySnapshot | Response:
        """A fresh snapshot, or the answer instead of one: access refused, or the store not answering."""
        refused = access.refusal(request)
        if refused is not None:
            return refused
        try:
            return await feed.refresh()
        except UNAVAILABLE as exc:
            return _unavailable(exc)

    async def events(request: Request) -> Response:
        refused = access.refusal(request)
        if refused is not None:
            return refused
        if not feed.join():
            return _viewers_full(feed.max_viewers)
        headers = {**SECURITY_HEADERS, "X-Accel-Buffering": "no"}
        return _EventStream(feed.events(closing), feed.leave, headers)

    async def script(request: Request) -> Response:
        return _asset("page.js", "text/javascript")

    async def style(request: Request) -> Response:
        return _asset("page.css", "text/css")

    return [
        Route("/", index),
        Route("/snapshot.json", snapshot_json),
        Route("/events", events),
        Route("/page.js", script),
        Route("/page.css", style),
    ]


def serve_registry_page(health: HealthServer, overview: SnapshotSource, settings: Settings | None = None) -> str:
    """Add the page to `health`'s routes (or not, off loopback without a token); returns one line saying where it is.

    The token is `Settings.http_token` (`TOOLREG_HTTP_TOKEN`), of `settings` or of the environment now.
    """
    access = PageAccess(health.loopback, (settings or Settings.from_env()).http_token)
    if not access.loopback and access.token is None:
        log.info(
            "page.off",
            reason=f"bound to {health.host} and {TOKEN_ENV} is not set",
            fix=f"set {TOKEN_ENV}, or bind to 127.0.0.1",
        )
        health.add_routes(page_routes(overview, access, health.closing))  # answers 403 saying what to set
        return f"off: bound to {health.host} without {TOKEN_ENV} (set it to serve the page there)"
    health.add_routes(page_routes(overview, access, health.closing))
    return f"{health.url}/" + ("" if access.loopback else f" (bearer token {TOKEN_ENV} required)")
