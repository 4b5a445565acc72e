"""The registry's own search over its tools (what the registry page's search box asks): announced and static tools
of every workspace it lists, ranked as agents' searches rank them, by the health the page shows; its index is
built on the first search and then fed only what changed, never rebuilt per search."""

from __future__ import annotations

import json

import pytest
from support import eventually
from support.registry import offering

from discovery.errors import RegistryUnavailable
from discovery.registry.options import RegistryOptions
from discovery.registry.overview import Overview, RegistrySnapshot
from discovery.registry.replicated import ActiveRegistry
from discovery.registry.service import Registry
from discovery.registry.usage import ToolUsage
from toolservice_base import BadQuery, ConfigClient, Transport

JIRA = {"jira.ticket.create": "Create a ticket in Jira", "jira.ticket.archive": "Archive a Jira ticket once it is done"}
WEATHER = {"weather.now": "The current weather in a city"}
FAX_SERVICE = {
    "id": "fax",
    "request-queue": "non-persistent://tg/request/fax",
    "response-queue": "non-persistent://tg/response/fax",
}
FAX = {"type": "tool-service", "name": "fax.send", "description": "Send a fax to a number", "service": "fax"}


def keys(matches: list) -> list[str]:  # type: ignore[type-arg]
    return [m.name for m in matches]


async def announce(connection: Transport, registry: Registry, message: bytes, tool: str, listed: bool = True) -> None:
    """Send one announcement or withdraw; wait until the registry's page lists `tool` (or, `listed=False`, no more)."""
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    try:
        await publisher.send(message)
    finally:
        await connection.close_publisher(publisher)

    async def done() -> bool:
        return (tool in {t.name for t in (await registry.overview.snapshot()).tools}) == listed

    await eventually(done, timeout=10)
    await registry.settle()


async def search(overview: Overview, query: str, limit: int = 5) -> list[str]:
    return keys(await overview.search(query, limit, await overview.snapshot()))


async def test_the_registry_searches_its_tools_and_feeds_its_index_only_what_changed(
    connection: Transport, registry: Registry, config_client: ConfigClient
) -> None:
    overview = registry.overview
    await config_client.put([("tool-service", "fax", json.dumps(FAX_SERVICE)), ("tool", "fax.send", json.dumps(FAX))])
    await announce(connection, registry, offering("jira", JIRA), "jira.ticket.archive")
    await announce(connection, registry, offering("weather", WEATHER), "weather.now")
    index = overview.finder.index
    assert not index.built, "nothing is indexed before the first search"

    assert (await search(overview, "archive a jira ticket"))[0] == "default/jira.ticket.archive"
    assert await search(overview, "send a fax") == ["default/fax.send"], "static tools are searched too"
    assert (index.builds, index.updates) == (1, 0)

    # Searches that find nothing changed write nothing, even after the store moved and its items were read again.
    await config_client.put([("tool-service", "unrelated", json.dumps({**FAX_SERVICE, "id": "unrelated"}))])
    await eventually(lambda: overview.config_version is not None and overview.config_version >= 2)
    assert await search(overview, "weather in a city") == ["default/weather.now"]
    assert (index.builds, index.updates) == (1, 0)

    # A service comes with two tools: two documents written. One goes: one removed. Never a rebuild.
    await announce(
        connection, registry, offering("mail", {"mail.send": "Send an email", "mail.read": "Read mail"}), "mail.send"
    )
    assert (await search(overview, "send an email"))[0] == "default/mail.send"
    assert (index.builds, index.updates, index.last_changed) == (1, 1, 2)
    await announce(
        connection, registry, offering("weather", WEATHER, kind="withdraw", sequence=2), "weather.now", False
    )
    assert "default/weather.now" not in await search(overview, "weather")
    assert (index.builds, index.updates, index.last_changed) == (1, 2, 1)

    for query, limit in (("the", 5), ("x" * 10_000, 5), ("jira", 0), ("jira", 101)):
        with pytest.raises(BadQuery):
            await search(overview, query, limit)


def with_health(snapshot: RegistrySnapshot, **changes: dict[str, object]) -> RegistrySnapshot:
    """`snapshot` with the named tools' status or usage changed, as the page would show them."""
    tools = [t.model_copy(update=changes[t.name]) if t.name in changes else t for t in snapshot.tools]
    return snapshot.model_copy(update={"tools": tools})


async def test_what_the_page_shows_of_a_tools_health_ranks_it(
    connection: Transport, registry: Registry, config_client: ConfigClient
) -> None:
    overview = registry.overview
    twins = {"archive.one": "Archive a Jira ticket", "archive.two": "Archive a Jira ticket"}
    await announce(connection, registry, offering("archive", twins), "archive.two")
    # A static tool whose service is not in the store: agents skip it, so its search never returns it.
    await config_client.put([("tool", "archive.c", json.dumps({**FAX, "name": "archive.c", "service": "gone"}))])
    await eventually(lambda: overview.config_version is not None and overview.config_version >= 2)
    shown = await overview.snapshot()
    assert {t.name: t.status for t in shown.tools}["archive.c"] == "unavailable"
    both = ["default/archive.one", "default/archive.two"]
    assert keys(await overview.search("archive jira ticket", 5, shown)) == both

    failing = ToolUsage(calls_per_s=10.0, errors_per_s=9.0)
    ranked = await overview.search("archive jira ticket", 5, with_health(shown, **{"archive.one": {"usage": failing}}))
    assert keys(ranked) == ["default/archive.two", "default/archive.one"]
    assert ranked[0].relevance == pytest.approx(ranked[1].relevance, rel=0.01), "twins but for their names"
    held = with_health(shown, **{"archive.two": {"status": "held"}})
    assert keys(await overview.search("archive jira ticket", 5, held)) == ["default/archive.one"]
    gone = shown.model_copy(update={"tools": [t for t in shown.tools if t.name != "archive.one"]})
    assert keys(await overview.search("archive", 5, gone)) == ["default/archive.two"], "only the tools shown"


async def test_a_standby_replica_has_no_search_to_offer(connection: Transport) -> None:
    standby = ActiveRegistry(connection, RegistryOptions())
    nothing = RegistrySnapshot(
        at=0.0, config_version=None, held=[], tools=[], instances=[], rejections=[], rejected_total=0, conflicts=[]
    )
    with pytest.raises(RegistryUnavailable, match="standby"):
        await standby.search("jira", 5, nothing)
