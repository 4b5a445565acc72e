"""What a tool says and returns beyond text, through a real broker: declared schemas (a dict, a pydantic model, type
hints), arguments checked at the agent and again at the service with the path of the first violation, content
blocks and structured content reaching `ToolSet.call` as typed values and text callers as a rendering, and the
bounds (a structured result that breaks its own output schema, a 20 MB image the broker cannot carry)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from agent_bridge import BadArguments, ToolError, ToolServiceClient, ToolSet
from discovery.registry.service import Registry
from toolservice_base import DynamicToolService, Settings, Transport
from toolservice_base.errors import ServiceDefinitionError
from toolservice_base.schemas import (
    AudioContent,
    EmbeddedResource,
    ImageContent,
    ResourceContents,
    ResourceLink,
    TextContent,
    ToolResult,
)

pytestmark = pytest.mark.brokers

PIXELS = bytes(range(256)) * 4096  # 1 MiB, every byte value


class Address(BaseModel):
    street: str
    city: str = Field(description="City name")


class Person(BaseModel):
    name: str = Field(description="Full name")
    age: int = Field(ge=0, le=150)
    address: Address | None = None


class Scaled(TypedDict):
    width: int
    height: int


def resize(width: int, height: int = 100) -> None:
    """Its parameters (and their type hints) are the tool's arguments."""


class GalleryService(DynamicToolService):
    descriptor = {"id": "gallery"}
    tools = [
        {"name": "register", "description": "Register a person", "input-schema": Person},
        {"name": "resize", "description": "Resize", "input-schema": resize, "output-schema": Scaled},
        {
            "name": "picture",
            "description": "A picture, a sound, a resource and a link",
            "input-schema": {"type": "object"},
        },
        {"name": "broken", "description": "Breaks its own output schema", "output-schema": Scaled},
        {"name": "huge", "description": "A 20 MB image"},
        {"name": "chunks", "description": "Text, then an image, streamed"},
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = "") -> Any:
        if tool == "register":
            return f"registered {arguments['name']}"
        if tool == "resize":
            return {"width": arguments["width"], "height": arguments.get("height", 100)}
        if tool == "picture":
            return [
                ImageContent.of(PIXELS, "image/png"),
                AudioContent.of(b"RIFF....WAVE", "audio/wav"),
                EmbeddedResource(
                    resource=ResourceContents(uri="file:///a.bin", mime_type="application/octet-stream", blob="AAEC")
                ),
                ResourceLink(uri="https://example.org/report.pdf", name="report", mime_type="application/pdf"),
            ]
        if tool == "broken":
            return {"width": "wide", "height": 1}
        if tool == "huge":
            return ImageContent.of(b"\0" * (20 * 1024 * 1024), "image/png")
        return self._chunks()

    async def _chunks(self) -> Any:
        yield "first "
        yield "second"
        yield ToolResult(content=(ImageContent.of(b"png", "image/png"),))


@pytest.fixture
async def gallery(settings: Settings, registry: Registry, connection: Transport, tmp_path: Path) -> Any:
    async with (
        GalleryService(settings=settings),
        ToolSet(settings=settings, connection=connection, data_dir=tmp_path) as tools,
    ):
        await tools.wait_for(lambda t: len(t) == 6, timeout=15)
        yield tools


async def test_declared_schemas_reach_the_agent_as_declared(gallery: ToolSet) -> None:
    specs = {spec["name"]: spec for spec in gallery.describe()}
    assert specs["register"]["parameters"] == Person.model_json_schema()
    assert specs["register"]["parameters"]["$defs"]["Address"]["required"] == ["street", "city"]
    assert specs["resize"]["parameters"]["required"] == ["width"]
    assert specs["resize"]["output_schema"]["properties"]["height"] == {"title": "Height", "type": "integer"}
    mcp = {tool["name"]: tool for tool in gallery.as_mcp_tools()}
    assert mcp["resize"]["outputSchema"] == specs["resize"]["output_schema"] and "outputSchema" not in mcp["huge"]


