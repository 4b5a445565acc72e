"""`ToolSet.search`: the live set, searched; the index follows each reload by what changed; the agent's own calls
and the registry's report move the ranking."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support import static_items

from agent_bridge import ToolSet
from toolservice_base import BadQuery, ConfigClient, DynamicToolService, Settings, ToolError, Transport
from toolservice_base.search import Health


def toolset(connection: Transport, settings: Settings, **options: Any) -> ToolSet:
    return ToolSet(connection=connection, settings=settings, **{"poll_interval": 60.0, **options})


def calculator_twin(running: dict[str, DynamicToolService], name: str) -> tuple[str, str, str]:
    """Another tool of the calculator service, described exactly like `calculate`: it matches as well."""
    [tool] = running["calculator"].tool_descriptors
    return ("tool", name, json.dumps({**json.loads(tool.to_json()), "name": name}))


def names(matches: list[Any]) -> list[str]:
    return [m.name for m in matches]


async def test_search_finds_the_live_tools_and_follows_each_reload_by_what_changed(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put(static_items(running["joke-service"], running["calculator"], running["echo"]))
    async with toolset(connection, settings) as tools:
        assert names(await tools.search("tell me a joke", 3))[0] == "tell-joke"
        assert names(await tools.search("arithmetic expression", 1)) == ["calculate"]
        search = tools._search.index
        assert search.updates == 0  # built on the first search, over the set as it was

        # A tool comes: one document written, not the set again.
        version = await config_client.put([calculator_twin(running, "compute-sum")])
        await tools.wait_for(lambda t: t.version >= version)
        assert "compute-sum" in names(await tools.search("arithmetic", 5))
        assert (search.updates, search.last_changed) == (1, 1)

        # One changes (its description): that one document again.
        [joke] = running["joke-service"].tool_descriptors
        changed = {**json.loads(joke.to_json()), "description": "Recite a limerick about something"}
        version = await config_client.put([("tool", "tell-joke", json.dumps(changed))])
        await tools.wait_for(lambda t: t.version >= version)
        found = await tools.search("limerick", 5)
        assert names(found) == ["tell-joke"] and found[0].score > 0
        assert (search.updates, search.last_changed) == (2, 1)

        # One goes: it is never found again.
        version = await config_client.delete([("tool", "compute-sum")])
        await tools.wait_for(lambda t: t.version >= version)
        assert "compute-sum" not in names(await tools.search("arithmetic", 5))
        assert (search.updates, search.last_changed) == (3, 1)
        assert tools.describe(names(await tools.search("arithmetic", 5)))[0]["name"] == "calculate"


async def test_a_tool_failing_its_calls_here_ranks_below_its_healthy_twin(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put([*static_items(running["calculator"]), calculator_twin(running, "calculate-too")])
    async with toolset(connection, settings) as tools:
        assert names(await tools.search("arithmetic", 2)) == ["calculate", "calculate-too"]  # a tie, by name

        # Calls the caller got wrong are no evidence against the tool.
        for _ in range(3):
            with pytest.raises(ToolError):  # ToolDiscoveryError: BadArguments
                await tools.invoke("calculate", {"wrong": 1})
        assert names(await tools.search("arithmetic", 2)) == ["calculate", "calculate-too"]

        # Three failures of the tool itself: it now ranks second.
        for _ in range(3):
            with pytest.raises(ToolError):
                await tools.invoke("calculate", {"expression": "1 % 0"})
        assert tools.health("calculate").failure_share == pytest.approx(1.0, abs=0.01)
        ranked = await tools.search("arithmetic", 2)
        # Their texts differ only by name, so they match as well as each other (within a hundredth).
        assert names(ranked) == ["calculate-too", "calculate"]
        assert ranked[1].relevance == pytest.approx(ranked[0].relevance, rel=0.01)

        # It works again: a run of successes brings it back level (the twin still wins the tie by health).
        for _ in range(30):
            assert await tools.invoke("calculate", {"expression": "1 + 1"}) == "2"
        assert tools.health("calculate").failure_share < 0.1
        assert names(await tools.search("arithmetic", 2)) == ["calculate", "calculate-too"]


async def test_what_the_registry_reports_held_or_unavailable_is_never_returned(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put([*static_items(running["calculator"]), calculator_twin(running, "calculate-too")])
    async with toolset(connection, settings) as tools:
        tools.report_health({"calculate": Health(status="held"), "calculate-too": Health(status="live")})
        assert names(await tools.search("arithmetic", 5)) == ["calculate-too"]
        tools.report_health({"calculate-too": Health(status="unavailable", failure_share=None)})
        assert names(await tools.search("arithmetic", 5)) == ["calculate"]
        tools.report_health({"calculate-too": Health(status="live", failure_share=0.9)})
        assert names(await tools.search("arithmetic", 5)) == ["calculate", "calculate-too"]
        with pytest.raises(BadQuery, match="limit must be"):
            await tools.search("arithmetic", 0)


async def test_an_agent_that_never_searches_builds_no_index_and_a_bad_query_builds_none_either(
    connection: Transport, settings: Settings, config_client: ConfigClient, running: dict[str, DynamicToolService]
) -> None:
    await config_client.put(static_items(running["calculator"]))
    async with toolset(connection, settings) as tools:
        version = await config_client.put([calculator_twin(running, "calculate-too")])
        await tools.wait_for(lambda t: t.version >= version)
        assert len(tools) == 2 and await tools.invoke("calculate", {"expression": "2 * 3"}) == "6"
        index = tools._search.index
        assert not index.built, "reloads and calls build nothing: the index is built when a search asks for it"
        for query, limit in (("the", 5), ("x" * 5000, 5), ("arithmetic", 0)):
            with pytest.raises(BadQuery):
                await tools.search(query, limit)
        assert not index.built
        assert names(await tools.search("arithmetic", 5)) == ["calculate", "calculate-too"] and index.builds == 1
