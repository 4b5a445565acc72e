"""`LiveToolsMiddleware`: a `create_agent` agent's tools follow the ToolSet (imported only with the `langchain`
package)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import (
    AgentMiddleware,
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    ToolCallRequest,
)
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.types import Command

from ..specs import ToolSpec
from ._common import SEARCH_PARAMETERS, SEARCH_TOOL, Focus
from ._langchain_tools import CurrentTools, LiveTool, on_loop

if TYPE_CHECKING:
    from .. import ToolSet

ModelResult = ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]


class LiveToolsMiddleware(AgentMiddleware[Any, Any, Any]):
    """Offers the ToolSet's current tools at every model call, and runs the model's calls of them."""

    def __init__(
        self,
        toolset: ToolSet,
        *,
        user: str = "",
        loop: asyncio.AbstractEventLoop | None = None,
        top_k: int | None = None,
    ) -> None:
        super().__init__()
        self.toolset = toolset
        self._tools = CurrentTools(toolset, user, loop)
        self._offered: set[str] = set()
        self._focus = Focus(self._tools.specs, top_k) if top_k is not None else None
        self._search = self._search_tool() if self._focus is not None else None

    def _search_tool(self) -> LiveTool:
        focus = self._focus
        assert focus is not None

        async def search(arguments: dict[str, Any]) -> str:
            return await focus.answer(arguments.get("query"))

        def search_sync(arguments: dict[str, Any]) -> str:
            return on_loop(self._tools.loop, lambda: focus.answer(arguments.get("query")), SEARCH_TOOL)

        return LiveTool(
            name=SEARCH_TOOL,
            description=focus.description,
            args_schema=SEARCH_PARAMETERS,
            func=search_sync,
            coroutine=search,
            toolset=self.toolset,
        )

    async def _focused(self, request: ModelRequest[Any]) -> list[ToolSpec]:
        """The top-k mode's choice for this model call (nothing without it)."""
        return [] if self._focus is None else await self._focus.offered(_step_query(request.messages))

    def _offer(self, request: ModelRequest[Any], focused: list[ToolSpec]) -> ModelRequest[Any]:
        current = self._tools.current()
        self._offered.update(current)
        others = [t for t in request.tools if not self._ours(t)]
        if self._focus is None or self._search is None:
            return request.override(tools=[*others, *current.values()])
        self._offered.add(SEARCH_TOOL)
        return request.override(
            tools=[*others, self._search, *(current[s.openai_name] for s in focused if s.openai_name in current)]
        )

    def _route(self, request: ToolCallRequest) -> ToolCallRequest:
        name = request.tool_call["name"]
        if request.tool is None and name not in self._offered:
            return request  # not a tool of ours: the ToolNode (or another middleware) answers
        if request.tool is not None and not self._ours(request.tool):
            return request
        if name == SEARCH_TOOL and self._search is not None:
            return request.override(tool=self._search)
        return request.override(tool=self._tools.for_name(name))

    def _ours(self, tool: Any) -> bool:
        return isinstance(tool, LiveTool) and tool.toolset is self.toolset

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResult:
        focused = [] if self._focus is None else on_loop(self._tools.loop, lambda: self._focused(request), SEARCH_TOOL)
        return handler(self._offer(request, focused))

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]
    ) -> ModelResult:
        return await handler(self._offer(request, await self._focused(request)))

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        return handler(self._route(request))

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
    ) -> ToolMessage | Command[Any]:
        return await handler(self._route(request))


def _step_query(messages: list[AnyMessage]) -> str | None:
    """The model's latest `search_tools` query, or the last human message's text, whichever came last."""
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            for call in reversed(message.tool_calls):
                query = call["args"].get("query")
                if call["name"] == SEARCH_TOOL and isinstance(query, str):
                    return query
        if isinstance(message, HumanMessage):
            return message.text
    return None
