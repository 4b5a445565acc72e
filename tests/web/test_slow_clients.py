"""Clients that never finish their request headers cannot hold the product's HTTP ports.

Two servers, one set of limits (`discovery.web.hardening.bounded_config`): the health/page port and
`toolreg mcp --http`. Before, about 1,100 sockets that sent half a request head and stopped were
never timed out: they used up the file descriptors, `/healthz` stopped answering and asyncio logged
a traceback per refused accept (88 MB in 25 s). Now a request head has a deadline, open sockets a
cap (the oldest still waiting for its head makes room), and repeated log records are held back.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import resource
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from agent_bridge import ToolSet
from discovery.mcp.server import McpFront
from discovery.mcp.transports import http_server
from discovery.web.hardening import MAX_CONNECTIONS, RepeatFilter
from discovery.web.health import HealthServer
from toolservice_base import Settings

SLOW = 200
"""Half-open sockets per test: more than the cap, so both the cap and the deadline act."""
DEADLINE = 1.0
"""The header deadline the servers get here (10 s by default)."""


@asynccontextmanager
async def health_port(tmp_path: Path) -> AsyncIterator[tuple[int, str]]:
    async with HealthServer(port=0, header_timeout=DEADLINE) as health:
        yield health.port, "/healthz"


@asynccontextmanager
async def mcp_port(tmp_path: Path) -> AsyncIterator[tuple[int, str]]:
    tools = ToolSet(settings=Settings(data_dir=tmp_path / "data", pulsar_url="pulsar://127.0.0.1:9"))
    async with http_server(McpFront(tools), "127.0.0.1", 0, header_timeout=DEADLINE) as url:
        yield int(url.rsplit(":", 1)[1].split("/")[0]), "/mcp"


SERVERS: dict[str, Callable[[Path], AbstractAsyncContextManager[tuple[int, str]]]] = {
    "health": health_port,
    "mcp": mcp_port,
}


def open_half_requests(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for n in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow-{n}: never".encode())
        sockets.append(sock)
    return sockets


def wait_closed(sockets: list[socket.socket], within: float) -> tuple[int, dict[str, int]]:
    """How many of `sockets` the server closed within `within` seconds, and the status lines it sent them."""
    deadline = time.monotonic() + within
    closed = 0
    said: dict[str, int] = {}
    for sock in sockets:
        received = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                closed += 1
                status = received.split(b"\r\n", 1)[0].decode(errors="replace") or "(nothing)"
                said[status] = said.get(status, 0) + 1
                break
            received += chunk
        sock.close()
    return closed, said


def ask(port: int, path: str) -> tuple[int, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        if path == "/mcp":
            body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
            connection.request(
                "POST",
                path,
                body=body,
                headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
            )
        else:
            connection.request("GET", path)
        status = connection.getresponse().status
    finally:
        connection.close()
    return status, time.monotonic() - started


@pytest.mark.parametrize("server", sorted(SERVERS))
async def test_half_sent_request_heads_are_closed_and_the_port_keeps_answering(server: str, tmp_path: Path) -> None:
    async with SERVERS[server](tmp_path) as (port, probe):
        opened = time.monotonic()
        slow = await asyncio.to_thread(open_half_requests, port, SLOW)
        all_open = time.monotonic() - opened  # past DEADLINE, the first heads timed out before the last were open
        status, took = await asyncio.to_thread(ask, port, probe)
        assert status in (200, 400, 404) and took < 1.0, (
            f"{probe} answered {status} after {took:.2f}s with {SLOW} slow sockets open"
        )
        # Every slow socket is closed by the server: the oldest at once (over the cap), the rest at the deadline.
        closed, said = await asyncio.to_thread(wait_closed, slow, DEADLINE + 2.0)
        assert closed == SLOW, (
            f"{SLOW - closed} of {SLOW} half-open sockets still open {time.monotonic() - opened:.1f}s later; {said}"
        )
        # A socket closed before the server read what it sent may be reset, its 503 lost on the way: "(nothing)".
        assert set(said) <= {"HTTP/1.1 408 Request Timeout", "HTTP/1.1 503 Service Unavailable", "(nothing)"}, said
        shed = said.get("HTTP/1.1 503 Service Unavailable", 0) + said.get("(nothing)", 0)
        # Only when every socket was open before the first head's deadline must the cap have made the room (on a
        # machine so loaded that opening 200 sockets took longer, deadlines freed slots as they opened).
        if all_open < DEADLINE:
            assert shed >= SLOW - MAX_CONNECTIONS, f"the cap made room at once: {said}"
        assert (await asyncio.to_thread(ask, port, probe))[0] in (200, 400, 404), "and it still answers afterwards"


async def test_a_slow_trickle_does_not_reset_the_deadline() -> None:
    async with HealthServer(port=0, header_timeout=DEADLINE) as health:
        reader, writer = await asyncio.open_connection("127.0.0.1", health.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")
        started = time.monotonic()
        try:
            while time.monotonic() - started < DEADLINE + 2:
                writer.write(b"X-Drip: 1\r\n")  # one header every 0.2 s, never the blank line
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(), 0.2) is not None:
                        break
                except TimeoutError:
                    continue
        except ConnectionError:
            pass
        finally:
            writer.close()
        assert time.monotonic() - started < DEADLINE + 1, (
            "the deadline counts from the start of the head, not its last byte"
        )


async def test_an_answered_connection_kept_alive_is_not_cut_while_it_streams() -> None:
    """The deadline covers the request head only: a slow answer (an event stream) is never cut by it."""
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def slow_body() -> AsyncIterator[bytes]:
        for _ in range(6):
            yield b"tick\n"
            await asyncio.sleep(0.4)

    async def stream(request: object) -> StreamingResponse:
        return StreamingResponse(slow_body(), media_type="text/plain")

    async with HealthServer(port=0, header_timeout=DEADLINE) as health:
        health.add_routes([Route("/stream", stream)])
        reader, writer = await asyncio.open_connection("127.0.0.1", health.port)
        writer.write(f"GET /stream HTTP/1.1\r\nHost: 127.0.0.1:{health.port}\r\n\r\n".encode())
        body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
        writer.close()
        assert body.count(b"tick") == 6 and body.startswith(b"HTTP/1.1 200")


SERVER = """
import asyncio, sys
from toolservice_base import configure_logging
from discovery.web.health import HealthServer

