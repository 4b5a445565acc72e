"""`HybridIndex`: tools ranked by what they mean as well as by the words they share with the query.

Two rankings of the same tools, fused by score:

- words: BM25 (`ToolIndex`), as before: the field boosts, one count per word, the lookalike resistance.
- meaning: the cosine between the query's vector and each tool's (`embedding`): the tool's name split into
  words, its title, description, and each argument's name and description, as one text.

Plain reciprocal rank fusion treats BM25's first result as strong evidence whatever it matched; on queries that
share no content word with their tool, BM25's first results are tools that share a filler ("two", "numbers") and
RRF lets them outvote meaning (`python -m bench.search_meaning`: recall@5 0.46 fused by RRF, 0.73 by meaning
alone, 0.72 fused here, which also keeps the lexical corpus at 0.96 where meaning alone gets 0.95 and holds a
strong lexical match first whatever the cosines say). Here a tool's relevance is

    max(0, cosine) + LEXICAL_WEIGHT * coverage**2 * bm25 / best_bm25

and tools under `RELATIVE_FLOOR` of the best tool's relevance are left out (noise beside it).

`coverage` is how much of the query the tool's words hold, each word weighted by its rarity (BM25's idf over the
tools): 1 when the tool has every word of the query, 1/3 for one word of three equally rare. Squared, a strong
lexical match (most of the query, its rare words) earns up to `LEXICAL_WEIGHT`, more than the cosines of two
plausible tools ever differ by, and wins; a tool sharing one common word with a query earns a few hundredths,
which never outvotes meaning. `bm25 / best_bm25` keeps BM25's own order among lexical matches (a word in the name
counts more than one in an argument). A query sharing no word with any tool is ranked by meaning alone.

Without an embedder (`TOOLREG_SEARCH_EMBEDDER=bm25`, or one that failed to load) the ranking is BM25's alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..logs import get_logger
from .embedding import BATCH, Embedder, expected, load
from .index import ToolIndex
from .settings import DEFAULT_EMBEDDER, WORDS_ONLY
from .text import SearchDoc, analyzer, query_terms
from .vectors import TermTable, VectorTable

if TYPE_CHECKING:
    import numpy as np

log = get_logger("toolservice_base.search")

LEXICAL_WEIGHT = 0.5
"""What a tool holding every word of the query gains, at BM25's best score: cosines run from about 0.2 (unrelated)
to 0.8 (the same request in other words), so a whole lexical match outranks any difference in meaning."""
COVERAGE_POWER = 2
"""Coverage is squared: half the query's words earn a quarter of the lexical weight, a third a ninth."""
RELATIVE_FLOOR = 0.3
"""A tool under this share of the best tool's relevance is not returned: beside a strong lexical match (about 1.2),
tools related by meaning alone (0.1 to 0.4) are noise; when no word matches, the best meaning matches are all close
to one another and stay. Costs one meaning query of 93 its hit (`bench/meaning-corpus`: 0.731 -> 0.720), none on the
lexical corpus, and keeps 'send a fax' from listing five tools that have nothing to do with faxes."""
LEXICAL_WINDOW = 30
"""BM25's best this many tools (or the limit asked for, if more) are read for lexical evidence; a tool further down
BM25's list counts by meaning alone (its lexical bonus would be a small share of the best's in any case). 30, 50
and 100 rank both corpora alike; each document read costs, so the smallest."""


def meaning_text(fields: Mapping[str, str]) -> str:
    """What of a tool is embedded: the fields BM25 searches (`SearchDoc.fields`), as one text."""
    return f"{fields['name']}. {fields['title']}. {fields['description']} {fields['arguments']}".strip()


