"""OpenTelemetry: a call is one trace across the bridge and the service; the registry's merge links to the announcement.

Spans are recorded by the SDK's in-memory exporter on a provider handed to
`toolservice_base.tracing.use_tracer_provider`, never the process-wide global,
so every other test in the run keeps the untraced path (no SDK configured).
Without an SDK the product must not even notice: that is checked in a
process where `opentelemetry.sdk` cannot be imported at all.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support import eventually
from support.registry import FAST

from agent_bridge import ToolError, ToolServiceClient, ToolSet
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, DynamicToolService, Settings, Transport, tracing
from toolservice_base.examples.joke import JokeService

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)
    provider.shutdown()


def items(*services: DynamicToolService) -> list[tuple[str, str, str]]:
    out = [("tool-service", s.id, s.service_descriptor.to_json()) for s in services]
    return out + [("tool", t.name, t.to_json()) for s in services for t in s.tool_descriptors]


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name.startswith(prefix)]


async def test_one_invoke_is_a_client_span_with_the_service_span_as_its_child(
    spans: InMemorySpanExporter,
    connection: Transport,
    settings: Settings,
    config_client: ConfigClient,
    running: dict[str, DynamicToolService],
) -> None:
    calculator = running["calculator"]
    await config_client.put(items(calculator))
    async with ToolSet(connection=connection, settings=settings, poll_interval=60.0) as tools:
        spans.clear()
        assert await tools.invoke("calculate", {"expression": "6 * 7"}) == "42"
        await eventually(lambda: named(spans, "serve "), timeout=5)
    (client,) = named(spans, "call ")
    (server,) = named(spans, "serve ")
    assert client.kind == SpanKind.CLIENT and server.kind == SpanKind.SERVER
    assert client.name == "call calculate" and server.name == "serve calculate"
    assert server.context.trace_id == client.context.trace_id, "one trace across the broker"
    assert server.parent is not None and server.parent.span_id == client.context.span_id, (
        "the service's span is the call's child"
    )
    assert server.parent.is_remote
    attributes = dict(server.attributes or {})
    assert attributes["tool.name"] == "calculate" and attributes["tool.service"] == "calculator"
    assert attributes["tool.instance"] == calculator.instance and attributes["tool.outcome"] == "ok"
    assert dict(client.attributes or {})["tool.outcome"] == "ok"


async def test_a_failing_call_marks_both_spans_with_the_services_error_type(
    spans: InMemorySpanExporter,
    connection: Transport,
    settings: Settings,
    config_client: ConfigClient,
    running: dict[str, DynamicToolService],
) -> None:
    await config_client.put(items(running["calculator"]))
    async with ToolSet(connection=connection, settings=settings, poll_interval=60.0) as tools:
        spans.clear()
        with pytest.raises(ToolError, match="division by zero"):
            await tools.invoke("calculate", {"expression": "1 / 0"})
        await eventually(lambda: named(spans, "serve "), timeout=5)
    (client,) = named(spans, "call ")
    (server,) = named(spans, "serve ")
    assert not client.status.is_ok and not server.status.is_ok
    assert dict(server.attributes or {})["tool.outcome"] == "exception"
    assert dict(server.attributes or {})["error.type"] == "ExpressionError"
    assert dict(client.attributes or {})["error.type"] == "ExpressionError", (
        "the client span carries the service's type"
    )


class Dawdler(DynamicToolService):
    """One chunk, then nothing: ended by the service's limit, or by its caller leaving."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "dawdler"}
    tools: ClassVar[list[dict[str, Any]]] = [{"name": "dawdle", "description": "Says one thing, then waits forever"}]
    call_timeout = 0.3

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> AsyncIterator[str]:
        yield "first"
        await asyncio.Event().wait()


async def test_a_call_ended_by_the_services_limit_is_a_timeout_on_both_spans(
    spans: InMemorySpanExporter, connection: Transport, settings: Settings
) -> None:
    async with Dawdler(connection=connection, settings=settings, announce=False) as service:
        client = ToolServiceClient(connection, service.service_descriptor)
        spans.clear()
        with pytest.raises(ToolError) as caught:
            await client.call("", {}, {}, 10, tool="dawdle")
        assert caught.value.type == "timeout"
        await eventually(lambda: named(spans, "serve "), timeout=5)
        await client.close()
    (server,) = named(spans, "serve ")
    (call,) = named(spans, "call ")
    assert dict(server.attributes or {})["tool.outcome"] == "timeout" and server.status.status_code == StatusCode.ERROR
    assert dict(call.attributes or {})["error.type"] == "timeout", "the caller sees the service's `timeout` answer"


