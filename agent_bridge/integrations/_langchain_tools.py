"""The LangChain tools a `ToolSet` is offered as: `LiveTool`, and the current set of them (`CurrentTools`).

Shared by `langchain` (the public face: `as_langchain_tools`,
`live_tools_middleware`) and `_langchain_middleware`, which each build on it
and not on each other. Needs `langchain-core` only.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Coroutine
from contextlib import aclosing
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import Field

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.schemas.content import ToolResult, merge

from ..specs import ToolSpec
from ._common import Binary, SpecCache, for_model, model_parts, require

require("langchain_core", "langchain", "langchain-core")  # before the imports below: one line if it is missing

from langchain_core.tools import StructuredTool, ToolException

if TYPE_CHECKING:
    from .. import ToolSet

__all__ = ["CurrentTools", "LiveTool", "live_tool", "on_loop", "running_loop"]

T = TypeVar("T")

_EMPTY: dict[str, Any] = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}


class LiveTool(StructuredTool):
    """A `StructuredTool` that calls one tool of a `ToolSet` (through `ToolSet.call`) by its OpenAI-safe name.

    The model's arguments reach the ToolSet as one dict, whatever their names
    (an argument called `config` or `callbacks` is the tool's, not LangChain's).
    """

    toolset: Any = Field(default=None, exclude=True)
    """The ToolSet this tool calls."""

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if isinstance(tool_input, str):
            try:
                tool_input = json.loads(tool_input) if tool_input.strip() else {}
            except ValueError:
                raise ToolException(f"bad-arguments: tool {self.name!r}: the arguments are not JSON") from None
        if not isinstance(tool_input, dict):
            raise ToolException(f"bad-arguments: tool {self.name!r}: the arguments must be a JSON object")
        return (dict(tool_input),), {}


class CurrentTools:
    """The ToolSet's current tools as `LiveTool`s, built again only when the set changed."""

    def __init__(self, toolset: ToolSet, user: str, loop: asyncio.AbstractEventLoop | None) -> None:
        self.toolset = toolset
        self.user = user
        self.loop = loop
        self.specs = SpecCache(toolset)
        self._built_from: tuple[ToolSpec, ...] | None = None
        self._tools: dict[str, LiveTool] = {}

    def current(self) -> dict[str, LiveTool]:
        specs = self.specs.current()
        if specs is not self._built_from:
            self._tools = {spec.openai_name: live_tool(self.toolset, spec, self.user, self.loop) for spec in specs}
            self._built_from = specs
        return self._tools

    def for_name(self, name: str) -> LiveTool:
        """The current tool called `name`; for a name the set no longer holds, a tool whose call tells the model so."""
        found = self.current().get(name)
        if found is None:
            found = live_tool(self.toolset, ToolSpec.synthetic(name, "", _EMPTY), self.user, self.loop)
        return found


def live_tool(toolset: ToolSet, spec: ToolSpec, user: str, loop: asyncio.AbstractEventLoop | None) -> LiveTool:
    name = spec.openai_name

    async def acall(arguments: dict[str, Any]) -> str | list[dict[str, Any]]:
        try:
            writer = _tool_output_writer()
            if writer is None:
                return _content(await toolset.call(name, arguments, user=user))
            parts: list[ToolResult] = []  # LangGraph streams this call's output: pass each part's text on as it comes
            async with aclosing(
                cast(AsyncGenerator[ToolResult, None], toolset.parts(name, arguments, user=user))
            ) as each:
                async for part in each:
                    writer(part.text)
                    parts.append(part)
            return _content(merge(parts))
        except ToolDiscoveryError as exc:
            raise ToolException(for_model(name, exc)) from exc

    def call(arguments: dict[str, Any]) -> str | list[dict[str, Any]]:
        return on_loop(loop, lambda: acall(arguments), f"tool {name!r}")

    return LiveTool(
        name=name,
        description=spec.description,
        args_schema=spec.parameters,
        func=call,
        coroutine=acall,
        handle_tool_error=True,
        toolset=toolset,
        metadata=_metadata(spec),
    )


def _content(result: ToolResult) -> str | list[dict[str, Any]]:
    """A result as a `ToolMessage`'s content: its text, or, with images, audio or files, LangChain's standard content
    blocks (`text`, `image`, `file`), which each chat model integration sends on as its provider takes them."""
    parts = model_parts(result)
    if parts is None:
        return result.text
    return [_block(part) for part in parts]


def _block(part: str | Binary) -> dict[str, Any]:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    kind = "image" if part.kind == "image" else "file"  # a tool message takes no audio block: it goes as a file
    block: dict[str, Any] = {"type": kind, "base64": part.data, "mime_type": part.mime_type}
    if part.name:
        block["extras"] = {"filename": part.name}
    return block


def _metadata(spec: ToolSpec) -> dict[str, Any] | None:
    """What MCP says of the tool beyond its schema (title, annotations, output schema), for a LangChain tool's
    `metadata`; None when it says nothing more."""
    said = {**(spec.mcp_metadata() or {}), **({"output_schema": spec.output_schema} if spec.output_schema else {})}
    return said or None


def on_loop(loop: asyncio.AbstractEventLoop | None, work: Callable[[], Coroutine[Any, Any, T]], what: str) -> T:
    """For LangChain's synchronous paths: run `work()` on the ToolSet's `loop` (from another thread) and wait."""
    if loop is None:
        raise RuntimeError(
            f"{what} was made outside an event loop: pass loop=<the ToolSet's loop> to make it callable"
            " synchronously, or use ainvoke"
        )
    if running_loop() is loop:
        raise RuntimeError(
            f"{what} was called synchronously on the ToolSet's own event loop, which would block it; use ainvoke"
        )
    return asyncio.run_coroutine_threadsafe(work(), loop).result()


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@cache
def _writer_var() -> Any:
    """LangGraph's per-tool-call writer of `tool-output-delta` events (what `ToolRuntime.emit_output_delta` uses), if
    LangGraph is there."""
    try:
        from langgraph.pregel._tools import _tool_call_writer
    except ImportError:
        return None
    return _tool_call_writer


def _tool_output_writer() -> Callable[[Any], None] | None:
    var = _writer_var()
    return None if var is None else cast(Callable[[Any], None] | None, var.get())
