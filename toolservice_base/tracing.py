"""OpenTelemetry spans around tool calls, through `opentelemetry-api` only.

The application chooses the SDK and the exporter (`toolreg` does it from the
standard `OTEL_*` variables when `tool-discovery[otel]` is installed). With
no SDK configured the global tracer provider is the API's proxy, and every
function here returns before creating anything: no span object, no context
switch, no `traceparent` parsed or written. That check is one global read
per call, which is why it is done here instead of relying on the API's
non-recording spans (those still cost a context attach and detach per call).

What is traced:

- a client span (`call <tool>`) around each call the bridge sends, its W3C
  `traceparent` carried in the request's message properties;
- a server span (`serve <tool>`) in `DynamicToolService`, the client span's
  child, with the tool, service, instance and outcome as attributes;
- a producer span (`announce <service>`) per announce or withdraw, its
  `traceparent` on the announcement message, and the registry's merge and
  store write (`registry.merge`, `registry.write`), linked to the
  announcements they carry: one merge may coalesce many services' messages,
  so they are links, not parents.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Link, ProxyTracerProvider, Span, SpanContext, SpanKind, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from toolservice_base.rpc.wire import TOOL

# --- the OpenTelemetry standard's variables `toolreg` chooses its tracing set-up by ------------------------------

TRACES_EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
OTLP_TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTLP_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_PROTOCOL"
SDK_DISABLED_ENV = "OTEL_SDK_DISABLED"
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"
TRACER_PROVIDER_ENV = "OTEL_PYTHON_TRACER_PROVIDER"


@dataclass(frozen=True)
class TracingEnv:
    """The standard `OTEL_*` variables `toolreg` chooses its tracing set-up by; the SDK reads the others itself."""

    sdk_disabled: bool = False
    """`OTEL_SDK_DISABLED` is `true` (any case): no tracing, whatever else is set."""
    traces_exporter: str = ""
    """`OTEL_TRACES_EXPORTER` as given: exporter names, comma-separated (`otlp`, `console`, `none`)."""
    otlp_endpoint: bool = False
    """`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set (not blank): that alone asks for
    `otlp`."""
    otlp_protocol: str = "http/protobuf"
    """`OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` (the default when unset or blank) or `grpc`."""
    service_name: str | None = None
    """`OTEL_SERVICE_NAME` (None when unset or empty): the SDK names the spans' service by it."""

    @classmethod
    def from_env(cls) -> "TracingEnv":
        return cls(
            sdk_disabled=os.environ.get(SDK_DISABLED_ENV, "").strip().lower() == "true",
            traces_exporter=os.environ.get(TRACES_EXPORTER_ENV, ""),
            otlp_endpoint=bool(
                os.environ.get(OTLP_TRACES_ENDPOINT_ENV, "").strip() or os.environ.get(OTLP_ENDPOINT_ENV, "").strip()
            ),
            otlp_protocol=os.environ.get(OTLP_PROTOCOL_ENV, "").strip() or "http/protobuf",
            service_name=os.environ.get(SERVICE_NAME_ENV) or None,
        )


def tracer_provider_named() -> bool:
    """`OTEL_PYTHON_TRACER_PROVIDER` is set: the OpenTelemetry API then builds its global provider from that name."""
    return os.environ.get(TRACER_PROVIDER_ENV) is not None


SCOPE = "tool-discovery"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TOOL_PROPERTY = TOOL
"""Message property naming the tool a request is for (`rpc_wire.TOOL`): the protocol has no field for it, and a
service's metrics and spans want it."""
MAX_LINKS = 32
"""Links kept per merge: a burst of a thousand announcements is one merge, not a span with a thousand links."""

_PROPAGATOR = TraceContextTextMapPropagator()
_override: trace.TracerProvider | None = None
_cached: tuple[trace.TracerProvider, Tracer] | None = None
_READ_GLOBAL = hasattr(trace, "_TRACER_PROVIDER") and not tracer_provider_named()
"""Read the API's global directly: `get_tracer_provider()` looks up an environment variable on every call
(1.4 us, measured), which would be most of what an untraced call pays here. Where the API differs, or the
provider is named by that variable, the public function is used."""

T = TypeVar("T")


class _Untraced(AbstractContextManager[T]):
    """What every function here returns when nothing records: enter, hand back a value, exit. Nothing else."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value

    def __enter__(self) -> T:
        return self.value

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        return None


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Trace with `provider` instead of the global one; None goes back to the global.

    For applications that keep a provider of their own instead of setting the
    global one (and for tests, which must not set a process-wide global).
    """
    global _override
    _override = provider


def tracer() -> Tracer | None:
    """The tracer to use, or None when nothing would record (no SDK configured): callers then skip tracing entirely."""
    global _cached
    provider: trace.TracerProvider | None = _override
    if provider is None:
        provider = getattr(trace, "_TRACER_PROVIDER", None) if _READ_GLOBAL else trace.get_tracer_provider()
        if provider is None or isinstance(provider, (ProxyTracerProvider, trace.NoOpTracerProvider)):
            return None
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    found = provider.get_tracer(SCOPE)
    _cached = (provider, found)
    return found


def inject(span: Span, properties: dict[str, str]) -> dict[str, str]:
    """Write `span`'s W3C `traceparent` (and `tracestate`) into message `properties`; returns them."""
    _PROPAGATOR.inject(properties, context=trace.set_span_in_context(span))
    return properties


def remote_context(properties: Mapping[str, str]) -> SpanContext | None:
    """The sender's span context from a message's `traceparent`, or None (absent, malformed, or no SDK here)."""
    if TRACEPARENT not in properties or tracer() is None:
        return None
    context = trace.get_current_span(_PROPAGATOR.extract(properties)).get_span_context()
    return context if context.is_valid else None


class _Outcome:
    """What a traced block reports back: the outcome attribute, and the error if there was one."""

    __slots__ = ("span", "properties")

    def __init__(self, span: Span | None, properties: dict[str, str]) -> None:
        self.span = span
        self.properties = properties
        """Message properties to send: the tool name, and `traceparent` when a span is recording."""

    def set(self, key: str, value: str) -> None:
        if self.span is not None:
            self.span.set_attribute(key, value)

    def rename(self, name: str) -> None:
        if self.span is not None:
            self.span.update_name(name)


def _close(span: Span, exc: BaseException | None, outcome: str | None = None) -> None:
    if exc is not None and not isinstance(exc, GeneratorExit):
        span.record_exception(exc)
        span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        span.set_attribute("tool.outcome", outcome or "error")
        declared = getattr(exc, "type", None)  # a ToolError's type is the service's own (`ExpressionError`)
        span.set_attribute("error.type", declared if isinstance(declared, str) and declared else type(exc).__name__)
    elif outcome is not None:
        span.set_attribute("tool.outcome", outcome)
    span.end()


def _ending(exc: BaseException) -> str:
    if isinstance(exc, GeneratorExit):
        return "closed"  # the caller stopped reading a stream: not an error of the call
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return "error"


def client_call(tool: str, service: str) -> AbstractContextManager[_Outcome]:
    """A client span around one call to `service` (not made current: it lives across a stream's yields).

    Enters as the message properties to send with the request: the tool's
    name and, when tracing, the span's `traceparent`, so the service's span
    becomes its child.
    """
    properties = {TOOL_PROPERTY: tool} if tool else {}
    found = tracer()
    if found is None:
        return _Untraced(_Outcome(None, properties))
    return _client_span(found, tool, service, properties)


@contextmanager
def _client_span(found: Tracer, tool: str, service: str, properties: dict[str, str]) -> Iterator[_Outcome]:
    span = found.start_span(
        f"call {tool or service}",
        kind=SpanKind.CLIENT,
        attributes={"tool.name": tool, "tool.service": service, "messaging.system": "pulsar"},
    )
    inject(span, properties)
    try:
        yield _Outcome(span, properties)
    except BaseException as exc:
        _close(span, exc, _ending(exc))
        raise
    _close(span, None, "ok")


def server_call(
    properties: Mapping[str, str], tool: str, service: str, instance: str
) -> AbstractContextManager[_Outcome]:
    """The service's span for one request: current while the handler runs, the caller's span as parent."""
    found = tracer()
    if found is None:
        return _UNTRACED_SERVER
    return _server_span(found, properties, tool, service, instance)


@contextmanager
def _server_span(
    found: Tracer, properties: Mapping[str, str], tool: str, service: str, instance: str
) -> Iterator[_Outcome]:
    parent = _PROPAGATOR.extract(properties) if TRACEPARENT in properties else None
    attributes = {"tool.name": tool, "tool.service": service, "tool.instance": instance}
    with found.start_as_current_span(
        f"serve {tool}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield _Outcome(span, {})


_UNTRACED_SERVER = _Untraced(_Outcome(None, {}))


def outcome(handle: _Outcome, error: str | None, error_type: str | None = None) -> None:
    """Record how a served request ended: `ok`, or the error kind (`bad-request`, `exception`, `timeout`, `cancelled`)
    and type.

    `cancelled` (its caller gave up, or the service is shutting down) is not the service's failure: the span
    says so without an error status. A `timeout` (the call's deadline passed) is an error.
    """
    span = handle.span
    if span is None:
        return
    span.set_attribute("tool.outcome", error or "ok")
    if error is not None:
        span.set_attribute("error.type", error_type or error)
        if error != "cancelled":
            span.set_status(StatusCode.ERROR, error_type or error)


def announcement(kind: str, service: str, instance: str) -> AbstractContextManager[dict[str, str] | None]:
    """A producer span per announce or withdraw; enters as the properties to send (None when not tracing)."""
    found = tracer()
    if found is None:
        return _Untraced(None)
    return _announcement_span(found, kind, service, instance)


@contextmanager
def _announcement_span(found: Tracer, kind: str, service: str, instance: str) -> Iterator[dict[str, str] | None]:
    with found.start_as_current_span(
        f"announce {service}",
        kind=SpanKind.PRODUCER,
        attributes={"tool.service": service, "tool.instance": instance, "announcement.kind": kind},
    ) as span:
        yield inject(span, {})


def registry_merge(services: int, links: Iterable[SpanContext]) -> AbstractContextManager[None]:
    """The registry's merge of one batch, linked to the announcements that caused it; current, so writes nest under
    it."""
    found = tracer()
    if found is None:
        return _Untraced(None)
    return _merge_span(found, services, links)


@contextmanager
def _merge_span(found: Tracer, services: int, links: Iterable[SpanContext]) -> Iterator[None]:
    kept = [Link(context) for context, _ in zip(links, range(MAX_LINKS))]
    with found.start_as_current_span(
        "registry.merge", kind=SpanKind.INTERNAL, links=kept, attributes={"registry.services": services}
    ):
        yield


def registry_write(workspace: str, puts: int, deletes: int) -> AbstractContextManager[None]:
    """One conditional write to the config store, inside the merge that planned it."""
    found = tracer()
    if found is None:
        return _Untraced(None)
    return _write_span(found, workspace, puts, deletes)


@contextmanager
def _write_span(found: Tracer, workspace: str, puts: int, deletes: int) -> Iterator[None]:
    attributes: dict[str, Any] = {"config.workspace": workspace, "config.puts": puts, "config.deletes": deletes}
    with found.start_as_current_span("registry.write", kind=SpanKind.CLIENT, attributes=attributes):
        yield


__all__ = [
    "MAX_LINKS",
    "TOOL_PROPERTY",
    "TRACEPARENT",
    "announcement",
    "client_call",
    "inject",
    "outcome",
    "registry_merge",
    "registry_write",
    "remote_context",
    "server_call",
    "tracer",
    "use_tracer_provider",
]
