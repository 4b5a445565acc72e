"""pydantic-ai's own agent loop (`Agent.run`, a `FunctionModel`) on `LiveToolset` over a real broker, registry and
store.

The scripted model records the tools each step offers it and what it was
told about its last calls, so each test fails if the live set, the answers
or the error path broke.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from support.live import REPORT, SWATCH, NapService, Services, SwatchService

from agent_bridge import ToolSet
from agent_bridge.integrations.pydantic_ai import LiveToolset
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService

Step = ModelResponse | Callable[[], Awaitable[ModelResponse]]


def call(tool: str, **arguments: Any) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart(tool, arguments)])


def say(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(text)])


class Script:
    """The model: answers from a plan, and records what it was offered and told at each step."""

    def __init__(self) -> None:
        self.plan: list[Step] = []
        self.offered: list[list[str]] = []
        self.told: list[tuple[str, str]] = []  # (outcome, text) of each tool result the model received
        self.received: list[Any] = []  # the content of each tool result, as the model received it

    def run(self, *plan: Step) -> None:
        self.plan, self.offered, self.told, self.received = list(plan), [], [], []

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.offered.append(sorted(t.name for t in info.function_tools))
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        self.told += [(p.outcome, str(p.content)) for p in last.parts if isinstance(p, ToolReturnPart)]
        self.received += [p.content for p in last.parts if isinstance(p, ToolReturnPart)]
        step = self.plan.pop(0)
        return step if isinstance(step, ModelResponse) else await step()


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def ask(script: Script, live_toolset: ToolSet) -> Callable[..., Awaitable[str]]:
    """One run of one agent (built once) with the model following `plan`; returns the run's output."""
    agent = Agent(FunctionModel(script), toolsets=[LiveToolset(live_toolset)])

    async def run(*plan: Step) -> str:
        script.run(*plan)
        result = await agent.run("go")
        assert script.plan == []
        return result.output

    return run


async def test_each_run_and_each_step_offers_the_services_running_then(
    ask: Callable[..., Awaitable[str]], script: Script, live_services: Services
) -> None:
    await ask(say("nothing to call"))
    assert script.offered == [[]]

    # A service starts: the next run calls its tool and gets its answer.
    await live_services.start(EchoService)
    output = await ask(call("echo", text="hello broker"), say("done"))
    assert output == "done"
    assert script.offered == [["echo"], ["echo"]]
    assert script.told == [("success", "hello broker")]

    # A second one starts: the next run offers both; a streamed answer arrives joined.
    await live_services.start(CountdownService)
    await ask(call("countdown", start=3), say("done"))
    assert script.offered == [["countdown", "echo"], ["countdown", "echo"]]
    assert script.told == [("success", "3\n2\n1\n0\n")]

    # Within one run, at every step: a service that starts between two steps is offered at the next.
    async def start_calculator() -> ModelResponse:
        await live_services.start(CalculatorService)
        return call("echo", text="and now?")

    await ask(start_calculator, call("calculate", expression="6 * 7"), say("done"))
    assert script.offered == [
        ["countdown", "echo"],
        ["calculate", "countdown", "echo"],
        ["calculate", "countdown", "echo"],
    ]
    assert script.told == [("success", "and now?"), ("success", "42")]

    # A service stops: the next run does not offer it.
    await live_services.stop("echo")
    await ask(say("ok"))
    assert script.offered == [["calculate", "countdown"]]


async def test_bad_arguments_a_vanished_tool_and_a_timeout_go_back_to_the_model(
    ask: Callable[..., Awaitable[str]], script: Script, live_services: Services
) -> None:
    await live_services.start(EchoService)
    await live_services.start(NapService)

    # Bad arguments: a ModelRetry naming the argument; the model corrects its call.
    output = await ask(call("echo", txt="hi"), call("echo", text="hi"), say("fixed"))
    assert output == "fixed"
    assert script.told[0][0] == "retried" and "argument 'text' is missing (required, string)" in script.told[0][1]
    assert script.told[1] == ("success", "hi")

    # A timing-out tool (its dotted name offered as acme_nap): a failure the model sees; the run goes on.
    output = await ask(call("acme_nap", seconds=30), say("gave up"))
    assert output == "gave up"
    assert "acme_nap" in script.offered[0]
    [(outcome, text)] = script.told
    assert (
        outcome == "failed" and text.startswith("timeout:") and "nap" in text
    )  # the caller's deadline, or the service's

    # A tool that leaves between the step that offered it and the call: a ModelRetry, then it is not offered.
    async def echo_leaves_first() -> ModelResponse:
        await live_services.stop("echo")
        return call("echo", text="still there?")

    output = await ask(echo_leaves_first, say("it left"))
    assert output == "it left"
    assert script.offered == [["acme_nap", "echo"], ["acme_nap"]]
    [(outcome, text)] = script.told
    assert outcome == "retried" and "no tool named 'echo'" in text


async def test_an_image_and_a_file_reach_the_model_as_binary_content_in_the_tool_return(
    ask: Callable[..., Awaitable[str]], script: Script, live_services: Services
) -> None:
    await live_services.start(SwatchService)
    await ask(call("swatch", rgb="9,9,9"), say("seen"))
    [content] = script.received
    assert content[0] == "swatch 9,9,9"
    assert isinstance(content[1], BinaryContent) and content[1].is_image
    assert (content[1].data, content[1].media_type) == (SWATCH, "image/png")
    assert isinstance(content[2], BinaryContent) and content[2].is_document
    assert (content[2].data, content[2].media_type) == (REPORT, "application/pdf")

    await live_services.start(EchoService)  # a text result stays text
    await ask(call("echo", text="plain"), say("ok"))
    assert script.received == ["plain"]


def test_importing_the_bridge_loads_no_framework() -> None:
    code = (
        "import sys, json, agent_bridge, agent_bridge.integrations\nprint(json.dumps(sorted(m for m in ('pydantic_ai',"
        " 'langchain_core', 'langchain', 'langgraph', 'agents', 'openai') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert json.loads(out) == []


def test_a_missing_framework_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "agent_bridge.integrations.pydantic_ai")
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)  # as if it were not installed
    with pytest.raises(ModuleNotFoundError) as caught:
        importlib.import_module("agent_bridge.integrations.pydantic_ai")
    assert (
        str(caught.value)
        == "agent_bridge.integrations needs pydantic-ai-slim for this: pip install 'tool-discovery[pydantic-ai]'"
    )