class HybridIndex:
    """A `Ranker`: BM25 and an embedder's vectors over the same tools, fused by score (see the module). With
    `embedder=None`, BM25 alone. `built_with` says which embedder made the vectors."""

    def __init__(self, embedder: Embedder | None) -> None:
        self.words = ToolIndex()
        self.embedder = embedder
        self.built_with = embedder.name if embedder is not None else WORDS_ONLY
        self._vectors = VectorTable() if embedder is not None else None
        self._terms = TermTable()
        self._failed = False

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, name: object) -> bool:
        return name in self.words

    def stage(self, upserts: Mapping[str, SearchDoc], removals: Iterable[str] = ()) -> int:
        """As `ToolIndex.stage`, and the changed tools embedded and analysed (in this thread: a worker's)."""
        removals = list(removals)
        changed = self.words.stage(upserts, removals)
        if self._vectors is not None and self.embedder is not None:
            names = list(upserts)
            fields = [upserts[name].fields() for name in names]
            vectors = self._embed([meaning_text(f) for f in fields])
            self._vectors.stage(dict(zip(names, vectors, strict=True)), removals)
            words = analyzer()
            self._terms.stage(
                {name: frozenset(words.analyze(" ".join(f.values()))) for name, f in zip(names, fields, strict=True)},
                removals,
            )
        return changed

    def _embed(self, texts: list[str]) -> list[np.ndarray]:
        """Vectors of `texts`, `BATCH` at a time: the embedder may hold the GIL for a whole call, and the event loop
        waits on the GIL while a worker thread builds the index."""
        assert self.embedder is not None
        rows: list[np.ndarray] = []
        for start in range(0, len(texts), BATCH):
            rows.extend(self.embedder.embed(texts[start : start + BATCH]))
        return rows

    def commit(self) -> None:
        self.words.commit()

    def refresh(self) -> None:
        """Let searches see the last commit, and the staged vectors and words (a few row writes per changed tool)."""
        self.words.refresh()
        if self._vectors is not None:
            self._vectors.apply()
            self._terms.apply()

    def update(self, upserts: Mapping[str, SearchDoc], removals: Iterable[str] = ()) -> int:
        """`stage`, `commit` and `refresh` at once, in this thread."""
        changed = self.stage(upserts, removals)
        self.commit()
        self.refresh()
        return changed

    def search(self, query: str, limit: int) -> list[tuple[str, float]]:
        """The best `limit` tools for `query`, best first, with their fused relevance; `BadQuery` as
        `ToolIndex.search`."""
        lexical = self.words.search(query, max(limit, LEXICAL_WINDOW))
        vectors = self._vectors
        if vectors is None or not len(vectors) or limit < 1:
            return lexical[:limit]
        meant = self._embed_query(query)
        if meant is None:
            return lexical[:limit]
        import numpy as np

        relevance = vectors.cosines(meant)
        np.maximum(relevance, 0.0, out=relevance)
        if lexical:
            weights = self._terms.weights(query_terms(query))
            best = lexical[0][1] or 1.0
            rows = vectors.rows
            for name, score in lexical:
                coverage = self._terms.coverage(name, weights)
                relevance[rows[name]] += LEXICAL_WEIGHT * coverage**COVERAGE_POWER * score / best
        return self._best(relevance, limit)

    def _embed_query(self, query: str) -> np.ndarray | None:
        """The query's vector; None (BM25 alone, said once) if the embedder fails now (an endpoint gone)."""
        assert self.embedder is not None
        try:
            vector: np.ndarray = self.embedder.embed([query])[0]
            return vector
        except Exception as exc:  # noqa: BLE001 - a search is still answered, by words
            if not self._failed:
                self._failed = True
                log.warning("search.embedder_failed", embedder=self.built_with, error=f"{type(exc).__name__}: {exc}")
            return None

    def _best(self, relevance: np.ndarray, limit: int) -> list[tuple[str, float]]:
        import numpy as np

        assert self._vectors is not None
        names = self._vectors.names
        live = self._vectors.live[: len(relevance)]
        relevance[~live] = -1.0
        count = min(limit, len(self._vectors))
        if count < len(relevance):
            top = np.argpartition(relevance, len(relevance) - count)[-count:]
        else:
            top = np.arange(len(relevance))
        found = [(names[row], float(relevance[row])) for row in top if live[row]]
        found.sort(key=lambda item: (-item[1], item[0]))
        floor = RELATIVE_FLOOR * found[0][1] if found else 0.0
        return [(name, score) for name, score in found[:count] if name is not None and score >= floor]


def ranker_for(embedder: str = DEFAULT_EMBEDDER, key: str | None = None) -> Rankers:
    """What makes a search's ranker (`LiveIndex` calls it in a worker thread, at the first search): a
    `HybridIndex` with the embedder `embedder` names (`SearchSettings.embedder`), loaded there and then, once per
    process; BM25 alone for `bm25`, or when it cannot be loaded."""
    return Rankers(embedder, key)


class Rankers:
    """`ranker_for`'s factory: `HybridIndex`es with one embedder, and whether an index was built with what a build
    now would use (`stale`): one built by words alone while the embedder could not be loaded is rebuilt once it
    may load, never patched with vectors of another embedder."""

    def __init__(self, embedder: str, key: str | None) -> None:
        self.embedder, self.key = embedder, key

    def __call__(self) -> HybridIndex:
        return HybridIndex(load(self.embedder, self.key))

    def stale(self, ranker: object) -> bool:
        """Whether `ranker` (one of ours) was built with another embedder than a build now would be."""
        return getattr(ranker, "built_with", None) != expected(self.embedder, self.key)
