"""LangChain's own agent loop (`create_agent`, on LangGraph) with a scripted fake chat model, over a real broker,
registry and store.

The model is langchain-core's `GenericFakeChatModel` taught `bind_tools`: it
records the tools each model call is bound with and the tool messages it
was sent, so each test fails if the live set, the answers or the error path broke.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import itertools
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from support.live import REPORT, SWATCH, NapService, Services, SwatchService

from agent_bridge import ToolSet
from agent_bridge.integrations.langchain import LiveTool, as_langchain_tools, live_tools_middleware
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService

Step = AIMessage | Callable[[], Awaitable[AIMessage]]
_ids = itertools.count(1)


def call(tool: str, **arguments: Any) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": tool, "args": arguments, "id": f"call-{next(_ids)}", "type": "tool_call"}]
    )


def say(text: str) -> AIMessage:
    return AIMessage(content=text)


class Script:
    """The model's side: answers from a plan, and records what it was bound with and sent at each call."""

    def __init__(self) -> None:
        self.plan: list[Step] = []
        self.offered: list[list[str]] = []
        self.told: list[tuple[str, str]] = []  # (status, content) of each tool message the model was sent
        self.received: list[Any] = []  # the content of each of those, as it is

    def run(self, *plan: Step) -> None:
        self.plan, self.offered, self.told, self.received = list(plan), [], [], []

    async def respond(self, messages: list[BaseMessage], bound: list[str]) -> AIMessage:
        self.offered.append(bound)
        fresh: list[ToolMessage] = []
        for message in reversed(messages):  # the tool messages since the model last spoke
            if not isinstance(message, ToolMessage):
                break
            fresh.insert(0, message)
        self.told += [(m.status, str(m.content)) for m in fresh]
        self.received += [m.content for m in fresh]
        step = self.plan.pop(0)
        return step if isinstance(step, AIMessage) else await step()


class ScriptedChatModel(GenericFakeChatModel):
    """`GenericFakeChatModel` that supports `bind_tools` (recording the names) and answers from a `Script`."""

    script: Any
    bound: list[str] = []
    messages: Any = iter(())
    disable_streaming: bool = True  # the fake's streaming would drop tool calls

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.model_copy(update={"bound": sorted(convert_to_openai_tool(t)["function"]["name"] for t in tools)})

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError("the tests run the agent asynchronously")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=await self.script.respond(messages, self.bound))])


@pytest.fixture
def script() -> Script:
    return Script()


async def test_a_create_agent_agent_with_the_middleware_follows_the_services_between_turns_and_within_one(
    script: Script, live_toolset: ToolSet, live_services: Services
) -> None:
    agent = create_agent(
        ScriptedChatModel(script=script), middleware=[live_tools_middleware(live_toolset)], checkpointer=InMemorySaver()
    )
    thread = {"configurable": {"thread_id": "one conversation"}}

    async def turn(*plan: Step) -> str:
        script.run(*plan)
        state = await agent.ainvoke({"messages": [("user", "go")]}, thread)
        assert script.plan == []
        return str(state["messages"][-1].content)

    assert await turn(say("nothing to call")) == "nothing to call"
    assert script.offered == [[]]

    # A service starts: the next turn calls its tool and gets its answer.
    await live_services.start(EchoService)
    assert await turn(call("echo", text="hello broker"), say("done")) == "done"
    assert script.offered == [["echo"], ["echo"]]
    assert script.told == [("success", "hello broker")]

    # A second one starts: the next turn offers both, and a streaming tool's chunks come as LangGraph streams tool
    # output.
    await live_services.start(CountdownService)
    script.run(call("countdown", start=3), say("done"))
    deltas = [
        payload["delta"]
        async for mode, payload in agent.astream({"messages": [("user", "count")]}, thread, stream_mode=["tools"])
        if mode == "tools" and payload["event"] == "tool-output-delta"
    ]
    assert deltas == ["3\n", "2\n", "1\n", "0\n"]
    assert script.offered == [["countdown", "echo"], ["countdown", "echo"]]
    assert script.told == [("success", "3\n2\n1\n0\n")]

    # Within one turn: a service that starts between two model calls is offered at the next.
    async def start_calculator() -> AIMessage:
        await live_services.start(CalculatorService)
        return call("echo", text="and now?")

    await turn(start_calculator, call("calculate", expression="6 * 7"), say("done"))
    assert script.offered == [
        ["countdown", "echo"],
        ["calculate", "countdown", "echo"],
        ["calculate", "countdown", "echo"],
    ]
    assert script.told == [("success", "and now?"), ("success", "42")]

    # A service stops, even mid-turn: a call already made is told so, and the next model call does not offer it.
    async def echo_leaves_first() -> AIMessage:
        await live_services.stop("echo")
        return call("echo", text="still there?")

    assert await turn(echo_leaves_first, say("it left")) == "it left"
    assert script.offered == [["calculate", "countdown", "echo"], ["calculate", "countdown"]]
    [(status, text)] = script.told
    assert status == "error" and text.startswith("no tool named 'echo'")


