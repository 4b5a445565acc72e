"""`LiveIndex`: built off the event loop when first asked for, then fed only what changed; one writer, shared
builds, and a failed write never leaves a half-written index in use."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from toolservice_base.schemas import ToolDescriptor
from toolservice_base.search import LiveIndex, SearchDoc, ToolIndex, rank

CORPUS = Path(__file__).resolve().parents[2] / "bench" / "search-corpus"
TICK = 0.002


def fleet(count: int) -> dict[str, ToolDescriptor]:
    """`count` tools: the corpus, copies named `<name>-<k>`."""
    tools = json.loads((CORPUS / "tools.json").read_text())
    found = {}
    for i in range(count):
        tool = dict(tools[i % len(tools)], service="corpus")
        if i >= len(tools):
            tool["name"] = f"{tool['name']}-{i // len(tools)}"
        found[tool["name"]] = ToolDescriptor.model_validate(tool)
    return found


def searched(name: str, tool: ToolDescriptor) -> SearchDoc:
    return SearchDoc.of(tool)


def tool(name: str, description: str) -> ToolDescriptor:
    return ToolDescriptor(name=name, description=description, service="svc")


async def ticking(gaps: list[float]) -> None:
    while True:
        before = time.perf_counter()
        await asyncio.sleep(TICK)
        gaps.append(time.perf_counter() - before - TICK)


async def test_the_event_loop_keeps_running_while_10000_tools_are_indexed() -> None:
    tools = fleet(10_000)
    index = LiveIndex(searched)
    gaps: list[float] = []
    ticker = asyncio.create_task(ticking(gaps))
    await asyncio.sleep(0.05)
    gaps.clear()
    started = time.perf_counter()
    ranker = await index.sync(tools)
    took = time.perf_counter() - started
    ticker.cancel()
    assert len(ranker) == 10_000 and index.builds == 1
    assert [m.name for m in rank(ranker, "archive a jira ticket", 1)] == ["jira.ticket.archive"]
    # Built on the loop, the whole build would be one gap (0.6-0.9 s here); in a worker thread the loop gets the
    # GIL back every few milliseconds. (A busy machine may still hold the process up now and then: the longest gap
    # is bounded by the build, most of them by a few ticks of the GIL's switch interval.)
    gaps.sort()
    assert len(gaps) >= 10, (took, len(gaps))
    assert gaps[-1] < took / 2 and gaps[int(0.9 * len(gaps))] < 0.05, (took, gaps[-5:])


async def test_after_the_build_only_what_changed_is_written() -> None:
    tools = {f"t{n}": tool(f"t{n}", f"Tool number {n} of the fleet") for n in range(50)}
    index = LiveIndex(searched)
    ranker = await index.sync(tools)
    assert (index.builds, index.updates) == (1, 0)

    # The same mapping, or another whose tools are the same objects or equal ones: nothing written.
    assert await index.sync(tools) is ranker
    await index.sync({name: tool(t.name, t.description) for name, t in tools.items()})
    assert index.updates == 0

    # One came, one changed, one went: three documents, not fifty.
    after = dict(tools)
    after["t3"] = tool("t3", "Send a fax to the archive")
    after["fax.send"] = tool("fax.send", "Send a fax")
    del after["t7"]
    await index.sync(after)
    assert (index.builds, index.updates, index.last_changed) == (1, 1, 3)
    assert [m.name for m in rank(ranker, "fax", 5)] == ["fax.send", "t3"]
    assert "t7" not in ranker and len(ranker) == 50


async def test_the_first_askers_share_one_build_and_one_who_gives_up_stops_nothing() -> None:
    tools = fleet(2_000)
    index = LiveIndex(searched)
    impatient = asyncio.create_task(index.sync(tools))
    await asyncio.sleep(0.01)
    impatient.cancel()  # while its build runs in the worker thread
    rankers = await asyncio.gather(*(index.sync(tools) for _ in range(20)))
    assert impatient.cancelled()
    assert len({id(r) for r in rankers}) == 1 and index.builds == 1 and len(rankers[0]) == 2_000
    assert await index.sync(tools) is rankers[0]


async def test_follow_feeds_a_built_index_in_the_background_and_builds_nothing() -> None:
    index = LiveIndex(searched)
    index.follow({"a": tool("a", "Alpha")})
    await asyncio.sleep(0.05)
    assert not index.built and index.builds == 0, "a swap before any search builds nothing"
    ranker = await index.sync({"a": tool("a", "Alpha")})
    index.follow({"a": tool("a", "Alpha"), "b": tool("b", "Beta release notes")})
    for _ in range(200):
        if "b" in ranker and index.updates:
            break
        await asyncio.sleep(0.01)
    assert [m.name for m in rank(ranker, "release notes", 2)] == ["b"]


class Flaky(ToolIndex):
    """A ranker whose next commit fails once, as a full disk or a bug in the engine would."""

    fail = False

    def stage(self, upserts: Mapping[str, SearchDoc], removals: Iterable[str] = ()) -> int:
        if Flaky.fail:
            Flaky.fail = False
            raise RuntimeError("the index could not be written")
        return super().stage(upserts, removals)


async def test_a_failed_write_drops_the_index_and_the_next_ask_builds_it_whole() -> None:
    index = LiveIndex(searched, ranker=Flaky)
    await index.sync({"a": tool("a", "Alpha")})
    Flaky.fail = True
    with pytest.raises(RuntimeError, match="could not be written"):
        await index.sync({"a": tool("a", "Alpha"), "b": tool("b", "Beta")})
    assert not index.built
    ranker = await index.sync({"a": tool("a", "Alpha"), "b": tool("b", "Beta")})
    assert index.builds == 2 and [m.name for m in rank(ranker, "beta", 5)] == ["b"]
    await index.close()
    assert not index.built
