"""What a tool says beyond the spec reaches each agent framework where it has a place: the full input schema as the
tool's parameters everywhere; title and annotations as the tool's metadata (pydantic-ai, LangChain), and the output
schema as pydantic-ai's `return_schema`. OpenAI's Agents SDK has no place for them but the parameters."""

from __future__ import annotations

from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.models.test import TestModel
from pydantic_ai.usage import RunUsage

from agent_bridge import ToolSet
from agent_bridge.integrations.langchain import as_langchain_tools
from agent_bridge.integrations.openai_agents import as_function_tools
from agent_bridge.integrations.pydantic_ai import LiveToolset
from toolservice_base import DynamicToolService, Settings

SCHEMA = {
    "type": "object",
    "$defs": {"unit": {"enum": ["c", "f"]}},
    "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
    "required": ["city"],
}
OUTPUT = {"type": "object", "properties": {"temp": {"type": "number"}}, "required": ["temp"]}


class WeatherService(DynamicToolService):
    descriptor = {"id": "weather"}
    tools = [
        {
            "name": "weather",
            "title": "Weather now",
            "description": "The weather in a city",
            "annotations": {"readOnlyHint": True},
            "input-schema": SCHEMA,
            "output-schema": OUTPUT,
        }
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
        return {"temp": 21.5}


async def test_each_framework_gets_the_schemas_and_hints_where_it_has_a_place(
    settings: Settings, live_toolset: ToolSet
) -> None:
    async with WeatherService(settings=settings):
        await live_toolset.wait_for(lambda t: "weather" in t, timeout=10)
        metadata = {"title": "Weather now", "annotations": {"readOnlyHint": True}}

        toolset = LiveToolset(live_toolset)
        context = RunContext(deps=None, model=TestModel(), usage=RunUsage())
        definition = (await toolset.get_tools(context))["weather"].tool_def
        assert definition.parameters_json_schema == SCHEMA and definition.return_schema == OUTPUT
        assert definition.metadata == metadata

        (langchain,) = as_langchain_tools(live_toolset)
        assert langchain.metadata == {**metadata, "output_schema": OUTPUT}
        assert langchain.tool_call_schema == SCHEMA or langchain.args_schema == SCHEMA
        assert await langchain.ainvoke({"city": "Oslo"}) == '{"temp": 21.5}'

        (function,) = as_function_tools(live_toolset)
        assert function.params_json_schema == SCHEMA and function.strict_json_schema is False
