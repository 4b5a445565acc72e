"""Tool search (`toolservice_base.search`): BM25 over four fields, health rules, bad queries, keyword stuffing."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from toolservice_base.errors import BadQuery
from toolservice_base.search import (
    FAILING_WEIGHT,
    MAX_LIMIT,
    MAX_QUERY_CHARS,
    Health,
    SearchDoc,
    ToolIndex,
    arguments_text,
    rank,
)

CORPUS = Path(__file__).resolve().parents[2] / "bench" / "search-corpus"


def doc(tool: dict[str, object]) -> SearchDoc:
    arguments = tool.get("arguments") or []
    assert isinstance(arguments, list)
    return SearchDoc(
        str(tool["name"]),
        str(tool.get("title") or ""),
        str(tool["description"]),
        arguments_text((a["name"], a["description"]) for a in arguments),
    )


@pytest.fixture(scope="module")
def corpus() -> tuple[list[dict[str, object]], list[dict[str, str]]]:
    return json.loads((CORPUS / "tools.json").read_text()), json.loads((CORPUS / "queries.json").read_text())


def indexed(tools: list[dict[str, object]]) -> ToolIndex:
    index = ToolIndex()
    index.update({str(t["name"]): doc(t) for t in tools})
    return index


def names(matches: list) -> list[str]:  # type: ignore[type-arg]
    return [m.name for m in matches]


def recall_at_5(index: ToolIndex, queries: list[dict[str, str]]) -> float:
    return sum(q["tool"] in names(rank(index, q["query"], 5)) for q in queries) / len(queries)


def test_the_committed_corpus_is_what_its_script_makes() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.search_corpus", "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_recall_at_5_on_the_corpus_holds(corpus: tuple[list[dict[str, object]], list[dict[str, str]]]) -> None:
    tools, queries = corpus
    assert len(tools) == 1000 and len(queries) == 200
    assert recall_at_5(indexed(tools), queries) >= 0.9


def test_a_word_in_the_name_counts_more_than_in_an_argument() -> None:
    index = ToolIndex()
    index.update(
        {
            "weather.forecast": SearchDoc("weather.forecast", "", "What tomorrow brings", "city City name"),
            "city.lookup": SearchDoc("city.lookup", "", "Facts about a place", "name Name of the place"),
        }
    )
    assert names(rank(index, "city", 2)) == ["city.lookup", "weather.forecast"]
    # camelCase and stems: `createTicket` is found as "create tickets"
    index.update({"createTicket": SearchDoc("createTicket", "", "Opens one", "")})
    assert names(rank(index, "creating tickets", 1)) == ["createTicket"]


def test_the_index_follows_adds_changes_and_removals() -> None:
    index = ToolIndex()
    assert index.update({"a": SearchDoc("a", "", "send an email"), "b": SearchDoc("b", "", "book a flight")}) == 2
    assert names(rank(index, "email", 5)) == ["a"]
    assert index.update({"a": SearchDoc("a", "", "post a chat message")}) == 1  # replaced, not added beside
    assert names(rank(index, "email", 5)) == [] and names(rank(index, "chat", 5)) == ["a"]
    assert index.update({}, ["b", "not-there"]) == 1
    assert names(rank(index, "flight", 5)) == [] and len(index) == 1


# --- health ---------------------------------------------------------------------------------------------------


def twins() -> ToolIndex:
    """Two tools that match a query exactly as well, and one that matches worse."""
    index = ToolIndex()
    text = "Create a ticket in the tracker"
    index.update(
        {
            "alpha.ticket": SearchDoc("alpha.ticket", "", text),
            "beta.ticket": SearchDoc("beta.ticket", "", text),
            "gamma.note": SearchDoc("gamma.note", "", "Write a note; tickets elsewhere"),
        }
    )
    return index


def test_held_and_unavailable_tools_are_never_returned() -> None:
    index = twins()
    for status in ("held", "unavailable"):
        found = rank(
            index, "ticket", 10, health_of=lambda n, s=status: Health(status=s) if n == "alpha.ticket" else Health()
        )
        assert "alpha.ticket" not in names(found)
        assert set(names(found)) == {"beta.ticket", "gamma.note"}
    # the only match, excluded: nothing rather than a tool that cannot answer
    assert rank(index, "tracker", 5, health_of=lambda n: Health(status="held")) == []


def test_a_tool_failing_most_calls_ranks_below_a_healthy_one_that_matches_as_well() -> None:
    index = twins()
    plain = rank(index, "ticket tracker", 3)
    assert names(plain)[:2] == ["alpha.ticket", "beta.ticket"] and plain[0].score == plain[1].score  # a tie, by name
    failing = rank(
        index, "ticket tracker", 3, health_of=lambda n: Health(failure_share=0.8) if n == "alpha.ticket" else Health()
    )
    assert names(failing)[0] == "beta.ticket"
    demoted = next(m for m in failing if m.name == "alpha.ticket")
    assert demoted.score == pytest.approx(demoted.relevance * (1 - FAILING_WEIGHT * 0.8))
    # still returned when it is the only match: the model may have no other way
    assert names(rank(index, "tracker", 5, health_of=lambda n: Health(failure_share=1.0))) == [
        "alpha.ticket",
        "beta.ticket",
    ]


def test_noise_and_unknown_health_change_nothing() -> None:
    index = twins()
    noisy = rank(
        index, "ticket tracker", 2, health_of=lambda n: Health(failure_share=0.1) if n == "alpha.ticket" else Health()
    )
    assert names(noisy) == ["alpha.ticket", "beta.ticket"] and noisy[0].score == noisy[1].score
    assert Health().weight() == 1.0 and Health(status="live").weight() == 1.0 and Health(status="grace").weight() == 1.0


def test_ranking_with_health_is_exact_however_many_tools_health_moves() -> None:
    """Demoting or excluding many top tools reaches past the first window of candidates; the result is still the
    full ranking's."""
    rng = random.Random(7)
    words = "alpha beta gamma delta ticket email chat file search create list update".split()
    index = ToolIndex()
    index.update(
        {f"t{i}": SearchDoc(f"t{i}", "", " ".join(rng.choices(words, k=rng.randint(3, 12)))) for i in range(400)}
    )
    health = {f"t{i}": Health(status="held") if i % 3 == 0 else Health(failure_share=rng.random()) for i in range(400)}
    full = sorted(
        ((s * health[n].weight(), n) for n, s in index.search("ticket email", 400) if health[n].weight() > 0),
        key=lambda p: (-p[0], p[1]),
    )
    assert names(rank(index, "ticket email", MAX_LIMIT, health_of=health.__getitem__)) == [
        n for _, n in full[:MAX_LIMIT]
    ]
    assert names(rank(index, "ticket email", 7, health_of=health.__getitem__)) == [n for _, n in full[:7]]


