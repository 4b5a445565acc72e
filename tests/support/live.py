"""Helpers for the agent-framework tests: a slow service and services that announce themselves."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from agent_bridge import ToolSet
from toolservice_base import DynamicToolService, Settings
from toolservice_base.schemas import EmbeddedResource, ImageContent, ResourceContents, TextContent

CALL_TIMEOUT = 1.0
"""The ToolSet's bound on one call: `acme.nap` sleeps past it."""


class NapService(DynamicToolService):
    """A tool that takes its time (it outlasts `CALL_TIMEOUT`); its dotted name is offered as `acme_nap`."""

    descriptor = {"id": "napper"}
    tools = [
        {
            "name": "acme.nap",
            "description": "Sleep for a while, then say so",
            "arguments": [{"name": "seconds", "type": "number", "description": "How long to sleep"}],
        }
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        await asyncio.sleep(float(arguments["seconds"]))
        return "rested"


class Services:
    """Start and stop announcing services; each start or stop returns once the ToolSet has followed it."""

    def __init__(self, settings: Settings, toolset: ToolSet) -> None:
        self.settings = settings
        self.toolset = toolset
        self.running: dict[str, DynamicToolService] = {}

    async def start(self, cls: type[DynamicToolService]) -> None:
        service = cls(settings=self.settings)
        await service.start()
        self.running[service.id] = service
        names = [t.name for t in service.tool_descriptors]
        await self.toolset.wait_for(lambda t: all(n in t for n in names), timeout=10)

    async def stop(self, service_id: str) -> None:
        service = self.running.pop(service_id)
        names = [t.name for t in service.tool_descriptors]
        await service.stop()
        await self.toolset.wait_for(lambda t: not any(n in t for n in names), timeout=10)

    async def close(self) -> None:
        for service in self.running.values():
            await service.stop()
        self.running.clear()


SWATCH = b"\x89PNG\r\n\x1a\n" + bytes(range(63))
"""The bytes of the swatch's image (71 of them): what a model must be handed, not a line saying they exist."""
REPORT = b"%PDF-1.4 swatch report"


class SwatchService(DynamicToolService):
    """A tool whose result is text, an image and a file: what each framework must carry to its model as its own
    kind of content."""

    descriptor = {"id": "swatches"}
    tools = [
        {
            "name": "swatch",
            "description": "A colour swatch as an image, with its report",
            "arguments": [{"name": "rgb", "type": "string", "description": "r,g,b"}],
        }
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        return [
            TextContent(text=f"swatch {arguments['rgb']}"),
            ImageContent.of(SWATCH, "image/png"),
            EmbeddedResource(
                resource=ResourceContents(
                    uri="file:///swatches/report.pdf",
                    mime_type="application/pdf",
                    blob=base64.b64encode(REPORT).decode(),
                )
            ),
        ]
