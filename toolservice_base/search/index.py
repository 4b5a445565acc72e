"""`ToolIndex`: BM25 over tools' names, titles, descriptions and arguments, updated by what changed.

Built on tantivy (Rust's Lucene-like engine, through its official Python bindings), in memory. Each change is a
delete and an add of that tool's document, and one commit makes the batch visible: a commit writes one new
segment of the changed documents, whatever the size of the index, and tantivy merges segments in its own
thread. Measured on this project's corpus (`python -m bench --only search`): p50 about 0.2 ms per search over
10,000 tools; one changed tool costs one commit of a few milliseconds at 1,000 or 30,000 tools alike.

Threads: any. `stage` and `commit` grow with what changed (a whole first build of 10,000 tools is about half a
second), so an event loop runs them in a worker thread, as `LiveIndex` (`live`) does; searches keep reading the
last refreshed view meanwhile, from any thread. One writer: a caller serialises its `stage`/`commit` pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from .text import BOOSTS, SearchDoc, analyzer, query_terms

WRITER_HEAP = 15_000_000
"""Bytes of tantivy's indexing arena (its floor is 3 MB per thread); past it the writer flushes a segment itself."""
TOKENIZER = "tools"
INDEX_OPTION = "basic"
"""Which documents hold a word, not how often: a word said twenty times in a field counts as once (BM25 with a
term frequency of one), so repeating a query's words is no way up the ranking (`text`, keyword stuffing)."""
ID = "id"


class Ranker(Protocol):
    """What `rank` ranks with: `ToolIndex`, or another ranker kept up to date the same way (an embedding model's).

    `stage` and `commit` run in a worker thread (`LiveIndex`), `search` wherever the caller is, while a write may
    be under way: it reads what the last `refresh` made visible."""

    def __len__(self) -> int: ...

    def stage(self, upserts: Mapping[str, SearchDoc], removals: Iterable[str] = ()) -> int: ...

    def commit(self) -> None: ...

    def refresh(self) -> None: ...

    def search(self, query: str, limit: int) -> list[tuple[str, float]]: ...


class ToolIndex:
    """Tools by name, searchable with BM25 per field (`text.BOOSTS`); `stage` changes, `commit` and `refresh` make
    them visible."""

    def __init__(self) -> None:
        import tantivy

        self._tantivy = tantivy
        builder = tantivy.SchemaBuilder()
        builder.add_text_field(ID, stored=True, tokenizer_name="raw")
        for field in BOOSTS:
            builder.add_text_field(field, tokenizer_name=TOKENIZER, index_option=INDEX_OPTION)
        self._schema = builder.build()
        self._index = tantivy.Index(self._schema)
        self._index.register_tokenizer(TOKENIZER, analyzer())
        self._writer = self._index.writer(WRITER_HEAP, 1)
        self._names: set[str] = set()
        self._staged = False

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def stage(self, upserts: Mapping[str, SearchDoc], removals: Iterable[str] = ()) -> int:
        """Replace or add the documents of `upserts`, remove those named in `removals`; returns how many changed.
        Visible after `commit` and `refresh`."""
        changed = 0
        writer = self._writer
        for name in removals:
            if name in self._names:
                writer.delete_documents_by_term(ID, name)
                self._names.discard(name)
                changed += 1
        for name, doc in upserts.items():
            if name in self._names:
                writer.delete_documents_by_term(ID, name)
            writer.add_document(self._tantivy.Document(**{ID: name}, **doc.fields()))
            self._names.add(name)
            changed += 1
        self._staged = self._staged or changed > 0
        return changed

    def commit(self) -> None:
        """Write what was staged (milliseconds for a few tools; releases the GIL)."""
        if self._staged:
            self._staged = False
            self._writer.commit()

    def refresh(self) -> None:
        """Let searches see the last commit."""
        self._index.reload()

    def update(self, upserts: Mapping[str, SearchDoc], removals: Iterable[str] = ()) -> int:
        """`stage`, `commit` and `refresh` at once, in this thread."""
        changed = self.stage(upserts, removals)
        self.commit()
        self.refresh()
        return changed

    def search(self, query: str, limit: int) -> list[tuple[str, float]]:
        """The best `limit` tools for `query`, best first, with their BM25 scores (summed over fields, each boosted
        by `BOOSTS`); `BadQuery` for a query `text.query_terms` refuses."""
        terms = query_terms(query)
        if limit < 1 or not self._names:
            return []
        tantivy = self._tantivy
        clauses = [
            (
                tantivy.Occur.Should,
                tantivy.Query.boost_query(tantivy.Query.term_query(self._schema, field, term), boost),
            )
            for term in terms
            for field, boost in BOOSTS.items()
        ]
        searcher = self._index.searcher()
        hits = searcher.search(tantivy.Query.boolean_query(clauses), limit).hits
        return [(searcher.doc(address)[ID][0], score) for score, address in hits]