async def test_structured_tools_have_the_schemas_and_errors_go_back_to_the_model(
    script: Script, live_toolset: ToolSet, live_services: Services
) -> None:
    await live_services.start(EchoService)
    await live_services.start(NapService)
    tools = as_langchain_tools(live_toolset)
    assert [t.name for t in tools] == ["acme_nap", "echo"]  # the dotted name, OpenAI-safe
    assert all(isinstance(t, LiveTool) and t.handle_tool_error for t in tools)
    assert (
        tools[1].args_schema == live_toolset.describe()[1]["parameters"]
    )  # the ToolSet's JSON Schema, as the model gets it
    assert convert_to_openai_tool(tools[0])["function"]["parameters"] == live_toolset.describe()[0]["parameters"]

    # Sync, from another thread (the agent's sync path runs tools so); the ToolSet's loop does the call.
    assert await asyncio.to_thread(tools[1].invoke, {"text": "sync"}) == "sync"
    with pytest.raises(RuntimeError, match="use ainvoke"):
        tools[1].invoke({"text": "on the loop"})

    async def turn(*plan: Step) -> str:  # the agent rebuilt for each turn with the tools of the moment
        script.run(*plan)
        agent = create_agent(ScriptedChatModel(script=script), as_langchain_tools(live_toolset))
        state = await agent.ainvoke({"messages": [("user", "go")]})
        assert script.plan == []
        return str(state["messages"][-1].content)

    # Bad arguments: an error message naming the argument; the model corrects its call.
    assert await turn(call("echo", txt="hi"), call("echo", text="hi"), say("fixed")) == "fixed"
    assert script.told == [
        ("error", "bad-arguments: tool 'echo': argument 'text' is missing (required, string) (tool service 'echo')"),
        ("success", "hi"),
    ]

    # A timing-out tool: an error message; the run goes on.
    assert await turn(call("acme_nap", seconds=30), say("gave up")) == "gave up"
    [(status, text)] = script.told
    assert status == "error" and text.startswith("timeout:") and "nap" in text

    # A tool of the snapshot that left since: an error message, the run goes on.
    async def echo_leaves_first() -> AIMessage:
        await live_services.stop("echo")
        return call("echo", text="still there?")

    assert await turn(echo_leaves_first, say("it left")) == "it left"
    [(status, text)] = script.told
    assert status == "error" and text.startswith("no tool named 'echo'")


async def test_an_image_and_a_file_reach_the_model_as_content_blocks(
    script: Script, live_toolset: ToolSet, live_services: Services
) -> None:
    await live_services.start(SwatchService)
    script.run(call("swatch", rgb="9,9,9"), say("seen"))
    agent = create_agent(ScriptedChatModel(script=script), as_langchain_tools(live_toolset))
    await agent.ainvoke({"messages": [("user", "go")]})
    [content] = script.received
    assert content == [
        {"type": "text", "text": "swatch 9,9,9"},
        {"type": "image", "base64": base64.b64encode(SWATCH).decode(), "mime_type": "image/png"},
        {
            "type": "file",
            "base64": base64.b64encode(REPORT).decode(),
            "mime_type": "application/pdf",
            "extras": {"filename": "report.pdf"},
        },
    ]
    [swatch] = as_langchain_tools(live_toolset)
    assert (
        await swatch.ainvoke({"rgb": "1,2,3"})
        == [  # outside an agent too: the same blocks
            {"type": "text", "text": "swatch 1,2,3"},
            *content[1:],
        ]
    )


def test_a_missing_framework_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "agent_bridge.integrations.langchain")
    monkeypatch.setitem(sys.modules, "langchain_core", None)  # as if it were not installed
    with pytest.raises(ModuleNotFoundError) as caught:
        importlib.import_module("agent_bridge.integrations.langchain")
    assert (
        str(caught.value)
        == "agent_bridge.integrations needs langchain-core for this: pip install 'tool-discovery[langchain]'"
    )
