"""Viewers of the registry page cost the registry little, and never without bound.

Before: every heartbeat counted as a change and sent the whole snapshot (1.77 MB with 5,000 tools)
to every viewer, each encoded for each viewer; a few hundred `/events` streams that never read grew
`toolreg up` to 1-1.4 GB and `/healthz` answered 503. Now: one encoded buffer for all viewers, a
heartbeat is a small `heartbeats` event (not a change), each viewer is sent only the newest state,
at most `MAX_VIEWERS` streams (the next gets 503), and a viewer that stops reading is cut off.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import AsyncIterator

import psutil
import pytest
from support import eventually

from discovery.registry.overview import InstanceView, RegistrySnapshot, ToolView
from discovery.registry.service import Registry
from discovery.web.health import HealthServer
from discovery.web.page import MAX_VIEWERS, PageAccess, PageFeed, instance_key, page_routes
from toolservice_base import ConfigClient, Settings
from toolservice_base.examples.joke import JokeService

STALL = 1.0
"""The write timeout the page's server gets here (15 s by default)."""


class Stub:
    """An `Overview` whose next snapshot the test sets."""

    def __init__(self, snapshot: RegistrySnapshot) -> None:
        self.value = snapshot

    async def snapshot(self) -> RegistrySnapshot:
        return self.value


def snapshot(last_seen: float, tools: int = 3, at: float = 1000.0) -> RegistrySnapshot:
    return RegistrySnapshot(
        at=at,
        config_version=1,
        held=[],
        tools=[
            ToolView(
                name=f"t{n}",
                service="svc",
                workspace="default",
                source="announced",
                status="live",
                instances=1,
                description="d",
            )
            for n in range(tools)
        ],
        instances=[
            InstanceView(
                id="svc-1",
                service="svc",
                workspace="default",
                version="1",
                signer="",
                state="live",
                ttl=15,
                last_seen=last_seen,
            )
        ],
        rejections=[],
        rejected_total=0,
        conflicts=[],
    )


async def test_one_buffer_for_every_viewer_and_a_heartbeat_is_no_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("discovery.web.feed.BEATS_INTERVAL", 0.0)
    stub = Stub(snapshot(last_seen=990.0))
    feed = PageFeed(stub)  # type: ignore[arg-type]
    closing = asyncio.Event()
    await feed.refresh()
    first, second = feed.events(closing), feed.events(closing)
    assert await anext(first) == await anext(second) == b"retry: 1000\n\n"
    a, b = await anext(first), await anext(second)
    assert a is b and a is feed.frame and a.startswith(b"event: snapshot\n"), (
        "one encoded buffer, the same object for both"
    )

    stub.value = snapshot(last_seen=995.0, at=1005.0)  # only a heartbeat (and the clock) moved
    await feed.refresh()
    beat = await asyncio.wait_for(anext(first), 1)
    assert beat.startswith(b"event: heartbeats\n") and feed.snapshots == 1
    sent = json.loads(beat.split(b"data: ", 1)[1])
    assert sent == {"at": 1005.0, "last_seen": {"default/svc/svc-1": 995.0}} and len(beat) < 200

    for n in range(5):  # real changes while `second` is not reading: it is sent only the newest afterwards
        stub.value = snapshot(last_seen=996.0 + n, tools=4 + n, at=1006.0 + n)
        await feed.refresh()
    newest = await asyncio.wait_for(anext(second), 1)
    assert newest is feed.frame and len(json.loads(newest.split(b"data: ", 1)[1])["tools"]) == 8
    assert feed.snapshots == 6
    closing.set()
    assert await anext(second, None) is None


@pytest.fixture
async def page(registry: Registry) -> AsyncIterator[tuple[HealthServer, PageFeed]]:
    feed = PageFeed(registry.overview)
    async with HealthServer(port=0, write_timeout=STALL) as health:
        health.add_routes(page_routes(registry.overview, PageAccess(True, None), health.closing, feed=feed))
        yield health, feed


async def read_events(reader: asyncio.StreamReader, seconds: float) -> list[tuple[str, bytes]]:
    """The events a reading viewer gets in `seconds`: (name, data)."""
    found: list[tuple[str, bytes]] = []
    deadline = time.monotonic() + seconds
    name = ""
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = await asyncio.wait_for(reader.readline(), left)
        except TimeoutError:
            break
        if line.startswith(b"event: "):
            name = line[7:].strip().decode()
        elif line.startswith(b"data: "):
            found.append((name, line[6:].strip()))
    return found


