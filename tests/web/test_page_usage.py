"""The tools table's CALLS/S, ERRORS/S and P95: what the services' own counters say, carried by their heartbeats.

A real service on pulsar-lite, called through a real `ToolSet`, some calls
failing: within two heartbeats the registry's snapshot, its JSON and its HTML
show a positive rate, the errors and a p95, and, once the calls stop, 0/s
and no p95. A sender of an older release (no `tool-stats` property) keeps its
lease and shows `-`. Heartbeats that only move these figures are no change
to the page: they go out in the small `heartbeats` event.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import eventually
from support.registry import descriptors

from agent_bridge import ToolError, ToolSet
from discovery.registry.overview import InstanceView, RegistrySnapshot, ToolView
from discovery.registry.service import Registry
from discovery.registry.usage import ToolUsage
from discovery.web.health import HealthServer
from discovery.web.page import PageFeed, serve_registry_page
from toolservice_base import Settings, Transport
from toolservice_base.announcer import Announcer
from toolservice_base.examples.calculator import CalculatorService

TTL = 1.5
"""A heartbeat every 0.5 s."""


@pytest.fixture
async def page(registry: Registry) -> AsyncIterator[HealthServer]:
    async with HealthServer(port=0) as health:
        serve_registry_page(health, registry.overview)
        yield health


def get(port: int, path: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        response = connection.getresponse()
        assert response.status == 200, response.status
        return response.read().decode()
    finally:
        connection.close()


async def row_figures(port: int, tool: str) -> tuple[str, str, str]:
    """The CALLS/S, ERRORS/S and P95 cells of `tool`'s row in the server-rendered page."""
    html = await asyncio.to_thread(get, port, "/")
    found = re.search(rf'<tr data-tool="default/{re.escape(tool)}">(.*?)</tr>', html, re.S)
    assert found is not None, f"no row for {tool}"
    row = found.group(1)
    cells = [re.search(rf'<td class="num {name}">([^<]*)</td>', row) for name in ("calls", "errors", "p95")]
    assert all(cells), row
    calls, errors, p95 = (cell.group(1) for cell in cells if cell is not None)
    return calls, errors, p95


async def json_usage(port: int, tool: str) -> dict[str, Any] | None:
    snapshot = json.loads(await asyncio.to_thread(get, port, "/snapshot.json"))
    usage: dict[str, Any] | None = next(t["usage"] for t in snapshot["tools"] if t["name"] == tool)
    return usage


async def usage_of(registry: Registry, tool: str) -> ToolUsage | None | bool:
    """The tool's figures in a fresh snapshot; False while the tool is not listed yet."""
    for view in (await registry.overview.snapshot()).tools:
        if view.name == tool:
            return view.usage
    return False


async def test_calls_errors_and_p95_of_a_real_service_reach_the_page_within_two_heartbeats(
    page: HealthServer, registry: Registry, connection: Transport, settings: Settings
) -> None:
    calculator = CalculatorService(connection=connection, settings=settings, ttl=TTL)
    made = {"ok": 0, "failed": 0}
    stop = asyncio.Event()

    async def keep_calling(tools: ToolSet) -> None:
        while not stop.is_set():
            if (made["ok"] + made["failed"]) % 4 == 3:
                with pytest.raises(ToolError, match="division by zero"):
                    await tools.invoke("calculate", {"expression": "1 / 0"})
                made["failed"] += 1
            else:
                assert await tools.invoke("calculate", {"expression": "6 * 7"}) == "42"
                made["ok"] += 1
            await asyncio.sleep(0.01)

    await calculator.start()
    try:
        async with ToolSet(connection=connection, settings=settings) as tools:
            await eventually(lambda: "calculate" in tools.names(), timeout=10)
            caller = asyncio.create_task(keep_calling(tools))
            try:
                usage = await eventually(
                    lambda: busy(registry), timeout=4 * TTL
                )  # two heartbeats 0.5 s apart, calls between
                assert usage.calls_per_s is not None and usage.errors_per_s is not None and usage.p95_ms is not None
                assert usage.calls_per_s > usage.errors_per_s > 0 and 0 < usage.p95_ms < 1000
                calls, errors, p95 = await row_figures(page.port, "calculate")
                assert float(calls) > float(errors) > 0 and re.fullmatch(r"\d+(\.\d+)? ms", p95), (calls, errors, p95)
                shown = await json_usage(page.port, "calculate")
                assert shown is not None and shown["calls_per_s"] > shown["errors_per_s"] > 0 and shown["p95_ms"] > 0
            finally:
                stop.set()
                await caller

        # Every call counted, as the next heartbeat says; then, with no calls, 0/s and no p95.
        lease = registry.leases.get(calculator.instance)
        assert lease is not None

        def counted() -> tuple[int, int] | None:
            latest = lease.calls.latest if lease.calls is not None else None
            return (latest.tools["calculate"][0], latest.tools["calculate"][1]) if latest is not None else None

        await eventually(
            lambda: counted() == (made["ok"] + made["failed"], made["failed"]),
            timeout=4 * TTL,
            explain=lambda: f"the registry heard {counted()}, the tool set made {made}",
        )
        idle = ToolUsage(calls_per_s=0.0, errors_per_s=0.0, p95_ms=None)
        await eventually(lambda: _is(registry, "calculate", idle), timeout=4 * TTL)
        assert await row_figures(page.port, "calculate") == ("0", "0", "-")
    finally:
        await calculator.stop()