async def test_arguments_are_checked_before_they_leave_the_agent_naming_the_path_of_the_first_violation(
    gallery: ToolSet,
) -> None:
    with pytest.raises(BadArguments, match=r"arguments at \$\.address\.city: 5 is not of type 'string'"):
        await gallery.invoke("register", {"name": "Ada", "age": 36, "address": {"street": "x", "city": 5}})
    with pytest.raises(BadArguments, match=r"arguments at \$: 'age' is a required property"):
        await gallery.invoke("register", {"name": "Ada"})
    assert await gallery.invoke("register", {"name": "Ada", "age": 36}) == "registered Ada"


async def test_the_service_checks_again_what_a_caller_sends_unchecked(
    settings: Settings, connection: Transport
) -> None:
    async with GalleryService(settings=settings, announce=False) as service:
        client = await ToolServiceClient(connection, service.service_descriptor).start()
        try:
            with pytest.raises(ToolError, match=r"bad-arguments: tool 'register': arguments at \$\.age: -1 is less"):
                await client.call("", {}, {"name": "Ada", "age": -1}, tool="register")
        finally:
            await client.close()


async def test_content_blocks_reach_the_caller_as_typed_values_and_text_callers_as_a_rendering(
    gallery: ToolSet,
) -> None:
    result = await gallery.call("picture")
    image, audio, resource, link = result.content
    assert isinstance(image, ImageContent) and image.bytes == PIXELS and image.mime_type == "image/png"
    assert isinstance(audio, AudioContent) and audio.bytes == b"RIFF....WAVE"
    assert isinstance(resource, EmbeddedResource) and resource.resource.blob == "AAEC"
    assert isinstance(link, ResourceLink) and link.name == "report"
    text = await gallery.invoke("picture")
    assert text.splitlines() == [
        f"[image: image/png, {len(PIXELS)} bytes]",
        "[audio: audio/wav, 12 bytes]",
        "[resource file:///a.bin: application/octet-stream, 3 bytes]",
        "[resource link https://example.org/report.pdf: report]",
    ]


async def test_structured_content_is_checked_against_the_output_schema(gallery: ToolSet) -> None:
    result = await gallery.call("resize", {"width": 640})
    assert result.structured == {"width": 640, "height": 100}
    assert json.loads(result.text) == result.structured, "with its JSON as a text block, as MCP recommends"
    with pytest.raises(ToolError, match=r"bad-result: .*does not match its output-schema at \$\.width"):
        await gallery.call("broken")


async def test_a_stream_of_text_and_an_image_merges_into_one_result(gallery: ToolSet) -> None:
    parts = [part async for part in gallery.parts("chunks")]
    assert len(parts) == 3
    result = await gallery.call("chunks")
    assert result.content[0] == TextContent(text="first second") and isinstance(result.content[1], ImageContent)


async def test_a_20_mb_image_is_refused_at_once_by_its_size_and_the_service_goes_on(gallery: ToolSet) -> None:
    started = time.monotonic()
    with pytest.raises(ToolError, match="answer-too-large"):
        await gallery.call("huge")
    assert time.monotonic() - started < 10, "told at once, not at the call's timeout"
    assert await gallery.invoke("register", {"name": "Ada", "age": 36}) == "registered Ada"


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (
            {
                "type": "object",
                "properties": {f"p{i}": {"type": "string", "description": "x" * 1000} for i in range(1100)},
            },
            "bytes of JSON; the limit is 32768",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.org/schema.json"}}}, "outside itself"),
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "is not a valid JSON Schema at properties/a/type"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "which it does not define"),
        ({"type": "array"}, '"type": "object"'),
        ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}, "is not one this accepts"),
    ],
)
def test_a_schema_past_a_limit_or_invalid_is_refused_in_one_line_when_declared(
    schema: dict[str, Any], says: str
) -> None:
    class Bad(DynamicToolService):
        descriptor = {"id": "bad"}
        tools = [{"name": "bad", "description": "bad", "input-schema": schema}]

    with pytest.raises(ServiceDefinitionError) as refused:
        Bad(announce=False)
    assert says in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_a_schema_nested_200_deep_is_refused_in_one_line_when_declared() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}}

    class Deep(DynamicToolService):
        descriptor = {"id": "deep"}
        tools = [{"name": "deep", "description": "deep", "input-schema": deep}]

    with pytest.raises(ServiceDefinitionError, match="nested more than 32 levels deep"):
        Deep(announce=False)