async def test_heartbeats_of_a_live_service_go_out_as_small_events_not_snapshots(
    page: tuple[HealthServer, PageFeed], settings: Settings
) -> None:
    health, feed = page
    reader, writer = await asyncio.open_connection("127.0.0.1", health.port)
    writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{health.port}\r\n\r\n".encode())
    joke = JokeService(settings=settings, ttl=1.5)  # a heartbeat every 0.5 s
    await joke.start()
    try:
        await eventually(
            lambda: (
                feed.latest is not None
                and [t.name for t in feed.latest.tools] == ["tell-joke"]
                and all(i.last_seen for i in feed.latest.instances)
            ),
            timeout=10,
        )
        await read_events(reader, 1.0)  # what led up to it
        events = await read_events(reader, 3.0)
        names = [name for name, _ in events]
        assert "snapshot" not in names, f"a heartbeat is no change, yet snapshots were sent: {names}"
        beats = [json.loads(data) for name, data in events if name == "heartbeats"]
        key = instance_key(feed.latest.instances[0])  # type: ignore[union-attr]
        assert len(beats) >= 2 and all(key in beat["last_seen"] for beat in beats), events
        assert beats[-1]["last_seen"][key] > beats[0]["last_seen"][key]
    finally:
        writer.close()
        await joke.stop()


def stalled_viewer(port: int) -> socket.socket:
    """An `/events` stream that is never read: a tiny receive window, and nothing taken from it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock


def get(port: int, path: str) -> tuple[int, str, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        response = connection.getresponse()
        body = response.read(2000).decode(errors="replace") if response.status != 200 or path != "/events" else ""
        return response.status, body, time.monotonic() - started
    finally:
        connection.close()


class PeakMemory:
    """This process's peak resident memory above where it started, sampled every 20 ms in a thread."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.start = self.process.memory_info().rss
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.start


async def test_viewers_are_capped_and_one_that_stops_reading_is_cut_off_with_memory_bounded(
    page: tuple[HealthServer, PageFeed], config_client: ConfigClient
) -> None:
    health, feed = page
    described = "x" * 450
    for start in range(0, 2000, 500):
        await config_client.put(
            [
                (
                    "tool",
                    f"bulk.tool-{n:04d}",
                    json.dumps(
                        {
                            "type": "tool-service",
                            "name": f"bulk.tool-{n:04d}",
                            "description": described,
                            "service": "bulk",
                        }
                    ),
                )
                for n in range(start, start + 500)
            ]
        )

    async def all_listed() -> bool:
        return len((await feed.refresh()).tools) >= 2000

    await eventually(all_listed, timeout=10)
    frame = len(feed.frame)
    assert frame > 1_000_000, frame

    memory = PeakMemory()
    stalled: list[socket.socket] = []
    try:
        for _ in range(MAX_VIEWERS):
            stalled.append(await asyncio.to_thread(stalled_viewer, health.port))
        await eventually(lambda: feed.viewers == MAX_VIEWERS, timeout=5)
        for _ in range(5):
            status, body, _ = await asyncio.to_thread(get, health.port, "/events")
            assert status == 503 and body.count("\n") == 0 and f"{MAX_VIEWERS} viewers" in json.loads(body)["error"], (
                status,
                body,
            )
        status, _, took = await asyncio.to_thread(get, health.port, "/healthz")
        assert status == 200 and took < 1.0, f"/healthz {status} in {took:.2f}s"
        # Not one of them reads: each is cut off once its buffer has been full for STALL seconds, and its place freed.
        await eventually(
            lambda: feed.viewers == 0, timeout=STALL + 4, explain=lambda: f"{feed.viewers} stalled viewers still served"
        )
    finally:
        grown = memory.stop()
        for sock in stalled:
            sock.close()
    print(f"peak growth {grown / 1e6:.1f} MB with {MAX_VIEWERS} stalled viewers of a {frame / 1e6:.2f} MB snapshot")
    assert grown < MAX_VIEWERS * frame + 48_000_000, (
        f"{grown / 1e6:.0f} MB more for {MAX_VIEWERS} stalled viewers of a {frame / 1e6:.1f} MB snapshot"
    )
    status, _, _ = await asyncio.to_thread(get, health.port, "/healthz")
    assert status == 200
    reader, writer = await asyncio.open_connection("127.0.0.1", health.port)
    writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{health.port}\r\n\r\n".encode())
    try:
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 200"), "a place is free again"
    finally:
        writer.close()
