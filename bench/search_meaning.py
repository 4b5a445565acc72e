"""Search by meaning: the default ranking against its parts and against plain reciprocal rank fusion.

    python -m bench.search_meaning       # prints the table as JSON

On `bench/meaning-corpus` (108 tools; 93 queries sharing no content word with their tool, checked by
`bench.meaning_corpus --check`; 29 twin queries) and on `bench/search-corpus` (1,000 tools, 200 queries written
from the tools' own words), four rankings of the same index (`HybridIndex` with the default embedder):

- `bm25`: the words alone (`HybridIndex.words`, what search was before);
- `meaning`: the embedder's cosine alone;
- `rrf`: both fused by reciprocal rank (k = 60), each over its best 100;
- `fused`: the default, score-aware fusion (`toolservice_base.search.hybrid`), through `rank` as every caller sees it.

Recall@5: the share of queries whose tool is among the first five. Twins: the share of twin queries whose tool
ranks above its twin (a tool not in the first 20 ranks below any that is).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolservice_base.schemas import ToolDescriptor
from toolservice_base.search import HybridIndex, SearchDoc, rank, ranker_for

BENCH = Path(__file__).resolve().parent
RRF_K = 60
Ranking = Callable[[str], list[str]]


def corpus(name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return json.loads((BENCH / name / "tools.json").read_text()), json.loads(
        (BENCH / name / "queries.json").read_text()
    )


def rankings(index: HybridIndex) -> dict[str, Ranking]:
    vectors = index._vectors
    assert vectors is not None and index.embedder is not None
    embedder = index.embedder

    def bm25(query: str) -> list[str]:
        return [name for name, _ in index.words.search(query, 20)]

    def meaning(query: str) -> list[str]:
        cosines = vectors.cosines(embedder.embed([query])[0])
        return [str(vectors.names[row]) for row in cosines.argsort()[::-1] if vectors.live[row]][:100]

    def rrf(query: str) -> list[str]:
        scores: dict[str, float] = {}
        for ranked in (meaning(query), [name for name, _ in index.words.search(query, 100)]):
            for place, name in enumerate(ranked):
                scores[name] = scores.get(name, 0.0) + 1 / (RRF_K + place + 1)
        return sorted(scores, key=lambda name: (-scores[name], name))[:20]

    def fused(query: str) -> list[str]:
        return [m.name for m in rank(index, query, 20)]

    return {"bm25": bm25, "meaning": meaning, "rrf": rrf, "fused": fused}


def above(ranked: list[str], right: str, wrong: str) -> bool:
    return right in ranked and (wrong not in ranked or ranked.index(right) < ranked.index(wrong))


def indexed(tools: list[dict[str, Any]]) -> tuple[HybridIndex, float]:
    started = time.perf_counter()
    index = ranker_for()()
    assert isinstance(index, HybridIndex)
    index.update({t["name"]: SearchDoc.of(ToolDescriptor.model_validate(t)) for t in tools})
    return index, time.perf_counter() - started


def measure() -> dict[str, Any]:
    tools, queries = corpus("meaning-corpus")
    index, built = indexed(tools)
    meant = [q for q in queries if q["kind"] == "meaning"]
    twins = [q for q in queries if q["kind"] == "twin"]
    lexical_tools, lexical = corpus("search-corpus")
    big, _ = indexed(lexical_tools)
    found: dict[str, Any] = {"embedder": index.built_with, "first_index_s": round(built, 3)}
    for how, ranking in rankings(index).items():
        big_ranking = rankings(big)[how]
        found[how] = {
            "meaning_recall_at_5": round(sum(q["tool"] in ranking(q["query"])[:5] for q in meant) / len(meant), 3),
            "twins_right_above_wrong": round(
                sum(above(ranking(q["query"]), q["tool"], q["wrong"]) for q in twins) / len(twins), 3
            ),
            "lexical_recall_at_5": round(
                sum(q["tool"] in big_ranking(q["query"])[:5] for q in lexical) / len(lexical), 3
            ),
        }
    found["queries"] = {"meaning": len(meant), "twins": len(twins), "lexical": len(lexical)}
    return found


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))
