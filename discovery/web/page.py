"""The registry page: tools, instances, conflicts and rejections, live, on the registry's HTTP port.

`GET /` is complete HTML rendered here, every value escaped (tool
descriptions and rejection reasons come from the network), so it works with
JavaScript off (it then refreshes itself every few seconds). With JavaScript,
`/page.js` subscribes to `/events` (server-sent events) and redraws the
tables from each snapshot, as text, within a quarter of a second of a change.
No build step: the script and style are two files served as they are.

Read-only: every route is a GET that reads. On a loopback address the page
is open to this machine (the Host header must name the loopback address, so
another site cannot read it through DNS rebinding). Bound anywhere else it
requires the bearer token `TOOLREG_HTTP_TOKEN`, compared in constant time:
`Authorization: Bearer <token>`, or open `/?token=<token>` once, which sets a
cookie (HttpOnly, SameSite=Strict) and redirects to `/`. Without the variable
the page is not served off loopback at all; health and metrics are unaffected.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import AsyncIterator
from html import escape
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from discovery.registry.overview import Overview, RegistrySnapshot
from toolservice_base.errors import ConfigError, TransportError
from toolservice_base.logs import get_logger

from .health import HealthServer

log = get_logger("discovery.web")

TOKEN_ENV = "TOOLREG_HTTP_TOKEN"
COOKIE = "toolreg_token"
TICK = 0.25
"""Seconds between snapshots while anyone watches: the page is at most this much behind the registry."""
KEEPALIVE = 15.0
"""Seconds between comments on an idle event stream, so proxies keep it open and a gone viewer is noticed."""
NO_SCRIPT_REFRESH = 5
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class PageFeed:
    """One snapshot loop per process while anyone watches; every viewer gets the same JSON.

    A snapshot is sent when something in it changed (the build time aside),
    so an idle registry costs one memory walk per tick and no store reads.
    """

    def __init__(self, overview: Overview, *, tick: float = TICK) -> None:
        self.overview = overview
        self.tick = tick
        self.latest: RegistrySnapshot | None = None
        self.text = ""
        self.problem: str | None = None
        self.version = 0
        self._compare = ""
        self._changed = asyncio.Event()
        """Set (and replaced by a fresh one) whenever `version` moves."""
        self._viewers = 0
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> RegistrySnapshot:
        """Build a snapshot now; notify viewers if it differs from the last."""
        try:
            snapshot = await self.overview.snapshot()
        except (ConfigError, TransportError) as exc:
            problem = f"the config store did not answer ({exc}); static tools and the version may be out of date"
            if problem != self.problem:
                self.problem = problem
                await self._notify()
            if self.latest is None:
                raise
            return self.latest
        compare = snapshot.model_dump_json(exclude={"at"})
        self.latest = snapshot
        if compare != self._compare or self.problem is not None:
            self._compare, self.text, self.problem = compare, snapshot.model_dump_json(), None
            await self._notify()
        return snapshot

    async def _notify(self) -> None:
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except (ConfigError, TransportError):
                pass  # said once as a problem event; the next tick tries again
            except Exception:
                log.exception("page.snapshot_failed")
            await asyncio.sleep(self.tick)

    async def events(self, closing: asyncio.Event) -> AsyncIterator[str]:
        """Server-sent events for one viewer: every changed snapshot, problems, and keep-alive comments."""
        self._viewers += 1
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="registry-page-feed")
        seen = -1
        closed = asyncio.ensure_future(closing.wait())
        try:
            yield "retry: 1000\n\n"
            while not closing.is_set():
                if self.version != seen:
                    seen = self.version
                    if self.text:
                        yield f"event: snapshot\ndata: {self.text}\n\n"
                    if self.problem:
                        yield f"event: problem\ndata: {self.problem}\n\n"
                    continue
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    done, _ = await asyncio.wait({changed, closed}, timeout=KEEPALIVE, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                if not done:
                    yield ": keep-alive\n\n"
        finally:
            closed.cancel()
            self._viewers -= 1
            if self._viewers == 0 and self._task is not None:
                self._task.cancel()
                self._task = None


# --- the HTML, rendered here ------------------------------------------------------


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _cell(value: Any, css: str = "") -> str:
    text = "-" if value is None or value == "" else str(value)
    cls = f' class="{escape(css)}"' if css else ""
    return f"<td{cls}>{escape(text)}</td>"


def _rows(rows: list[str], columns: int, empty: str) -> str:
    return "".join(rows) or f'<tr><td class="empty" colspan="{columns}">{escape(empty)}</td></tr>'


def _table(table_id: str, title: str, count: int, headers: list[str], body: str, note: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return (
        f'<section><h2>{escape(title)} <span class="count" id="{table_id}-count">({count})</span>{note}</h2>'
        f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>'
    )


def render(snapshot: RegistrySnapshot, problem: str | None = None) -> str:
    """The whole page for `snapshot`: complete without JavaScript, every value escaped."""
    s = snapshot
    tools = [
        "<tr>" + _cell(t.name, "mono") + _cell(t.service, "mono") + _cell(t.workspace) + _cell(t.source)
        + _cell(t.status, f"status-{t.status}") + _cell(t.instances if t.source == "announced" else "-")
        + _cell(t.description, "description") + "</tr>"
        for t in s.tools
    ]
    instances = []
    for i in s.instances:
        if i.last_seen is None:
            meter = f"<span>not heard from since the registry started (grace of {i.ttl:g} s)</span>"
        else:
            seen = max(0.0, s.at - i.last_seen)
            meter = (
                f'<meter min="0" max="{i.ttl:g}" low="{i.ttl / 3:g}" high="{i.ttl * 2 / 3:g}" optimum="0" '
                f'value="{min(seen, i.ttl):.3f}" data-last-seen="{i.last_seen:.3f}"></meter><span>{escape(_age(seen))} ago of {i.ttl:g} s</span>'
            )
        instances.append(
            "<tr>" + _cell(i.service, "mono") + _cell(i.id, "id") + _cell(i.version) + _cell(i.signer or "unsigned")
            + _cell(i.state, f"state-{i.state}") + f"<td>{meter}</td></tr>"
        )
    conflicts = [
        "<tr>" + _cell(c.tool, "mono") + _cell(c.service, "mono") + _cell(c.held_by, "mono") + _cell(c.workspace) + _cell(c.reason) + "</tr>"
        for c in s.conflicts
    ]
    rejections = [
        "<tr>" + _cell(f"{_age(max(0.0, s.at - r.at))} ago") + _cell(r.service, "mono") + _cell(r.instance, "id") + _cell(r.reason) + "</tr>"
        for r in s.rejections
    ]
    held = ", ".join(s.held)
    version = "unknown" if s.config_version is None else str(s.config_version)
    total = f' <span class="count">of <span id="rejected-total">{s.rejected_total}</span> since start</span>'
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>toolreg registry</title>
<link rel="stylesheet" href="page.css">
<noscript><meta http-equiv="refresh" content="{NO_SCRIPT_REFRESH}"></noscript>
<script src="page.js" defer></script>
</head>
<body>
<header>
<h1>Tool registry</h1>
<p id="status">config version <b id="config-version">{escape(version)}</b> · updated <span id="updated">just now</span> ·
<span id="live">static page</span></p>
</header>
<p id="problem" class="problem"{"" if problem else " hidden"}>{escape(problem or "")}</p>
<div id="held" class="banner" role="alert"{"" if s.held else " hidden"}><b>Self-preservation is holding expiries</b>:
the leases of <span id="held-services">{escape(held)}</span> ran out together, so the registry suspects itself or the broker
and keeps their tools. They come back when heartbeats resume; run <code>toolreg release</code> to remove them.</div>
{_table("tools", "Tools", len(s.tools), ["Tool", "Service", "Workspace", "Source", "Status", "Instances", "Description"], _rows(tools, 7, "no tools"))}
{_table("instances", "Instances", len(s.instances), ["Service", "Instance", "Version", "Signer", "State", "Heartbeat (age of ttl)"],
        _rows(instances, 6, "no instances hold a lease"))}
{_table("conflicts", "Conflicts", len(s.conflicts), ["Tool", "Refused for", "Held by", "Workspace", "Reason"], _rows(conflicts, 5, "no conflicts"))}
{_table("rejections", "Rejections, newest first", len(s.rejections), ["When", "Service", "Instance", "Reason"],
        _rows(rejections, 4, "no rejected announcements"), total)}
<footer>Read-only. The same data: <code>toolreg tools</code>, <code>toolreg rejections</code>, <code>toolreg conflicts</code>;
as JSON: <a href="snapshot.json">snapshot.json</a>.</footer>
</body>
</html>
"""


