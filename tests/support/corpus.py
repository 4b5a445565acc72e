"""The search corpus (`bench/search-corpus/`, made by `bench/search_corpus.py`) as config items: 1,000 tools of one
service that is not running (they are found, never called)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "bench" / "search-corpus"
SERVICE = "corpus"


def corpus_tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = json.loads((CORPUS / "tools.json").read_text())
    return tools


def corpus_queries() -> list[dict[str, str]]:
    queries: list[dict[str, str]] = json.loads((CORPUS / "queries.json").read_text())
    return queries


def corpus_items() -> list[tuple[str, str, str]]:
    """`(type, key, value)` for `ConfigClient.put`: the corpus's service and its 1,000 tools."""
    service = {
        "id": SERVICE,
        "request-queue": f"non-persistent://tg/request/{SERVICE}",
        "response-queue": f"non-persistent://tg/response/{SERVICE}",
    }
    return [("tool-service", SERVICE, json.dumps(service))] + [
        ("tool", t["name"], json.dumps({**t, "service": SERVICE})) for t in corpus_tools()
    ]