async def main():
    async with HealthServer(port=0) as health:
        print(health.port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

configure_logging("info", json=True)
asyncio.run(main())
"""


def test_eleven_hundred_half_open_sockets_against_256_file_descriptors_leave_the_probe_answered_and_the_log_short(
    tmp_path: Path,
) -> None:
    """The issue's own measure: ~1,100 such sockets took every descriptor and wrote 88 MB of tracebacks in 25 s."""
    log = tmp_path / "health.log"
    with open(log, "wb") as err:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)),
        )
    assert server.stdout is not None and server.stdin is not None
    slow: list[socket.socket] = []
    try:
        port = int(server.stdout.readline())
        slow = open_half_requests(port, 1100)
        for _ in range(3):
            status, took = ask(port, "/healthz")
            assert status == 200 and took < 1.0, f"/healthz {status} after {took:.2f}s"
    finally:
        for sock in slow:
            sock.close()
        server.stdin.close()
        server.wait(15)
    written = log.read_text()
    assert len(written) < 20_000 and "Traceback" not in written, f"{len(written)} bytes of log: {written[:2000]}"


def test_repeated_log_records_are_held_back_and_counted() -> None:
    limit = RepeatFilter(burst=5, window=0.2)
    logger = logging.getLogger("test.repeat-filter")
    records = [
        logger.makeRecord(
            logger.name, logging.ERROR, __file__, 1, "socket.accept() out of system resource\nsocket: %s", ("x",), None
        )
        for _ in range(1000)
    ]
    assert sum(limit.filter(r) for r in records) == 5
    other = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "Invalid HTTP request received.", (), None)
    assert limit.filter(other), "another message has its own count"
    time.sleep(0.25)
    later = logger.makeRecord(
        logger.name, logging.ERROR, __file__, 1, "socket.accept() out of system resource\nsocket: %s", ("x",), None
    )
    assert limit.filter(later) and "995 more like this" in later.getMessage()


def test_connections_accepted_by_the_products_listeners_send_at_once_without_waiting_for_an_ack() -> None:
    """`tcp_listener`, what the health port and the MCP front bind with: Nagle off on the listener and so on every
    connection it accepts. Without it an answer written in two parts waited for the client's delayed ACK (about 40 ms
    a call on the MCP front, `bench --only front`)."""
    import socket

    from discovery.web.hardening import tcp_listener

    listener = tcp_listener("127.0.0.1", 0)
    try:
        assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        with socket.create_connection(listener.getsockname()[:2], timeout=5):
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        listener.close()
    plain = socket.create_server(("127.0.0.1", 0))  # what the servers bound with before: Nagle on
    try:
        assert not plain.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        plain.close()
