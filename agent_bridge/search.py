"""The `ToolSet`'s search: its index, fed from the difference between the old and the new set at each swap, and
what the agent knows of each tool's health.

The index (`toolservice_base.search.LiveIndex`) is built in a worker thread when the first search asks for it (an
agent that never searches pays nothing; the search waits for it without holding the event loop up), and from
then on fed at every swap, in the background, with the tools that came, changed or went: a changed tool is one
whose built entry is not the same object as before (`build` keeps unchanged ones as they were), so the cost of
an update follows the change, not the set, however the reload learned of it. A search that comes before the
last swap is written waits for it, so it ranks the set it is asked about.

Health, as `toolservice_base.search.health` ranks by it, from two sources:

- the agent's own calls (`CallOutcomes`), free: every call through `ToolSet.invoke`, `call`, `parts` and `stream`
  ends as a success or a failure of the tool (no answer in time, a transport error, the service's own error, a
  malformed answer, a busy service); a call the caller got wrong (bad arguments, an unknown tool) or gave up on
  is no evidence about the tool and is not counted. Counts decay with a half-life of `HALF_LIFE` seconds, so a
  tool that recovers climbs back; a share is given once about three recent calls are behind it (`MIN_CALLS`).
- the registry's report, when the application asks it (`ToolSet.report_health`; `toolreg mcp --search` does,
  from the query API's `list`): each tool's status (`held` and `unavailable` are never returned) and, where the
  services' heartbeats carry it, errors/s over calls/s across every caller.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import TracebackType
from typing import TypeVar

from toolservice_base.metrics import OTHER_TOOL
from toolservice_base.search import (
    UNKNOWN,
    Health,
    LiveIndex,
    Match,
    Ranker,
    SearchDoc,
    check_limit,
    combine,
    query_terms,
    rank,
)

from .build import Entry
from .metrics import ERROR_TYPES, MAX_SERIES, error_type

T = TypeVar("T")

HALF_LIFE = 300.0
"""Seconds after which a call's outcome counts half as much."""
MIN_CALLS = 2.5
"""Decayed calls needed before a tool's own failure share is used: three calls within the last few minutes."""
NOT_THE_TOOLS = frozenset(name for name, kind in ERROR_TYPES.items() if not kind.tool_at_fault)
"""`metrics.error_type`s that say nothing of the tool (`ErrorType.tool_at_fault`): such a call is not counted."""


class CallOutcomes:
    """Each tool's recent calls and failures, decayed exponentially; bounded like the bridge's metrics."""

    def __init__(self, half_life: float = HALF_LIFE, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = math.log(2) / half_life
        self._clock = clock
        self._tools: dict[str, tuple[float, float, float]] = {}  # tool -> (calls, failures, when)

    def _decayed(self, tool: str, now: float) -> tuple[float, float]:
        calls, failures, when = self._tools.get(tool, (0.0, 0.0, now))
        keep = math.exp(-self._rate * max(0.0, now - when))
        return calls * keep, failures * keep

    def record(self, tool: str, error: BaseException | None) -> None:
        """One call of `tool` ended; `error` is why it failed, or None."""
        kind = None if error is None else error_type(error)
        if tool == OTHER_TOOL or kind in NOT_THE_TOOLS:
            return
        if tool not in self._tools and len(self._tools) >= MAX_SERIES:
            return
        now = self._clock()
        calls, failures = self._decayed(tool, now)
        self._tools[tool] = (calls + 1.0, failures + (0.0 if kind is None else 1.0), now)

    def health(self, tool: str) -> Health | None:
        if tool not in self._tools:
            return None
        calls, failures = self._decayed(tool, self._clock())
        return Health(failure_share=failures / calls) if calls >= MIN_CALLS else None

    def tools(self) -> list[str]:
        """The tools with an outcome recorded."""
        return list(self._tools)

    def forget(self, tools: Iterable[str]) -> None:
        for tool in tools:
            self._tools.pop(tool, None)

    def counting(self, tool: str) -> _Counting:
        """Around one call: its outcome recorded. (An object, not a generator-based context manager: that cost
        more than the rest of `ToolSet.invoke`'s own frame.)"""
        return _Counting(self, tool)

    async def counted(self, tool: str, chunks: AsyncIterator[T]) -> AsyncIterator[T]:
        """`chunks` as one call, its outcome recorded when it ends; a caller that stops reading records nothing."""
        try:
            with self.counting(tool):
                async for chunk in chunks:
                    yield chunk
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()


class _Counting:
    """`CallOutcomes.counting`: the call's outcome, recorded as the block ends (a generator closed mid-way: none)."""

    __slots__ = ("_outcomes", "_tool")

    def __init__(self, outcomes: CallOutcomes, tool: str) -> None:
        self._outcomes, self._tool = outcomes, tool

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if not isinstance(exc, GeneratorExit):
            self._outcomes.record(self._tool, exc)


class ToolSearch:
    """One `ToolSet`'s index, kept in step at each swap, and the health it ranks by."""

    def __init__(self, ranker: Callable[[], Ranker] | None = None) -> None:
        self.outcomes = CallOutcomes()
        self.reported: Mapping[str, Health] = {}
        self.index: LiveIndex[Entry] = LiveIndex(_document, ranker)

    async def swap(self, old: Mapping[str, Entry], new: Mapping[str, Entry]) -> None:
        """Forget the outcomes of tools that went; feed the index the new set in the background (a reload never
        waits for it)."""
        self.outcomes.forget(name for name in self.outcomes.tools() if name not in new)  # only the tools called
        self.index.follow(new)

    def health(self, tool: str) -> Health:
        own, reported = self.outcomes.health(tool), self.reported.get(tool)
        return UNKNOWN if own is None and reported is None else combine(own, reported)

    async def search(self, query: str, limit: int, entries: Mapping[str, Entry]) -> list[Match]:
        check_limit(limit)
        query_terms(query)  # a query that cannot be searched is refused before anything is built
        ranker = await self.index.sync(entries)
        return rank(ranker, query, limit, health_of=self.health, admits=entries.__contains__)

    async def close(self) -> None:
        await self.index.close()


def _document(name: str, entry: Entry) -> SearchDoc:
    return SearchDoc.of(entry.tool)
