"""What the MCP conformance suite's server scenarios ask of the tools they call (`@modelcontextprotocol/conformance`
0.1.16, `src/scenarios/server/tools.ts` and `json-schema-2020-12.ts`): names, texts, a PNG, a WAV and a schema.

Shared by the two servers the suite meets through `toolreg mcp`: a `DynamicToolService` on the bus, and an MCP
server written with the official SDK, brought onto the bus by `toolreg announce --mcp`. Standard library only:
the SDK server imports it too.
"""

from __future__ import annotations

import io
import struct
import wave
import zlib

SIMPLE_TEXT = "This is a simple text response for testing."
ERROR_TEXT = "This tool intentionally returns an error for testing"
EMBEDDED_URI = "test://embedded-resource"
EMBEDDED_TEXT = "This is an embedded resource content."
MIXED_TEXT = "Multiple content types test:"
MIXED_URI = "test://mixed-content-resource"
MIXED_JSON = '{"test":"data","value":123}'
PROGRESS_STEPS = (0, 50, 100)
PROGRESS_DELAY = 0.05

JSON_SCHEMA_TOOL = "json_schema_2020_12_tool"
JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}
NO_ARGUMENTS = {"type": "object", "properties": {}}

TOOL_DESCRIPTIONS = {
    "test_simple_text": "Returns simple text content",
    "test_image_content": "Returns a 1x1 red PNG",
    "test_audio_content": "Returns a short WAV",
    "test_embedded_resource": "Returns an embedded text resource",
    "test_multiple_content_types": "Returns text, an image and a resource",
    "test_error_handling": "Always fails",
    "test_tool_with_progress": "Reports progress three times",
    "test_reconnection": "Answers after a moment",
    JSON_SCHEMA_TOOL: "Tool with JSON Schema 2020-12 features",
}


def red_pixel_png() -> bytes:
    """A 1x1 red PNG, built here (signature, IHDR, IDAT, IEND)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1x1, 8-bit RGB
    pixels = zlib.compress(b"\x00\xff\x00\x00")  # filter 0, one red pixel
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def short_wav() -> bytes:
    """A tenth of a second of silence, 8 kHz mono 16-bit."""
    out = io.BytesIO()
    with wave.open(out, "wb") as sound:
        sound.setnchannels(1)
        sound.setsampwidth(2)
        sound.setframerate(8000)
        sound.writeframes(b"\x00\x00" * 800)
    return out.getvalue()
