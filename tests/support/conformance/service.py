"""The tools the MCP conformance suite calls, served by a `DynamicToolService` on the bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from support.conformance.data import (
    EMBEDDED_TEXT,
    EMBEDDED_URI,
    ERROR_TEXT,
    JSON_SCHEMA_2020_12,
    JSON_SCHEMA_TOOL,
    MIXED_JSON,
    MIXED_TEXT,
    MIXED_URI,
    NO_ARGUMENTS,
    PROGRESS_DELAY,
    PROGRESS_STEPS,
    SIMPLE_TEXT,
    TOOL_DESCRIPTIONS,
    red_pixel_png,
    short_wav,
)
from toolservice_base import DynamicToolService
from toolservice_base.schemas import (
    AudioContent,
    EmbeddedResource,
    ImageContent,
    ResourceContents,
    TextContent,
    ToolResult,
)


def _schema(name: str) -> dict[str, Any]:
    return JSON_SCHEMA_2020_12 if name == JSON_SCHEMA_TOOL else NO_ARGUMENTS


class ConformanceService(DynamicToolService):
    """One service, every tool of the suite's tools scenarios; rich results as content blocks."""

    descriptor = {"id": "conformance"}
    tools = [
        {"name": name, "description": description, "input-schema": _schema(name)}
        for name, description in TOOL_DESCRIPTIONS.items()
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = "") -> Any:
        if tool == "test_tool_with_progress":
            return self._progress()
        if tool == "test_error_handling":
            raise RuntimeError(ERROR_TEXT)
        if tool == "test_image_content":
            return ImageContent.of(red_pixel_png(), "image/png")
        if tool == "test_audio_content":
            return AudioContent.of(short_wav(), "audio/wav")
        if tool == "test_embedded_resource":
            return EmbeddedResource(
                resource=ResourceContents(uri=EMBEDDED_URI, mime_type="text/plain", text=EMBEDDED_TEXT)
            )
        if tool == "test_multiple_content_types":
            return ToolResult(
                content=(
                    TextContent(text=MIXED_TEXT),
                    ImageContent.of(red_pixel_png(), "image/png"),
                    EmbeddedResource(
                        resource=ResourceContents(uri=MIXED_URI, mime_type="application/json", text=MIXED_JSON)
                    ),
                )
            )
        if tool == "test_reconnection":
            await asyncio.sleep(0.2)
            return "Reconnection test completed"
        if tool == JSON_SCHEMA_TOOL:
            return f"Hello, {arguments.get('name', 'nobody')}"
        return SIMPLE_TEXT

    async def _progress(self) -> AsyncIterator[str]:
        """Streamed: each chunk reaches an MCP client as a progress notification."""
        for step in PROGRESS_STEPS:
            yield f"{step}/100\n"
            await asyncio.sleep(PROGRESS_DELAY)
