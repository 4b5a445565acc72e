"""Search over tools, ranked by how well they match and how well they work.

    index = ToolIndex()
    index.update({"github.issue.create": SearchDoc("github.issue.create", "", "Open an issue", "title ...")})
    for match in rank(index, "open a bug", 5, health_of=lambda name: Health()):
        print(match.name, match.score)

`ToolIndex` (`index`) ranks by BM25 over four fields (`text`); `HybridIndex` (`hybrid`) fuses it with what tools
and queries mean, by an `Embedder` (`embedding`: WordLlama's, shipped in its wheel, unless a setting names
another); `rank` applies the health rules (`health`):
excluded tools dropped, failing ones lowered; `LiveIndex` (`live`) keeps a ranker in step with a live set, built
and fed off the event loop. `agent_bridge`'s `ToolSet.search`, `toolreg mcp --search`, `toolreg tools --search`
and the registry page's search box all rank this way (`ranker_for`, as `SearchSettings` names). A `Ranker` of
your own goes behind the same interface.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .embedding import Embedder
from .health import EXCLUDED, FAILING_WEIGHT, HEALTHY_SHARE, UNKNOWN, Health, combine, share_of
from .hybrid import LEXICAL_WEIGHT, HybridIndex, ranker_for
from .index import Ranker, ToolIndex
from .live import LiveIndex
from .text import BOOSTS, MAX_LIMIT, MAX_QUERY_CHARS, SearchDoc, arguments_text, check_limit, query_terms

__all__ = [
    "BOOSTS",
    "LEXICAL_WEIGHT",
    "Embedder",
    "HybridIndex",
    "ranker_for",
    "EXCLUDED",
    "FAILING_WEIGHT",
    "HEALTHY_SHARE",
    "MAX_LIMIT",
    "MAX_QUERY_CHARS",
    "UNKNOWN",
    "Health",
    "LiveIndex",
    "Match",
    "Ranker",
    "SearchDoc",
    "ToolIndex",
    "arguments_text",
    "check_limit",
    "combine",
    "query_terms",
    "rank",
    "share_of",
]


@dataclass(frozen=True)
class Match:
    """One result: `score` (what results are ordered by) is `relevance` (the ranker's own score) times
    `health.weight()`."""

    name: str
    score: float
    relevance: float
    health: Health


def rank(
    ranker: Ranker,
    query: str,
    limit: int,
    *,
    health_of: Callable[[str], Health] = lambda name: UNKNOWN,
    admits: Callable[[str], bool] = lambda name: True,
) -> list[Match]:
    """The best `limit` tools for `query`, health applied (`health`), best first; ties by name.

    Exact, not approximate: candidates are read from the ranker in a window that widens until no tool outside
    it could outrank the last one kept (health only ever lowers a score). `admits` leaves out tools the caller
    does not hold (a swap in flight). `BadQuery` for a query or limit out of bounds.
    """
    check_limit(limit)
    window = 2 * limit + 10
    while True:
        found = ranker.search(query, window)
        matches = []
        for name, relevance in found:
            if not admits(name):
                continue
            health = health_of(name)
            weight = health.weight()
            if weight > 0:
                matches.append(Match(name, relevance * weight, relevance, health))
        matches.sort(key=lambda m: (-m.score, m.name))
        exhausted = len(found) < window or window >= len(ranker)
        if exhausted or (len(matches) >= limit and matches[limit - 1].score >= found[-1][1]):
            return matches[:limit]
        window *= 4
