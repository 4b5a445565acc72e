"""Per-tool RED metrics on both ends of a call: requests, errors by type, durations, with bounded labels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest
from prometheus_client import CollectorRegistry
from support import static_items

from agent_bridge import BadArguments, CallLimits, ToolError, ToolSet, UnknownToolError
from agent_bridge.metrics import ERROR_TYPES, BridgeMetrics
from toolservice_base import ConfigClient, DynamicToolService, Settings, Transport
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.joke import JokeService
from toolservice_base.metrics import OTHER_TOOL, ServiceMetrics

pytestmark = pytest.mark.contract

N_OK = 7
M_FAILED = 3


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_n_calls_and_m_errors_show_in_the_histograms_and_error_counters_of_both_sides(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    service_side, bridge_side = CollectorRegistry(), CollectorRegistry()
    service_metrics = ServiceMetrics(service_side)  # one set of families per registry, as the process default is
    calculator = CalculatorService(connection=connection, settings=settings, announce=False, metrics=service_metrics)
    joke = JokeService(connection=connection, settings=settings, announce=False, metrics=service_metrics)
    await calculator.start()
    await joke.start()
    try:
        await config_client.put(static_items(calculator, joke))
        async with ToolSet(
            connection=connection, settings=settings, poll_interval=60.0, metrics=BridgeMetrics(bridge_side)
        ) as tools:
            for i in range(N_OK):
                assert await tools.invoke("calculate", {"expression": f"{i} + 1"}) == str(i + 1)
            for _ in range(M_FAILED):
                with pytest.raises(ToolError):
                    await tools.invoke("calculate", {"expression": "1 / 0"})
            assert "".join([c async for c in tools.stream("tell-joke", {"topic": "metrics"})])
            for name in ("made-up-1", "made-up-2", "made-up-3"):  # an LLM inventing names
                with pytest.raises(UnknownToolError):
                    await tools.invoke(name, {})
    finally:
        await joke.stop()
        await calculator.stop()

    calc = {"service": "calculator", "tool": "calculate"}
    assert value(service_side, "toolreg_tool_service_request_seconds_count", **calc) == N_OK + M_FAILED
    assert value(service_side, "toolreg_tool_service_requests_total", **calc) == N_OK + M_FAILED
    assert value(service_side, "toolreg_tool_service_errors_total", **calc, kind="exception") == M_FAILED
    assert value(service_side, "toolreg_tool_service_errors_total", **calc, kind="bad-request") == 0
    assert value(service_side, "toolreg_tool_service_requests_total", service="joke-service", tool="tell-joke") == 1

    assert value(bridge_side, "toolreg_bridge_call_seconds_count", **calc) == N_OK + M_FAILED
    assert value(bridge_side, "toolreg_bridge_calls_total", **calc) == N_OK + M_FAILED
    assert value(bridge_side, "toolreg_bridge_call_errors_total", **calc, type="tool-error") == M_FAILED
    assert value(bridge_side, "toolreg_bridge_call_seconds_count", service="joke-service", tool="tell-joke") == 1, (
        "a stream is one call"
    )
    assert 0 < value(bridge_side, "toolreg_bridge_call_seconds_sum", **calc) < 10

    unknown = {"service": "", "tool": OTHER_TOOL}
    assert value(bridge_side, "toolreg_bridge_calls_total", **unknown) == 3
    assert value(bridge_side, "toolreg_bridge_call_errors_total", **unknown, type="unknown-tool") == 3
    tools_seen = {s.labels["tool"] for family in bridge_side.collect() for s in family.samples if "tool" in s.labels}
    assert tools_seen == {"calculate", "tell-joke", OTHER_TOOL}, "invented names never become label values"


async def test_a_service_counts_a_tool_it_does_not_declare_under_other(
    connection: Transport, settings: Settings
) -> None:
    """The `tool` property is the caller's word: a name the service does not declare must not create a series."""
    from toolservice_base import RequestClient

    registry = CollectorRegistry()
    service = JokeService(connection=connection, settings=settings, announce=False, metrics=ServiceMetrics(registry))
    await service.start()
    d = service.service_descriptor
    client = await RequestClient(connection, d.request_queue, d.response_queue).start()
    try:
        request: dict[str, Any] = {"user": "", "config": "{}", "arguments": '{"topic": "x"}'}

        async def ask(**properties: str) -> dict[str, Any]:
            async for body in client.stream(request, limits=CallLimits(5), properties=properties):
                return body
            raise AssertionError("no answer")

        for forged in ("forged-1", "forged-2"):
            assert (await ask(tool=forged)).get("error") is None
        await ask(tool="tell-joke")
        await ask()  # no property (TrustGraph's agent): a one-tool service knows
    finally:
        await client.close()
        await service.stop()
    assert value(registry, "toolreg_tool_service_requests_total", service="joke-service", tool=OTHER_TOOL) == 2
    assert value(registry, "toolreg_tool_service_requests_total", service="joke-service", tool="tell-joke") == 2
    assert {s.labels["tool"] for f in registry.collect() for s in f.samples if "tool" in s.labels} == {
        "tell-joke",
        OTHER_TOOL,
    }


