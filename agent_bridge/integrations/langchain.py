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
        agent = create_agent(
            "openai:gpt-5-mini", middleware=[live_tools_middleware(tools)], checkpointer=InMemorySaver()
        )
        thread = {"configurable": {"thread_id": "1"}}
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
from typing import TYPE_CHECKING, Any

from ._common import SpecCache, require

require("langchain_core", "langchain", "langchain-core")  # before the imports below: one line if it is missing

from langchain_core.tools import BaseTool

from ._langchain_tools import LiveTool, live_tool, running_loop

if TYPE_CHECKING:
    from langchain.agents.middleware import AgentMiddleware

    from .. import ToolSet

__all__ = ["LiveTool", "as_langchain_tools", "live_tools_middleware"]


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
    home = loop if loop is not None else running_loop()
    return [live_tool(toolset, spec, user, home) for spec in SpecCache(toolset).current()]


def live_tools_middleware(
    toolset: ToolSet, *, user: str = "", loop: asyncio.AbstractEventLoop | None = None, top_k: int | None = None
) -> AgentMiddleware[Any, Any, Any]:
    """A `create_agent` middleware that offers the ToolSet's current tools at every model call and runs their calls.

    Pass it in `middleware=[...]`, with or without other tools; no tool of the
    ToolSet needs to be given to `create_agent`. Needs the `langchain` package.
    With `top_k=5`, each model call is offered only the five tools that best match
    the step (the model's latest `search_tools` call, or else the last human
    message; `ToolSet.search` ranks them by text, then health) and `search_tools`. An agent run synchronously
    (`invoke`) has its searches and calls run on `loop`, the ToolSet's event loop (by default the one this is
    called on).
    """
    require("langchain.agents", "langchain", "langchain")
    from ._langchain_middleware import LiveToolsMiddleware

    return LiveToolsMiddleware(toolset, user=user, loop=loop if loop is not None else running_loop(), top_k=top_k)
