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

Calls go through `ToolSet.invoke` (a streamed answer arrives joined). Errors
(bad arguments, a service's error, a timeout, a tool gone since) come back
to the model as the tool's output, one line saying what went wrong, as the
SDK expects of a tool that failed: the run goes on.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from toolservice_base.errors import ToolDiscoveryError

from ._common import Spec, SpecCache, for_model, require

require("agents", "openai-agents", "openai-agents")  # before the imports below: one line if it is missing

from agents import FunctionTool
from agents.tool_context import ToolContext

if TYPE_CHECKING:
    from .. import ToolSet

__all__ = ["as_function_tools", "strict_compatible"]

_SCALARS = frozenset({"string", "number", "integer", "boolean"})


def as_function_tools(toolset: ToolSet, *, user: str = "") -> list[FunctionTool]:
    """The ToolSet's tools now, as `FunctionTool`s; `user` is sent with every call."""
    return [_function_tool(toolset, spec, user) for spec in SpecCache(toolset).current()]


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


def _function_tool(toolset: ToolSet, spec: Spec, user: str) -> FunctionTool:
    name = spec.name

    async def invoke(ctx: ToolContext[Any], input: str) -> str:
        try:
            arguments = json.loads(input) if input.strip() else {}
        except ValueError:
            return f"bad-arguments: tool {name!r}: the arguments are not JSON"
        if not isinstance(arguments, dict):
            return f"bad-arguments: tool {name!r}: the arguments must be a JSON object"
        try:
            return await toolset.invoke(name, arguments, user=user)
        except ToolDiscoveryError as exc:
            return for_model(name, exc)

    return FunctionTool(
        name=name,
        description=spec.description,
        params_json_schema=spec.parameters,
        on_invoke_tool=invoke,
        strict_json_schema=strict_compatible(spec.parameters),
    )
