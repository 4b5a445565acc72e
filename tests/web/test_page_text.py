"""The registry page shows what a stranger wrote in a tool's title or description with its control characters and
bidi controls as visible escapes (round five, row 8): in the server-rendered HTML, in `/snapshot.json` and in the
event stream the page's script draws from, which it puts in as text."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import eventually
from support.store import registry_lists

from discovery.registry.overview import RegistrySnapshot, ToolView
from discovery.registry.service import Registry
from discovery.web.feed import snapshot_json
from discovery.web.health import HealthServer
from discovery.web.page import render, serve_registry_page
from toolservice_base import ConfigClient
from toolservice_base.schemas import ToolDescriptor, ToolServiceDescriptor

DESCRIPTION = "Weather forecast\x1b[2J for a city\x00, \u202eevil\u202c \x9b31m\x7f\u2066done\u2069"
TITLE = "Forecast\x1b]0;pwned\x07"
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What the page must never show raw: C0 controls but tab and newline, DEL, C1 controls, bidi controls."""


def strings(value: Any) -> list[str]:
    """Every string of decoded JSON, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in [key, *strings(item)]]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return []


def raw_controls(data: Any) -> list[str]:
    return sorted({hex(ord(c)) for text in strings(data) for c in UNSAFE.findall(text)})


def test_the_rendered_page_shows_control_and_bidi_characters_as_escapes() -> None:
    tool = ToolView(
        name="weather", service="w", workspace="default", source="static", status="configured", instances=0,
        description=DESCRIPTION, title=TITLE,
    )  # fmt: skip
    empty: dict[str, Any] = {"held": [], "instances": [], "rejections": [], "rejected_total": 0, "conflicts": []}
    html = render(RegistrySnapshot(at=time.time(), config_version=1, tools=[tool], **empty))
    assert not UNSAFE.search(html), sorted({hex(ord(c)) for c in UNSAFE.findall(html)})
    assert "Weather forecast\\u001b[2J for a city\\u0000, \\u202eevil\\u202c \\u009b31m\\u007f" in html


@pytest.mark.parametrize("char", ["\x1b", "\x00", "\r", "\b", "\x0c", "\x7f", "\x9b", "\u202e", "\u2066", "\u061c"])
@pytest.mark.parametrize("rest", ["plain ASCII", "déjà vu — it’s 天気", 'a "quoted" C:\\path\nnext line'])
def test_the_feed_s_json_shows_every_control_and_bidi_character(char: str, rest: str) -> None:
    """Whatever else the snapshot holds (only ASCII, other scripts, JSON's own escapes), one such character in one
    description is enough for the JSON to carry it escaped."""
    tools = [
        ToolView(name=f"t{i}", service="s", workspace="default", source="static", status="configured", instances=0,
                 description=rest + (char if i == 3 else ""))
        for i in range(5)
    ]  # fmt: skip
    empty: dict[str, Any] = {"held": [], "instances": [], "rejections": [], "rejected_total": 0, "conflicts": []}
    data = json.loads(snapshot_json(RegistrySnapshot(at=time.time(), config_version=1, tools=tools, **empty)))
    assert raw_controls(data) == [] and data["tools"][3]["description"] == rest + f"\\u{ord(char):04x}"
    assert data["tools"][0]["description"] == rest


@pytest.fixture
async def page(registry: Registry) -> AsyncIterator[HealthServer]:
    async with HealthServer(port=0) as health:
        serve_registry_page(health, registry.overview)
        yield health


async def test_the_page_and_its_feed_never_carry_a_raw_control_character(
    page: HealthServer, registry: Registry, config_client: ConfigClient
) -> None:
    service = ToolServiceDescriptor.model_validate(
        {
            "id": "weather-service",
            "request-queue": "non-persistent://tg/request/weather-service",
            "response-queue": "non-persistent://tg/response/weather-service",
        }
    )
    tool = ToolDescriptor(name="weather", title=TITLE, description=DESCRIPTION, service=service.id)
    await config_client.put([("tool-service", service.id, service.to_json()), ("tool", tool.name, tool.to_json())])
    await eventually(lambda: registry_lists(registry, "weather"), timeout=10)
    html = await asyncio.to_thread(_get, page.port, "/")
    assert not UNSAFE.search(html) and "\\u202eevil" in html
    snapshot = json.loads(await asyncio.to_thread(_get, page.port, "/snapshot.json"))
    assert raw_controls(snapshot) == []
    [shown] = [t for t in snapshot["tools"] if t["name"] == "weather"]
    assert (
        "forecast\\u001b[2J for a city\\u0000" in shown["description"]
        and shown["title"] == "Forecast\\u001b]0;pwned\\u0007"
    )
    frame = await _first_snapshot_event(page.port)
    assert raw_controls(frame) == [] and any("\\u202eevil" in t["description"] for t in frame["tools"])


def _get(port: int, path: str) -> str:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        return connection.getresponse().read().decode()
    finally:
        connection.close()


async def _first_snapshot_event(port: int) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
        await writer.drain()
        while True:
            line = await asyncio.wait_for(reader.readline(), 10)
            if line.startswith(b"data: {"):
                frame: dict[str, Any] = json.loads(line[6:])
                if any(t["name"] == "weather" for t in frame.get("tools", [])):
                    return frame
    finally:
        writer.close()
