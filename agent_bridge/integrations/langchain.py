"""The live `ToolSet` as LangChain tools (`pip install 'tool-discovery[langchain]'`).

`as_langchain_tools(toolset)` gives the ToolSet's current tools as
`StructuredTool`s: the JSON Schema the ToolSet advertises as `args_schema`,
async (`ainvoke`) and sync (`invoke`, from any thread but the ToolSet's
event loop's). Every call goes through `ToolSet.invoke`; an error (bad
arguments, a service's error, a timeout, a tool gone since) is a
`ToolException` the tool hands back to the model as an error `ToolMessage`
(`handle_tool_error=True`), so the run goes on. Inside a LangGraph run
streamed with `stream_mode="tools"`, a streaming tool's chunks arrive as
`tool-output-delta` events while it runs; the `ToolMessage` has the whole answer.

A `create_agent` agent picks up new tools at every model call, between turns
and within one, with `live_tools_middleware(toolset)` (needs `langchain`):

    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver
    from agent_bridge import ToolSet
    from agent_bridge.integrations.langchain import live_tools_middleware

    async with ToolSet(workspace="default") as tools:
        agent = create_agent("openai:gpt-5-mini", middleware=[live_tools_middleware(tools)],
        checkpointer=InMemorySaver()) thread = {"configurable": {"thread_id": "1"}}
        await agent.ainvoke({"messages": [("user", "Tell me a joke about brokers")]}, thread)
        # ... a service starts ...
        await agent.ainvoke({"messages": [("user", "Now add 2 and 2")]}, thread)   # offered its tool

The middleware gives the model the ToolSet's tools of the moment at each model
call (besides the agent's own) and runs the calls of them. A hand-built
LangGraph graph (`ToolNode`, `model.bind_tools`) takes fixed tools instead:
rebuild it per turn with `as_langchain_tools(tools)` and the same checkpointer
and thread, and the conversation goes on with the new tools.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from pydantic import Field

from toolservice_base.errors import ToolDiscoveryError

from ._common import Spec, SpecCache, for_model, require

require("langchain_core", "langchain", "langchain-core")  # before the imports below: one line if it is missing

from langchain_core.tools import BaseTool, StructuredTool, ToolException

if TYPE_CHECKING:
    from langchain.agents.middleware import AgentMiddleware

    from .. import ToolSet

__all__ = ["LiveTool", "as_langchain_tools", "live_tools_middleware"]

_EMPTY: dict[str, Any] = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}


class LiveTool(StructuredTool):
    """A `StructuredTool` that calls one tool of a `ToolSet` (through `ToolSet.invoke`) by its OpenAI-safe name.

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


def as_langchain_tools(
    toolset: ToolSet, *, user: str = "", loop: asyncio.AbstractEventLoop | None = None
) -> list[BaseTool]:
    """The ToolSet's tools now, as LangChain `StructuredTool`s (`LiveTool`), named as in `as_openai_tools()`.

    The list is a snapshot of the set; each tool calls the ToolSet by name, so
    a tool that left since answers the model with an error. Call again for the
    current set, or use `live_tools_middleware` with `create_agent`. `user`
    is sent with every call. Sync calls run on `loop`, the ToolSet's event
    loop (by default the loop this is called on).
    """
    home = loop if loop is not None else _running_loop()
    return [_live_tool(toolset, spec, user, home) for spec in SpecCache(toolset).current()]


def live_tools_middleware(
    toolset: ToolSet, *, user: str = "", loop: asyncio.AbstractEventLoop | None = None
) -> AgentMiddleware[Any, Any, Any]:
    """A `create_agent` middleware that offers the ToolSet's current tools at every model call and runs their calls.

    Pass it in `middleware=[...]`, with or without other tools; no tool of the
    ToolSet needs to be given to `create_agent`. Needs the `langchain` package.
    """
    require("langchain.agents", "langchain", "langchain")
    from ._langchain_middleware import LiveToolsMiddleware

    return LiveToolsMiddleware(toolset, user=user, loop=loop if loop is not None else _running_loop())


class CurrentTools:
    """The ToolSet's current tools as `LiveTool`s, built again only when the set changed."""

    def __init__(self, toolset: ToolSet, user: str, loop: asyncio.AbstractEventLoop | None) -> None:
        self.toolset = toolset
        self.user = user
        self.loop = loop
        self._specs = SpecCache(toolset)
        self._built_from: tuple[Spec, ...] | None = None
        self._tools: dict[str, LiveTool] = {}

    def current(self) -> dict[str, LiveTool]:
        specs = self._specs.current()
        if specs is not self._built_from:
            self._tools = {spec.name: _live_tool(self.toolset, spec, self.user, self.loop) for spec in specs}
            self._built_from = specs
        return self._tools

    def for_name(self, name: str) -> LiveTool:
        """The current tool called `name`; for a name the set no longer holds, a tool whose call tells the model so."""
        found = self.current().get(name)
        return found if found is not None else _live_tool(self.toolset, Spec(name, "", _EMPTY), self.user, self.loop)


def _live_tool(toolset: ToolSet, spec: Spec, user: str, loop: asyncio.AbstractEventLoop | None) -> LiveTool:
    name = spec.name

    async def acall(arguments: dict[str, Any]) -> str:
        try:
            writer = _tool_output_writer()
            if writer is None:
                return await toolset.invoke(name, arguments, user=user)
            parts: list[str] = []  # LangGraph streams this call's output: pass each chunk on as it comes
            async with aclosing(cast(AsyncGenerator[str, None], toolset.stream(name, arguments, user=user))) as chunks:
                async for chunk in chunks:
                    writer(chunk)
                    parts.append(chunk)
            return "".join(parts)
        except ToolDiscoveryError as exc:
            raise ToolException(for_model(name, exc)) from exc

    def call(arguments: dict[str, Any]) -> str:
        if loop is None:
            raise RuntimeError(
                f"tool {name!r} was made outside an event loop: pass loop=<the ToolSet's loop> to make it callable"
                " synchronously, or use ainvoke"
            )
        if _running_loop() is loop:
            raise RuntimeError(
                f"tool {name!r} was called synchronously on the ToolSet's own event loop, which would block it; use"
                " ainvoke"
            )
        return asyncio.run_coroutine_threadsafe(acall(arguments), loop).result()

    return LiveTool(
        name=name,
        description=spec.description,
        args_schema=spec.parameters,
        func=call,
        coroutine=acall,
        handle_tool_error=True,
        toolset=toolset,
    )


def _running_loop() -> asyncio.AbstractEventLoop | None:
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
