"""A tool held by pinning is listed as `held` with the pointer to `toolreg pending`, wherever it is looked up.

With `--pin-definitions`, a service that goes and comes back with another definition of its tool is held: the tool
leaves the store (no instance offers the pinned definition) until an operator decides. It used to vanish from
`toolreg tools`, and `toolreg call` said "no tool" with no pointer; an MCP client was told "unknown tool".
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from support import atoolreg, eventually, toolreg_env
from support.mcp import stdio_session
from support.pins import PINNING

from discovery.cli.held import HeldLookup
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import Settings, Transport
from toolservice_base.examples.joke import JokeService


class ChangedJokeService(JokeService):
    """The joke service, restarted with another description of its tool: a changed definition."""

    tools = [{**JokeService.tools[0], "description": "Tell a joke on a given topic, and ask for a tip"}]


@pytest.fixture
async def held(connection: Transport, settings: Settings, config_store: ConfigStoreService) -> AsyncIterator[Registry]:
    """A pinning registry where `tell-joke` was pinned, its service went, and came back with another definition."""
    registry = Registry(connection, options=PINNING)
    await registry.start()
    try:
        async with JokeService(settings=settings, ttl=5):
            await eventually(lambda: _status(registry, "tell-joke", "live"), timeout=5)
        await eventually(lambda: _gone(registry, "tell-joke"), timeout=5)
        async with ChangedJokeService(settings=settings, ttl=5):
            await eventually(lambda: _status(registry, "tell-joke", "held"), timeout=5)
            yield registry
    finally:
        await registry.stop()


async def _status(registry: Registry, name: str, status: str) -> bool:
    return any(t.name == name and t.status == status for t in await registry.list_tools())


async def _gone(registry: Registry, name: str) -> bool:
    return all(t.name != name for t in await registry.list_tools())


async def test_toolreg_tools_lists_a_held_tool_as_held_with_what_to_run(
    held: Registry, settings: Settings, tmp_path: Path
) -> None:
    env = toolreg_env(settings.pulsar_url or "", tmp_path / "cli")
    listed = await atoolreg("tools", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    row = {r["name"]: r for r in json.loads(listed.stdout)}["tell-joke"]
    assert (row["status"], row["service"], row["source"], row["instances"]) == ("held", "joke-service", "announced", 1)
    assert "`toolreg pending`" in row["detail"] and "`toolreg approve tell-joke`" in row["detail"]
    table = await atoolreg("tools", env=env)
    line = next(line for line in table.stdout.splitlines() if line.startswith("tell-joke"))
    assert " held " in line and "toolreg pending" in line
    page = {t.name: t for t in (await held.overview.snapshot()).tools}
    assert (page["tell-joke"].status, page["tell-joke"].detail) == ("held", row["detail"])  # the page says the same


async def test_toolreg_call_of_a_held_tool_says_it_is_held_and_what_to_run(
    held: Registry, settings: Settings, tmp_path: Path
) -> None:
    env = toolreg_env(settings.pulsar_url or "", tmp_path / "cli")
    called = await atoolreg("call", "tell-joke", "topic=cats", env=env)
    assert called.returncode == 1 and called.stdout == ""
    line = called.stderr.strip()
    assert "\n" not in line, called.stderr
    assert line.startswith("toolreg: tool 'tell-joke' is held in workspace 'default': its definition changed")
    assert "`toolreg pending`" in line
    unknown = await atoolreg("call", "no-such-tool", env=env)
    assert "no tool 'no-such-tool'" in unknown.stderr and "held" not in unknown.stderr


async def test_the_mcp_front_answers_a_call_of_a_held_tool_with_the_pointer(
    held: Registry, settings: Settings, tmp_path: Path
) -> None:
    async with stdio_session(settings.pulsar_url or "", tmp_path, "legacy") as (session, _):
        with pytest.raises(MCPError) as caught:
            await session.call_tool("tell-joke", {"topic": "cats"})
    assert caught.value.error.code == types.INVALID_PARAMS
    assert "is held in workspace 'default'" in caught.value.error.message
    assert "`toolreg pending`" in caught.value.error.message


async def test_the_lookup_says_nothing_of_a_tool_that_is_not_held_nor_when_no_registry_answers(
    held: Registry, settings: Settings
) -> None:
    lookup = HeldLookup(settings, "default")
    try:
        assert await lookup.explain("no-such-tool") is None
        assert "is held" in (await lookup.explain("tell-joke") or "")
    finally:
        await lookup.close()
    await held.stop()
    silent = HeldLookup(settings, "default", timeout=0.3)
    try:
        assert await silent.explain("tell-joke") is None
    finally:
        await silent.close()
