"""`toolreg mcp --search` over stdio, driven by the official SDK's `ClientSession`: two tools in front of a
thousand, found by words and called by name."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from support import eventually
from support.corpus import corpus_items
from support.mcp import ERAS, Era, list_all, stdio_session, text_of

from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry
from toolservice_base import ConfigClient, Settings
from toolservice_base.examples.calculator import CalculatorService


@pytest.fixture
async def fleet(settings: Settings, registry: Registry, config_client: ConfigClient) -> AsyncIterator[None]:
    await config_client.put(corpus_items())
    calculator = CalculatorService(settings=settings)
    await calculator.start()
    await eventually(lambda: _has(config_client, "calculate"), timeout=10)
    yield
    await calculator.stop()


async def _has(client: ConfigClient, name: str) -> bool:
    return name in await client.list("tool")


def found(result: types.CallToolResult) -> list[dict[str, Any]]:
    assert result.is_error is False, text_of(result)
    assert result.structured_content is not None
    tools: list[dict[str, Any]] = result.structured_content["tools"]
    if tools:
        assert json.loads(text_of(result)) == tools  # the same, for a client that reads only text
    else:
        assert text_of(result).startswith("no live tool matches")
    return tools


@pytest.mark.parametrize("era", ERAS)
async def test_two_tools_find_and_call_any_of_a_thousand(
    era: Era, broker: EmbeddedBroker, tmp_path: Path, fleet: None
) -> None:
    async with stdio_session(broker.url, tmp_path, era, "--search") as (session, _):
        listed, _ = await list_all(session)
        assert [t.name for t in listed] == ["search_tools", "call_tool"]
        assert listed[0].output_schema is not None and listed[0].annotations is not None

        # Found by words, with the definition tools/list would give, best first.
        [calculate] = found(
            await session.call_tool("search_tools", {"query": "evaluate an arithmetic expression", "limit": 1})
        )
        assert calculate["name"] == "calculate" and calculate["score"] > 0
        assert calculate["inputSchema"]["required"] == ["expression"]
        matches = found(await session.call_tool("search_tools", {"query": "archive a ticket in jira"}))
        assert len(matches) == 5 and matches[0]["name"] == "jira_ticket_archive"  # the MCP name of jira.ticket.archive
        assert [m["score"] for m in matches] == sorted((m["score"] for m in matches), reverse=True)

        # Called by name through call_tool, or directly.
        answer = await session.call_tool("call_tool", {"name": "calculate", "arguments": {"expression": "6 * 7"}})
        assert answer.is_error is False and text_of(answer) == "42"
        assert text_of(await session.call_tool("calculate", {"expression": "2 + 2"})) == "4"
        failed = await session.call_tool("call_tool", {"name": "calculate", "arguments": {"expression": "1 % 0"}})
        assert failed.is_error is True and "division by zero" in text_of(failed)


async def test_bad_searches_and_calls_are_error_results_saying_what_would_do(
    broker: EmbeddedBroker, tmp_path: Path, fleet: None
) -> None:
    async with stdio_session(broker.url, tmp_path, "legacy", "--search") as (session, _):
        cases = {
            "no words": ({"query": "  ?! "}, "no words to search for"),
            "10 KB": ({"query": "ticket " * 1500}, "at most 4,096 are searched"),
            "limit 0": ({"query": "ticket", "limit": 0}, "limit must be a whole number from 1 to 100"),
            "limit 10,000": ({"query": "ticket", "limit": 10_000}, "limit must be a whole number from 1 to 100"),
            "not text": ({"query": 7}, "query must be text"),
        }
        for case, (arguments, message) in cases.items():
            result = await session.call_tool("search_tools", arguments)
            assert result.is_error is True and message in text_of(result), case
        # No tool shares a word with it: what comes back (if anything) is ranked by meaning alone, never an error.
        gibberish = await session.call_tool("search_tools", {"query": "zzyzx qwertyuiop", "limit": 3})
        assert gibberish.is_error is not True and len(found(gibberish)) <= 3
        unicode = found(await session.call_tool("search_tools", {"query": "wetter für München 🌦 forecast"}))
        assert unicode and unicode[0]["name"].startswith("weather_forecast")

        unknown = await session.call_tool("call_tool", {"name": "no.such.tool", "arguments": {}})
        assert unknown.is_error is True and "no live tool named 'no.such.tool'" in text_of(unknown)
        wrong = await session.call_tool("call_tool", {"name": "calculate", "arguments": {"expr": "1"}})
        assert wrong.is_error is True and "argument 'expression' is missing" in text_of(wrong)
