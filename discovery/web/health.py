"""One HTTP surface per process: `/healthz`, `/readyz`, `/metrics`, and on the registry its page.

An ASGI app (Starlette) served by uvicorn inside the process's own event
loop: handlers read product state directly, with no locks and no thread
hops, and the registry page can stream changes as they happen.

A server on the loop cannot say the loop is wedged: a wedged loop answers
nothing. So a watchdog thread keeps that meaning of `/healthz`: a task on the
loop stamps a heartbeat every fraction of `timeout`, and while the stamp is
older than `timeout` the thread answers 503 itself (`hardening.Watchdog`).
Slow, idle and hostile clients cannot hold the port: the server runs with
the limits of `hardening` (header and write deadlines, a cap on sockets and
on header size, log floods held back), as `toolreg mcp --http` does.

Off by default. `--metrics-port N` (or `TOOLREG_METRICS_PORT`) turns it on,
bound to 127.0.0.1 unless `TOOLREG_METRICS_HOST` says otherwise (containers
set 0.0.0.0 so the kubelet and Prometheus can reach it).

The registry's and the store's metric classes live in their own packages
(`discovery.registry.metrics`, `discovery.store.metrics`); this serves what
they fill, from the process's Prometheus registry.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Callable, Sequence

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger

from .hardening import (
    HEADER_TIMEOUT,
    MAX_CONNECTIONS,
    WRITE_TIMEOUT,
    BoundedServer,
    Watchdog,
    bounded_config,
    tcp_listener,
)
from .settings import DEFAULT_METRICS_HOST, HttpSettings

log = get_logger("discovery.web")

DEFAULT_METRICS_PORT = 9464
"""The conventional port: what deploy/ sets and the help suggests. Nothing listens unless asked."""
LOOP_TIMEOUT = 2.0
"""Seconds without a loop heartbeat after which `/healthz` answers 503."""
SHUTDOWN_GRACE = 2.0
"""Seconds uvicorn waits for open responses (a page's event stream) before cutting them at stop."""

Check = Callable[[], "str | None"]
"""Runs on the event loop; returns None when fine, else a one-line reason."""


class HealthError(ToolDiscoveryError):
    """The health server cannot be configured or bound; the message says what to fix."""


def metrics_address(port: int | None = None, settings: HttpSettings | None = None) -> tuple[str, int] | None:
    """Where to serve, or None for off. An explicit port wins over `TOOLREG_METRICS_PORT`; 0 picks a free one.

    `settings`: where the environment's say comes from (`HttpSettings.metrics_port`, `metrics_host`); read now if
    None.
    """
    settings = settings or HttpSettings.from_env()
    host = settings.metrics_host
    if port is None:
        port = settings.metrics_port
        if port is None:
            return None
    if not 0 <= port <= 65535:
        raise HealthError(f"metrics port must be in 0-65535, got {port}")
    return host, port


# --- host names, compared exactly ------------------------------------------------------


def split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header (or `host[:port]`) as (lower-cased host name, port or None); None if it is not one.

    `[::1]:8765` -> (`::1`, 8765); `127.0.0.1` -> (`127.0.0.1`, None). A bare
    IPv6 address without brackets, an empty name or a bad port is not a host.
    """
    value = value.strip()
    if value.startswith("["):
        name, closed, rest = value[1:].partition("]")
        if not closed:
            return None
        port_text = rest[1:] if rest.startswith(":") else None
        if rest and port_text is None:
            return None
    else:
        if value.count(":") > 1:
            return None
        name, colon, port_text_ = value.partition(":")
        port_text = port_text_ if colon else None
    if not name or any(c.isspace() or c in "/\\?#@" for c in name):
        return None
    if port_text is None:
        return name.lower(), None
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) <= 65535:
        return None
    return name.lower(), int(port_text)


def is_loopback_host(name: str) -> bool:
    """Exactly `localhost` or a loopback IP literal (`127.0.0.2`, `::1`): never a name that merely starts like one."""
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HealthServer:
    """`/healthz` (the event loop answers), `/readyz` (every check passes), `/metrics`, and routes added later.

    `start()` on the event loop the checks belong to, then `await aclose()`
    (or use it as an async context manager, as `toolreg` does on its exit
    stack). `stop()` is the synchronous half of `aclose()`: it stops the
    watchdog and asks uvicorn to finish, which it does on the loop within a
    tenth of a second. Checks and routes can be added before or after start.
    """

    def __init__(
        self,
        host: str = DEFAULT_METRICS_HOST,
        port: int = DEFAULT_METRICS_PORT,
        *,
        registry: CollectorRegistry = REGISTRY,
        timeout: float = LOOP_TIMEOUT,
        header_timeout: float = HEADER_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.host = host
        self.header_timeout = header_timeout
        self.write_timeout = write_timeout
        self.max_connections = max_connections
        self.requested_port = port
        self.registry = registry
        self.timeout = timeout
        self._checks: dict[str, Check] = {}
        self._facts: dict[str, Callable[[], object]] = {}
        self._port: int | None = None
        self.closing = asyncio.Event()
        """Set at stop: long-lived responses (the page's event stream) end when they see it."""
        self.app = Starlette(
            routes=[
                Route("/healthz", self._healthz),
                Route("/readyz", self._readyz),
                Route("/metrics", self._metrics),
            ],
            exception_handlers={404: self._not_found, 405: self._not_allowed},
        )
        self._server: BoundedServer | None = None
        self._serving: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._watchdog: Watchdog | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add_check(self, name: str, check: Check) -> None:
        """Add a readiness check; call it on the event loop (or before `start()`)."""
        self._checks[name] = check

    def add_fact(self, name: str, fact: Callable[[], object]) -> None:
        """Add what `/readyz` should say beside its checks (a replica's role: a standby is ready, and says it is a
        standby)."""
        self._facts[name] = fact

    def add_routes(self, routes: Sequence[BaseRoute]) -> None:
        """Serve more routes on the same port (the registry page); call on the event loop."""
        self.app.router.routes.extend(routes)

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the health server is not started")
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """Bound to a loopback address only: nobody off this machine can connect."""
        return is_loopback_host(self.host)

    # --- life cycle ------------------------------------------------------------

    def start(self) -> HealthServer:
        """Bind now (a taken port is a `HealthError` here, not later), then serve on the running loop."""
        loop = asyncio.get_running_loop()
        try:
            sock = tcp_listener(self.host, self.requested_port, backlog=128)
        except OSError as exc:
            raise HealthError(
                f"cannot serve health and metrics on {self.host}:{self.requested_port}: {exc.strerror}"
            ) from None
        sock.setblocking(False)
        self._port = int(sock.getsockname()[1])
        config = bounded_config(
            self.app,
            header_timeout=self.header_timeout,
            write_timeout=self.write_timeout,
            max_connections=self.max_connections,
            event="health.slow_clients_dropped",
            lifespan="off",
            ws="none",
            log_config=None,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE),
        )
        self._loop = loop
        self._server = BoundedServer(config)
        self._watchdog = Watchdog(sock, self.timeout)
        self._heartbeat = loop.create_task(self._beat(self._watchdog), name="toolreg-health-heartbeat")
        self._serving = loop.create_task(self._serve(self._server, sock), name="toolreg-health-server")
        self._watchdog.start()
        log.info("health.listening", url=self.url, routes=[getattr(route, "path", "") for route in self.app.routes])
        return self

    async def _beat(self, watchdog: Watchdog) -> None:
        while True:
            watchdog.stamp = time.monotonic()
            await asyncio.sleep(watchdog.interval)

    async def _serve(self, server: BoundedServer, sock: socket.socket) -> None:
        try:
            await server.serve(sockets=[sock])
        except asyncio.CancelledError:
            sock.close()
            raise
        except BaseException:  # SystemExit included: uvicorn exits on start-up failure
            sock.close()
            log.exception("health.server_failed", url=self.url)

    def stop(self) -> None:
        """Stop the watchdog, end event streams, tell uvicorn to finish. Safe twice, and before start."""
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if self._server is not None:
            self._server.should_exit = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                self.closing.set()
            else:
                loop.call_soon_threadsafe(self.closing.set)

    async def aclose(self) -> None:
        """`stop()`, then wait for uvicorn to close the socket and its connections."""
        self.stop()
        serving, self._serving = self._serving, None
        if serving is not None:
            try:
                await asyncio.wait_for(asyncio.shield(serving), SHUTDOWN_GRACE + 3)
            except TimeoutError:
                serving.cancel()
                log.warning("health.stop_forced", url=self.url)

    async def __aenter__(self) -> HealthServer:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- routes (on the event loop) ------------------------------------------------

    async def _healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})  # answering at all is the proof: this runs on the loop

    async def _readyz(self, request: Request) -> Response:
        results: dict[str, str] = {}
        for name, check in list(self._checks.items()):
            try:
                results[name] = check() or "ok"
            except Exception as exc:  # a broken check must not break the probe
                results[name] = f"check failed: {type(exc).__name__}: {exc}"
        ready = bool(results) and all(value == "ok" for value in results.values())
        body: dict[str, object] = {"status": "ready" if ready else "not ready", "checks": results}
        for name, fact in list(self._facts.items()):
            try:
                body[name] = fact()
            except Exception as exc:  # a broken fact must not break the probe either
                body[name] = f"unknown: {type(exc).__name__}: {exc}"
        return JSONResponse(body, status_code=200 if ready else 503)

    async def _metrics(self, request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(self.registry), headers={"Content-Type": content_type})

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        path = request.url.path
        return JSONResponse({"error": f"no route {path}; try /healthz, /readyz or /metrics"}, status_code=404)

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 405
        return JSONResponse(
            {"error": f"{request.method} is not allowed here: every route is read-only (GET)"}, status_code=status
        )


__all__ = [
    "DEFAULT_METRICS_HOST",
    "DEFAULT_METRICS_PORT",
    "LOOP_TIMEOUT",
    "Check",
    "HealthError",
    "HealthServer",
    "is_loopback_host",
    "metrics_address",
    "split_host",
]
