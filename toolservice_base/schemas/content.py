"""What a tool returns besides text (DESIGN section 3): MCP content blocks and structured content.

A response may carry `content`, a list of MCP content blocks (text, image,
audio, an embedded resource, a resource link), and `structured`, the result as
a JSON object (per the tool's `output-schema`), beside `response`, which keeps
a text rendering for callers that read only it (a TrustGraph agent, an older
bridge). The blocks are spelled exactly as MCP spells them (`mimeType`,
`resource_link`, `_meta`), so a `CallToolResult` from an MCP server fills a
`ToolResult` as it is (`ToolResult.from_mcp`) and an MCP client gets the same
blocks back. Binary data travels as base64, as in MCP, and is checked to be
base64 where it is read.

A block keeps the fields it does not know (a newer MCP revision's), so what an
MCP server said reaches an MCP client unchanged.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator


class _Block(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _base64(value: str) -> str:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be base64 (RFC 4648, with padding)") from None
    return value


class TextContent(_Block):
    type: Literal["text"] = "text"
    text: str


class ImageContent(_Block):
    """An image, `data` base64-encoded; `ImageContent.of(png_bytes, "image/png")` encodes it."""

    type: Literal["image"] = "image"
    data: str
    mime_type: str = Field(alias="mimeType", max_length=255)

    _check = field_validator("data")(_base64)

    @classmethod
    def of(cls, data: bytes, mime_type: str) -> ImageContent:
        return cls.model_validate({"data": base64.b64encode(data).decode("ascii"), "mimeType": mime_type})

    @property
    def bytes(self) -> bytes:
        return base64.b64decode(self.data)


class AudioContent(_Block):
    """Audio, `data` base64-encoded; `AudioContent.of(wav_bytes, "audio/wav")` encodes it."""

    type: Literal["audio"] = "audio"
    data: str
    mime_type: str = Field(alias="mimeType", max_length=255)

    _check = field_validator("data")(_base64)

    @classmethod
    def of(cls, data: bytes, mime_type: str) -> AudioContent:
        return cls.model_validate({"data": base64.b64encode(data).decode("ascii"), "mimeType": mime_type})

    @property
    def bytes(self) -> bytes:
        return base64.b64decode(self.data)


class ResourceContents(_Block):
    """The contents of a resource: `text`, or `blob` (base64), never both."""

    uri: str = Field(min_length=1, max_length=4096)
    mime_type: str | None = Field(default=None, alias="mimeType", max_length=255)
    text: str | None = None
    blob: str | None = None

    @field_validator("blob")
    @classmethod
    def _blob(cls, value: str | None) -> str | None:
        return None if value is None else _base64(value)

    @model_validator(mode="after")
    def _one_of(self) -> ResourceContents:
        if (self.text is None) == (self.blob is None):
            raise ValueError("a resource has either 'text' or 'blob'")
        return self


class EmbeddedResource(_Block):
    type: Literal["resource"] = "resource"
    resource: ResourceContents


class ResourceLink(_Block):
    """A pointer to a resource the caller may read itself."""

    type: Literal["resource_link"] = "resource_link"
    uri: str = Field(min_length=1, max_length=4096)
    name: str = Field(max_length=1024)
    title: str | None = Field(default=None, max_length=1024)
    description: str | None = None
    mime_type: str | None = Field(default=None, alias="mimeType", max_length=255)
    size: int | None = Field(default=None, ge=0)


ContentBlock = Annotated[
    TextContent | ImageContent | AudioContent | EmbeddedResource | ResourceLink, Field(discriminator="type")
]
_BLOCKS: TypeAdapter[list[ContentBlock]] = TypeAdapter(list[ContentBlock])
BLOCK_TYPES = (TextContent, ImageContent, AudioContent, EmbeddedResource, ResourceLink)


def is_rich(value: Any) -> bool:
    """Whether an `invoke` returned a rich result: a ToolResult, a content block, or a non-empty list of blocks."""
    if isinstance(value, ToolResult | _Block):
        return True
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(item, BLOCK_TYPES) for item in value)


def _decoded_size(data: str) -> int:
    """Bytes that base64 `data` holds, without decoding it."""
    return len(data) * 3 // 4 - (data[-2:].count("=") if data else 0)


def render(block: ContentBlock) -> str:
    """A block as text, for a caller that reads only `response`: the text itself, or a line saying what it is."""
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent | AudioContent):
        return f"[{block.type}: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if isinstance(block, EmbeddedResource):
        contents = block.resource
        if contents.text is not None:
            return contents.text
        return (
            f"[resource {contents.uri}: {contents.mime_type or 'binary'}, {_decoded_size(contents.blob or '')} bytes]"
        )
    return f"[resource link {block.uri}: {block.name}]"


def block_size(block: ContentBlock) -> int:
    """About what a block weighs on the wire (its text, data or blob): what the caller's answer limit counts."""
    if isinstance(block, TextContent):
        return len(block.text)
    if isinstance(block, ImageContent | AudioContent):
        return len(block.data)
    if isinstance(block, EmbeddedResource):
        return len(block.resource.text or "") + len(block.resource.blob or "")
    return len(block.uri) + len(block.name)


