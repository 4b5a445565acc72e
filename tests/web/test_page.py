"""The registry page over plain HTTP: escaped server-side HTML, live events, read-only routes, and who may read it.

The page in a real browser (JavaScript on) is tests/web/test_page_browser.py.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from support import eventually
from support.registry import announcement

from discovery.registry.overview import InstanceView, RegistrySnapshot, ToolView
from discovery.registry.protocol import NameConflict, Rejection
from discovery.registry.service import Registry
from discovery.web.health import HealthServer
from discovery.web.page import TOKEN_ENV, render, serve_registry_page
from toolservice_base import Settings, Transport
from toolservice_base.examples.joke import JokeService

HOSTILE = '<script>document.title="owned"</script><img src=x onerror="alert(1)">'


def call(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, read: bool = True
) -> tuple[int, dict[str, str], str]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        connection.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers or {})
        response = connection.getresponse()
        body = response.read().decode() if read else ""
        return response.status, {k.lower(): v for k, v in response.getheaders()}, body
    finally:
        connection.close()


async def acall(
    url: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    return await asyncio.to_thread(call, url, method, headers)


@pytest.fixture
async def page(registry: Registry) -> AsyncIterator[HealthServer]:
    async with HealthServer(port=0) as health:
        serve_registry_page(health, registry.overview)
        yield health


def test_the_server_rendered_page_escapes_everything_that_came_from_the_network() -> None:
    now = time.time()  # one clock reading: the bar's value is exactly 3 s, not 2.999 under load
    snapshot = RegistrySnapshot(
        at=now,
        config_version=7,
        held=["held-svc"],
        tools=[
            ToolView(
                name="t",
                service="svc",
                workspace="default",
                source="announced",
                status="live",
                instances=1,
                description=HOSTILE,
            )
        ],
        instances=[
            InstanceView(
                id="svc-1",
                service="svc",
                workspace="default",
                version="<b>1</b>",
                signer="",
                state="live",
                ttl=15,
                last_seen=now - 3,
            )
        ],
        rejections=[Rejection(at=time.time(), reason=f"not a valid announcement: {HOSTILE}")],
        rejected_total=1,
        conflicts=[NameConflict(at=time.time(), tool="t2", service="svc", held_by="static", reason=HOSTILE)],
    )
    html = render(snapshot)
    assert "<script>document" not in html and "<img src=x" not in html and "<b>1</b>" not in html
    assert (
        html.count("&lt;script&gt;document.title=&#34;owned&#34;&lt;/script&gt;") == 3
    )  # description, rejection, conflict
    assert '<b id="config-version">7</b>' in html
    assert '<div id="held" class="banner" role="alert">' in html and "held-svc" in html, (
        "the banner shows when something is held"
    )
    assert 'value="3.' in html and 'max="15"' in html, "the heartbeat bar is drawn server-side too"
    assert 'http-equiv="refresh"' not in html, "without JavaScript the page stays put: a reload wipes the search box"
    assert html.count("<script") == 1 and '<script src="page.js" defer></script>' in html, "no inline script"


async def test_the_page_lists_tools_instances_and_rejections_and_sends_security_headers(
    page: HealthServer, registry: Registry, connection: Transport, settings: Settings
) -> None:
    joke = JokeService(connection=connection, settings=settings)
    await joke.start()
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    try:
        await publisher.send(announcement("outside", namespace="elsewhere").model_dump_json(by_alias=True).encode())
        await eventually(lambda: registry.rejections() and registry.leases.get(joke.instance), timeout=10)
        await registry.settle()
        status, headers, html = await acall(f"{page.url}/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert (
            "script-src 'self'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
        )
        assert '<td class="mono">tell-joke</td><td class="mono">joke-service</td>' in html
        assert (
            f'<td class="id">{joke.instance}</td><td>1.0</td><td>unsigned</td><td class="state-live">live</td>' in html
        )
        assert "outside the allowed namespaces" in html
        status, headers, body = await acall(f"{page.url}/snapshot.json")
        snapshot = json.loads(body)
        assert [t["name"] for t in snapshot["tools"]] == ["tell-joke"] and snapshot["instances"][0][
            "ttl"
        ] == joke.lease_ttl
        assert snapshot["config_version"] >= 1 and snapshot["rejected_total"] == 1
        for asset, kind in (("page.js", "text/javascript"), ("page.css", "text/css")):
            status, headers, _ = await acall(f"{page.url}/{asset}")
            assert status == 200 and headers["content-type"].startswith(kind)
    finally:
        await connection.close_publisher(publisher)
        await joke.stop()


async def test_every_route_is_read_only(page: HealthServer) -> None:
    for path in ("/", "/events", "/snapshot.json", "/metrics", "/healthz"):
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, _, body = await acall(f"{page.url}{path}", method)
            assert status == 405 and "read-only" in json.loads(body)["error"], (method, path)


async def test_on_loopback_only_a_loopback_host_may_read_it(page: HealthServer) -> None:
    """A page on 127.0.0.1 must not be readable by another site through DNS rebinding (its name resolving to
    127.0.0.1)."""
    assert (await acall(f"{page.url}/", headers={"Host": f"localhost:{page.port}"}))[0] == 200
    status, _, body = await acall(f"{page.url}/", headers={"Host": f"attacker.example:{page.port}"})
    assert status == 403 and "loopback" in json.loads(body)["error"]
    assert (await acall(f"{page.url}/healthz", headers={"Host": "attacker.example"}))[0] == 200, "probes are unaffected"


async def test_a_host_that_merely_starts_like_a_loopback_name_is_refused(page: HealthServer) -> None:
    """DNS rebinding with a crafted name: `127.0.0.1.attacker.example` resolves wherever its owner says; it is not
    loopback."""
    port = page.port
    for host in (
        f"127.0.0.1.attacker.example:{port}",
        f"127.attacker.example:{port}",
        "127.0.0.1.nip.io",
        f"localhost.attacker.example:{port}",
        f"localhostattacker.example:{port}",
        f"[::1].attacker.example:{port}",
        f"127.0.0.1:{port}@attacker.example",
        "127.1",
        "",
    ):
        status, _, body = await acall(f"{page.url}/snapshot.json", headers={"Host": host})
        assert status == 403 and "loopback" in json.loads(body)["error"] and "tools" not in body, (
            host,
            status,
            body[:200],
        )
        assert (await acall(f"{page.url}/events", headers={"Host": host}))[0] == 403, host
    for host in (
        f"127.0.0.1:{port}",
        f"127.0.0.2:{port}",
        f"[::1]:{port}",
        f"LOCALHOST:{port}",
        "localhost",
        f"[0:0:0:0:0:0:0:1]:{port}",
    ):
        assert (await acall(f"{page.url}/snapshot.json", headers={"Host": host}))[0] == 200, host


def test_whether_a_bind_address_is_loopback_is_decided_exactly() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "127.255.0.9", "::1", "localhost"):
        assert HealthServer(host=host).loopback, host
    for host in (
        "127.attacker.example",
        "127.0.0.1.attacker.example",
        "localhost.attacker.example",
        "0.0.0.0",
        "::",
        "10.0.0.1",
        "128.0.0.1",
    ):
        assert not HealthServer(host=host).loopback, host


async def test_the_event_stream_sends_a_change_within_a_second(
    page: HealthServer, connection: Transport, settings: Settings
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", page.port)
    writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{page.port}\r\nAccept: text/event-stream\r\n\r\n".encode())
    await writer.drain()

    async def next_snapshot() -> dict[str, Any]:
        while True:
            line = await reader.readline()
            if line.startswith(b"data: {"):
                return dict(json.loads(line[6:]))

    joke = JokeService(connection=connection, settings=settings)
    try:
        first = await asyncio.wait_for(next_snapshot(), 5)
        assert first["tools"] == []
        started = time.monotonic()
        await joke.start()
        while True:
            snapshot = await asyncio.wait_for(next_snapshot(), 5)
            if [t["name"] for t in snapshot["tools"]] == ["tell-joke"]:
                break
        assert time.monotonic() - started < 1.0, "the page learns of a new tool within a second"
    finally:
        writer.close()
        await joke.stop()


async def test_off_loopback_the_page_needs_the_token_and_health_does_not(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    async with HealthServer(host="0.0.0.0", port=0) as health:
        where = serve_registry_page(health, registry.overview)
        assert where.startswith("off:") and TOKEN_ENV in where
        url = f"http://127.0.0.1:{health.port}"
        status, _, body = await acall(f"{url}/")
        assert status == 403 and TOKEN_ENV in json.loads(body)["error"]
        assert (await acall(f"{url}/healthz"))[0] == 200 and (await acall(f"{url}/metrics"))[0] == 200

    monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
    async with HealthServer(host="0.0.0.0", port=0) as health:
        assert TOKEN_ENV in serve_registry_page(health, registry.overview)
        url = f"http://127.0.0.1:{health.port}"
        for path in ("/", "/events", "/snapshot.json"):
            status, headers, _ = await acall(f"{url}{path}")
            assert status == 401 and headers["www-authenticate"].startswith("Bearer"), path
        assert (await acall(f"{url}/", headers={"Authorization": "Bearer wrong"}))[0] == 401
        assert (await acall(f"{url}/?token=wrong"))[0] == 401
        assert (await acall(f"{url}/snapshot.json", headers={"Authorization": "Bearer s3cret-token"}))[0] == 200
        status, headers, _ = await acall(f"{url}/?token=s3cret-token")
        assert status == 303 and headers["location"] == "./", "the token leaves the address bar at once"
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        status, _, html = await acall(f"{url}/", headers={"Cookie": cookie.split(";")[0]})
        assert status == 200 and "Tool registry" in html
        status, headers, _ = await asyncio.to_thread(
            call, f"{url}/events", "GET", {"Cookie": cookie.split(";")[0]}, False
        )
        assert status == 200 and headers["content-type"].startswith("text/event-stream")


async def test_without_the_store_the_page_says_so_instead_of_failing(connection: Transport) -> None:
    """Static tools and the version come from the store: with none answering, 503 and what to do, not a 500."""
    from discovery.registry.leases import LeaseTable
    from discovery.registry.overview import Overview
    from discovery.registry.validation import RejectionLog
    from toolservice_base import ConfigClient

    client = await ConfigClient(connection, timeout=0.5).start()
    overview = Overview(
        services={},
        leases=LeaseTable(),
        config=client,
        rejections=RejectionLog(),
        conflicts=list,
        key_names=dict,
        workspace_default="default",
    )
    try:
        async with HealthServer(port=0) as health:
            serve_registry_page(health, overview)
            for path in ("/", "/snapshot.json"):
                status, _, body = await acall(f"{health.url}{path}")
                assert status == 503 and "toolreg up" in json.loads(body)["error"], path
            assert (await acall(f"{health.url}/healthz"))[0] == 200
    finally:
        await client.close()
