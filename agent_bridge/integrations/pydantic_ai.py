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

Calls go through `ToolSet.call` (a streamed answer arrives joined). A result
with images, audio or files reaches the model as text and `BinaryContent`
parts in the tool's return, where pydantic-ai carries them natively; a text
result is its text. Errors go back to the model, never out of the run:

- arguments that break the tool's schema (`BadArguments`) and a tool that
  left the set since the step began (`UnknownToolError`) raise `ModelRetry`:
  the model is asked to correct its call, within the tool's `max_retries`;
- a service's error, a timeout and any other `ToolDiscoveryError` raise
  `ToolFailed`: the model sees the failure and adapts, no retry budget spent.

With `top_k=5`, each step offers the model only the five tools that best match the step (its own latest
`search_tools` call, or else the last user prompt), ranked by `ToolSet.search` (text, then health), and
`search_tools` to look for others: a fleet of thousands costs a handful of definitions per step.

Tool names are the OpenAI-safe ones of `ToolSet.as_openai_tools()`
(`acme.search` is offered as `acme_search`); `.prefixed("live")` and the
other pydantic-ai wrappers apply as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..specs import ToolSpec
from ._common import (
    SEARCH_PARAMETERS,
    SEARCH_TOOL,
    Binary,
    Focus,
    SpecCache,
    for_model,
    is_retry,
    model_parts,
    require,
)

require("pydantic_ai", "pydantic-ai", "pydantic-ai-slim")  # before the imports below: one line if it is missing

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ModelRetry, ToolFailed
from pydantic_ai.messages import BinaryContent, ModelMessage, ModelRequest, ModelResponse, ToolCallPart, UserPromptPart
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
    agent's toolsets (durable execution needs one). `top_k`: offer only the best
    `top_k` tools for each step, and `search_tools` (see the module's docstring).
    """

    def __init__(
        self,
        toolset: ToolSet,
        *,
        user: User = "",
        max_retries: int = 1,
        id: str | None = None,
        top_k: int | None = None,
    ) -> None:
        self.toolset = toolset
        self.user = user
        self.max_retries = max_retries
        self._id = id
        self._specs = SpecCache(toolset)
        self._focus = Focus(self._specs, top_k) if top_k is not None else None
        self._built_from: tuple[ToolSpec, ...] | None = None
        self._tools: dict[str, ToolsetTool[Any]] = {}

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        specs = self._specs.current()
        if specs is not self._built_from:  # the set changed since the last step: build the definitions again
            self._tools = {spec.openai_name: self._tool(spec) for spec in specs}
            self._built_from = specs
        if self._focus is None:
            return dict(self._tools)
        offered = await self._focus.offered(_step_query(ctx.messages))
        search = self._tool(ToolSpec.synthetic(SEARCH_TOOL, self._focus.description, SEARCH_PARAMETERS))
        return {SEARCH_TOOL: search, **{spec.openai_name: self._tools[spec.openai_name] for spec in offered}}

    def _tool(self, spec: ToolSpec) -> ToolsetTool[Any]:
        return ToolsetTool(
            toolset=self,
            tool_def=ToolDefinition(
                name=spec.openai_name,
                description=spec.description,
                parameters_json_schema=spec.parameters,
                metadata=spec.mcp_metadata(),
                return_schema=spec.output_schema,
            ),
            max_retries=self.max_retries,
            args_validator=_ARGUMENTS,
        )

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> str | list[str | BinaryContent]:
        if self._focus is not None and name == SEARCH_TOOL:
            return await self._focus.answer(tool_args.get("query"))
        user = self.user if isinstance(self.user, str) else self.user(ctx)
        try:
            result = await self.toolset.call(name, tool_args, user=user)
        except ToolDiscoveryError as exc:
            message = for_model(name, exc)
            if is_retry(exc):
                raise ModelRetry(message) from exc
            raise ToolFailed(message) from exc
        parts = model_parts(result)
        if parts is None:
            return result.text
        return [_binary(part) if isinstance(part, Binary) else part for part in parts]


def _binary(part: Binary) -> BinaryContent:
    """A binary block as pydantic-ai carries one in a tool's return: natively, to a model that takes it there."""
    return BinaryContent(data=part.bytes, media_type=part.mime_type, identifier=part.name)


def _step_query(messages: list[ModelMessage]) -> str | None:
    """The model's latest `search_tools` query, or the last user prompt's text, whichever came last."""
    for message in reversed(messages):
        for part in reversed(message.parts):
            if isinstance(message, ModelResponse) and isinstance(part, ToolCallPart) and part.tool_name == SEARCH_TOOL:
                query = part.args_as_dict().get("query")
                if isinstance(query, str):
                    return query
            if isinstance(message, ModelRequest) and isinstance(part, UserPromptPart):
                content = part.content
                return content if isinstance(content, str) else " ".join(c for c in content if isinstance(c, str))
    return None
