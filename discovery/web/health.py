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

Slow and idle clients cannot hold the port (`bounded_config`, also used by
`toolreg mcp --http`): a connection must finish its request headers within
`HEADER_TIMEOUT` seconds of opening (or of its last answer); headers are
capped at `MAX_HEADER_BYTES`; a client that stops reading what it is sent
(a page viewer that never reads its event stream) is cut off after
`WRITE_TIMEOUT` seconds, which frees what was buffered for it; and at most
`MAX_CONNECTIONS` sockets are open at once: past that, the oldest
connection still waiting for its headers is closed to make room, so a flood
of half-open sockets cannot starve a liveness probe, which sends its
request at once. What is dropped is logged as one line per window, not one
per socket, and repeated log records of uvicorn and asyncio are held back
(`RepeatFilter`), so no client can fill the disk with the log.

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
import ipaddress
import json
import logging
import resource
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import h11
import uvicorn
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger
from toolservice_base.settings import env

log = get_logger("discovery.web")

DEFAULT_METRICS_PORT = 9464
"""The conventional port: what deploy/ sets and the help suggests. Nothing listens unless asked."""
DEFAULT_METRICS_HOST = "127.0.0.1"
METRICS_HOST_ENV = "TOOLREG_METRICS_HOST"
METRICS_PORT_ENV = "TOOLREG_METRICS_PORT"
LOOP_TIMEOUT = 2.0
"""Seconds without a loop heartbeat after which `/healthz` answers 503."""
SHUTDOWN_GRACE = 2.0
"""Seconds uvicorn waits for open responses (a page's event stream) before cutting them at stop."""

HEADER_TIMEOUT = 10.0
"""Seconds a connection has to send its request headers, from opening or from its last answer; then it is closed
(408)."""
MAX_HEADER_BYTES = 16 * 1024
"""The longest request head (request line and headers) read; a longer one is answered 400."""
MAX_CONNECTIONS = 128
"""Open sockets per server, at most (and at most an eighth of the process's file-descriptor limit)."""
KEEP_ALIVE = 5
"""Seconds an idle keep-alive connection stays open after an answer."""
WRITE_TIMEOUT = 15.0
"""Seconds a client may leave what it is sent unread (the server's buffer for it full) before it is cut off."""
SEND_BUFFER = 128 * 1024
"""The kernel's send buffer per connection (Linux doubles it). Without it, autotuning lets each client that does not
read hold megabytes in the kernel, and the server never learns it stopped reading."""

Check = Callable[[], "str | None"]
"""Runs on the event loop; returns None when fine, else a one-line reason."""


class HealthError(ToolDiscoveryError):
    """The health server cannot be configured or bound; the message says what to fix."""


def metrics_address(port: int | None = None) -> tuple[str, int] | None:
    """Where to serve, or None for off. An explicit port wins over `TOOLREG_METRICS_PORT`; 0 picks a free one."""
    host = env(METRICS_HOST_ENV) or DEFAULT_METRICS_HOST
    if port is None:
        raw = env(METRICS_PORT_ENV) or ""
        if not raw:
            return None
        try:
            port = int(raw)
        except ValueError:
            raise HealthError(f"TOOLREG_METRICS_PORT must be a port number, got {raw!r}") from None
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


# --- connections that cannot hold the port ----------------------------------------------


class RepeatFilter(logging.Filter):
    """Lets through at most `burst` records with the same message template per `window` seconds.

    The first record after a held-back stretch says how many were held back.
    On the loggers of uvicorn and asyncio, where a client (or a process out of
    file descriptors) can otherwise cause one traceback per connection.
    """

    def __init__(self, burst: int = 5, window: float = 10.0) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self._seen: dict[str, list[float]] = {}
        """Template -> [window start, passed in the window, held back since the last that passed]."""

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}:{str(record.msg).partition(chr(10))[0][:200]}"
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is None or now - seen[0] >= self.window:
            if len(self._seen) > 1000:
                self._seen.clear()
            held = int(seen[2]) if seen is not None else 0
            self._seen[key] = [now, 1, 0]
            if held:
                record.msg = f"{record.msg} [{held} more like this in the last {self.window:g}s were not logged]"
            return True
        if seen[1] < self.burst:
            seen[1] += 1
            return True
        seen[2] += 1
        return False


LIMITED_LOGGERS = ("asyncio", "uvicorn", "uvicorn.error")


def limit_log_repeats() -> None:
    """Put a `RepeatFilter` on the loggers a flood of clients can make noisy; once per process."""
    for name in LIMITED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatFilter) for f in logger.filters):
            logger.addFilter(RepeatFilter())


