"""Prometheus metrics of a tool service: requests, errors, latency, per tool.

Why the label children are bound once per service (`bind`): looking up
`.labels(service)` on every request takes a lock and a dict lookup; a bound
child is one lock-protected add. Measured: about 3 microseconds of metrics per
request (a counter and a 15-bucket histogram), around 1 % of a loopback
request/response round trip.

The `tool` label takes the service's own tool names and `(other)`, nothing
else: a request naming a tool the service does not declare (a hand-wired
alias, a forged property) counts under `(other)`, so no caller can create
series. `(other)` cannot be a tool name (names are `[A-Za-z0-9_.-]`).

The metric objects live in a `CollectorRegistry`: the process-wide default
one (what `/metrics` serves) unless a test passes its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

ERROR_KINDS = ("bad-request", "exception", "cancelled")
"""`bad-request`: the request could not be parsed; `exception`: `invoke` raised; `cancelled`: `invoke` was
stopped at the call's deadline (the caller's or the service's) or because its caller gave up."""

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds. Tools range from sub-millisecond lookups to long LLM-side work; the top buckets catch the latter."""
OTHER_TOOL = "(other)"
"""The `tool` label of requests for a tool the service (or the bridge's set) does not hold."""


class ServiceMetrics:
    """The tool-service metric families, registered once per registry."""

    _default: ServiceMetrics | None = None
    _default_lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.requests = Counter(
            "toolreg_tool_service_requests",
            "Requests a tool service handled (answered with a result or an error).",
            ["service", "tool"],
            registry=registry,
        )
        self.errors = Counter(
            "toolreg_tool_service_errors",
            "Requests that failed: bad-request (unparseable), exception (invoke raised), cancelled (deadline or caller"
            " gone).",
            ["service", "tool", "kind"],
            registry=registry,
        )
        self.latency = Histogram(
            "toolreg_tool_service_request_seconds",
            "Time from taking a request to sending its last response (whole stream for streaming tools).",
            ["service", "tool"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    @classmethod
    def default(cls) -> ServiceMetrics:
        """The process-wide instance on the default registry (created on first use)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default

    def bind(self, service: str, tools: Iterable[str] = ()) -> BoundServiceMetrics:
        """The children of one service and its declared `tools` (plus `(other)`), resolved once."""
        return BoundServiceMetrics(self, service, tools)


class _ToolChildren:
    __slots__ = ("requests", "latency", "errors")

    def __init__(self, metrics: ServiceMetrics, service: str, tool: str) -> None:
        self.requests = metrics.requests.labels(service, tool)
        self.latency = metrics.latency.labels(service, tool)
        self.errors = {kind: metrics.errors.labels(service, tool, kind) for kind in ERROR_KINDS}


class BoundServiceMetrics:
    """One service's children, resolved up front so the hot path does no label lookups.

    Every tool and error kind is created here, so each series exists at 0
    from the start and `rate()` over it works before the first error.
    """

    __slots__ = ("service", "_tools", "_other")

    def __init__(self, metrics: ServiceMetrics, service: str, tools: Iterable[str] = ()) -> None:
        self.service = service
        self._tools = {tool: _ToolChildren(metrics, service, tool) for tool in tools}
        self._other = _ToolChildren(metrics, service, OTHER_TOOL)

    def observe(self, seconds: float, error: str | None = None, tool: str | None = None) -> None:
        """Count one handled request of `tool`; `error` is one of `ERROR_KINDS`, or None."""
        children = self._tools.get(tool, self._other) if tool is not None else self._other
        children.requests.inc()
        children.latency.observe(seconds)
        if error is not None:
            children.errors[error].inc()
