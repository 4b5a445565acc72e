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
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.types import Command

from ._langchain_tools import CurrentTools, LiveTool

if TYPE_CHECKING:
    from .. import ToolSet

ModelResult = ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]


class LiveToolsMiddleware(AgentMiddleware[Any, Any, Any]):
    """Offers the ToolSet's current tools at every model call, and runs the model's calls of them."""

    def __init__(self, toolset: ToolSet, *, user: str = "", loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__()
        self.toolset = toolset
        self._tools = CurrentTools(toolset, user, loop)
        self._offered: set[str] = set()

    def _offer(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        current = self._tools.current()
        self._offered.update(current)
        others = [t for t in request.tools if not self._ours(t)]
        return request.override(tools=[*others, *current.values()])

    def _route(self, request: ToolCallRequest) -> ToolCallRequest:
        name = request.tool_call["name"]
        if request.tool is None and name not in self._offered:
            return request  # not a tool of ours: the ToolNode (or another middleware) answers
        if request.tool is not None and not self._ours(request.tool):
            return request
        return request.override(tool=self._tools.for_name(name))

    def _ours(self, tool: Any) -> bool:
        return isinstance(tool, LiveTool) and tool.toolset is self.toolset

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResult:
        return handler(self._offer(request))

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]
    ) -> ModelResult:
        return await handler(self._offer(request))

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        return handler(self._route(request))

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
    ) -> ToolMessage | Command[Any]:
        return await handler(self._route(request))