def connection_cap(wanted: int = MAX_CONNECTIONS) -> int:
    """`wanted`, but at most an eighth of the file descriptors this process may open (at least 8).

    An eighth: asyncio may accept up to three times the cap before it looks at the first of them.
    """
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return wanted
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return wanted
    return max(8, min(wanted, soft // 8))


class _Dropped:
    """Counts of connections closed for being slow or one too many, logged once per window per server."""

    def __init__(self, event: str, window: float = 10.0) -> None:
        self.event = event
        self.window = window
        self.timed_out = 0
        self.shed = 0
        self.stalled = 0
        self._pending: asyncio.TimerHandle | None = None

    def count(self, loop: asyncio.AbstractEventLoop, *, timed_out: int = 0, shed: int = 0, stalled: int = 0) -> None:
        self.timed_out += timed_out
        self.shed += shed
        self.stalled += stalled
        if self._pending is None:
            self._pending = loop.call_later(self.window, self._flush)

    def _flush(self) -> None:
        self._pending = None
        if self.timed_out or self.shed or self.stalled:
            log.warning(
                self.event,
                headers_timed_out=self.timed_out,
                closed_over_cap=self.shed,
                stopped_reading=self.stalled,
                window_s=self.window,
            )
        self.timed_out = self.shed = self.stalled = 0


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with what it lacks: deadlines for the request head and for a stalled reader, a cap on
    sockets.

    Use `bounded_protocol()` to make one with its own limits (a class per
    server). The deadline runs from the connection's opening and again from
    the end of each answer; it stops when the request head is complete, so a
    long answer (an event stream) is never cut by it. A client that leaves
    the answer unread (asyncio paused writing: its buffer is full) for
    `write_timeout` seconds is aborted, which frees that buffer at once (a
    close would wait for the client to read it).
    """

    header_timeout: ClassVar[float] = HEADER_TIMEOUT
    write_timeout: ClassVar[float] = WRITE_TIMEOUT
    send_buffer: ClassVar[int] = SEND_BUFFER
    max_connections: ClassVar[int] = MAX_CONNECTIONS
    dropped: ClassVar[_Dropped] = _Dropped("http.slow_clients_dropped")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._opened = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self.loop.time()
        sock = transport.get_extra_info("socket")
        if sock is not None and self.send_buffer > 0:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        self._arm()
        if len(self.connections) > self.max_connections:
            waiting = [c for c in self.connections if isinstance(c, BoundedH11Protocol) and c.awaiting_headers()]
            if waiting:
                oldest = min(waiting, key=lambda c: c._opened)
                oldest._close_with(503, "Service Unavailable", "too many open connections; try again")
                self.dropped.count(self.loop, shed=1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._stopped_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _stopped_reading(self) -> None:
        self._write_timer = None
        if self.flow is not None and self.flow.write_paused:
            self.dropped.count(self.loop, stalled=1)
            self.transport.abort()  # close() would wait for the client to read what is buffered

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the request head is in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request's head has the same deadline

    def awaiting_headers(self) -> bool:
        """Open, and no request in progress: nothing is lost by closing it."""
        return (
            self.transport is not None
            and not self.transport.is_closing()
            and self.conn.their_state is h11.IDLE
            and (self.cycle is None or self.cycle.response_complete)
        )

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.awaiting_headers():
            self._close_with(
                408, "Request Timeout", f"the request headers did not arrive within {self.header_timeout:g}s"
            )
            self.dropped.count(self.loop, timed_out=1)

    def _close_with(self, status: int, reason: str, message: str) -> None:
        """Answer `status` (if no answer is under way) and close; for a connection that has sent no complete request."""
        self._disarm()
        if self.conn.our_state is h11.IDLE:
            body = (message + "\n").encode()
            with contextlib.suppress(Exception):
                self.transport.write(
                    f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                    + body
                )
        self.transport.close()


def bounded_protocol(
    *,
    header_timeout: float = HEADER_TIMEOUT,
    write_timeout: float = WRITE_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    event: str = "http.slow_clients_dropped",
) -> type[BoundedH11Protocol]:
    """A `BoundedH11Protocol` class with these limits, for one server (`uvicorn.Config(http=...)`)."""
    return type(
        "BoundedH11Protocol",
        (BoundedH11Protocol,),
        {
            "header_timeout": header_timeout,
            "write_timeout": write_timeout,
            "max_connections": connection_cap(max_connections),
            "dropped": _Dropped(event),
        },
    )


def bounded_config(
    app: Any,
    *,
    header_timeout: float = HEADER_TIMEOUT,
    write_timeout: float = WRITE_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    event: str = "http.slow_clients_dropped",
    **options: Any,
) -> uvicorn.Config:
    """uvicorn's config with the limits above, for any of the product's HTTP servers.

    Why not uvicorn's `limit_concurrency`: it answers 503 to every new request
    while the cap is reached, so a flood of half-open sockets would turn the
    liveness probe away; the cap here closes the flood's oldest socket instead.
    The listen backlog is the cap too: asyncio accepts up to a backlog of
    connections at once before any is looked at, so a larger one would let a
    flood take every file descriptor between two looks.
    """
    limit_log_repeats()
    protocol = bounded_protocol(
        header_timeout=header_timeout, write_timeout=write_timeout, max_connections=max_connections, event=event
    )
    return uvicorn.Config(
        app,
        http=protocol,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_keep_alive=KEEP_ALIVE,
        backlog=protocol.max_connections,
        **options,
    )


LISTEN_QUEUE = 1024
"""Connections the kernel holds for us to accept. Deep, so a probe behind a flood waits milliseconds, not a SYN
retry."""


class BoundedServer(uvicorn.Server):
    """uvicorn without its signal handlers (SIGTERM and SIGINT belong to the process, `toolreg`), and with a deep accept
    queue.

    asyncio accepts as many connections at once as the backlog it was given
    (`bounded_config` keeps that at the connection cap); the kernel's queue
    behind it is widened here, once listening, to `LISTEN_QUEUE`.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        for sock in sockets or []:
            with contextlib.suppress(OSError):
                sock.listen(LISTEN_QUEUE)


_Uvicorn = BoundedServer


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
        self._server: _Uvicorn | None = None
        self._serving: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._watchdog: _Watchdog | None = None
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
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        try:
            sock = socket.create_server((self.host, self.requested_port), family=family, backlog=128)
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
    "HEADER_TIMEOUT",
    "LOOP_TIMEOUT",
    "MAX_CONNECTIONS",
    "WRITE_TIMEOUT",
    "BoundedH11Protocol",
    "BoundedServer",
    "Check",
    "HealthError",
    "HealthServer",
    "RepeatFilter",
    "bounded_config",
    "is_loopback_host",
    "metrics_address",
    "split_host",
]
