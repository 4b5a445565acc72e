"""The registry page: tools, instances, conflicts, held definitions, rejections and replicas, live, on the registry's
HTTP port.

Its header says which registry it is (broker, topicspace, host, how long it
has run) and whether it checks signatures; a search box ranks the tools as
agents' searches do (`discovery.web.search`: a GET form, server-rendered,
followed live with JavaScript); a filter box (JavaScript) narrows every
table to the rows holding a piece of text.

`GET /` is complete HTML rendered here from `templates/page.html` (Jinja2
through Starlette's `Jinja2Templates`, autoescape on: tool descriptions and
rejection reasons come from the network), so it works with JavaScript off.
Every value is also `shown` (`discovery.shown`) on its way into the page, and
into the JSON the script draws from (`feed.snapshot_json`): a control
character or a bidi override a stranger put in a title or a description shows
as a visible escape (`\u001b`, `\u202e`), never reorders or hides text.
It does not reload itself then: a reload every few seconds wiped what was
being typed in the search box (browsers do not restore it). With
JavaScript, `/page.js`
subscribes to `/events` (server-sent events) and redraws the tables from
each snapshot, as text, within a quarter of a second of a change. No build
step: the script and style are two files served as they are.

Viewers cost the registry little and boundedly (`feed`): each snapshot is
encoded once for all of them, a heartbeat is a small event and no change, a
viewer is sent only the newest state, at most `MAX_VIEWERS` streams are open;
and a viewer that stops reading is cut off by the HTTP server once its buffer
is full for `WRITE_TIMEOUT` seconds (`discovery.web.hardening`).

Read-only: every route is a GET that reads; the one form (the search box) is
a GET to the page itself, all its Content-Security-Policy allows
(`form-action 'self'`). On a loopback address the page
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
from importlib import resources

import jinja2
import markupsafe
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.templating import Jinja2Templates

from discovery.errors import RegistryUnavailable
from discovery.registry.overview import RegistrySnapshot
from discovery.shown import shown
from toolservice_base.logs import get_logger
from toolservice_base.search import MAX_QUERY_CHARS

from .access import TOKEN_ENV, PageAccess
from .feed import (
    BEATS_INTERVAL,
    MAX_VIEWERS,
    TICK,
    UNAVAILABLE,
    EventStream,
    PageFeed,
    SnapshotSource,
    instance_key,
    pending_key,
    snapshot_json,
    tool_key,
)
from .health import HealthServer
from .search import NO_SEARCH, PageSearch, query_of, run_search, search_answer
from .settings import HttpSettings

__all__ = [
    "BEATS_INTERVAL",
    "MAX_VIEWERS",
    "SECURITY_HEADERS",
    "TICK",
    "TOKEN_ENV",
    "PageAccess",
    "PageFeed",
    "SnapshotSource",
    "instance_key",
    "page_routes",
    "pending_key",
    "render",
    "serve_registry_page",
    "tool_key",
]

log = get_logger("discovery.web")

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


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


SHORT_DIGEST = 12
"""Hex digits of a digest the tables show (the whole one is the cell's title), as `toolreg tools` and `toolreg pending`
do."""


def short(digest: str) -> str:
    return digest[:SHORT_DIGEST]


# --- the HTML, rendered from templates/page.html -------------------------------------


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _shown_value(value: object) -> object:
    """Jinja's `finalize`: each `{{ value }}` `shown` before it is escaped; markup the template made (a macro's
    output, already made of shown values) as it is."""
    return shown(value) if isinstance(value, str) and not isinstance(value, markupsafe.Markup) else value


TEMPLATES = Jinja2Templates(
    env=jinja2.Environment(
        finalize=_shown_value,
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
    max_query=MAX_QUERY_CHARS,
)
PAGE_TEMPLATE = "page.html"


def render(snapshot: RegistrySnapshot, problem: str | None = None, search: PageSearch = NO_SEARCH) -> str:
    """The whole page for `snapshot` (and `search`, when one was asked): complete without JavaScript, every value
    escaped."""
    return TEMPLATES.get_template(PAGE_TEMPLATE).render(s=snapshot, problem=problem, search=search)


# --- routes and access ------------------------------------------------------------


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


class _Routes:
    """The page's handlers: over one source, who may read it, and one feed."""

    def __init__(self, overview: SnapshotSource, access: PageAccess, closing: asyncio.Event, feed: PageFeed) -> None:
        self.overview, self.access, self.closing, self.feed = overview, access, closing, feed

    async def index(self, request: Request) -> Response:
        login = self.access.login(request)
        if login is not None:
            return login
        found = await self._snapshot(request)
        if isinstance(found, Response):
            return found
        search = await self._search(request, found)
        if isinstance(search, Response):
            return search
        return TEMPLATES.TemplateResponse(
            request,
            PAGE_TEMPLATE,
            {"s": found, "problem": self.feed.problem, "search": search},
            status_code=400 if search.error else 200,
            headers=SECURITY_HEADERS,
        )

    async def search_json(self, request: Request) -> Response:
        """The live page's ranking after each change: over the snapshot the feed last sent, which it draws."""
        found = await self._snapshot(request, latest=True)
        if isinstance(found, Response):
            return found
        search = await self._search(request, found)
        return search if isinstance(search, Response) else search_answer(search, SECURITY_HEADERS)

    async def snapshot_json(self, request: Request) -> Response:
        found = await self._snapshot(request)
        if isinstance(found, Response):
            return found
        return Response(snapshot_json(found), media_type="application/json", headers=SECURITY_HEADERS)

    async def events(self, request: Request) -> Response:
        refused = self.access.refusal(request)
        if refused is not None:
            return refused
        feed = self.feed
        if not feed.join():
            return _viewers_full(feed.max_viewers)
        headers = {**SECURITY_HEADERS, "X-Accel-Buffering": "no"}
        return EventStream(feed.events(self.closing), feed.leave, headers)

    async def _snapshot(self, request: Request, latest: bool = False) -> RegistrySnapshot | Response:
        """A fresh snapshot (`latest`: the feed's newest will do), or the answer instead of one: access refused, or
        the store not answering."""
        refused = self.access.refusal(request)
        if refused is not None:
            return refused
        try:
            return await (self.feed.current() if latest else self.feed.refresh())
        except UNAVAILABLE as exc:
            return _unavailable(exc)

    async def _search(self, request: Request, found: RegistrySnapshot) -> PageSearch | Response:
        try:
            return await run_search(self.overview, query_of(request), found)
        except UNAVAILABLE as exc:
            return _unavailable(exc)


def page_routes(
    overview: SnapshotSource, access: PageAccess, closing: asyncio.Event, feed: PageFeed | None = None
) -> list[BaseRoute]:
    """The page's routes, for `HealthServer.add_routes`; `feed` to share one (a test watching it)."""
    page = _Routes(overview, access, closing, feed if feed is not None else PageFeed(overview))

    async def script(request: Request) -> Response:
        return _asset("page.js", "text/javascript")

    async def style(request: Request) -> Response:
        return _asset("page.css", "text/css")

    return [
        Route("/", page.index),
        Route("/snapshot.json", page.snapshot_json),
        Route("/search.json", page.search_json),
        Route("/events", page.events),
        Route("/page.js", script),
        Route("/page.css", style),
    ]


def serve_registry_page(health: HealthServer, overview: SnapshotSource, settings: HttpSettings | None = None) -> str:
    """Add the page to `health`'s routes (or not, off loopback without a token); returns one line saying where it is.

    The token is `HttpSettings.http_token` (`TOOLREG_HTTP_TOKEN`), of `settings` or of the environment now.
    """
    access = PageAccess(health.loopback, (settings or HttpSettings.from_env()).http_token)
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
