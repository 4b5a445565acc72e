"""Search by meaning: tools found from what a query means when it shares no word with them, near-twins told apart,
lexical matches kept, the vectors updated per changed tool, and an embedder that cannot load leaving words alone."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from toolservice_base.schemas import ToolDescriptor
from toolservice_base.search import HybridIndex, LiveIndex, SearchDoc, rank, ranker_for
from toolservice_base.search.embedding import load, unit

BENCH = Path(__file__).resolve().parents[2] / "bench"


def corpus(name: str) -> tuple[list[dict[str, object]], list[dict[str, str]]]:
    return json.loads((BENCH / name / "tools.json").read_text()), json.loads(
        (BENCH / name / "queries.json").read_text()
    )


def indexed(tools: list[dict[str, object]]) -> HybridIndex:
    index = ranker_for()()
    index.update({str(t["name"]): SearchDoc.of(ToolDescriptor.model_validate(t)) for t in tools})
    return index


def top(index: HybridIndex, query: str, limit: int = 5) -> list[str]:
    return [m.name for m in rank(index, query, limit)]


@pytest.fixture(scope="module")
def meaning() -> tuple[HybridIndex, list[dict[str, str]]]:
    tools, queries = corpus("meaning-corpus")
    return indexed(tools), queries


def test_the_meaning_corpus_is_what_its_script_makes_and_its_queries_share_no_word_with_their_tools() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.meaning_corpus", "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_queries_that_share_no_word_with_their_tool_find_it_in_the_first_five(
    meaning: tuple[HybridIndex, list[dict[str, str]]],
) -> None:
    index, queries = meaning
    asked = [q for q in queries if q["kind"] == "meaning"]
    found = sum(q["tool"] in top(index, q["query"]) for q in asked)
    assert found / len(asked) >= 0.6, f"recall@5 {found / len(asked):.3f} over {len(asked)} queries"
    assert top(index, "will I need an umbrella in Lisbon tomorrow", 1) == ["weather-forecast"]
    assert top(index, "multiply two numbers", 1) == ["calculate"]


def test_of_two_near_twins_the_one_asked_for_ranks_above_the_other(
    meaning: tuple[HybridIndex, list[dict[str, str]]],
) -> None:
    index, queries = meaning
    twins = [q for q in queries if q["kind"] == "twin"]

    def above(q: dict[str, str]) -> bool:
        ranked = top(index, q["query"], 20)
        return q["tool"] in ranked and (q["wrong"] not in ranked or ranked.index(q["tool"]) < ranked.index(q["wrong"]))

    assert sum(map(above, twins)) / len(twins) >= 0.6
    assert top(index, "convert 100 dollars to euros", 1) == ["ops-currency-convert"]


def test_a_strong_lexical_match_still_wins_on_the_lexical_corpus() -> None:
    tools, queries = corpus("search-corpus")
    index = indexed(tools)
    found = sum(q["tool"] in top(index, q["query"]) for q in queries)
    assert found / len(queries) >= 0.95
    assert index.built_with == "wordllama:l2_supercat-256"


async def test_a_changed_tool_is_embedded_again_and_found_by_meaning_at_once() -> None:
    tools, _ = corpus("meaning-corpus")
    fleet = {str(t["name"]): ToolDescriptor.model_validate(t) for t in tools}
    live: LiveIndex[ToolDescriptor] = LiveIndex(lambda name, tool: SearchDoc.of(tool))
    ranker = await live.sync(fleet)
    asked = "my kitten is hungry"  # no word of the new description
    assert "countdown" not in [m.name for m in rank(ranker, asked, 3)]

    changed = dict(fleet)
    changed["countdown"] = fleet["countdown"].model_copy(update={"description": "Feeds the cat and fills its bowl."})
    ranker = await live.sync(changed)
    assert (live.builds, live.updates, live.last_changed) == (1, 1, 1), "one tool written, not the set"
    assert [m.name for m in rank(ranker, asked, 1)] == ["countdown"]


def test_an_embedder_that_cannot_load_leaves_search_to_words_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    make = ranker_for("sentence-transformers:all-MiniLM-L6-v2")  # not installed with the product
    first, second = make(), make()
    warned = [r.getMessage() for r in caplog.records if "search.embedder_unavailable" in r.getMessage()]
    assert len(warned) == 1 and "BM25 alone" in warned[0] and "sentence_transformers" in warned[0]
    assert first.built_with == second.built_with == "bm25"
    first.update({"fax.send": SearchDoc("fax.send", "Send a fax"), "mail.send": SearchDoc("mail.send", "Send mail")})
    assert [name for name, _ in first.search("fax", 5)] == ["fax.send"], "BM25's ranking, BM25's matches"


class Letters:
    """An embedder of one's own: letter-trigram counts hashed into 64 dimensions."""

    name = "letters-64"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = np.zeros((len(texts), 64), dtype=np.float32)
        for row, text in enumerate(texts):
            for i in range(len(text) - 2):
                rows[row, sum(map(ord, text[i : i + 3].lower())) % 64] += 1
        return unit(rows)


