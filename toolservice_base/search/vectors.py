"""What a hybrid index keeps beside BM25: each tool's vector, and which words each tool holds (for `coverage`).

Both are written the way `ToolIndex` is: `stage` (in a worker thread: the costly part, embedding and analysing the
changed tools) leaves the changes pending, and `apply` (in the searching thread, at `refresh`) puts them in place,
a few row assignments per changed tool. A search never sees half a change, and an update costs what changed: a
tool's row is overwritten in place, a removed tool's row is reused by the next one to come, and the table only
grows when every row is taken (a first build to its size exactly, later by at least a quarter).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


class VectorTable:
    """Tools' unit vectors as rows of one float32 matrix: a query's cosine with every tool is one product."""

    def __init__(self) -> None:
        import numpy as np

        self._np = np
        self.matrix = np.zeros((0, 0), dtype=np.float32)
        self.live = np.zeros(0, dtype=bool)
        self.rows: dict[str, int] = {}
        self.names: list[str | None] = []
        self._free: list[int] = []
        self.used = 0
        """Rows up to the last one ever taken (free rows are taken lowest first, so they stay packed)."""
        self._pending: dict[str, np.ndarray | None] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def stage(self, vectors: Mapping[str, np.ndarray], removals: Iterable[str]) -> None:
        for name in removals:
            self._pending[name] = None
        self._pending.update(vectors)

    def apply(self) -> None:
        pending, self._pending = self._pending, {}
        coming = [v for name, v in pending.items() if v is not None and name not in self.rows]
        if coming:
            self._reserve(len(coming), len(coming[0]))
        for name, vector in pending.items():
            row = self.rows.get(name)
            if vector is None:
                if row is not None:
                    del self.rows[name]
                    self.names[row], self.live[row] = None, False
                    self._free.append(row)
                continue
            if row is None:
                row = self._free.pop()
                self.rows[name], self.names[row], self.live[row] = row, name, True
                self.used = max(self.used, row + 1)
            self.matrix[row] = vector

    def _reserve(self, count: int, dim: int) -> None:
        """Free rows for `count` more tools: the table grown once, by what is missing and at least a quarter (a
        first build takes exactly its size; one tool at a time still costs a copy only every so often)."""
        np = self._np
        if len(self._free) >= count:
            return
        size = len(self.names)
        grown = size + max(count - len(self._free), size // 4, 16)
        matrix = np.zeros((grown, dim), dtype=np.float32)
        matrix[:size] = self.matrix[:size] if size else 0
        live = np.zeros(grown, dtype=bool)
        live[:size] = self.live
        self.matrix, self.live = matrix, live
        self.names += [None] * (grown - size)
        self._free = list(range(grown - 1, size - 1, -1)) + self._free

    def cosines(self, query: np.ndarray) -> np.ndarray:
        """The query's cosine with every row up to the last taken; 0 for free rows (never returned: they have no
        name). `einsum`, not `@`: a matrix-vector product through BLAS wakes its thread pool at every call, which on
        a busy machine cost 10 to 20 ms a search where one thread's pass over 10,000 rows takes 0.4 ms."""
        used = self.used
        scores: np.ndarray = self._np.einsum("ij,j->i", self.matrix[:used], query)
        scores[~self.live[:used]] = 0.0
        return scores


class TermTable:
    """Which analysed words each tool holds (any field), and in how many tools each word is: how much of a query a
    tool covers, each word weighted by its rarity (BM25's idf)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.df: list[int] = []
        self.docs: dict[str, tuple[int, ...]] = {}
        """Tool -> its words' ids: a tuple (about 300 bytes for a tool of 30 words; a set would be 2 KB)."""
        self._pending: dict[str, frozenset[str] | None] = {}

    def stage(self, terms: Mapping[str, frozenset[str]], removals: Iterable[str]) -> None:
        for name in removals:
            self._pending[name] = None
        self._pending.update(terms)

    def apply(self) -> None:
        pending, self._pending = self._pending, {}
        for name, words in pending.items():
            for old in self.docs.pop(name, ()):
                self.df[old] -= 1
            if words is None:
                continue
            ids = []
            for word in words:
                wid = self.ids.setdefault(word, len(self.ids))
                if wid == len(self.df):
                    self.df.append(0)
                self.df[wid] += 1
                ids.append(wid)
            self.docs[name] = tuple(ids)

    def weights(self, terms: list[str]) -> dict[int, float]:
        """Each query word known to some tool -> its idf; and under -1, the summed idf of every query word (an
        unknown word is as rare as can be: no tool covers it, so no tool covers the whole query)."""
        count = len(self.docs)
        weights, total = {}, 0.0
        for term in terms:
            wid = self.ids.get(term)
            df = self.df[wid] if wid is not None else 0
            idf = math.log(1 + (count - df + 0.5) / (df + 0.5))
            total += idf
            if wid is not None and df:
                weights[wid] = idf
        weights[-1] = total
        return weights

    def coverage(self, name: str, weights: dict[int, float]) -> float:
        """The share of the query's idf that `name`'s words hold, 0 to 1."""
        held = self.docs.get(name, ())
        total = weights[-1]
        return sum(w for wid, w in weights.items() if wid in held) / total if total > 0 else 0.0
