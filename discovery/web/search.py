"""The registry page's search box: `GET /?q=...` ranked on the server, and `/search.json` for the live page.

The box is a plain GET form, so a search works with JavaScript off: the server renders the tools table as the
registry's search ranks it (`Overview.search`: the ranking agents get, over every tool the page lists, with
the health it shows), best first, with each tool's score; held and unavailable tools are left out, as agents'
searches leave them out. With JavaScript, the page keeps the query and the order as it redraws itself: after
each change it asks `/search.json?q=...` for the ranking over the snapshot it was just sent (the feed's own, so
the page and the ranking agree), and draws the table in that order.

What a hostile query can cost is bounded: a query is at most `MAX_QUERY_CHARS` characters (a longer one is
refused, and only that much of it is shown back), a search returns at most `PAGE_RESULTS` tools, and a query or
limit out of bounds is refused (400, one line saying why) before the index is asked anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from discovery.registry.overview import RegistrySnapshot, ToolView
from discovery.registry.search import search_key
from toolservice_base.errors import BadQuery
from toolservice_base.search import MAX_LIMIT, MAX_QUERY_CHARS, Match

__all__ = ["NO_SEARCH", "PAGE_RESULTS", "PageSearch", "SearchSource", "query_of", "run_search", "search_answer"]

PAGE_RESULTS = MAX_LIMIT
"""The most tools a search on the page shows."""
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class SearchSource(Protocol):
    """What ranks the page's search: the registry's `Overview`, or the active replica's."""

    async def search(self, query: str, limit: int, among: RegistrySnapshot) -> list[Match]: ...


@dataclass(frozen=True)
class PageSearch:
    """One search as the page shows it: the query, the tools it found (best first, with their scores), or why it
    was refused."""

    query: str = ""
    """What was asked ('' no search), at most `MAX_QUERY_CHARS` characters of it, control characters taken out."""
    found: list[tuple[ToolView, float]] = field(default_factory=list)
    error: str | None = None
    total: int = 0
    """Tools the page lists: what the search ran over."""

    @property
    def active(self) -> bool:
        """A search whose results the page shows in place of the whole table."""
        return bool(self.query) and self.error is None


NO_SEARCH = PageSearch()


def query_of(request: Request) -> str:
    """The `q` parameter, as sent ('' without one); whitespace alone is no search."""
    query = request.query_params.get("q", "")
    return query if query.strip() else ""


def _shown(query: str) -> str:
    return _UNPRINTABLE.sub("", query[:MAX_QUERY_CHARS])


async def run_search(source: SearchSource, query: str, snapshot: RegistrySnapshot) -> PageSearch:
    """`query` over the tools of `snapshot`; a refused query says why (`error`), and changes nothing else."""
    total = len(snapshot.tools)
    if not query:
        return PageSearch(total=total)
    try:
        matches = await source.search(query, PAGE_RESULTS, snapshot)
    except BadQuery as exc:
        return PageSearch(_shown(query), error=f"search: {exc}", total=total)
    views = {search_key(t.workspace, t.name): t for t in snapshot.tools}
    found = [(views[m.name], m.score) for m in matches if m.name in views]
    return PageSearch(_shown(query), found, total=total)


def search_answer(search: PageSearch, headers: dict[str, str]) -> Response:
    """`/search.json`: `{"query", "tools": [{"key", "score"}], "total", "error"}`, best first; 400 when refused."""
    body = {
        "query": search.query,
        "tools": [{"key": search_key(t.workspace, t.name), "score": round(score, 4)} for t, score in search.found],
        "total": search.total,
        "error": search.error,
    }
    return JSONResponse(body, status_code=400 if search.error else 200, headers=headers)
