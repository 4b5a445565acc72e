"""The registry page shows what a tool says of itself beyond its description: its title, and MCP's annotations in a
few words (what a client would ask about before calling it), server-rendered and in the live snapshot alike."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import eventually
from test_page import acall

from discovery.registry.overview import hints
from discovery.registry.service import Registry
from discovery.web.health import HealthServer
from discovery.web.page import serve_registry_page
from toolservice_base import DynamicToolService, Settings


class Files(DynamicToolService):
    descriptor = {"id": "files"}
    tools = [
        {
            "name": "delete-file",
            "title": "Delete a file",
            "description": "Deletes a file for good",
            "annotations": {"destructiveHint": True, "openWorldHint": False},
            "input-schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
        {"name": "read-file", "description": "Reads a file", "annotations": {"readOnlyHint": True}},
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return "ok"


def test_hints_say_what_a_client_would_ask_about() -> None:
    assert hints({"readOnlyHint": True}) == "read-only, open world"
    assert hints({"destructiveHint": False, "idempotentHint": True, "openWorldHint": False}) == (
        "not destructive, idempotent, closed world"
    )
    assert hints({}) == "" and hints(None) == "" and hints({"readOnlyHint": "yes please"}) == ""


@pytest.fixture
async def page(registry: Registry) -> AsyncIterator[HealthServer]:
    async with HealthServer(port=0) as health:
        serve_registry_page(health, registry.overview)
        yield health


async def test_the_page_shows_titles_and_hints(page: HealthServer, registry: Registry, settings: Settings) -> None:
    async with Files(settings=settings) as files:
        await eventually(lambda: registry.leases.get(files.instance), timeout=10)
        await registry.settle()
        _, _, html = await acall(f"{page.url}/")
        assert '<td class="hints">destructive, closed world</td>' in html
        assert '<td class="description">Delete a file: Deletes a file for good</td>' in html
        assert '<td class="hints">read-only, open world</td>' in html
        _, _, body = await acall(f"{page.url}/snapshot.json")
        tools = {t["name"]: t for t in json.loads(body)["tools"]}
        assert tools["delete-file"]["title"] == "Delete a file" and tools["read-file"]["title"] is None
