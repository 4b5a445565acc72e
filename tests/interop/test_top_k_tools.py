"""The adapters' top-k mode, in each framework's own agent loop with its own test model: a thousand live tools
behind, and each step offered `search_tools` and the five that best match the last user message or the model's own
search."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from support.corpus import corpus_items
from support.live import Services

from agent_bridge import ToolSet
from toolservice_base import ConfigClient
from toolservice_base.examples.calculator import CalculatorService

ASK = "please evaluate the arithmetic expression 6 * 7"
SEARCH = "archive a ticket in jira"


@pytest.fixture
async def fleet(config_client: ConfigClient, live_toolset: ToolSet, live_services: Services) -> AsyncIterator[None]:
    await config_client.put(corpus_items())
    await live_toolset.wait_for(lambda t: len(t) >= 1000, timeout=20)
    await live_services.start(CalculatorService)
    yield


def check(offered: list[list[str]], told: list[str]) -> None:
    """What every framework's model must have seen in the two runs: (1) asked to calculate, offered the calculator
    among five, called it; (2) searched, and offered what it searched for at the next step."""
    first, after_call, before_search, after_search = offered
    assert first[:2] == ["search_tools", "calculate"] and len(first) <= 6
    assert after_call == first  # the same query: the same tools
    assert "calculate" not in after_search and "jira_ticket_archive" in after_search and len(after_search) == 6
    assert told[0] == "42"
    assert told[1].startswith("Offered at your next step:\n- jira_ticket_archive: Archive a ticket in Jira")


async def test_pydantic_ai_offers_the_top_five_and_search_tools(live_toolset: ToolSet, fleet: None) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from agent_bridge.integrations.pydantic_ai import LiveToolset

    offered: list[list[str]] = []
    told: list[str] = []
    plan: list[ModelResponse] = []

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.append([t.name for t in info.function_tools])
        told.extend(str(p.content) for p in messages[-1].parts if isinstance(p, ToolReturnPart))
        return plan.pop(0)

    agent = Agent(FunctionModel(model), toolsets=[LiveToolset(live_toolset, top_k=5)])
    plan[:] = [
        ModelResponse(parts=[ToolCallPart("calculate", {"expression": "6 * 7"})]),
        ModelResponse([TextPart("ok")]),
    ]
    await agent.run(ASK)
    plan[:] = [ModelResponse(parts=[ToolCallPart("search_tools", {"query": SEARCH})]), ModelResponse([TextPart("ok")])]
    await agent.run("hello")
    check([sorted_after_first(o) for o in offered], told)


def sorted_after_first(names: Sequence[str]) -> list[str]:
    """search_tools first, then the offered tools (in rank order, but where the SDK keeps its own)."""
    rest = [n for n in names if n != "search_tools"]
    return ["search_tools", *rest] if "search_tools" in names else list(names)


@pytest.mark.parametrize("run", ["ainvoke", "invoke"])
async def test_langchain_middleware_offers_the_top_five_and_search_tools(
    live_toolset: ToolSet, fleet: None, run: str
) -> None:
    """`invoke` runs the agent synchronously, in another thread: its searches and calls run on the ToolSet's loop."""
    from langchain.agents import create_agent
    from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from agent_bridge.integrations.langchain import live_tools_middleware

    offered: list[list[str]] = []
    told: list[str] = []
    plan: list[AIMessage] = []
    ids = itertools.count(1)

    def call(tool: str, **arguments: Any) -> AIMessage:
        return AIMessage(
            content="", tool_calls=[{"name": tool, "args": arguments, "id": f"c{next(ids)}", "type": "tool_call"}]
        )

    class Scripted(GenericFakeChatModel):
        bound: list[str] = []
        messages: Any = iter(())
        disable_streaming: bool = True

        def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
            return self.model_copy(update={"bound": [convert_to_openai_tool(t)["function"]["name"] for t in tools]})

        def _generate(
            self,
            messages: list[BaseMessage],
            stop: Any = None,
            run_manager: CallbackManagerForLLMRun | None = None,
            **kwargs: Any,
        ) -> ChatResult:
            offered.append(self.bound)
            told.extend(str(m.content) for m in messages[-1:] if isinstance(m, ToolMessage))
            return ChatResult(generations=[ChatGeneration(message=plan.pop(0))])

        async def _agenerate(
            self,
            messages: list[BaseMessage],
            stop: Any = None,
            run_manager: AsyncCallbackManagerForLLMRun | None = None,
            **kwargs: Any,
        ) -> ChatResult:
            return self._generate(messages, stop, **kwargs)

    agent = create_agent(Scripted(), middleware=[live_tools_middleware(live_toolset, top_k=5)])

    async def ask(text: str) -> None:
        question = {"messages": [("user", text)]}
        await (agent.ainvoke(question) if run == "ainvoke" else asyncio.to_thread(agent.invoke, question))

    plan[:] = [call("calculate", expression="6 * 7"), AIMessage(content="ok")]
    await ask(ASK)
    plan[:] = [call("search_tools", query=SEARCH), AIMessage(content="ok")]
    await ask("hello")
    check([sorted_after_first(o) for o in offered], told)


async def test_openai_agents_enable_the_top_five_and_search_tools(live_toolset: ToolSet, fleet: None) -> None:
    from agents import Agent, FunctionTool, RunConfig, Runner
    from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

    from agent_bridge.integrations.openai_agents import as_function_tools

    offered: list[list[str]] = []
    told: list[str] = []
    seen: set[str] = set()

    async def run(question: str, *steps: Any) -> None:
        plan = list(steps)

        async def respond(call: ModelCall) -> Any:
            offered.append([t.name for t in call.tools if isinstance(t, FunctionTool)])
            for item in call.input if isinstance(call.input, list) else []:
                if (
                    isinstance(item, dict)
                    and item.get("type") == "function_call_output"
                    and item["call_id"] not in seen
                ):
                    seen.add(item["call_id"])
                    told.append(str(item["output"]))
            return plan.pop(0)

        model = ScriptedModel([ModelStep.respond(respond) for _ in steps])
        agent = Agent(name="assistant", tools=as_function_tools(live_toolset, top_k=5), model=model)
        await Runner.run(agent, question, run_config=RunConfig(tracing_disabled=True))
        model.assert_complete()

    await run(ASK, [function_call("calculate", {"expression": "6 * 7"}, call_id="a1")], [assistant_message("ok")])
    await run("hello", [function_call("search_tools", {"query": SEARCH}, call_id="a2")], [assistant_message("ok")])
    check([sorted_after_first(o) for o in offered], told)