def letters() -> Letters:
    return Letters()


def test_a_deployment_plugs_its_own_embedder_by_naming_it_and_the_index_says_which() -> None:
    index = ranker_for("tests.search.test_meaning:letters")()
    assert index.built_with == "letters-64" and load("tests.search.test_meaning:letters") is index.embedder
    index.update({"weather.now": SearchDoc("weather.now", "Weather now"), "fax.send": SearchDoc("fax.send", "Fax")})
    assert [name for name, _ in index.search("wheather", 1)] == ["weather.now"], "misspelt: no word, but letters"


def test_an_agent_that_never_searches_loads_neither_numpy_nor_the_model() -> None:
    code = (
        "import sys, agent_bridge, discovery.cli.main, toolservice_base.search;"
        "from agent_bridge import ToolSet; ToolSet(static_dir='.');"
        "print(sorted(m for m in ('numpy', 'wordllama', 'tokenizers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


class Embeddings:
    """An OpenAI-compatible `/embeddings` endpoint on loopback, answering with `Letters`' vectors."""

    def __init__(self) -> None:
        import threading

        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        self.seen: list[tuple[str | None, str]] = []

        async def embeddings(request: Request) -> JSONResponse:
            body = await request.json()
            self.seen.append((request.headers.get("authorization"), body["model"]))
            rows = Letters().embed(body["input"]).tolist()
            return JSONResponse(
                {"data": [{"index": i, "embedding": row} for i, row in reversed(list(enumerate(rows)))]}
            )

        app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        import time

        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


def test_an_openai_compatible_endpoint_embeds_with_its_key_and_its_order_kept() -> None:
    endpoint = Embeddings()
    with endpoint as url:
        index = ranker_for(f"openai:letters@{url}", key="s3cret")()
        assert index.built_with == f"openai:letters@{url}"
        index.update({"weather.now": SearchDoc("weather.now", "Weather now"), "fax.send": SearchDoc("fax.send", "Fax")})
        assert [name for name, _ in index.search("wheather", 1)] == ["weather.now"]
    assert set(endpoint.seen) == {("Bearer s3cret", "letters")}


CALLS = {"flaky": 0}


def flaky_letters() -> Letters:
    """A plug-in embedder whose first load fails, as an endpoint that is down at the first search would."""
    CALLS["flaky"] += 1
    if CALLS["flaky"] == 1:
        raise ConnectionError("embeddings endpoint refused the connection")
    return Letters()


async def test_an_index_built_by_words_while_its_embedder_was_down_is_rebuilt_with_it_once_it_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("toolservice_base.search.embedding.RETRY_AFTER", 0.0)  # try again at the next search
    tools = {"weather.now": ToolDescriptor(name="weather.now", description="Weather now", service="s")}
    live: LiveIndex[ToolDescriptor] = LiveIndex(
        lambda name, tool: SearchDoc.of(tool), ranker_for("tests.search.test_meaning:flaky_letters")
    )
    first = await live.sync(tools)
    assert isinstance(first, HybridIndex) and first.built_with == "bm25" and rank(first, "wheather", 1) == []
    second = await live.sync(tools)
    assert isinstance(second, HybridIndex) and second.built_with == "letters-64" and live.builds == 2
    assert [m.name for m in rank(second, "wheather", 1)] == ["weather.now"], "by its letters, not its words"
    assert await live.sync(tools) is second, "built with what a build would use now: kept"
