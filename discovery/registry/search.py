"""The registry's own search over its tools: what the registry page's search box asks (`GET /?q=`).

The ranking agents get (`toolservice_base.search`: BM25 over names, titles, descriptions and arguments, then
health), over every tool the page lists, in every workspace: an announced tool as its service's offer describes
it, a static one as its item in the store does. Health is what the page shows of each tool: its status (`held`
and `unavailable` tools are never returned, as agents' searches leave them out) and its errors/s over calls/s
from the services' heartbeats.

The index is the registry's own, following the tools as they come and go: built in a worker thread on the first
search (a registry nobody searches builds none), then fed, at each search, only what changed since the last
(`LiveIndex`): an announced tool's definition is one object for as long as its service offers it, a static
item's text compares equal while it is unchanged. So a search costs no rebuild, and the event loop no more than
one comparison per tool.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from toolservice_base.schemas import ToolDescriptor, validate_config_item
from toolservice_base.search import (
    Health,
    LiveIndex,
    Match,
    Ranker,
    SearchDoc,
    check_limit,
    query_terms,
    rank,
    share_of,
)

from .usage import ToolUsage

__all__ = ["ToolFinder", "ToolSource", "document", "search_key", "usage_health"]

ToolSource = ToolDescriptor | str | None
"""How the registry knows a tool: its service's offer (a descriptor), its static item's text, or neither (an
announced tool restored at start whose service has not announced since: searched by its name)."""


def search_key(workspace: str, name: str) -> str:
    """A tool across workspaces, as the index and the page name it (a workspace name holds no `/`)."""
    return f"{workspace}/{name}"


def usage_health(status: str | None, usage: ToolUsage | None) -> Health:
    """What the registry says of a tool, as a search ranks by it: its status and its heartbeats' failure share."""
    return Health(status=status, failure_share=share_of(usage.calls_per_s, usage.errors_per_s) if usage else None)


def document(key: str, source: ToolSource) -> SearchDoc:
    """The searched text of one tool (in a worker thread: a static item is parsed here, once per change)."""
    name = key.partition("/")[2]
    if isinstance(source, ToolDescriptor):
        return SearchDoc.of(source)
    if source is None:
        return SearchDoc(name)
    try:
        tool = validate_config_item("tool", name, source)
    except ValueError:  # agents skip it; the page lists it, so its name and words still find it
        body = _object(source)
        return SearchDoc(name, _text(body.get("title")), _text(body.get("description")))
    assert isinstance(tool, ToolDescriptor)
    return SearchDoc.of(tool)


def _object(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


class ToolFinder:
    """The registry's index of its tools, fed from `sources` (every tool the page lists, by `search_key`) at each
    search."""

    def __init__(
        self, sources: Callable[[], Awaitable[Mapping[str, ToolSource]]], ranker: Callable[[], Ranker] | None = None
    ) -> None:
        self._sources = sources
        self.index: LiveIndex[ToolSource] = LiveIndex(document, ranker)

    async def search(self, query: str, limit: int, shown: Mapping[str, Health]) -> list[Match]:
        """The tools of `shown` (what the page shows, by `search_key`, with the health it shows) that best match
        `query`, best first; `BadQuery` (before anything is read) for a query or limit out of bounds."""
        check_limit(limit)
        query_terms(query)
        ranker = await self.index.sync(await self._sources())
        return rank(ranker, query, limit, health_of=shown.__getitem__, admits=shown.__contains__)

    async def close(self) -> None:
        await self.index.close()
