"""`ToolSpec`: one tool as a model or a client is told of it, typed, and the shapes each audience reads it in.

A tool is described to four audiences: `ToolSet.describe()` (plain dicts, the bridge's own shape), OpenAI function
calling (`as_openai_tools`), MCP's `tools/list` (`as_mcp_tools`, the MCP front) and the framework adapters. Each used
to build its own dict and spell the same fields its own way (`output_schema`, `outputSchema`, `output-schema`), and the
adapters kept a twin of the spec of their own; the spec is built once per tool, the adapters read it as it is, and each
shape is a method of it, with MCP's names taken from the one table of them (`toolservice_base.schemas.tools.MCP_NAMES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from toolservice_base.schemas import ToolServiceDescriptor
from toolservice_base.schemas.tools import MCP_NAMES, definition_digest

from .build import Entry, Signature
from .impls import arguments_schema

_DIGESTS: dict[Signature, str] = {}
"""Definition digest by signature (the stored text of a tool's item and its service's): computed once per text."""
MAX_DIGESTS = 16_384


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool's definition as it is shown: `name` (its own), `openai_name` (what OpenAI accepts, which `invoke`
    takes back), `parameters` (its input schema as its service declared it, or the one derived from its flat
    arguments), `digest` (the sha256 the registry pins and `toolreg tools` shows), and what MCP says of it besides."""

    name: str
    openai_name: str
    description: str
    parameters: dict[str, Any]
    digest: str
    title: str | None = None
    annotations: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None

    @classmethod
    def synthetic(cls, name: str, description: str, parameters: dict[str, Any]) -> ToolSpec:
        """A tool no service declared, which an adapter offers the model itself: the top-k mode's `search_tools`, or a
        name the set no longer holds (calling it tells the model so). `name` is already one OpenAI accepts; there is
        no stored definition, so no digest."""
        return cls(name=name, openai_name=name, description=description, parameters=parameters, digest="")

    @classmethod
    def of(cls, name: str, openai_name: str, entry: Entry) -> ToolSpec:
        tool = entry.tool
        return cls(
            name=name,
            openai_name=openai_name,
            description=tool.description,
            parameters=arguments_schema(tool),
            digest=_digest(entry),
            title=tool.title,
            annotations=tool.annotations.to_wire() if tool.annotations is not None else None,
            output_schema=tool.output_schema,
        )

    def as_dict(self) -> dict[str, Any]:
        """`ToolSet.describe()`'s shape: `name`, `description`, `parameters`, `digest`, and `title`, `annotations`,
        `output_schema` where the tool has them."""
        found: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "digest": self.digest,
        }
        for key, value in (
            ("title", self.title),
            ("annotations", self.annotations),
            ("output_schema", self.output_schema),
        ):
            if value is not None:
                found[key] = value
        return found

    def to_openai(self) -> dict[str, Any]:
        """One entry of OpenAI's `tools`: a function under the name OpenAI accepts."""
        return {
            "type": "function",
            "function": {"name": self.openai_name, "description": self.description, "parameters": self.parameters},
        }

    def to_mcp(self, name: str | None = None) -> dict[str, Any]:
        """One tool of MCP's `tools/list`, under `name` (default: its own), in MCP's spelling."""
        shown: dict[str, Any] = {
            "name": self.name if name is None else name,
            "description": self.description,
            MCP_NAMES["input-schema"]: self.parameters,
        }
        for wire, value in (
            ("title", self.title),
            ("annotations", self.annotations),
            ("output-schema", self.output_schema),
        ):
            if value is not None:
                shown[MCP_NAMES[wire]] = value
        return shown

    def mcp_metadata(self) -> dict[str, Any] | None:
        """`title` and `annotations`, those it has, as a framework's free-form tool metadata; None if neither."""
        found = {key: value for key, value in (("title", self.title), ("annotations", self.annotations)) if value}
        return found or None


@lru_cache(maxsize=1024)
def _service(text: str) -> ToolServiceDescriptor | None:
    try:
        return ToolServiceDescriptor.model_validate_json(text)
    except ValueError:
        return None


def _digest(entry: Entry) -> str:
    """A built tool's definition digest (`definition_digest`), as `toolreg tools` shows and the registry pins it."""
    digest = _DIGESTS.get(entry.signature)
    if digest is None:
        digest = definition_digest(entry.tool, _service(entry.signature[1]) if entry.signature[1] is not None else None)
        if len(_DIGESTS) >= MAX_DIGESTS:
            _DIGESTS.clear()
        _DIGESTS[entry.signature] = digest
    return digest
