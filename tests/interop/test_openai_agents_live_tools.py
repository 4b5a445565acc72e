"""The OpenAI Agents SDK's own loop (`Runner.run`) with its scripted `Model` (`agents.testing.ScriptedModel`) on
`as_function_tools`, over a real broker, registry and store.

Every model step is a responder that records the tools the step was given
and the tool outputs it was sent, so each test fails if the live set, the
answers or the error path broke.
"""

from __future__ import annotations

import base64
import importlib
import itertools
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunConfig, Runner
from agents.items import TResponseOutputItem
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from support.live import REPORT, SWATCH, NapService, Services, SwatchService

from agent_bridge import ToolSet
from agent_bridge.integrations.openai_agents import as_function_tools, strict_compatible
from toolservice_base import DynamicToolService
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService

Output = list[TResponseOutputItem]
Step = Output | Callable[[], Awaitable[Output]]
_ids = itertools.count(1)


def call(tool: str, **arguments: Any) -> Output:
    return [function_call(tool, arguments, call_id=f"call-{next(_ids)}")]


def say(text: str) -> Output:
    return [assistant_message(text)]


class TagsService(DynamicToolService):
    """A tool with an array argument: strict mode cannot take its schema as it is."""

    descriptor = {"id": "tags"}
    tools = [
        {
            "name": "count-tags",
            "description": "Count tags",
            "arguments": [{"name": "tags", "type": "array", "description": "Tags"}],
        }
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return str(len(arguments["tags"]))


class Script:
    """The model's side: each step answers from a plan and records the tools it was given and the outputs it was
    sent."""

    def __init__(self) -> None:
        self.offered: list[list[str]] = []
        self.told: list[str] = []
        self.received: list[Any] = []
        self._seen: set[str] = set()

    async def run(self, agent: Agent[Any], *plan: Step) -> str:
        self.offered, self.told, self.received, steps = [], [], [], list(plan)

        async def respond(call: ModelCall) -> Output:
            self.offered.append(sorted(t.name for t in call.tools if isinstance(t, FunctionTool)))
            for item in call.input if isinstance(call.input, list) else []:
                if (
                    isinstance(item, dict)
                    and item.get("type") == "function_call_output"
                    and item["call_id"] not in self._seen
                ):
                    self._seen.add(item["call_id"])
                    self.told.append(str(item["output"]))
                    self.received.append(item["output"])
            step = steps.pop(0)
            return step if isinstance(step, list) else await step()

        model = ScriptedModel([ModelStep.respond(respond) for _ in plan])
        result = await Runner.run(agent.clone(model=model), "go", run_config=RunConfig(tracing_disabled=True))
        model.assert_complete()
        return str(result.final_output)


@pytest.fixture
def script() -> Script:
    return Script()


async def test_each_run_gets_the_services_running_then(
    script: Script, live_toolset: ToolSet, live_services: Services
) -> None:
    agent: Agent[Any] = Agent(name="assistant", instructions="Use the tools.")

    def live() -> Agent[Any]:  # the tools of the moment, for each run
        return agent.clone(tools=as_function_tools(live_toolset))

    assert await script.run(live(), say("nothing to call")) == "nothing to call"
    assert script.offered == [[]]

    # A service starts: the next run calls its tool and gets its answer.
    await live_services.start(EchoService)
    assert await script.run(live(), call("echo", text="hello broker"), say("done")) == "done"
    assert script.offered == [["echo"], ["echo"]]
    assert script.told == ["hello broker"]

    # A second one starts: the next run offers both; a streamed answer arrives joined.
    await live_services.start(CountdownService)
    await script.run(live(), call("countdown", start=3), say("done"))
    assert script.offered == [["countdown", "echo"], ["countdown", "echo"]]
    assert script.told == ["3\n2\n1\n0\n"]

    # A third: offered from the next run on.
    await live_services.start(CalculatorService)
    await script.run(live(), call("calculate", expression="6 * 7"), say("done"))
    assert script.offered == [["calculate", "countdown", "echo"], ["calculate", "countdown", "echo"]]
    assert script.told == ["42"]

    # A service stops: the next run does not offer it.
    await live_services.stop("echo")
    await script.run(live(), say("ok"))
    assert script.offered == [["calculate", "countdown"]]


async def test_strict_schemas_where_allowed_and_errors_go_back_to_the_model(
    script: Script, live_toolset: ToolSet, live_services: Services
) -> None:
    await live_services.start(EchoService)
    await live_services.start(NapService)
    await live_services.start(TagsService)
    tools = {t.name: t for t in as_function_tools(live_toolset)}
    assert sorted(tools) == ["acme_nap", "count-tags", "echo"]  # the dotted name, OpenAI-safe
    assert tools["echo"].strict_json_schema is True and tools["acme_nap"].strict_json_schema is True
    assert tools["echo"].params_json_schema == live_toolset.describe()[2]["parameters"]
    assert tools["count-tags"].strict_json_schema is False  # an array of anything: sent non-strict, as it is
    assert tools["count-tags"].params_json_schema == live_toolset.describe()[1]["parameters"]
    assert not strict_compatible(
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": [], "additionalProperties": False}
    )
    agent: Agent[Any] = Agent(name="assistant", tools=list(tools.values()))

    # Bad arguments: a message naming the argument; the model corrects its call.
    assert await script.run(agent, call("echo", txt="hi"), call("echo", text="hi"), say("fixed")) == "fixed"
    assert script.told == [
        "bad-arguments: tool 'echo': argument 'text' is missing (required, string) (tool service 'echo')",
        "hi",
    ]
    assert await script.run(agent, call("count-tags", tags=["a", "b"]), say("two")) == "two"
    assert script.told == ["2"]

    # A timing-out tool: a message; the run goes on.
    assert await script.run(agent, call("acme_nap", seconds=30), say("gave up")) == "gave up"
    [text] = script.told
    assert text.startswith("timeout:") and "nap" in text

    # Arguments that are not JSON, and a tool of the run's snapshot that left since: messages, the run goes on.
    async def echo_leaves_first() -> Output:
        await live_services.stop("echo")
        return [function_call("echo", "{not json", call_id="call-bad-json"), *call("echo", text="still there?")]

    assert await script.run(agent, echo_leaves_first, say("it left")) == "it left"
    assert script.told[0] == "bad-arguments: tool 'echo': the arguments are not JSON"
    assert script.told[1].startswith("no tool named 'echo'")


async def test_an_image_and_a_file_reach_the_model_as_the_sdks_image_and_file_outputs(
    script: Script, live_toolset: ToolSet, live_services: Services
) -> None:
    await live_services.start(SwatchService)
    agent: Agent[Any] = Agent(name="assistant", tools=as_function_tools(live_toolset))
    assert await script.run(agent, call("swatch", rgb="9,9,9"), say("seen")) == "seen"
    [output] = script.received
    assert output[0] == {"type": "input_text", "text": "swatch 9,9,9"}
    assert output[1]["type"] == "input_image"
    assert output[1]["image_url"] == "data:image/png;base64," + base64.b64encode(SWATCH).decode()
    assert output[2]["type"] == "input_file" and output[2]["filename"] == "report.pdf"
    assert output[2]["file_data"] == "data:application/pdf;base64," + base64.b64encode(REPORT).decode()


def test_a_missing_framework_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "agent_bridge.integrations.openai_agents")
    monkeypatch.setitem(sys.modules, "agents", None)  # as if it were not installed
    with pytest.raises(ModuleNotFoundError) as caught:
        importlib.import_module("agent_bridge.integrations.openai_agents")
    assert (
        str(caught.value)
        == "agent_bridge.integrations needs openai-agents for this: pip install 'tool-discovery[openai-agents]'"
    )
