"""The live `ToolSet` as OpenAI Agents SDK function tools (`pip install 'tool-discovery[openai-agents]'`).

    from agents import Agent, Runner
    from agent_bridge import ToolSet
    from agent_bridge.integrations.openai_agents import as_function_tools

    async with ToolSet(workspace="default") as tools:
        agent = Agent(name="assistant", instructions="Use the tools.")
        for question in questions:
            # The tools of the moment, for each run: a service started since is offered.
            result = await Runner.run(agent.clone(tools=as_function_tools(tools)), question)

`as_function_tools(toolset)` gives the ToolSet's current tools as
`FunctionTool`s, named as in `ToolSet.as_openai_tools()`. The list is a
snapshot of the set, so build it for each run. (It is not narrowed within a
run through `is_enabled`: the SDK fails the whole run when the model calls a
tool disabled since the turn began; a call of a tool that left instead tells
the model so, and the run goes on.) A schema
OpenAI's strict mode can take (no open objects or arrays, as for every tool
whose arguments are strings, numbers, integers and booleans) is sent strict;
any other is sent as it is, non-strict.

With `as_function_tools(tools, top_k=5)` each turn of the run is offered only
the five tools that best match it (the model's latest `search_tools` call in
this run, or else the run's last user message), ranked by `ToolSet.search`
(text, then health), and `search_tools`: every live tool is in the list, and
the others are disabled for that turn (`is_enabled`). Build it for each run,
as above: what the model searched for is kept for the run.

Calls go through `ToolSet.call` (a streamed answer arrives joined). A result
with images, audio or files reaches the model as the SDK's own tool outputs
(`ToolOutputText`, `ToolOutputImage`, `ToolOutputFileContent`); a text result
is its text. Errors
(bad arguments, a service's error, a timeout, a tool gone since) come back
to the model as the tool's output, one line saying what went wrong, as the
SDK expects of a tool that failed: the run goes on.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from toolservice_base.errors import ToolDiscoveryError

from ..specs import ToolSpec
from ._common import (
    SEARCH_PARAMETERS,
    SEARCH_TOOL,
    Binary,
    Focus,
    SpecCache,
    for_model,
    model_parts,
    require,
)

require("agents", "openai-agents", "openai-agents")  # before the imports below: one line if it is missing

from agents import FunctionTool, ToolOutputFileContent, ToolOutputImage, ToolOutputText
from agents.run_context import RunContextWrapper
from agents.tool_context import ToolContext

if TYPE_CHECKING:
    from .. import ToolSet

__all__ = ["as_function_tools", "strict_compatible"]

_SCALARS = frozenset({"string", "number", "integer", "boolean"})


def as_function_tools(toolset: ToolSet, *, user: str = "", top_k: int | None = None) -> list[FunctionTool]:
    """The ToolSet's tools now, as `FunctionTool`s; `user` is sent with every call. `top_k`: only the best `top_k`
    for each turn are enabled, and `search_tools` is added (see the module's docstring)."""
    specs = SpecCache(toolset)
    if top_k is None:
        return [_function_tool(toolset, spec, user) for spec in specs.current()]
    turns = _Turns(Focus(specs, top_k))
    return [turns.search_tool(), *(_function_tool(toolset, spec, user, turns) for spec in specs.current())]


def strict_compatible(schema: dict[str, Any]) -> bool:
    """Whether OpenAI's strict mode takes `schema` as it is: a closed object, every property required, none an open
    object or array."""
    properties = schema.get("properties")
    if (
        schema.get("type") != "object"
        or schema.get("additionalProperties") is not False
        or not isinstance(properties, dict)
    ):
        return False
    if sorted(schema.get("required", ())) != sorted(properties):
        return False
    return all(
        isinstance(p, dict) and p.get("type") in _SCALARS and set(p) <= {"type", "description"}
        for p in properties.values()
    )


class _Turns:
    """One run's top-k state: the model's latest search, and the tools chosen for a turn."""

    def __init__(self, focus: Focus) -> None:
        self.focus = focus
        self.searched: str | None = None

    def search_tool(self) -> FunctionTool:
        async def invoke(ctx: ToolContext[Any], input: str) -> str:
            try:
                query = json.loads(input).get("query") if input.strip() else None
            except (ValueError, AttributeError):
                query = None
            if isinstance(query, str):
                self.searched = query
            return await self.focus.answer(query)

        return FunctionTool(
            name=SEARCH_TOOL,
            description=self.focus.description,
            params_json_schema=SEARCH_PARAMETERS,
            on_invoke_tool=invoke,
            strict_json_schema=True,
        )

    def enabled(self, name: str) -> Any:
        async def check(ctx: RunContextWrapper[Any], agent: Any) -> bool:
            query = self.searched or _last_user_text(ctx.turn_input)
            return any(spec.openai_name == name for spec in await self.focus.offered(query))

        return check


def _last_user_text(items: list[Any]) -> str | None:
    for item in reversed(items):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return None


def _function_tool(toolset: ToolSet, spec: ToolSpec, user: str, turns: _Turns | None = None) -> FunctionTool:
    name = spec.openai_name

    async def invoke(ctx: ToolContext[Any], input: str) -> str | list[ToolOutputItem]:
        try:
            arguments = json.loads(input) if input.strip() else {}
        except ValueError:
            return f"bad-arguments: tool {name!r}: the arguments are not JSON"
        if not isinstance(arguments, dict):
            return f"bad-arguments: tool {name!r}: the arguments must be a JSON object"
        try:
            result = await toolset.call(name, arguments, user=user)
        except ToolDiscoveryError as exc:
            return for_model(name, exc)
        parts = model_parts(result)
        return result.text if parts is None else [_output(part) for part in parts]

    return FunctionTool(
        name=name,
        description=spec.description,
        params_json_schema=spec.parameters,
        on_invoke_tool=invoke,
        strict_json_schema=strict_compatible(spec.parameters),
        is_enabled=True if turns is None else turns.enabled(name),
    )


ToolOutputItem = ToolOutputText | ToolOutputImage | ToolOutputFileContent


def _output(part: str | Binary) -> ToolOutputItem:
    """A part of a result as the SDK's own tool output: text, an image, or a file (audio goes as a file: the SDK has
    no audio output), each binary as a data URL the Responses API takes inline."""
    if isinstance(part, str):
        return ToolOutputText(text=part)
    if part.kind == "image":
        return ToolOutputImage(image_url=part.data_url)
    return ToolOutputFileContent(file_data=part.data_url, filename=part.name or f"{part.kind}")
