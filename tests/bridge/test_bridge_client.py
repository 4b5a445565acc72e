"""`ToolServiceClient` and `ToolServiceImpl` against real in-process tool services."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import eventually

from agent_bridge import CallLimits, RequestTimeout, ToolError, ToolServiceClient, ToolServiceImpl
from toolservice_base import (
    DynamicToolService,
    Settings,
    ToolServiceDescriptor,
    Transport,
)
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService
from toolservice_base.examples.joke import JokeService

pytestmark = pytest.mark.contract


class WhoAmIService(DynamicToolService):
    """Answers with exactly what it received, to check what the bridge sends."""

    descriptor = {"id": "whoami", "config-params": [{"name": "style"}, {"name": "depth"}]}
    tools = [{"name": "whoami", "description": "Echo the request", "style": "pun", "depth": 2}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return json.dumps({"user": user, "config": config, "arguments": arguments}, sort_keys=True)


@pytest.fixture
async def running(settings: Settings) -> AsyncIterator[dict[str, DynamicToolService]]:
    services = [
        cls(settings=settings, announce=False)
        for cls in (JokeService, CalculatorService, CountdownService, EchoService, WhoAmIService)
    ]
    for service in services:
        await service.start()
    yield {s.id: s for s in services}
    for service in services:
        await service.stop()


def impl_of(service: DynamicToolService, client: ToolServiceClient, user: str = "") -> ToolServiceImpl:
    return ToolServiceImpl(
        service.tool_descriptors[0], service.service_descriptor, client, user=user, limits=CallLimits(timeout=5)
    )


async def test_joke_and_calculator_answer_through_impl_invoke(
    connection: Transport, running: dict[str, DynamicToolService]
) -> None:
    joke_client = ToolServiceClient(connection, running["joke-service"].service_descriptor)
    calc_client = ToolServiceClient(connection, running["calculator"].service_descriptor)
    joke = impl_of(running["joke-service"], joke_client)
    calc = impl_of(running["calculator"], calc_client)
    assert await joke.invoke(topic="cats") == "I would tell you a joke about cats, but it would be too punny."
    assert await calc.invoke(expression="(2 + 3) * 4 / 2") == "10"
    await joke_client.close()
    await calc_client.close()


async def test_impl_sends_the_tools_config_values_and_the_user(
    connection: Transport, running: dict[str, DynamicToolService]
) -> None:
    client = ToolServiceClient(connection, running["whoami"].service_descriptor)
    impl = impl_of(running["whoami"], client, user="agent-7")
    seen = json.loads(await impl.invoke(question="why", n=3))
    assert seen == {"user": "agent-7", "config": {"style": "pun", "depth": 2}, "arguments": {"question": "why", "n": 3}}
    seen = json.loads(await impl.call({"question": "who"}, user="alice"))
    assert seen["user"] == "alice" and seen["config"] == {"style": "pun", "depth": 2}
    await client.close()


async def test_stream_delivers_every_chunk_in_order(
    connection: Transport, running: dict[str, DynamicToolService]
) -> None:
    client = ToolServiceClient(connection, running["countdown"].service_descriptor)
    impl = impl_of(running["countdown"], client)
    chunks = [chunk async for chunk in impl.stream(start=25)]
    assert chunks == [f"{n}\n" for n in range(25, -1, -1)]
    assert await impl.invoke(start=3) == "3\n2\n1\n0\n"
    assert client.in_flight == 0
    await client.close()


async def test_an_exception_in_the_service_is_a_tool_error_and_it_keeps_serving(
    connection: Transport, running: dict[str, DynamicToolService]
) -> None:
    client = ToolServiceClient(connection, running["calculator"].service_descriptor)
    calc = impl_of(running["calculator"], client)
    with pytest.raises(ToolError) as caught:
        await calc.invoke(expression="1 / 0")
    assert caught.value.type == "ExpressionError"
    assert caught.value.message == "division by zero"
    assert caught.value.service == "calculator"
    assert await calc.invoke(expression="6 * 7") == "42"
    countdown = impl_of(running["countdown"], ToolServiceClient(connection, running["countdown"].service_descriptor))
    with pytest.raises(ToolError, match="start must be between"):
        [chunk async for chunk in countdown.stream(start=-1)]
    assert client.in_flight == 0 and countdown.client.in_flight == 0
    await client.close()
    await countdown.client.close()


async def test_100_concurrent_calls_each_get_their_own_answer(
    connection: Transport, running: dict[str, DynamicToolService]
) -> None:
    echo = impl_of(running["echo"], ToolServiceClient(connection, running["echo"].service_descriptor))
    calc = impl_of(running["calculator"], ToolServiceClient(connection, running["calculator"].service_descriptor))
    calls = [
        echo.invoke(text=f"message {i}") if i % 2 else calc.invoke(expression=f"{i} * {i} + 1") for i in range(100)
    ]
    expected = [f"message {i}" if i % 2 else str(i * i + 1) for i in range(100)]
    assert await asyncio.gather(*calls) == expected
    assert echo.client.in_flight == 0 and calc.client.in_flight == 0
    await echo.client.close()
    await calc.client.close()


async def test_a_service_nobody_serves_times_out_with_a_clear_error(connection: Transport) -> None:
    topics = connection.topics
    nobody = ToolServiceDescriptor.model_validate(
        {
            "id": "nobody",
            "request-queue": topics.request_queue("nobody"),
            "response-queue": topics.response_queue("nobody"),
        }
    )
    client = ToolServiceClient(connection, nobody)
    with pytest.raises(RequestTimeout, match=f"is a service consuming {topics.request_queue('nobody')}"):
        await client.call("", {}, {}, 0.3)
    assert client.in_flight == 0
    await client.close()


async def test_a_client_calls_inside_async_with_and_is_closed_after(
    connection: Transport, running: dict[str, DynamicToolService]
) -> None:
    async with ToolServiceClient(connection, running["calculator"].service_descriptor) as client:
        assert not client.closed
        assert await client.call("", {}, {"expression": "6 * 7"}, 5) == "42"
    assert client.closed


async def test_close_when_idle_waits_for_the_call_in_flight_then_refuses_new_ones(
    connection: Transport, running: dict[str, DynamicToolService]
) -> None:
    client = ToolServiceClient(connection, running["countdown"].service_descriptor)
    call = asyncio.create_task(client.call("", {"delay": 0.03}, {"start": 10}))
    await eventually(lambda: client.in_flight == 1)
    closing = asyncio.create_task(client.close_when_idle())
    await asyncio.sleep(0.1)
    assert not closing.done() and not client.closed
    assert await call == "".join(f"{n}\n" for n in range(10, -1, -1))
    await asyncio.wait_for(closing, 2)
    assert client.closed
    with pytest.raises(ToolError) as caught:
        await client.call("", {}, {"start": 1})
    assert caught.value.type == "client-closed"


async def test_arguments_that_are_not_json_are_refused_before_sending(connection: Transport) -> None:
    service = EchoService(settings=Settings(pulsar_url="pulsar://unused:1"), announce=False).service_descriptor
    client = ToolServiceClient(connection, service)
    with pytest.raises(ToolError) as caught:
        await client.call("", {}, {"text": object()})
    assert caught.value.type == "bad-arguments" and client.in_flight == 0
    await client.close()
