"""Tokens of the tool definitions each framework sends its model in one step: every tool listed, or the top-k mode.

Each framework runs its own loop with its own test model for one step (pydantic-ai's `FunctionModel`, LangChain's
`create_agent` on a fake chat model, the OpenAI Agents SDK's `ScriptedModel`); the definitions the model was
given are serialised as OpenAI function definitions and counted with o200k_base (`bpe-openai`: the GPT-4o
family's tokenizer, offline). LangChain's own count (`count_tokens_approximately(tools=...)`) is given beside.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agent_bridge import ToolSet

QUESTION = "please archive the ticket PROJ-12 in jira"


def o200k(definitions: list[dict[str, Any]]) -> int:
    import bpe_openai

    return len(bpe_openai.get_encoding("o200k_base").encode(json.dumps(definitions, ensure_ascii=False)))


def function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


async def pydantic_ai(tools: ToolSet, top_k: int | None) -> list[dict[str, Any]]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agent_bridge.integrations.pydantic_ai import LiveToolset

    seen: list[dict[str, Any]] = []

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.extend(function(t.name, t.description or "", t.parameters_json_schema) for t in info.function_tools)
        return ModelResponse(parts=[TextPart("ok")])

    await Agent(FunctionModel(model), toolsets=[LiveToolset(tools, top_k=top_k)]).run(QUESTION)
    return seen


async def langchain(tools: ToolSet, top_k: int | None) -> tuple[list[dict[str, Any]], int]:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.messages.utils import count_tokens_approximately
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from agent_bridge.integrations.langchain import live_tools_middleware

    seen: list[Any] = []

    class Fake(GenericFakeChatModel):
        bound: list[Any] = []
        messages: Any = iter(())
        disable_streaming: bool = True

        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
            return self.model_copy(update={"bound": list(tools)})

        async def _agenerate(
            self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> ChatResult:
            seen.extend(self.bound)
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="ok"))])

    agent = create_agent(Fake(), middleware=[live_tools_middleware(tools, top_k=top_k)])
    await agent.ainvoke({"messages": [("user", QUESTION)]})
    return [convert_to_openai_tool(t) for t in seen], count_tokens_approximately([], tools=seen)


async def openai_agents(tools: ToolSet, top_k: int | None) -> list[dict[str, Any]]:
    from agents import Agent, FunctionTool, RunConfig, Runner
    from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message

    from agent_bridge.integrations.openai_agents import as_function_tools

    seen: list[dict[str, Any]] = []

    async def respond(call: ModelCall) -> Any:
        seen.extend(
            function(t.name, t.description, t.params_json_schema) for t in call.tools if isinstance(t, FunctionTool)
        )
        return [assistant_message("ok")]

    model = ScriptedModel([ModelStep.respond(respond)])
    agent = Agent(name="bench", tools=as_function_tools(tools, top_k=top_k), model=model)
    await Runner.run(agent, QUESTION, run_config=RunConfig(tracing_disabled=True))
    return seen


async def tokens_per_step(tools: ToolSet, top_k: int) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    listed, searched = await pydantic_ai(tools, None), await pydantic_ai(tools, top_k)
    counts["pydantic-ai (o200k)"] = {"listed": o200k(listed), "searched": o200k(searched), "tools": len(searched)}
    (listed_lc, own_listed), (searched_lc, own_searched) = await langchain(tools, None), await langchain(tools, top_k)
    counts["LangChain (o200k)"] = {"listed": o200k(listed_lc), "searched": o200k(searched_lc)}
    counts["LangChain (its own count)"] = {"listed": own_listed, "searched": own_searched}
    listed_oa, searched_oa = await openai_agents(tools, None), await openai_agents(tools, top_k)
    counts["OpenAI Agents SDK (o200k)"] = {"listed": o200k(listed_oa), "searched": o200k(searched_oa)}
    return counts
