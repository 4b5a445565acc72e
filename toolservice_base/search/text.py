"""What of a tool is searched, how much each part counts, and what a query may be.

A tool is searched as four fields: its name (split into words: `github.pull-request.create` and `createIssue`
are searched as `github pull request create` and `create Issue`), its title, its description, and its
arguments (each one's name and description). A word found in the name counts most; one found only in an
argument's description, least (`BOOSTS`). Every field is ranked by BM25 on its own, and a word counts once in a
field however often it is repeated there (the index keeps no term frequencies, `index.INDEX_OPTION`). So what one
word can earn a tool in a field is bounded (its rarity, the field's boost, and at most BM25's bonus for a short
field, 1.7 times that of a field of average length), and a long field (a description stuffed with every word
there is) earns less for each word in it: a description that repeats the words of another tool's queries ranks
no higher for saying them a hundred times than for saying them once.

Words are taken the same way from a tool and from a query: split on anything that is not a letter or digit
(any script), lower-cased, English stop words and request fillers (`please`, `how do I`) dropped, stemmed
(Snowball English: `tickets` finds `ticket`). The analysis is tantivy's own (`analyzer`), so the index and the
query agree by construction.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from ..errors import BadQuery

if TYPE_CHECKING:
    import tantivy

    from ..schemas import ToolDescriptor

BOOSTS: dict[str, float] = {"name": 3.0, "title": 2.0, "description": 1.0, "arguments": 0.6}
"""Field -> how much a match in it counts, relative to one in the description (tantivy's per-field boost)."""

MAX_QUERY_CHARS = 4096
"""The longest query taken; a longer one is refused, saying so (an adapter searching a whole user message keeps
its last `MAX_QUERY_CHARS` characters instead)."""
MAX_QUERY_TERMS = 64
"""Distinct words of a query searched for, the first ones: each costs a lookup in every field."""
MAX_LIMIT = 100
"""The most results one search returns."""
MAX_WORD = 40
"""Longer runs of letters (base64, hashes) are not words: left out of the index and of queries."""

FILLERS = (
    "i me my mine we our you your please could would can kindly want need like how do does did help some any tool tools"
).split()
"""Words a request is wrapped in that say nothing about which tool: dropped besides tantivy's English stop words
(Lucene's list: a, the, of, to, with, ...)."""
STOP_WORDS = sorted(
    {
        *"a an and are as at be but by for if in into is it no not of on or such that the their then there these "
        "they this to was will with".split(),
        *FILLERS,
    }
)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SURROGATES = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class SearchDoc:
    """One tool as the index holds it: the text of each field in `BOOSTS`."""

    name: str
    title: str = ""
    description: str = ""
    arguments: str = ""

    @classmethod
    def of(cls, tool: ToolDescriptor) -> SearchDoc:
        """A tool descriptor as searched: its name, title, description, and each argument's name and description."""
        arguments = arguments_text((a.name, a.description) for a in tool.arguments)
        return cls(tool.name, tool.title or "", tool.description, arguments)

    def fields(self) -> dict[str, str]:
        return {
            "name": name_words(self.name),
            "title": clean(self.title),
            "description": clean(self.description),
            "arguments": clean(self.arguments),
        }


def name_words(name: str) -> str:
    """A tool's name as words: separators become spaces, camelCase is split."""
    return _CAMEL.sub(" ", re.sub(r"[._\-]+", " ", name))


def clean(text: str) -> str:
    """Text that can cross into the index: lone surrogates (from JSON `\\ud800` escapes) are not characters."""
    return _SURROGATES.sub(" ", text)


def arguments_text(arguments: Iterable[tuple[str, str]]) -> str:
    """The `arguments` field: each argument's name (as words) and description."""
    return " ".join(f"{name_words(name)} {description}" for name, description in arguments)


@cache
def analyzer() -> tantivy.TextAnalyzer:
    """The one analysis of tool text and queries: tantivy's simple tokenizer, long runs out, lower case, stop words
    out, Snowball English stems."""
    import tantivy

    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(MAX_WORD))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.custom_stopword(STOP_WORDS))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise BadQuery(f"limit must be a whole number from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def query_terms(query: str) -> list[str]:
    """The distinct analysed words of `query`, in order, at most `MAX_QUERY_TERMS`; `BadQuery` when it is too long
    or says nothing searchable."""
    if not isinstance(query, str):
        raise BadQuery(f"a query is text, got {type(query).__name__}")
    if len(query) > MAX_QUERY_CHARS:
        raise BadQuery(f"the query is {len(query):,} characters long; at most {MAX_QUERY_CHARS:,} are searched")
    terms = list(dict.fromkeys(analyzer().analyze(clean(query))))
    if not terms:
        raise BadQuery(
            "the query has no words to search for (it is empty, or only punctuation and words like 'the' or"
            " 'please'); say what the tool should do"
        )
    return terms[:MAX_QUERY_TERMS]
