"""A name MCP and OpenAI-style clients see stays with the tool that had it first (issue 22, item 2).

`acme.search` is listed to those clients as `acme_search`. A later service
announcing a tool literally named `acme_search` (or the other way round) would
take that name, and a client that listed before would send its next call,
with its arguments, to the newcomer. Such a collision is a conflict like any
other: refused, listed in `toolreg conflicts`, told to the refused service.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from support import eventually
from support.registry import announcement

from discovery.registry.client import RegistryClient
from discovery.registry.keys import Key
from discovery.registry.merge import InstanceRecord, Offer, OwnershipRecord, Plan, apply_plan, plan_service
from discovery.registry.service import Registry
from discovery.registry.validation import AnnouncementValidator, Rejected
from toolservice_base import ConfigClient, Transport, names
from toolservice_base.mcp_service.listing import tool_name
from toolservice_base.schemas import Probe, ToolDescriptor, ToolServiceDescriptor, descriptor_digest


def offer(service_id: str, *tools: str) -> Offer:
    service = ToolServiceDescriptor.model_validate(
        {
            "id": service_id,
            "request-queue": f"non-persistent://tg/request/{service_id}",
            "response-queue": f"non-persistent://tg/response/{service_id}",
        }
    )
    parsed = tuple(ToolDescriptor(name=name, description="does things", service=service_id) for name in tools)
    return Offer(service, parsed, descriptor_digest(service, list(parsed)), "1.0")


def base_record(service_id: str, *instances: str, digest: str | None = None) -> OwnershipRecord:
    return OwnershipRecord(
        service=service_id,
        workspace="default",
        digest=digest,
        instances={i: InstanceRecord(ttl=2.0, since=1.0) for i in instances},
    )


# --- the rules, without a broker ---------------------------------------------------------------


def plan(
    view: dict[Key, str | None],
    owners: dict[Key, str],
    service_id: str,
    *tools: str,
    kept: dict[Key, float] | None = None,
) -> Plan:
    the_offer = offer(service_id, *tools)
    return plan_service(
        view,
        owners,
        service_id=service_id,
        owned={},
        record=base_record(service_id, "i1", digest=the_offer.digest),
        offer=the_offer,
        kept=kept,
    )


@pytest.mark.parametrize(
    ("first", "later"), [("acme.search", "acme_search"), ("acme_search", "acme.search"), ("a_b.c", "a.b_c")]
)
def test_a_tool_whose_client_name_another_tool_has_is_refused_to_the_later_service(first: str, later: str) -> None:
    view: dict[Key, str | None] = {}
    owners: dict[Key, str] = {}
    held = plan(view, owners, "acme", first)
    apply_plan(view, owners, held, [])
    assert held.conflicts == [] and ("tool", first) in held.owned
    refused = plan(view, owners, "other", later, "other-tool")
    assert ("tool", later) not in refused.writes and ("tool", later) not in refused.owned
    assert ("tool", "other-tool") in refused.owned  # the rest of its offer goes in
    [conflict] = refused.conflicts
    shown = names.client_name(later)
    assert (conflict.tool, conflict.held_by) == (later, "acme")
    assert f"as {shown!r}" in conflict.reason and repr(first) in conflict.reason and "first" in conflict.reason


def test_a_name_kept_for_a_service_that_went_keeps_its_client_name_too() -> None:
    until = time.time() + 60
    refused = plan({}, {("tool", "acme.search"): "acme"}, "other", "acme_search", kept={("tool", "acme.search"): until})
    assert [(c.tool, c.held_by) for c in refused.conflicts] == [("acme_search", "acme")]
    assert "kept for it until" in refused.conflicts[0].reason


def test_a_static_tool_read_with_the_batch_keeps_its_client_name() -> None:
    static = ToolDescriptor(name="acme.search", description="by hand", service="acme").to_json()
    refused = plan({("tool", "acme.search"): static}, {}, "other", "acme_search")
    assert [(c.tool, c.held_by) for c in refused.conflicts] == [("acme_search", "static")]


def test_a_client_name_released_earlier_in_a_batch_is_free_for_a_later_service() -> None:
    view: dict[Key, str | None] = {}
    owners: dict[Key, str] = {}
    first = plan(view, owners, "acme", "acme.search")
    apply_plan(view, owners, first, [])
    renamed = offer("acme", "acme.find")  # acme's next version drops acme.search
    moved = plan_service(
        view,
        owners,
        service_id="acme",
        owned=first.owned,
        record=base_record("acme", "i1", digest=renamed.digest),
        offer=renamed,
    )
    apply_plan(view, owners, moved, first.owned)
    assert moved.removed == ["acme.search"]
    assert plan(view, owners, "rival", "acme_search").conflicts == []
    owners[("tool", "acme.search")] = (
        "acme"  # kept for it after all, set by hand as the writer does for a service that went
    )
    assert [c.held_by for c in plan(view, owners, "rival", "acme_search").conflicts] == ["acme"]


def test_names_that_merely_share_words_do_not_collide() -> None:
    view: dict[Key, str | None] = {}
    owners: dict[Key, str] = {}
    apply_plan(view, owners, plan(view, owners, "acme", "acme.search"), [])
    assert plan(view, owners, "other", "acme.search.v2", "acme.searches", "search.acme").conflicts == []


@pytest.mark.parametrize(
    "lookalike",
    [
        "TELL-JOKE",  # case
        "tell_joke",  # `_` for `-`
        "tell.joke",
        "tell--joke",
        tool_name("tell-joke "),  # an MCP server's tool with a trailing space: announced as `tell-joke_`
    ],
)
def test_a_name_that_looks_like_another_services_tool_is_refused_naming_that_tool(lookalike: str) -> None:
    view: dict[Key, str | None] = {}
    owners: dict[Key, str] = {}
    apply_plan(view, owners, plan(view, owners, "joke-service", "tell-joke"), [])
    refused = plan(view, owners, "rival", lookalike, "rival-tool")
    assert ("tool", lookalike) not in refused.owned and ("tool", "rival-tool") in refused.owned
    assert [(c.tool, c.held_by) for c in refused.conflicts] == [(lookalike, "joke-service")]
    assert "'tell-joke'" in refused.conflicts[0].reason


@pytest.mark.parametrize("mcp_name", ["tell\u2010joke", "t\u0435ll-joke", "tell\u2011joke"])
def test_an_mcp_tool_with_lookalike_characters_is_announced_as_the_name_it_imitates_and_refused(
    mcp_name: str,
) -> None:
    """A hyphen U+2010, a Cyrillic `е`: mapped to the ASCII they look like, not to `_` (a new name that looks alike)."""
    assert tool_name(mcp_name) == "tell-joke"
    view: dict[Key, str | None] = {}
    owners: dict[Key, str] = {}
    apply_plan(view, owners, plan(view, owners, "joke-service", "tell-joke"), [])
    refused = plan(view, owners, "rival", tool_name(mcp_name))
    assert [(c.tool, c.held_by) for c in refused.conflicts] == [("tell-joke", "joke-service")]


@pytest.mark.parametrize(
    "lookalike", ["tell\u2010joke", "t\u0435ll-joke", "TELL\u2011JOKE", "tell-joke ", "tell\u200b-joke", "Tell_Joke."]
)
def test_every_lookalike_folds_to_the_name_it_imitates(lookalike: str) -> None:
    assert names.name_keys("tell-joke") <= names.name_keys(lookalike)
    assert not names.name_keys("tell-jokes") & names.name_keys("tell-joke")


def test_a_service_may_rename_its_own_tool_to_a_lookalike() -> None:
    view: dict[Key, str | None] = {}
    owners: dict[Key, str] = {}
    first = plan(view, owners, "joke-service", "tell-joke")
    apply_plan(view, owners, first, [])
    renamed = offer("joke-service", "Tell_Joke")
    moved = plan_service(
        view,
        owners,
        service_id="joke-service",
        owned=first.owned,
        record=base_record("joke-service", "i1", digest=renamed.digest),
        offer=renamed,
    )
    assert moved.conflicts == [] and moved.removed == ["tell-joke"] and moved.registered == ["Tell_Joke"]


def test_one_service_announcing_two_lookalike_tools_is_refused_whole() -> None:
    data = announcement("jokes", ("tell-joke", "TELL_JOKE")).to_json().encode()
    with pytest.raises(Rejected, match="'TELL_JOKE' and 'tell-joke' look alike") as caught:
        AnnouncementValidator().check(data, time.time())
    assert caught.value.category == "malformed"


def test_a_long_name_keeps_its_hashed_client_name_from_a_tool_named_like_it() -> None:
    long = "x" * 100
    shown = names.client_name(long)
    assert len(shown) == 64 and names.OPENAI_NAME.match(shown)
    owners: dict[Key, str] = {}
    view: dict[Key, str | None] = {}
    apply_plan(view, owners, plan(view, owners, "acme", long), [])
    assert [c.tool for c in plan(view, owners, "other", shown).conflicts] == [shown]
    # And the bridge's mapping stays one-to-one even for a set the registry did not police.
    mapping = names.openai_names([long, shown])
    assert mapping[shown] == shown and mapping[long] != shown and names.OPENAI_NAME.match(mapping[long])


def test_one_service_announcing_two_tools_with_one_client_name_is_refused_whole() -> None:
    data = announcement("acme", ("acme.search", "acme_search")).to_json().encode()
    with pytest.raises(Rejected, match="would both be listed to MCP and OpenAI clients as 'acme_search'") as caught:
        AnnouncementValidator().check(data, time.time())
    assert caught.value.category == "malformed" and caught.value.reason.startswith("not a valid announcement")


def test_the_bridge_the_mcp_front_and_the_registry_use_one_mapping() -> None:
    from agent_bridge import reload
    from discovery.mcp import listing

    assert reload.openai_names is names.openai_names and listing.openai_names is names.openai_names
    assert listing.OPENAI_NAME is names.OPENAI_NAME


# --- on a real broker --------------------------------------------------------------------------


async def _notices(connection: Transport) -> list[Probe]:
    found: list[Probe] = []

    async def keep(message: Any) -> None:
        probe = Probe.model_validate_json(message.data)
        if probe.refused is not None:
            found.append(probe)

    await connection.subscribe(connection.topics.tool_probe, keep)
    return found


@pytest.mark.contract
@pytest.mark.parametrize(("first", "later"), [("acme.search", "acme_search"), ("acme_search", "acme.search")])
async def test_a_later_tool_cannot_take_the_name_clients_already_call(
    connection: Transport, config_client: ConfigClient, registry: Registry, first: str, later: str
) -> None:
    notices = await _notices(connection)
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await publisher.send(announcement("acme", (first,), instance="acme-1", ttl=30).to_json())
    await eventually(lambda: config_client.list("tool"), timeout=3.0)
    listed_before = names.openai_names(await config_client.list("tool"))
    await publisher.send(announcement("rival", (later, "rival-tool"), instance="rival-1", ttl=30).to_json())
    await eventually(lambda: registry.conflicts(), timeout=3.0)
    await registry.settle()
    # The store, and so every agent and MCP client, still has the first tool under the name it was listed by.
    in_store = await config_client.list("tool")
    assert sorted(in_store) == sorted([first, "rival-tool"])
    assert names.openai_names(in_store)[first] == listed_before[first] == "acme_search"
    assert json.loads((await config_client.get([("tool", first)]))[("tool", first)])["service"] == "acme"
    # A conflict like any other: listed by the query API `toolreg conflicts` reads ...
    async with RegistryClient(connection, timeout=5) as client:
        conflicts = await client.conflicts()
    assert [(c.tool, c.service, c.held_by, c.workspace) for c in conflicts] == [(later, "rival", "acme", "default")]
    assert "'acme_search'" in conflicts[0].reason
    # ... and told to the refused service.
    await eventually(lambda: any(n.instance == "rival-1" and later in (n.refused or "") for n in notices), timeout=3.0)
    assert not any(n.instance == "acme-1" for n in notices)


@pytest.mark.contract
async def test_lookalikes_of_another_services_tools_are_refused_as_conflicts(
    connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    """Row 7 of round five: `TELL-JOKE` and `archive-ticket ` (an MCP name with a trailing space, announced as
    `archive-ticket_`) beside `tell-joke` and `archive-ticket` of another service: refused, not shown to a model."""
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    originals = ("tell-joke", "archive-ticket")
    await publisher.send(announcement("joke-service", originals, instance="jokes-1", ttl=30).to_json())
    await eventually(lambda: config_client.list("tool"), timeout=3.0)
    lookalikes = ("TELL-JOKE", tool_name("archive-ticket "))
    await publisher.send(announcement("rival", (*lookalikes, "rival-tool"), instance="rival-1", ttl=30).to_json())
    await eventually(lambda: len(registry.conflicts()) == 2, timeout=10.0)
    await registry.settle()
    assert sorted(await config_client.list("tool")) == sorted([*originals, "rival-tool"])
    async with RegistryClient(connection, timeout=5) as client:
        conflicts = sorted(await client.conflicts(), key=lambda c: c.tool)
    assert [(c.tool, c.service, c.held_by) for c in conflicts] == [
        ("TELL-JOKE", "rival", "joke-service"),
        ("archive-ticket_", "rival", "joke-service"),
    ]
    assert "looks like tool 'tell-joke'" in conflicts[0].reason
    assert "looks like tool 'archive-ticket'" in conflicts[1].reason