async def busy(registry: Registry) -> ToolUsage | None:
    """The tool's figures once a rate, errors and a p95 are all known."""
    usage = await usage_of(registry, "calculate")
    if isinstance(usage, ToolUsage) and usage.calls_per_s and usage.errors_per_s and usage.p95_ms is not None:
        return usage
    return None


async def _is(registry: Registry, tool: str, expected: ToolUsage) -> bool:
    return await usage_of(registry, tool) == expected


async def test_a_service_of_an_older_release_keeps_its_lease_and_shows_dashes(
    page: HealthServer, registry: Registry, connection: Transport
) -> None:
    """Its heartbeats carry no `tool-stats` property (as `toolreg announce`'s do not either)."""
    service, tools = descriptors("legacy", ("old-tool",))
    async with Announcer(connection, service, tools, ttl=TTL) as announcer:
        await eventually(lambda: registry.leases.get(announcer.instance), timeout=5)
        await eventually(lambda: _heartbeats_heard(registry, announcer.instance) >= 2, timeout=4 * TTL)
        renewed = registry.leases.get(announcer.instance)
        assert renewed is not None and renewed.state == "live" and renewed.calls is None, (
            "renewed by heartbeats, no figures"
        )
        assert await eventually(lambda: _listed(registry, "old-tool"), timeout=5)
        assert await usage_of(registry, "old-tool") is None
        assert await row_figures(page.port, "old-tool") == ("-", "-", "-")
        assert await json_usage(page.port, "old-tool") is None


def _heartbeats_heard(registry: Registry, instance: str) -> int:
    """Messages the registry accepted from `instance` after its announce (sequence 1)."""
    lease = registry.leases.get(instance)
    return lease.sequence - 1 if lease is not None else 0


async def _listed(registry: Registry, tool: str) -> bool:
    return any(view.name == tool for view in (await registry.overview.snapshot()).tools)


def snapshot(at: float, last_seen: float, usage: ToolUsage | None) -> RegistrySnapshot:
    return RegistrySnapshot(
        at=at,
        config_version=1,
        held=[],
        rejections=[],
        rejected_total=0,
        conflicts=[],
        tools=[
            ToolView(
                name="calculate",
                service="calc",
                workspace="default",
                source="announced",
                status="live",
                instances=1,
                description="d",
                usage=usage,
            ),
            ToolView(
                name="static-one",
                service=None,
                workspace="default",
                source="static",
                status="configured",
                instances=0,
                description="d",
            ),
        ],
        instances=[
            InstanceView(
                id="calc-1",
                service="calc",
                workspace="default",
                version="1",
                signer="",
                state="live",
                ttl=15,
                last_seen=last_seen,
            )
        ],
    )


class Stub:
    def __init__(self, value: RegistrySnapshot) -> None:
        self.value = value

    async def snapshot(self) -> RegistrySnapshot:
        return self.value


async def test_figures_moved_by_heartbeats_go_out_in_the_small_heartbeats_event_not_as_a_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("discovery.web.feed.BEATS_INTERVAL", 0.0)
    stub = Stub(snapshot(1000.0, 999.0, None))
    feed = PageFeed(stub)
    await feed.refresh()
    assert feed.snapshots == 1
    stub.value = snapshot(1001.0, 1000.5, ToolUsage(calls_per_s=12.5, errors_per_s=0.5, p95_ms=3.25))
    await feed.refresh()
    assert feed.snapshots == 1 and feed.beats_sent == 1, "a heartbeat moving the figures is no change to the tables"
    sent = json.loads(feed.beats.split(b"data: ", 1)[1])
    assert sent["usage"] == {"default/calculate": [12.5, 0.5, 3.25]}, "known figures only, by workspace/tool"
    stub.value = snapshot(1002.0, 1001.5, ToolUsage(calls_per_s=0.0, errors_per_s=0.0))
    await feed.refresh()
    assert json.loads(feed.beats.split(b"data: ", 1)[1])["usage"] == {"default/calculate": [0.0, 0.0, None]}
    stub.value = snapshot(1003.0, 1001.5, None)  # figures no longer known, nothing else moved
    await feed.refresh()
    assert feed.beats_sent == 3 and "usage" not in json.loads(feed.beats.split(b"data: ", 1)[1]), (
        "not listed: not known"
    )
    assert feed.snapshots == 1