class Unruly(DynamicToolService):
    """`hang` outlasts the service's own limit; `flood` streams without end."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "unruly"}
    tools: ClassVar[list[dict[str, Any]]] = [
        {
            "name": "unruly",
            "description": "Hangs or floods",
            "arguments": [{"name": "mode", "type": "string", "description": "hang or flood"}],
        }
    ]
    call_timeout = 0.3

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> AsyncIterator[str]:
        while arguments.get("mode") == "flood":
            yield "x" * 1000
            await asyncio.sleep(
                0.01
            )  # a real producer waits for something; a loop that never does starves the event loop
        await asyncio.Event().wait()


async def test_deadlines_size_limits_and_refused_arguments_are_counted_per_tool_on_both_sides(
    connection: Transport, settings: Settings, config_client: ConfigClient
) -> None:
    service_side, bridge_side = CollectorRegistry(), CollectorRegistry()
    service = Unruly(connection=connection, settings=settings, announce=False, metrics=ServiceMetrics(service_side))
    await service.start()
    try:
        await config_client.put(static_items(service))
        metrics = BridgeMetrics(bridge_side)
        async with ToolSet(
            connection=connection,
            settings=settings,
            poll_interval=60.0,
            metrics=metrics,
            limits=CallLimits(max_answer_bytes=5000),
        ) as tools:
            with pytest.raises(ToolError) as caught:
                await tools.invoke("unruly", {"mode": "hang"})  # the service's 0.3 s limit ends it
            assert caught.value.type == "timeout"
            with pytest.raises(ToolError) as caught:
                await tools.invoke("unruly", {"mode": "flood"})
            assert caught.value.type == "answer-too-large"
            with pytest.raises(BadArguments):
                tools.stream("unruly", {"volume": 11})  # refused before anything is sent
        labels = {"service": "unruly", "tool": "unruly"}

        def cancelled() -> float:
            return value(service_side, "toolreg_tool_service_errors_total", **labels, kind="cancelled")

        for _ in range(50):  # the flood is stopped by the caller's cancel, a moment after the call returned
            if cancelled() == 2:
                break
            await asyncio.sleep(0.1)
    finally:
        await service.stop()
    assert cancelled() == 2, "the deadline and the cancel both end invoke, under the tool's own label"
    assert value(service_side, "toolreg_tool_service_requests_total", **labels) == 2, (
        "the refused arguments never reached it"
    )
    assert value(bridge_side, "toolreg_bridge_calls_total", **labels) == 3
    for kind in ("timeout", "answer-too-large", "bad-arguments"):
        assert value(bridge_side, "toolreg_bridge_call_errors_total", **labels, type=kind) == 1, kind
    assert value(bridge_side, "toolreg_bridge_call_errors_total", **labels, type="tool-error") == 0


def test_every_bridge_error_type_exists_at_zero_for_a_tool_once_it_is_called() -> None:
    registry = CollectorRegistry()
    metrics = BridgeMetrics(registry)
    with metrics.timed("svc", "t"):
        pass
    for kind in ERROR_TYPES:
        assert (
            registry.get_sample_value("toolreg_bridge_call_errors_total", {"service": "svc", "tool": "t", "type": kind})
            == 0
        )
    assert registry.get_sample_value("toolreg_bridge_calls_total", {"service": "svc", "tool": "t"}) == 1
