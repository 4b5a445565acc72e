"""Hardening of the product's HTTP servers: what uvicorn lacks against slow, idle and hostile clients.

Used by every HTTP surface (`health.HealthServer`, and `toolreg mcp --http`
through `bounded_config`). A connection must finish its request headers
within `HEADER_TIMEOUT` seconds of opening (or of its last answer); headers
are capped at `MAX_HEADER_BYTES`; a client that stops reading what it is
sent (a page viewer that never reads its event stream) is cut off after
`WRITE_TIMEOUT` seconds, which frees what was buffered for it; and at most
`MAX_CONNECTIONS` sockets are open at once: past that, the oldest connection
still waiting for its headers is closed to make room, so a flood of
half-open sockets cannot starve a liveness probe, which sends its request at
once. What is dropped is logged as one line per window, not one per socket,
and repeated log records of uvicorn and asyncio are held back
(`RepeatFilter`), so no client can fill the disk with the log.

uvicorn has no header timeout of its own, so `BoundedH11Protocol` subclasses
its h11 protocol (`uvicorn.protocols.http.h11_impl.H11Protocol`, an internal
class: the `h11` and `uvicorn` ranges in pyproject.toml are the ones it is
tested with).

A server on the event loop cannot say the loop is wedged: a wedged loop
answers nothing. `Watchdog` is a thread that answers for it: when the loop's
heartbeat is older than its timeout, it takes the connections waiting on the
listening socket itself and answers them 503 ("event loop did not answer
within ...s"), which is what a liveness probe should restart. When the loop
runs, the thread leaves the socket alone and uvicorn answers as usual.
(Accepting from two places is safe: the listening socket is non-blocking,
and asyncio shrugs off the connection it finds already taken.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from toolservice_base.logs import get_logger

__all__ = [
    "HEADER_TIMEOUT",
    "KEEP_ALIVE",
    "LISTEN_QUEUE",
    "MAX_CONNECTIONS",
    "MAX_HEADER_BYTES",
    "SEND_BUFFER",
    "WRITE_TIMEOUT",
    "BoundedH11Protocol",
    "BoundedServer",
    "RepeatFilter",
    "Watchdog",
    "bounded_config",
    "bounded_protocol",
    "connection_cap",
    "limit_log_repeats",
]

log = get_logger("discovery.web")

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


def tcp_listener(host: str, port: int, backlog: int | None = None) -> socket.socket:
    """A listening TCP socket on `host:port` (IPv6 where `host` has a colon) whose connections send at once.

    Why `TCP_NODELAY` here: asyncio turns Nagle off only on sockets whose `proto` is TCP, and a socket of
    `socket.create_server` (protocol 0), and every connection accepted from it, is not one of them. An answer
    written in two parts (an SSE event, then the stream's end; headers, then a body) then waits for the client's
    delayed acknowledgement: 40 ms a call, measured on the MCP front (48 ms against 2 ms for the same answer without
    it). Accepted connections inherit the option from the listener. OSError as `socket.create_server` raises it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=backlog)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        sock.close()
        raise
    return sock


LISTEN_QUEUE = 1024
"""Connections the kernel holds for us to accept. Deep, so a probe behind a flood waits milliseconds, not a SYN
retry."""


TICK = 1.0
"""Seconds between two of uvicorn's ticks (`BoundedServer.main_loop`): it refreshes the Date header once a second."""


class BoundedServer(uvicorn.Server):
    """uvicorn without its signal handlers (SIGTERM and SIGINT belong to the process, `toolreg`), with a deep accept
    queue, and ticking once a second.

    asyncio accepts as many connections at once as the backlog it was given
    (`bounded_config` keeps that at the connection cap); the kernel's queue
    behind it is widened here, once listening, to `LISTEN_QUEUE`.

    uvicorn ticks every 0.1 s to refresh its Date header (every tenth tick)
    and to see whether it should exit: ten wake-ups a second of the loop of
    every process that serves HTTP, most of an idle registry's. Here it ticks
    every `TICK`, and setting `should_exit` ends the wait at once.
    """

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_asked: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        super().__init__(config)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        """Set from any thread; True wakes `main_loop` now."""
        self._should_exit = value
        if value and self._exit_asked is not None:
            loop, asked = self._exit_asked
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits any more
                loop.call_soon_threadsafe(asked.set)

    async def main_loop(self) -> None:
        asked = asyncio.Event()
        self._exit_asked = (asyncio.get_running_loop(), asked)
        counter = 0
        while not await self.on_tick(counter):
            counter += 10  # a tick is a second: every one refreshes the Date header, as every tenth of uvicorn's does
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asked.wait(), TICK)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        for sock in sockets or []:
            with contextlib.suppress(OSError):
                sock.listen(LISTEN_QUEUE)


_Uvicorn = BoundedServer


class Watchdog:
    """A thread that answers for the event loop while the loop's heartbeat is older than `timeout`."""

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self._sock = sock
        self.timeout = timeout
        # The loop stamps, and this thread looks, every eighth of `timeout`: a wedge is told within 1.125 x `timeout`,
        # 8 wake-ups a second in all for the default 2 s (every 0.1 s they were 20 of an idle registry's 34 a second).
        self.interval = timeout / 8
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
