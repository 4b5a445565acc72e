"""Each announced tool's traffic for the registry page: calls and errors per second, and p95 latency.

The figures come from the services themselves: each heartbeat may carry its
instance's counters per tool (the `tool-stats` property,
`toolservice_base.call_stats`). The registry keeps the last two samples of
each instance, on its lease, so they go when the lease goes and are bounded
like leases are (`max_instances`, and `MAX_TOOL_STATS_BYTES` per sample).

Per tool, over the instances that are live:

- calls/s and errors/s: for each instance, the difference of its counters
  between its last two heartbeats over the time between them (the sender's
  `sent-at`), summed. A counter that went down means the counting started
  again: that instance adds nothing until its next heartbeat.
- p95: the highest of the instances' p95s over the calls since their
  previous heartbeat. An upper bound of the tool's p95, not a merged
  percentile (the instances send no distributions to merge).

Unknown stays unknown (None, `-` on the page): static tools, services of
releases that send no counters, an instance heard once so far, a window with
no calls (p95). The counters are not signed (only the body is): they can
mislead the page, never change a lease or the tool set.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from toolservice_base.call_stats import ToolCounters, parse_tool_stats


class ToolUsage(BaseModel):
    """One tool's traffic as the page shows it; a None figure is not known (shown as `-`)."""

    calls_per_s: float | None = None
    errors_per_s: float | None = None
    p95_ms: float | None = None
    """The highest p95 (milliseconds) among the live instances' last windows: an upper bound, not a merged
    percentile."""


@dataclass(frozen=True)
class CallSample:
    """One heartbeat's counters: when its sender sent it (its own clock), and per tool (calls, errors, p95_ms)."""

    at: float
    tools: dict[str, ToolCounters]


@dataclass
class InstanceCalls:
    """The last two samples of one instance: all it takes for a rate."""

    previous: CallSample | None = None
    latest: CallSample | None = None

    def add(self, sample: CallSample) -> None:
        self.previous, self.latest = self.latest, sample


def sample(text: str, sent_at: float, tools: Collection[str]) -> CallSample:
    """A heartbeat's `tool-stats` property as a sample of the `tools` its instance offers; `ValueError` if it is
    garbage."""
    return CallSample(sent_at, parse_tool_stats(text, tools))


def tool_usage(instances: Iterable[InstanceCalls]) -> dict[str, ToolUsage]:
    """The traffic of each tool the `instances` (the live ones of one service) sent counters for; a tool
    nothing is known of yet (one heartbeat so far, without calls) is left out."""
    calls: dict[str, float] = {}
    errors: dict[str, float] = {}
    slowest: dict[str, float] = {}
    for instance in instances:
        latest, previous = instance.latest, instance.previous
        if latest is None:
            continue
        for tool, (total, failed, p95_ms) in latest.tools.items():
            if p95_ms is not None:
                slowest[tool] = max(slowest.get(tool, p95_ms), p95_ms)
            before = previous.tools.get(tool) if previous is not None else None
            if previous is None or before is None or latest.at <= previous.at:
                continue
            if total < before[0] or failed < before[1]:
                continue  # counting started again: no rate from this pair
            elapsed = latest.at - previous.at
            calls[tool] = calls.get(tool, 0.0) + (total - before[0]) / elapsed
            errors[tool] = errors.get(tool, 0.0) + (failed - before[1]) / elapsed
    return {
        tool: ToolUsage(
            calls_per_s=round(calls[tool], 3) if tool in calls else None,
            errors_per_s=round(errors[tool], 3) if tool in errors else None,
            p95_ms=slowest.get(tool),
        )
        for tool in sorted(calls.keys() | slowest.keys())
    }


class Counted(Protocol):
    """What `live_usage` reads of a lease."""

    @property
    def calls(self) -> InstanceCalls | None: ...
    @property
    def state(self) -> str: ...


def live_usage(leases: Iterable[Counted]) -> dict[str, ToolUsage]:
    """`tool_usage` over the live ones of one service's leases."""
    return tool_usage(lease.calls for lease in leases if lease.calls is not None and lease.state == "live")