# --- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "   ", "?!…", "the of and", "please can you help me"])
def test_a_query_with_nothing_to_search_for_is_refused_in_one_line(query: str) -> None:
    with pytest.raises(BadQuery, match="no words to search for") as refused:
        rank(twins(), query, 5)
    assert "\n" not in str(refused.value)


def test_a_10_kb_query_is_refused_saying_the_bound() -> None:
    with pytest.raises(BadQuery, match=f"10,240 characters long; at most {MAX_QUERY_CHARS:,}"):
        rank(twins(), "ticket " * 1462 + "abcdef", 5)
    assert names(rank(twins(), ("x" * 30 + " ") * 100 + "ticket", 5))  # long but within bounds: searched


@pytest.mark.parametrize("limit", [0, -1, MAX_LIMIT + 1, 10_000, True, 2.5, "5"])
def test_a_limit_out_of_range_is_refused_saying_the_range(limit: object) -> None:
    with pytest.raises(BadQuery, match=f"limit must be a whole number from 1 to {MAX_LIMIT}"):
        rank(twins(), "ticket", limit)  # type: ignore[arg-type]


def test_unicode_queries_and_tools() -> None:
    index = ToolIndex()
    index.update(
        {
            "wetter": SearchDoc("wetter", "Wetterbericht", "Das Wetter für München, Übermorgen"),
            "nihongo": SearchDoc("nihongo", "", "日本語 テキスト を 翻訳"),
            "emoji": SearchDoc("emoji", "", "Rocket 🚀 launches"),
            "broken": SearchDoc("broken", "", "text with a lone \ud800 surrogate"),
        }
    )
    assert names(rank(index, "MÜNCHEN wetter", 5))[0] == "wetter"
    assert names(rank(index, "翻訳", 5)) == ["nihongo"]
    assert names(rank(index, "🚀 rocket", 5)) == ["emoji"]
    assert names(rank(index, "surrogate \udfff", 5)) == ["broken"]
    assert rank(index, "\u0000\u200b zero-width", 5) == []  # searched, nothing matches
    with pytest.raises(BadQuery):
        rank(index, "🚀🚀", 5)  # no letters or digits: nothing to search for


# --- keyword stuffing --------------------------------------------------------------------------------------------


def test_a_description_stuffed_with_every_word_does_not_rank_itself_first(
    corpus: tuple[list[dict[str, object]], list[dict[str, str]]],
) -> None:
    tools, queries = corpus
    vocabulary = sorted(
        {word for t in tools for word in json.dumps(t).replace('"', " ").split()}
        | {word for q in queries for word in q["query"].split()}
    )
    index = indexed(tools)
    before = recall_at_5(index, queries)
    stuffers = {
        "best.tool": SearchDoc("best.tool", "The best tool", " ".join(vocabulary)),
        "best.tool.repeated": SearchDoc("best.tool.repeated", "create get list search", " ".join(vocabulary * 20)),
        "best.tool.arguments": SearchDoc("best.tool.arguments", "", "Does everything", " ".join(vocabulary * 3)),
    }
    index.update(stuffers)
    first = [rank(index, q["query"], 1)[0].name for q in queries]
    assert not set(first) & set(stuffers), [q["query"] for q, f in zip(queries, first) if f in stuffers]
    assert recall_at_5(index, queries) >= before - 0.02


@pytest.mark.parametrize("repeats", [3, 20, 100])
def test_a_description_repeating_a_query_does_not_outrank_the_tool_that_matches_it(
    corpus: tuple[list[dict[str, object]], list[dict[str, str]]], repeats: int
) -> None:
    """A rival whose whole description is one query said over and over: for every corpus query whose tool is found
    in the top 5 on its own, the rival never ranks above that tool (a word repeated in a field counts once)."""
    tools, queries = corpus
    index = indexed(tools)
    found = [q for q in queries if q["tool"] in names(rank(index, q["query"], 5))]
    assert len(found) >= 180
    above = []
    for q in found:
        index.update({"zz.helper": SearchDoc("zz.helper", "", " ".join([q["query"]] * repeats))})
        ranked = names(rank(index, q["query"], 10))
        if "zz.helper" in ranked and (q["tool"] not in ranked or ranked.index("zz.helper") < ranked.index(q["tool"])):
            above.append(q["query"])
    assert not above, above
