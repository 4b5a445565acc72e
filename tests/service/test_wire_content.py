"""The wire forms of what MCP says of a tool and what it returns (no broker): filled from the MCP SDK's own
`Tool` and `CallToolResult` as they are, given back unchanged (the same bytes after canonical JSON), and refused
in one line when they are not what they claim."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import pytest
from pydantic import ValidationError

from toolservice_base.schemas import (
    ImageContent,
    ToolDescriptor,
    ToolResult,
    ToolServiceResponse,
    canonical_json,
    validate_config_item,
)
from toolservice_base.schemas.content import parse_blocks

SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "definitions": {"unit": {"enum": ["c", "f"]}},
    "properties": {
        "city": {"type": "string", "minLength": 1, "description": "City"},
        "unit": {"$ref": "#/definitions/unit"},
        "when": {"type": ["string", "null"], "format": "date"},
        "ratio": {"type": "number", "multipleOf": 0.25},
    },
    "required": ["city"],
}


def mcp_tool() -> types.Tool:
    return types.Tool(
        name="weather",
        title="Weather",
        description="The weather",
        input_schema=SCHEMA,
        output_schema={"type": "object", "properties": {"temp": {"type": "number"}}},
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=True),
    )


def test_an_mcp_tool_fills_a_descriptor_that_gives_it_back_byte_for_byte() -> None:
    tool = mcp_tool()
    listed = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
    descriptor = ToolDescriptor.from_mcp(listed, service="weather-svc")
    wire = json.loads(descriptor.to_json())
    assert canonical_json(wire["input-schema"]) == canonical_json(listed["inputSchema"])
    assert wire["annotations"] == {"readOnlyHint": True, "openWorldHint": True} and wire["title"] == "Weather"
    assert [a["name"] for a in wire["arguments"]] == ["city", "ratio", "unit", "when"]
    assert [a["type"] for a in wire["arguments"]] == ["string", "number", "string", "string"]
    stored = validate_config_item("tool", "weather", descriptor.to_json())  # what an agent reads from the store
    assert isinstance(stored, ToolDescriptor) and stored.to_json() == descriptor.to_json()
    assert types.Tool(name="weather", description="x", input_schema=stored.parameters).input_schema == SCHEMA


def test_flat_arguments_that_contradict_the_schema_are_refused() -> None:
    listed = mcp_tool().model_dump(by_alias=True, mode="json", exclude_none=True)
    forged = {
        **ToolDescriptor.from_mcp(listed, service="s").to_wire(),
        "arguments": [{"name": "city", "type": "integer", "description": "City"}],
    }
    with pytest.raises(ValidationError, match="arguments do not match input-schema"):
        ToolDescriptor.model_validate(forged)


def test_a_call_tool_result_round_trips_through_a_response() -> None:
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="hi", annotations=types.Annotations(audience=["user"])),
            types.ImageContent(type="image", data="AAEC", mime_type="image/png"),
            types.ResourceLink(type="resource_link", uri="file:///x", name="x", size=3),
        ],
        structured_content={"temp": 21.5},
    )
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    ours = ToolResult.from_mcp(dumped)
    response = ToolServiceResponse.model_validate_json(ToolServiceResponse.of_result(ours).model_dump_json())
    back = response.result().to_mcp()
    assert back["content"] == dumped["content"], "unknown fields (annotations) pass unchanged"
    assert back["structuredContent"] == {"temp": 21.5}
    assert response.response == "hi\n[image: image/png, 3 bytes]\n[resource link file:///x: x]"


def test_a_text_answer_is_the_bytes_it_always_was() -> None:
    assert ToolServiceResponse(response="42").model_dump_json(exclude_none=True) == (
        '{"response":"42","end_of_stream":true}'
    )


@pytest.mark.parametrize(
    ("blocks", "says"),
    [
        ([{"type": "image", "data": "not base64!", "mimeType": "image/png"}], "base64"),
        ([{"type": "resource", "resource": {"uri": "x:y", "text": "a", "blob": "AA=="}}], "either 'text' or 'blob'"),
        ([{"type": "video", "data": "AA=="}], "does not match any of the expected tags"),
        ([{"type": "image", "data": "AA=="}], "mimeType"),
    ],
)
def test_a_block_that_is_not_one_is_refused_in_one_line(blocks: list[dict[str, Any]], says: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_blocks(blocks)
    assert says in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_image_helpers_encode_and_decode() -> None:
    image = ImageContent.of(b"\x89PNG", "image/png")
    assert (
        image.to_wire() == {"type": "image", "data": "iVBORw==", "mimeType": "image/png"} and image.bytes == b"\x89PNG"
    )
