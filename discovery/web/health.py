"""One HTTP surface per process: `/healthz`, `/readyz`, `/metrics`, and on the registry its page.

An ASGI app (Starlette) served by uvicorn inside the process's own event
loop: handlers read product state directly, with no locks and no thread
hops, and the registry page can stream changes as they happen.

A server on the loop cannot say the loop is wedged: a wedged loop answers
nothing. So a watchdog thread keeps that meaning of `/healthz`. A task on the
loop stamps a heartbeat every fraction of `timeout`; when the stamp is older
than `timeout`, the thread takes the connections waiting on the listening
socket itself and answers them 503 ("event loop did not answer within
...s"), which is what a liveness probe should restart. When the loop runs,
the thread leaves the socket alone and uvicorn answers as usual. (Accepting
from two places is safe: the listening socket is non-blocking, and asyncio
shrugs off the connection it finds already taken.)

Off by default. `--metrics-port N` (or `TOOLREG_METRICS_PORT`) turns it on,
bound to 127.0.0.1 unless `TOOLREG_METRICS_HOST` says otherwise (containers
set 0.0.0.0 so the kubelet and Prometheus can reach it).

The registry's and the store's metric classes live in their own packages
(`discovery.registry.metrics`, `discovery.store.metrics`); this serves what
they fill, from the process's Prometheus registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import uvicorn
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger

log = get_logger("discovery.web")

DEFAULT_METRICS_PORT = 9464
"""The conventional port: what deploy/ sets and the help suggests. Nothing listens unless asked."""
DEFAULT_METRICS_HOST = "127.0.0.1"
LOOP_TIMEOUT = 2.0
"""Seconds without a loop heartbeat after which `/healthz` answers 503."""
SHUTDOWN_GRACE = 2.0
"""Seconds uvicorn waits for open responses (a page's event stream) before cutting them at stop."""

Check = Callable[[], "str | None"]
"""Runs on the event loop; returns None when fine, else a one-line reason."""


class HealthError(ToolDiscoveryError):
    """The health server cannot be configured or bound; the message says what to fix."""


def metrics_address(port: int | None = None) -> tuple[str, int] | None:
    """Where to serve, or None for off. An explicit port wins over `TOOLREG_METRICS_PORT`; 0 picks a free one."""
    host = os.environ.get("TOOLREG_METRICS_HOST", "").strip() or DEFAULT_METRICS_HOST
    if port is None:
        raw = os.environ.get("TOOLREG_METRICS_PORT", "").strip()
        if not raw:
            return None
        try:
            port = int(raw)
        except ValueError:
            raise HealthError(f"TOOLREG_METRICS_PORT must be a port number, got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise HealthError(f"metrics port must be in 0-65535, got {port}")
    return host, port


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: SIGTERM and SIGINT belong to the process (`toolreg`), not to its HTTP server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _Watchdog:
    """A thread that answers for the event loop while the loop's heartbeat is older than `timeout`."""

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self._sock = sock
        self.timeout = timeout
        self.interval = min(0.1, timeout / 4)
        self.stamp = time.monotonic()
        """Set by the heartbeat task on the loop; read here. A float store is atomic under the GIL."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolreg-health-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def stale(self) -> float | None:
        """Seconds since the loop's last heartbeat, if more than `timeout`; else None."""
        age = time.monotonic() - self.stamp
        return age if age > self.timeout else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.stale() is None:
                continue
            log.warning("health.loop_wedged", waited=round(time.monotonic() - self.stamp, 2), timeout=self.timeout)
            while not self._stop.is_set() and self.stale() is not None:
                try:
                    readable, _, _ = select.select([self._sock], [], [], self.interval)
                except (OSError, ValueError):
                    return  # the socket was closed under us: the server is stopping
                if readable and self.stale() is not None:
                    self._answer_one()
            if not self._stop.is_set():
                log.info("health.loop_recovered")

    def _answer_one(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # the loop woke up and took it
        except OSError:
            return
        with conn:
            try:
                conn.settimeout(1.0)
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 8192:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                parts = head.split(b" ", 2)
                path = parts[1].split(b"?", 1)[0].decode("latin-1") if len(parts) > 1 else ""
                reason = f"event loop did not answer within {self.timeout:g}s"
                status = "unhealthy" if path == "/healthz" else "not ready" if path == "/readyz" else "unavailable"
                body = json.dumps({"status": status, "reason": reason}).encode()
                conn.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
            except OSError:
                pass  # a probe that hangs up mid-answer is routine


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
    ) -> None:
        self.host = host
        self.requested_port = port
        self.registry = registry
        self.timeout = timeout
        self._checks: dict[str, Check] = {}
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
        self._server: _Uvicorn | None = None
        self._serving: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._watchdog: _Watchdog | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add_check(self, name: str, check: Check) -> None:
        """Add a readiness check; call it on the event loop (or before `start()`)."""
        self._checks[name] = check

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
        return self.host in ("127.0.0.1", "::1", "localhost") or self.host.startswith("127.")

    # --- life cycle ------------------------------------------------------------

    def start(self) -> HealthServer:
        """Bind now (a taken port is a `HealthError` here, not later), then serve on the running loop."""
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            sock = socket.create_server((self.host, self.requested_port), family=family, backlog=128)
        except OSError as exc:
            raise HealthError(f"cannot serve health and metrics on {self.host}:{self.requested_port}: {exc.strerror}") from None
        sock.setblocking(False)
        self._port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            http="h11",
            ws="none",
            log_config=None,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=int(SHUTDOWN_GRACE),
        )
        self._loop = loop
        self._server = _Uvicorn(config)
        self._watchdog = _Watchdog(sock, self.timeout)
        self._heartbeat = loop.create_task(self._beat(self._watchdog), name="toolreg-health-heartbeat")
        self._serving = loop.create_task(self._serve(self._server, sock), name="toolreg-health-server")
        self._watchdog.start()
        log.info("health.listening", url=self.url, routes=[getattr(route, "path", "") for route in self.app.routes])
        return self

    async def _beat(self, watchdog: _Watchdog) -> None:
        while True:
            watchdog.stamp = time.monotonic()
            await asyncio.sleep(watchdog.interval)

    async def _serve(self, server: _Uvicorn, sock: socket.socket) -> None:
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
        return JSONResponse({"status": "ready" if ready else "not ready", "checks": results}, status_code=200 if ready else 503)

    async def _metrics(self, request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(self.registry), headers={"Content-Type": content_type})

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        path = request.url.path
        return JSONResponse({"error": f"no route {path}; try /healthz, /readyz or /metrics"}, status_code=404)

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 405
        return JSONResponse({"error": f"{request.method} is not allowed here: every route is read-only (GET)"}, status_code=status)


__all__ = [
    "DEFAULT_METRICS_HOST",
    "DEFAULT_METRICS_PORT",
    "LOOP_TIMEOUT",
    "Check",
    "HealthError",
    "HealthServer",
    "metrics_address",
]
