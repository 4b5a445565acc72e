"""`ServiceHarness`: a tool-service author tests a service with no broker, through the real request path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from toolservice_base import DynamicToolService, ServiceDefinitionError, ToolError, UnknownToolError
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService
from toolservice_base.examples.joke import JokeService
from toolservice_base.testing import ServiceHarness


async def test_a_tool_is_called_with_its_config_values_and_the_given_arguments() -> None:
    async with ServiceHarness(JokeService) as h:
        answer = await h.invoke("tell-joke", {"topic": "cats"})
    assert (
        answer == "I would tell you a joke about cats, but it would be too punny."
    )  # style "pun" is the tool's config value


async def test_calculator_and_echo_answer_through_the_harness() -> None:
    async with ServiceHarness(CalculatorService) as calc, ServiceHarness(EchoService) as echo:
        assert await calc.invoke("calculate", {"expression": "(2 + 3) * 4 / 2"}) == "10"
        assert await echo.invoke("echo", {"text": "héllo"}) == "héllo"


async def test_a_streaming_tool_yields_each_chunk_in_order_and_invoke_joins_them() -> None:
    async with ServiceHarness(CountdownService) as h:
        chunks = [chunk async for chunk in h.stream("countdown", {"start": 3})]
        joined = await h.invoke("countdown", {"start": 2})
    assert chunks == ["3\n", "2\n", "1\n", "0\n"]
    assert joined == "2\n1\n0\n"


async def test_a_service_that_raises_becomes_a_tool_error_with_its_type_and_message() -> None:
    async with ServiceHarness(CalculatorService) as h:
        with pytest.raises(ToolError) as caught:
            await h.invoke("calculate", {"expression": "1 / 0"})
    assert caught.value.type == "ExpressionError"
    assert "division by zero" in caught.value.message
    assert caught.value.service == "calculator"


async def test_a_stream_that_fails_midway_delivers_what_came_before_then_raises() -> None:
    async with ServiceHarness(CountdownService) as h:
        with pytest.raises(ToolError) as caught:
            await h.invoke("countdown", {"start": -1})
    assert caught.value.type == "ValueError" and "between 0 and" in caught.value.message


async def test_an_unknown_tool_names_the_tools_the_service_has() -> None:
    async with ServiceHarness(JokeService) as h:
        with pytest.raises(UnknownToolError, match="has no tool 'nope'; it has: tell-joke"):
            await h.invoke("nope", {})


class Broken(DynamicToolService):
    descriptor: ClassVar[dict[str, Any]] = {"id": "broken"}
    tools: ClassVar[list[dict[str, Any]]] = [{"name": "bad name!", "description": "x"}]


async def test_a_bad_definition_is_refused_exactly_as_toolreg_serve_refuses_it() -> None:
    with pytest.raises(ServiceDefinitionError, match="bad name!"):
        async with ServiceHarness(Broken):
            pass


class Slow(DynamicToolService):
    descriptor: ClassVar[dict[str, Any]] = {"id": "slow"}
    tools: ClassVar[list[dict[str, Any]]] = [{"name": "slow", "description": "Never answers in time"}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        await asyncio.sleep(10)
        return "late"


async def test_a_service_that_does_not_answer_in_time_is_a_request_timeout() -> None:
    from toolservice_base import RequestTimeout

    async with ServiceHarness(Slow, timeout=0.2) as h:
        with pytest.raises(RequestTimeout):
            await h.invoke("slow")


class AsyncReturnsGenerator(DynamicToolService):
    """An `async def invoke` that returns an async generator: streamed like a generator `invoke`."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "wrapped"}
    tools: ClassVar[list[dict[str, Any]]] = [{"name": "letters", "description": "Spell a word"}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> AsyncIterator[str]:
        async def letters() -> AsyncIterator[str]:
            for letter in arguments.get("word", ""):
                yield letter

        return letters()


class OwnStream(DynamicToolService):
    """A subclass with a private helper named like the base class's internals keeps working."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "own-stream"}
    tools: ClassVar[list[dict[str, Any]]] = [{"name": "own", "description": "Uses its own _stream and _handle"}]

    def _stream(self) -> str:
        return "mine"

    def _handle(self) -> str:
        return "mine too"

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return self._stream() + " / " + self._handle()


async def test_an_async_invoke_returning_a_generator_streams_it() -> None:
    async with ServiceHarness(AsyncReturnsGenerator) as h:
        assert [c async for c in h.stream("letters", {"word": "abc"})] == ["a", "b", "c"]


async def test_a_subclass_may_define_its_own_underscore_helpers() -> None:
    async with ServiceHarness(OwnStream) as h:
        assert await h.invoke("own") == "mine / mine too"


class Units(DynamicToolService):
    """One service, several tools: `invoke` tells them apart by the `tool` it is given."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "units"}
    tools: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "km-to-miles",
            "description": "Kilometres to miles",
            "arguments": [{"name": "value", "type": "number", "description": "km"}],
        },
        {
            "name": "miles-to-km",
            "description": "Miles to kilometres",
            "arguments": [{"name": "value", "type": "number", "description": "miles"}],
        },
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = "") -> str:
        factor = {"km-to-miles": 0.621371, "miles-to-km": 1.609344}[tool]
        return f"{arguments['value'] * factor:.2f}"


class Loose(DynamicToolService):
    """An `invoke` that takes **context gets the tool's name too."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "loose"}
    tools: ClassVar[list[dict[str, Any]]] = [{"name": "which", "description": "Names itself"}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], **context: Any) -> str:
        return str(context)


async def test_invoke_is_told_which_tool_was_called() -> None:
    async with ServiceHarness(Units) as h:
        assert await h.invoke("km-to-miles", {"value": 10}) == "6.21"
        assert await h.invoke("miles-to-km", {"value": 10}) == "16.09"
    async with ServiceHarness(Loose) as h:
        assert await h.invoke("which") == "{'tool': 'which'}"


async def test_a_call_that_runs_past_the_services_limit_is_a_timeout_error() -> None:
    async with ServiceHarness(Slow, timeout=5, call_timeout=0.2) as h:
        with pytest.raises(ToolError) as caught:
            await h.invoke("slow")
        assert caught.value.type == "timeout"