async def test_a_call_its_caller_leaves_is_cancelled_on_the_service_span_and_not_an_error(
    spans: InMemorySpanExporter, connection: Transport, settings: Settings
) -> None:
    class Patient(Dawdler):
        call_timeout = 30.0

    async with Patient(connection=connection, settings=settings, announce=False) as service:
        client = ToolServiceClient(connection, service.service_descriptor)
        spans.clear()
        async with aclosing(client.stream("", {}, {}, 10, tool="dawdle")) as chunks:
            assert await anext(chunks) == "first"  # then the caller leaves: the service is told to stop
        await eventually(lambda: named(spans, "serve "), timeout=5)
        await client.close()
    (server,) = named(spans, "serve ")
    (call,) = named(spans, "call ")
    assert dict(server.attributes or {})["tool.outcome"] == "cancelled"
    assert server.status.status_code != StatusCode.ERROR, "a caller giving up is not the service's failure"
    assert dict(call.attributes or {})["tool.outcome"] == "closed"


async def test_the_registry_merge_links_to_the_announcing_service_and_the_write_nests_under_it(
    spans: InMemorySpanExporter, connection: Transport, settings: Settings, config_store: ConfigStoreService
) -> None:
    registry = Registry(connection, options=FAST)
    await registry.start()
    joke = JokeService(connection=connection, settings=settings)
    try:
        await joke.start()
        await eventually(lambda: [s for s in named(spans, "registry.write")], timeout=10)
    finally:
        await joke.stop()
        await registry.stop()
    announce = next(s for s in named(spans, "announce ") if dict(s.attributes or {})["announcement.kind"] == "announce")
    assert announce.kind == SpanKind.PRODUCER and dict(announce.attributes or {})["tool.instance"] == joke.instance
    merges = [
        m
        for m in named(spans, "registry.merge")
        if any(link.context.span_id == announce.context.span_id for link in m.links)
    ]
    assert merges, "a merge links to the announce that caused it"
    merge = merges[0]
    assert merge.context.trace_id != announce.context.trace_id, (
        "linked, not parented: one merge may carry many services"
    )
    writes = [
        w for w in named(spans, "registry.write") if w.parent is not None and w.parent.span_id == merge.context.span_id
    ]
    assert writes and dict(writes[0].attributes or {})["config.puts"] >= 3  # tool-service, tool, ownership record
    withdraws = [s for s in named(spans, "announce ") if dict(s.attributes or {})["announcement.kind"] == "withdraw"]
    assert len(withdraws) == 1


async def test_without_a_provider_nothing_is_traced_and_no_traceparent_is_sent() -> None:
    """The default (no SDK configured): the client sends the tool's name and nothing else."""
    assert tracing.tracer() is None
    with tracing.client_call("calculate", "calculator") as call:
        assert call.properties == {"tool": "calculate"}
        assert call.span is None
    assert tracing.remote_context({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}) is None


NO_SDK = """
import asyncio, builtins, json, os, sys
real_import = builtins.__import__
def refuse_sdk(name, *args, **kwargs):
    if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
        raise ImportError(f"No module named {name!r} (blocked: this process has no OpenTelemetry SDK)")
    return real_import(name, *args, **kwargs)
builtins.__import__ = refuse_sdk

from toolservice_base import configure_logging
configure_logging("warning", json=True)
from discovery.cli.otel import configure_tracing
from toolservice_base.testing import ServiceHarness
from toolservice_base.examples.calculator import CalculatorService

async def main():
    async with ServiceHarness(CalculatorService) as h:
        return await h.invoke("calculate", {"expression": "2 + 2"})

os.environ["OTEL_TRACES_EXPORTER"] = "otlp"
print(json.dumps({"configured": configure_tracing("toolreg-test"), "answer": asyncio.run(main()),
                  "sdk_loaded": any(m.startswith("opentelemetry.sdk") for m in sys.modules)}))
"""


def test_with_no_sdk_installed_the_otel_variables_cost_one_warning_and_calls_work() -> None:
    result = subprocess.run([sys.executable, "-c", NO_SDK], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == {"configured": None, "answer": "4", "sdk_loaded": False}
    warnings = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    (warning,) = [w for w in warnings if w["event"] == "otel.sdk_missing"]
    assert "tool-discovery[otel]" in warning["fix"]
