"""The live `ToolSet` as a pydantic-ai toolset (`pip install 'tool-discovery[pydantic-ai]'`).

    from pydantic_ai import Agent
    from agent_bridge import ToolSet
    from agent_bridge.integrations.pydantic_ai import LiveToolset

    async with ToolSet(workspace="default") as tools:
        agent = Agent("openai:gpt-5-mini", toolsets=[LiveToolset(tools)])
        result = await agent.run("Tell me a joke about brokers")

The agent asks the toolset for its tools at every step of every run, and
`LiveToolset` answers with the ToolSet's current ones: a service that starts
is offered from the next step on, one that stops is not offered any more. No
restart, no rebuilt agent.

Calls go through `ToolSet.invoke` (a streamed answer arrives joined). Errors
go back to the model, never out of the run:

- arguments that break the tool's schema (`BadArguments`) and a tool that
  left the set since the step began (`UnknownToolError`) raise `ModelRetry`:
  the model is asked to correct its call, within the tool's `max_retries`;
- a service's error, a timeout and any other `ToolDiscoveryError` raise
  `ToolFailed`: the model sees the failure and adapts, no retry budget spent.

Tool names are the OpenAI-safe ones of `ToolSet.as_openai_tools()`
(`acme.search` is offered as `acme_search`); `.prefixed("live")` and the
other pydantic-ai wrappers apply as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._common import Spec, SpecCache, for_model, is_retry, require

require("pydantic_ai", "pydantic-ai", "pydantic-ai-slim")  # before the imports below: one line if it is missing

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ModelRetry, ToolFailed
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_core import SchemaValidator, core_schema

from toolservice_base.errors import ToolDiscoveryError

if TYPE_CHECKING:
    from .. import ToolSet

__all__ = ["LiveToolset"]

_ARGUMENTS = SchemaValidator(core_schema.dict_schema(keys_schema=core_schema.str_schema()))
"""A JSON object, nothing more: the tool's own schema is checked by `ToolSet.invoke`, which says what is wrong."""

User = str | Callable[[RunContext[Any]], str]


class LiveToolset(AbstractToolset[Any]):
    """A pydantic-ai toolset whose tools are the `ToolSet`'s current ones at every step of every run.

    `toolset` is a started `ToolSet`; its lifetime is yours (entering this
    toolset neither starts nor closes it). `user` is sent with every call,
    for multi-tenant services: a string, or a function of the run context
    (`user=lambda ctx: ctx.deps.user_id`). `max_retries` is each tool's retry
    budget for calls the model must correct. `id` names the toolset among an
    agent's toolsets (durable execution needs one).
    """

    def __init__(self, toolset: ToolSet, *, user: User = "", max_retries: int = 1, id: str | None = None) -> None:
        self.toolset = toolset
        self.user = user
        self.max_retries = max_retries
        self._id = id
        self._specs = SpecCache(toolset)
        self._built_from: tuple[Spec, ...] | None = None
        self._tools: dict[str, ToolsetTool[Any]] = {}

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        specs = self._specs.current()
        if specs is not self._built_from:  # the set changed since the last step: build the definitions again
            self._tools = {
                spec.name: ToolsetTool(
                    toolset=self,
                    tool_def=ToolDefinition(
                        name=spec.name,
                        description=spec.description,
                        parameters_json_schema=spec.parameters,
                        metadata=spec.mcp_metadata(),
                        return_schema=spec.output_schema,
                    ),
                    max_retries=self.max_retries,
                    args_validator=_ARGUMENTS,
                )
                for spec in specs
            }
            self._built_from = specs
        return dict(self._tools)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> str:
        user = self.user if isinstance(self.user, str) else self.user(ctx)
        try:
            return await self.toolset.invoke(name, tool_args, user=user)
        except ToolDiscoveryError as exc:
            message = for_model(name, exc)
            if is_retry(exc):
                raise ModelRetry(message) from exc
            raise ToolFailed(message) from exc
