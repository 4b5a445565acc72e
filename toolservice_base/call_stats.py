"""Per-tool call counters a service sends with its heartbeats, so the registry page can show each tool's traffic.

Why a message property and not a field of `Announcement`: the announcement
forbids unknown fields, so a new field would make every registry of an older
release refuse the heartbeats of newer services during a rolling upgrade.
A property on the heartbeat (`tool-stats`) is ignored by those registries.

Its value is compact JSON, `{"<tool>": [calls, errors, p95_ms], ...}`, one
entry per tool the service declares: `calls` and `errors` count since the
instance started (the registry turns the difference between two heartbeats
into a rate), `p95_ms` is the 95th percentile latency, in milliseconds, of
the calls since the previous heartbeat (null when there were none). Past
`MAX_TOOL_STATS_BYTES` the property is left off (the heartbeat still goes).

Unsigned: a signature covers the announcement's body only, never its
properties. The figures are informational; a forged property can mislead the
page, and nothing else: the registry reads it only beside a heartbeat it
accepted, only for the tools that instance offers, and never lets it change
a lease or the tool set.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Collection, Iterable

from .logs import get_logger

log = get_logger("toolservice_base.call_stats")

TOOL_STATS = "tool-stats"
"""The heartbeat's message property that carries the counters."""
MAX_TOOL_STATS_BYTES = 4096
"""The largest property a service sends and a registry reads: enough for about a hundred tools."""
WINDOW_LATENCIES = 1024
"""Latencies kept per tool between two heartbeats, the newest: a busier window's p95 is that of its last 1,024 calls."""

ToolCounters = tuple[int, int, float | None]
"""(calls since start, errors since start, p95 in ms over the calls since the previous heartbeat, or None)."""


class _Tool:
    __slots__ = ("calls", "errors", "latencies")

    def __init__(self, window: int) -> None:
        self.calls = 0
        self.errors = 0
        self.latencies: deque[float] = deque(maxlen=window)


def p95(latencies: Iterable[float]) -> float | None:
    """The nearest-rank 95th percentile, or None for no values."""
    ordered = sorted(latencies)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class CallStats:
    """One instance's counters per declared tool; `record` is on every call's path, so it only adds and appends.

    Runs on the service's event loop (calls end there, heartbeats are sent
    there), so it needs no lock. Memory is bounded: a counter pair and at most
    `window` floats per declared tool; calls of undeclared tools (`(other)`)
    are not counted here (the registry would not show them).
    """

    __slots__ = ("_tools", "_oversized", "_window")

    def __init__(self, tools: Iterable[str], window: int = WINDOW_LATENCIES) -> None:
        self._window = window
        self._tools = {tool: _Tool(window) for tool in tools}
        self._oversized = False

    def track(self, tools: Iterable[str]) -> None:
        """Count `tools` from now on (a service whose tools changed): those kept keep their counters."""
        self._tools = {tool: self._tools.get(tool) or _Tool(self._window) for tool in tools}

    def record(self, tool: str, seconds: float, failed: bool) -> None:
        """One call of `tool` ended after `seconds`, with an error or not."""
        counters = self._tools.get(tool)
        if counters is None:
            return
        counters.calls += 1
        counters.errors += failed
        counters.latencies.append(seconds)

    def take(self) -> dict[str, ToolCounters]:
        """The counters now, and each tool's p95 over the window; a new window starts."""
        taken: dict[str, ToolCounters] = {}
        for name, counters in self._tools.items():
            slowest = p95(counters.latencies)
            counters.latencies.clear()
            taken[name] = (counters.calls, counters.errors, None if slowest is None else round(slowest * 1000, 3))
        return taken

    def property(self) -> dict[str, str]:
        """The heartbeat's properties: `{TOOL_STATS: ...}`, or none if they would not fit (said once, at debug)."""
        text = json.dumps(self.take(), separators=(",", ":"))
        if len(text.encode()) > MAX_TOOL_STATS_BYTES:
            if not self._oversized:
                self._oversized = True
                log.debug(
                    "heartbeat.stats_dropped",
                    bytes=len(text.encode()),
                    limit=MAX_TOOL_STATS_BYTES,
                    note="too many tools to carry their call counters; heartbeats go without them",
                )
            return {}
        return {TOOL_STATS: text}


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a count must be a non-negative integer, not {json.dumps(value)[:40]}")
    return value


def _millis(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"a p95 must be null or a non-negative number of milliseconds, not {json.dumps(value)[:40]}")
    return float(value)


def parse_tool_stats(text: str, tools: Collection[str]) -> dict[str, ToolCounters]:
    """The counters of a `tool-stats` property, for the `tools` its sender offers (others are left out).

    Raises `ValueError` saying what is wrong with a property that is too
    large, not JSON, or not `{tool: [calls, errors, p95_ms or null]}` with
    non-negative numbers and no more errors than calls.
    """
    if len(text.encode()) > MAX_TOOL_STATS_BYTES:
        raise ValueError(f"{len(text.encode())} bytes, over the limit of {MAX_TOOL_STATS_BYTES}")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(body, dict):
        raise ValueError(f"a JSON object was expected, not {type(body).__name__}")
    found: dict[str, ToolCounters] = {}
    for tool, value in body.items():
        if not isinstance(value, list) or len(value) != 3:
            raise ValueError(f"tool {tool[:128]!r}: [calls, errors, p95_ms] was expected")
        calls, errors, slowest = _count(value[0]), _count(value[1]), _millis(value[2])
        if errors > calls:
            raise ValueError(f"tool {tool[:128]!r}: {errors} errors out of {calls} calls")
        if tool in tools:
            found[tool] = (calls, errors, slowest)
    return found