class ToolResult(BaseModel):
    """What one call (or one part of a streamed call) returned: content blocks, and structured content.

    A service's `invoke` may return one (or a single block, or a list of
    blocks); a `ToolSet` caller gets one from `ToolSet.call`. `text` is the
    rendering a text-only caller reads: the text blocks as they are, other
    blocks as a line saying what they are, or the structured content as JSON
    when there are no blocks.
    """

    model_config = ConfigDict(frozen=True)

    content: tuple[ContentBlock, ...] = ()
    structured: dict[str, Any] | None = None

    @classmethod
    def of(cls, value: Any) -> ToolResult:
        """A result from what an `invoke` returned: a ToolResult, a block, or a list of blocks."""
        if isinstance(value, ToolResult):
            return value
        if isinstance(value, _Block):
            return cls(content=(value,))  # type: ignore[arg-type]
        return cls(content=tuple(value))

    @classmethod
    def from_mcp(cls, result: Mapping[str, Any]) -> ToolResult:
        """From an MCP `CallToolResult` as JSON (`result.model_dump(by_alias=True, mode="json")`): its `content`
        and `structuredContent`. Raises ValueError for a block that is not valid."""
        structured = result.get("structuredContent")
        return cls(content=tuple(parse_blocks(result.get("content") or [])), structured=structured)

    @property
    def text(self) -> str:
        if self.content:
            return (
                "\n".join(render(block) for block in self.content) if len(self.content) > 1 else render(self.content[0])
            )
        return "" if self.structured is None else json.dumps(self.structured)

    @property
    def size(self) -> int:
        return sum(block_size(b) for b in self.content) + (
            len(json.dumps(self.structured)) if self.structured is not None else 0
        )

    def to_mcp(self) -> dict[str, Any]:
        """`content` and (when there is some) `structuredContent`, as an MCP `CallToolResult` carries them."""
        body: dict[str, Any] = {"content": [block.to_wire() for block in self.content]}
        if self.structured is not None:
            body["structuredContent"] = self.structured
        return body


def parse_blocks(raw: Iterable[Any]) -> list[ContentBlock]:
    """Content blocks from JSON; ValueError naming the first that is not one."""
    from pydantic import ValidationError

    from .base import describe_validation_error

    try:
        return _BLOCKS.validate_python(list(raw))
    except ValidationError as exc:
        raise ValueError(f"content: {describe_validation_error(exc)}") from None


def merge(parts: Sequence[ToolResult]) -> ToolResult:
    """The parts of a streamed answer as one result: their blocks in order (adjacent text joined, as a text-only
    caller joins the chunks), the last structured content."""
    blocks: list[ContentBlock] = []
    structured: dict[str, Any] | None = None
    for part in parts:
        for block in part.content:
            last = blocks[-1] if blocks else None
            if isinstance(block, TextContent) and isinstance(last, TextContent) and _plain(block) and _plain(last):
                blocks[-1] = TextContent(text=last.text + block.text)
            else:
                blocks.append(block)
        if part.structured is not None:
            structured = part.structured
    return ToolResult(content=tuple(blocks), structured=structured)


def _plain(block: TextContent) -> bool:
    return not (block.model_extra or {})
