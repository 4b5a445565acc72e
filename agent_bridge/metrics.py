"""Prometheus metrics of the agent bridge: calls, errors by type and latency, per tool and service.

The service side counts what it served (`toolservice_base.metrics`); this
counts what the agent saw, which also holds what never reached a service:
unknown tools, timeouts, a broker that is down.

Labels are bounded by the tool set. `tool` is a name the set held when the
call was made, else `(other)` (an LLM inventing tool names cannot create
series); `service` is that tool's service (empty for tool types that have
none); `type` is one of `ERROR_TYPES`. The service's own error types
(`ExpressionError`, ...) are unbounded text from the network, so they all
count as `tool-error`; the span and the raised `ToolError` carry the real one.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from toolservice_base.errors import RequestTimeout, ToolError, TransportError, UnknownToolError
from toolservice_base.metrics import LATENCY_BUCKETS, OTHER_TOOL


@dataclass(frozen=True)
class ErrorType:
    """One value of the `type` label, and what the rest of the bridge makes of it."""

    on_wire: bool
    """A service may answer with it (`ToolError.type`): a `ToolError` of this type keeps it, any other counts as
    `tool-error`, since a service's own error types are unbounded text from the network."""
    tool_at_fault: bool
    """It counts against the tool's health in search (`search.CallHealth`); otherwise it was the caller's mistake
    (bad arguments, an unknown tool), the caller's bound (`answer-too-large`) or the caller giving up (`cancelled`)."""


ERROR_TYPES: dict[str, ErrorType] = {
    "unknown-tool": ErrorType(on_wire=False, tool_at_fault=False),
    "timeout": ErrorType(on_wire=True, tool_at_fault=True),
    "busy": ErrorType(on_wire=True, tool_at_fault=True),
    "bad-request": ErrorType(on_wire=True, tool_at_fault=False),
    "bad-response": ErrorType(on_wire=True, tool_at_fault=True),
    "bad-arguments": ErrorType(on_wire=True, tool_at_fault=False),
    "answer-too-large": ErrorType(on_wire=True, tool_at_fault=False),
    "client-closed": ErrorType(on_wire=True, tool_at_fault=True),
    "tool-error": ErrorType(on_wire=False, tool_at_fault=True),
    "transport": ErrorType(on_wire=False, tool_at_fault=True),
    "cancelled": ErrorType(on_wire=False, tool_at_fault=False),
    "other": ErrorType(on_wire=False, tool_at_fault=True),
}
"""Every `type` a failed call is counted under, the one table of them. `tool-error`: the service answered with an
error of its own; the others are the product's. `timeout` is the caller's deadline or the service's own limit (it
answers `timeout`); `cancelled`, a caller that gave up."""

_ON_WIRE = frozenset(name for name, kind in ERROR_TYPES.items() if kind.on_wire)
MAX_SERIES = 10_000
"""Distinct (service, tool) pairs kept; past it, new pairs count under (`(other)`, `(other)`): reloads cannot grow
memory forever."""

T = TypeVar("T")


def error_type(exc: BaseException) -> str:
    """The `type` label of a failed call."""
    if isinstance(exc, UnknownToolError):
        return "unknown-tool"
    if isinstance(exc, ToolError):
        return exc.type if exc.type in _ON_WIRE else "tool-error"
    if isinstance(exc, (RequestTimeout, TimeoutError)):
        return "timeout"
    if isinstance(exc, TransportError):
        return "transport"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return "other"


class _Children:
    __slots__ = ("calls", "seconds", "errors")

    def __init__(self, metrics: BridgeMetrics, service: str, tool: str) -> None:
        self.calls = metrics.calls.labels(service, tool)
        self.seconds = metrics.seconds.labels(service, tool)
        self.errors = {kind: metrics.errors.labels(service, tool, kind) for kind in ERROR_TYPES}


class BridgeMetrics:
    """The bridge's metric families, registered once per registry."""

    _default: BridgeMetrics | None = None
    _default_lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.calls = Counter(
            "toolreg_bridge_calls",
            "Tool calls the agent bridge made (invoke and stream), by tool and service.",
            ["service", "tool"],
            registry=registry,
        )
        self.errors = Counter(
            "toolreg_bridge_call_errors",
            "Calls that failed, by type: unknown-tool, timeout, busy, bad-request, bad-response, bad-arguments,"
            " answer-too-large, client-closed, tool-error (the service's own error), transport, cancelled, other.",
            ["service", "tool", "type"],
            registry=registry,
        )
        self.seconds = Histogram(
            "toolreg_bridge_call_seconds",
            "Time from the call to its last chunk (a whole stream for streaming tools), as the agent waited for it.",
            ["service", "tool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.dropped = Counter(
            "toolreg_bridge_dropped_answers",
            "Answers dropped because the key in the service's config (answer-key) did not sign them: another process"
            " answering on the service's queues. reason: unsigned, forged (another key or a bad signature).",
            ["service", "reason"],
            registry=registry,
        )
        self._children: dict[tuple[str, str], _Children] = {}

    @classmethod
    def default(cls) -> BridgeMetrics:
        """The process-wide instance on the default registry (created on first use)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default

    def children(self, service: str, tool: str) -> _Children:
        found = self._children.get((service, tool))
        if found is None:
            if len(self._children) >= MAX_SERIES:
                service = tool = OTHER_TOOL
                found = self._children.get((service, tool))
            if found is None:
                found = self._children[(service, tool)] = _Children(self, service, tool)
        return found

    def answer_dropped(self, service: str, why: str) -> None:
        """Count an answer not signed by the service's key (`why`: what the check said), by `unsigned`/`forged`."""
        self.dropped.labels(service, "unsigned" if why == "unsigned" else "forged").inc()

    def timed(self, service: str, tool: str) -> _Timed:
        """`with metrics.timed(service, tool):` around one call: counted, timed, and its error classified."""
        return _Timed(self.children(service, tool))

    def failed(self, service: str, tool: str, exc: BaseException) -> None:
        """A call that failed before it started (an unknown tool): counted as a call of no duration, and its error."""
        children = self.children(service, tool)
        children.calls.inc()
        children.seconds.observe(0.0)
        children.errors[error_type(exc)].inc()

    async def timed_stream(self, service: str, tool: str, chunks: AsyncIterator[T]) -> AsyncIterator[T]:
        """`chunks`, counted and timed as one call from the first read to the last chunk."""
        with self.timed(service, tool):
            try:
                async for chunk in chunks:
                    yield chunk
            finally:  # a caller that stops reading closes this; the call underneath must end now too
                close = getattr(chunks, "aclose", None)
                if close is not None:
                    await close()


class _Timed:
    __slots__ = ("_children", "_started")

    def __init__(self, children: _Children) -> None:
        self._children = children
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        children = self._children
        children.calls.inc()
        children.seconds.observe(time.perf_counter() - self._started)
        if exc is not None and not isinstance(exc, GeneratorExit):
            children.errors[error_type(exc)].inc()