# --- routes and access ------------------------------------------------------------


class PageAccess:
    """Who may read the page: anyone on this machine when bound to loopback; else the bearer of the token."""

    def __init__(self, loopback: bool, token: str | None) -> None:
        self.loopback = loopback
        self.token = token or None

    def refusal(self, request: Request) -> Response | None:
        """None if the request may read the page; else the response to send instead."""
        if self.loopback:
            host = _hostname(request.headers.get("host", ""))
            if host not in LOOPBACK_NAMES and not host.startswith("127."):
                return JSONResponse({"error": f"the registry page answers only to a loopback Host, not {host!r}"}, status_code=403)
            return None
        if self.token is None:
            return JSONResponse(
                {"error": f"the registry page is not served off loopback without a token; set {TOKEN_ENV} and restart"}, status_code=403
            )
        presented = _bearer(request) or request.cookies.get(COOKIE) or ""
        if hmac.compare_digest(presented.encode(), self.token.encode()):
            return None
        return JSONResponse(
            {"error": f"the registry page needs the token in {TOKEN_ENV}: send 'Authorization: Bearer <token>' or open /?token=<token>"},
            status_code=401,
            headers={"WWW-Authenticate": 'Bearer realm="toolreg"'},
        )


def _hostname(host: str) -> str:
    """`127.0.0.1:9464` -> `127.0.0.1`; `[::1]:9464` -> `::1`."""
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _unavailable(exc: Exception) -> Response:
    """The first snapshot needs the store (static tools, version); without it there is nothing honest to show."""
    message = f"the config store did not answer ({exc}); the page shows once it does, is `toolreg up` running?"
    return JSONResponse({"error": message}, status_code=503)


