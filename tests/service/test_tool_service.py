"""DynamicToolService on a real broker: the protocol of spec section 3."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import structlog

from toolservice_base import RequestClient, ServiceDefinitionError, Settings, Transport
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.rpc import CallLimits
from toolservice_base.service import DynamicToolService

pytestmark = pytest.mark.contract


class Flaky(DynamicToolService):
    descriptor = {"id": "flaky"}
    tools = [
        {
            "name": "flaky",
            "description": "Fails when asked to",
            "arguments": [{"name": "fail", "type": "boolean", "description": "fail?"}],
        }
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> Any:
        if arguments.get("fail"):
            raise RuntimeError("asked to fail")
        return {"user": user, "ok": True}


class Slow(DynamicToolService):
    descriptor = {"id": "slow"}
    tools = [{"name": "slow", "description": "Sleeps", "arguments": []}]
    max_in_flight = 4
    running = 0
    peak = 0

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        type(self).running += 1
        type(self).peak = max(type(self).peak, type(self).running)
        await asyncio.sleep(float(arguments.get("seconds", 0.2)))
        type(self).running -= 1
        return "done"


def request(arguments: dict[str, Any], config: dict[str, Any] | None = None, user: str = "") -> dict[str, str]:
    return {"user": user, "config": json.dumps(config or {}), "arguments": json.dumps(arguments)}


async def client_for(connection: Transport, service: DynamicToolService) -> RequestClient:
    d = service.service_descriptor
    return await RequestClient(connection, d.request_queue, d.response_queue).start()


async def test_descriptor_defaults_fill_queues_type_and_service() -> None:
    svc = CalculatorService(settings=Settings(pulsar_url="pulsar://unused:1"))
    assert svc.service_descriptor.request_queue == "non-persistent://tg/request/calculator"
    assert svc.service_descriptor.response_queue == "non-persistent://tg/response/calculator"
    tool = svc.tool_descriptors[0]
    assert (tool.type, tool.service) == ("tool-service", "calculator")


def test_a_bad_definition_is_refused_with_the_field_named() -> None:
    class Bad(DynamicToolService):
        descriptor = {"id": "bad id"}

    with pytest.raises(ServiceDefinitionError, match="id"):
        Bad(settings=Settings(pulsar_url="pulsar://unused:1"))


def test_a_service_too_large_to_announce_is_refused_at_definition() -> None:
    class Huge(DynamicToolService):
        descriptor = {"id": "huge"}
        tools = [{"name": f"tool-{n}", "description": "x" * 4000} for n in range(20)]

    with pytest.raises(ServiceDefinitionError, match="over the registry's 64 KiB limit"):
        Huge(settings=Settings(pulsar_url="pulsar://unused:1"))


async def test_a_value_is_one_response_and_non_strings_are_json(settings: Settings, connection: Transport) -> None:
    async with Flaky(settings=settings, announce=False) as svc:
        client = await client_for(connection, svc)
        body = await client.request(request({}, user="alice"), timeout=5)
        assert body["end_of_stream"] is True and body.get("error") is None
        assert json.loads(body["response"]) == {"user": "alice", "ok": True}


async def test_an_exception_is_an_error_response_and_the_service_keeps_serving(
    settings: Settings, connection: Transport
) -> None:
    async with Flaky(settings=settings, announce=False) as svc:
        client = await client_for(connection, svc)
        failed = await client.request(request({"fail": True}), timeout=5)
        assert failed["error"] == {"type": "RuntimeError", "message": "asked to fail"}
        assert failed["end_of_stream"] is True
        ok = await client.request(request({}), timeout=5)
        assert ok.get("error") is None


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        (b"{broken", "not a ToolServiceRequest"),
        (json.dumps({"arguments": "{not json"}).encode(), "'arguments' is not JSON"),
        (json.dumps({"config": "[1, 2]"}).encode(), "'config' must be a JSON object"),
    ],
)
async def test_broken_request_json_gets_an_error_naming_the_problem(
    settings: Settings, connection: Transport, payload: bytes, named: str
) -> None:
    async with Flaky(settings=settings, announce=False) as svc:
        client = await client_for(connection, svc)
        body = await client.request(payload, timeout=5)
        assert body["error"]["type"] == "bad-request"
        assert named in body["error"]["message"]
        assert (await client.request(request({}), timeout=5)).get("error") is None


async def test_streaming_delivers_every_chunk_in_order(settings: Settings, connection: Transport) -> None:
    async with CountdownService(settings=settings, announce=False) as svc:
        client = await client_for(connection, svc)
        chunks = [
            body
            async for body in client.stream(
                request({"start": 50}, {"delay": 0}), is_last=lambda b: b["end_of_stream"], limits=CallLimits(5)
            )
        ]
        assert [c["response"] for c in chunks[:-1]] == [f"{n}\n" for n in range(50, -1, -1)]
        assert chunks[-1] == {"response": "", "end_of_stream": True}


async def test_100_concurrent_calls_each_get_their_own_answer(settings: Settings, connection: Transport) -> None:
    async with CalculatorService(settings=settings, announce=False) as svc:
        client = await client_for(connection, svc)
        bodies = await asyncio.gather(
            *(client.request(request({"expression": f"{n} * 3"}), timeout=10) for n in range(100))
        )
        assert [b["response"] for b in bodies] == [str(n * 3) for n in range(100)]


async def test_in_flight_requests_are_capped(settings: Settings, connection: Transport) -> None:
    Slow.running = Slow.peak = 0
    async with Slow(settings=settings, announce=False) as svc:
        client = await client_for(connection, svc)
        await asyncio.gather(*(client.request(request({"seconds": 0.05}), timeout=10) for _ in range(20)))
    assert Slow.peak == 4


async def test_stop_finishes_in_flight_work_before_closing(settings: Settings, connection: Transport) -> None:
    svc = Slow(settings=settings, announce=False)
    await svc.start()
    client = await client_for(connection, svc)
    pending = asyncio.create_task(client.request(request({"seconds": 0.3}), timeout=5))
    await asyncio.sleep(0.1)
    await svc.stop()
    assert (await pending)["response"] == "done"


async def test_instances_share_the_load(settings: Settings, connection: Transport) -> None:
    class Who(DynamicToolService):
        descriptor = {"id": "who"}
        tools = [{"name": "who", "description": "Which instance answered", "arguments": []}]

        async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
            await asyncio.sleep(0.01)
            return str(id(self))

    async with Who(settings=settings, announce=False) as one, Who(settings=settings, announce=False) as two:
        client = await client_for(connection, one)
        bodies = await asyncio.gather(*(client.request(request({}), timeout=5) for _ in range(40)))
        answered_by = {b["response"] for b in bodies}
        assert answered_by == {str(id(one)), str(id(two))}


async def test_answers_over_64_kib_are_delivered_and_logged_at_powers_of_ten(
    settings: Settings, connection: Transport
) -> None:
    class Big(DynamicToolService):
        descriptor = {"id": "big"}
        tools = [{"name": "big", "description": "Answers with a large text", "arguments": []}]

        async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
            return "x" * 70_000

    with structlog.testing.capture_logs() as logs:
        async with Big(settings=settings, announce=False) as svc:
            client = await client_for(connection, svc)
            for _ in range(11):
                body = await client.request(request({}), timeout=5)
                assert len(body["response"]) == 70_000
    large = [entry for entry in logs if entry["event"] == "response.large"]
    assert [entry["large_so_far"] for entry in large] == [1, 10]
    assert large[0]["bytes"] > 64 * 1024 and "stream" in large[0]["hint"]


class Named(DynamicToolService):
    descriptor = {"id": "named"}
    tools = [{"name": "first", "description": "One tool"}, {"name": "second", "description": "Another"}]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = "") -> str:
        return tool or "(not said)"


async def test_the_tool_property_names_the_tool_and_a_request_without_it_still_works(
    settings: Settings, connection: Transport
) -> None:
    class Single(Named):
        descriptor = {"id": "single"}
        tools = [{"name": "only", "description": "The one tool"}]

    async with Named(settings=settings, announce=False) as several, Single(settings=settings, announce=False) as one:
        client = await client_for(connection, several)
        # A caller that does not send `tool` (a TrustGraph agent, an older bridge) is answered as before.
        assert (await client.request(request({}), timeout=5))["response"] == "(not said)"
        named = [body async for body in client.stream(request({}), limits=CallLimits(5), properties={"tool": "second"})]
        assert named[0]["response"] == "second"
        # A service with one tool knows which one it is without being told.
        assert (await (await client_for(connection, one)).request(request({}), timeout=5))["response"] == "only"