def _asset(name: str, media_type: str) -> Response:
    body = (resources.files("discovery") / "static" / name).read_bytes()
    return Response(body, media_type=media_type, headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"})


def page_routes(overview: Overview, access: PageAccess, closing: asyncio.Event) -> list[BaseRoute]:
    """The page's routes, for `HealthServer.add_routes`."""
    feed = PageFeed(overview)

    async def index(request: Request) -> Response:
        offered = request.query_params.get("token")
        if offered is not None and access.token is not None and not access.loopback:
            if not hmac.compare_digest(offered.encode(), access.token.encode()):
                return access.refusal(request) or Response(status_code=401)
            redirect = RedirectResponse("./", status_code=303)
            redirect.set_cookie(COOKIE, offered, httponly=True, samesite="strict", secure=request.url.scheme == "https")
            return redirect
        found = await snapshot_for(request)
        if isinstance(found, Response):
            return found
        return HTMLResponse(render(found, feed.problem), headers=SECURITY_HEADERS)

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
        except (ConfigError, TransportError) as exc:
            return _unavailable(exc)

    async def events(request: Request) -> Response:
        refused = access.refusal(request)
        if refused is not None:
            return refused
        headers = {**SECURITY_HEADERS, "X-Accel-Buffering": "no"}
        return StreamingResponse(feed.events(closing), media_type="text/event-stream", headers=headers)

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


def serve_registry_page(health: HealthServer, overview: Overview) -> str:
    """Add the page to `health`'s routes (or not, off loopback without a token); returns one line saying where it is."""
    access = PageAccess(health.loopback, os.environ.get(TOKEN_ENV, "").strip() or None)
    if not access.loopback and access.token is None:
        log.info("page.off", reason=f"bound to {health.host} and {TOKEN_ENV} is not set", fix=f"set {TOKEN_ENV}, or bind to 127.0.0.1")
        health.add_routes(page_routes(overview, access, health.closing))  # answers 403 saying what to set
        return f"off: bound to {health.host} without {TOKEN_ENV} (set it to serve the page there)"
    health.add_routes(page_routes(overview, access, health.closing))
    return f"{health.url}/" + ("" if access.loopback else f" (bearer token {TOKEN_ENV} required)")
