"""The registry on a real broker, in-process: merge, leases, conflicts, restarts, bad input."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry
from support import eventually
from support.registry import FAST, announcement, by_name, heartbeat, silence
from support.store import has_tools, tools_in_store

from discovery.registry.client import RegistryClient
from discovery.registry.metrics import RegistryMetrics
from discovery.registry.service import Registry, RegistryOptions
from discovery.store.service import ConfigStoreService
from toolservice_base import (
    ConfigClient,
    DynamicToolService,
    RequestClient,
    Settings,
    Transport,
)
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService
from toolservice_base.examples.joke import JokeService
from toolservice_base.schemas import Probe, ToolDescriptor

pytestmark = pytest.mark.contract

TTL = 1.0


class RivalJokes(DynamicToolService):
    """Another service claiming the name `tell-joke`."""

    descriptor = {"id": "rival-jokes"}
    tools = [
        {"name": "tell-joke", "description": "A rival's jokes", "arguments": []},
        {"name": "rival-only", "description": "Only the rival has this", "arguments": []},
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return "rival"


async def test_an_announced_service_is_merged_as_the_spec_items_and_listed(
    settings: Settings, config_client: ConfigClient, registry_client: RegistryClient
) -> None:
    async with JokeService(settings=settings, ttl=TTL) as svc:
        started = time.monotonic()
        await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
        assert time.monotonic() - started < 1.0
        got = await config_client.get(
            [("tool", "tell-joke"), ("tool-service", "joke-service"), ("discovery", "joke-service")]
        )
        assert got[("tool", "tell-joke")] == svc.tool_descriptors[0].to_json()
        assert got[("tool-service", "joke-service")] == svc.service_descriptor.to_json()
        record = json.loads(got[("discovery", "joke-service")])
        assert list(record["instances"]) == [svc.announcer.instance]  # type: ignore[union-attr]
        assert set(record["owned"]) == {"tool/tell-joke", "tool-service/joke-service"}
        listing = await registry_client.list()
        tool = by_name(listing.tools)["tell-joke"]
        assert (tool.service, tool.source, tool.status, tool.instances, tool.version) == (
            "joke-service",
            "announced",
            "live",
            1,
            "1.0",
        )
        assert tool.last_heartbeat_age is not None and tool.last_heartbeat_age < TTL
        got_one = await registry_client.get("tell-joke")
        assert got_one is not None and (got_one.name, got_one.status, got_one.instances) == ("tell-joke", "live", 1)
        assert await registry_client.get("no-such-tool") is None


async def test_withdraw_removes_every_owned_key_at_once(
    settings: Settings, config_client: ConfigClient, registry: Registry
) -> None:
    svc = JokeService(settings=settings, ttl=30)
    await svc.start()
    await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
    await svc.stop()
    stopped = time.monotonic()
    await eventually(lambda: _empty(config_client), timeout=1.0)
    assert time.monotonic() - stopped < 1.0


async def _empty(client: ConfigClient) -> bool:
    _, config = await client.config()
    return config == {}


async def test_a_silent_instance_expires_after_its_ttl(
    settings: Settings, config_client: ConfigClient, registry: Registry
) -> None:
    async with JokeService(settings=settings, ttl=TTL) as svc:
        await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
        await asyncio.sleep(TTL)  # heartbeats keep it alive past one ttl
        assert await has_tools(config_client, "tell-joke")
        silence(svc)
        silent = time.monotonic()
        await eventually(lambda: _empty(config_client), timeout=TTL + 1.0)
        assert time.monotonic() - silent >= TTL * 0.6  # not before the lease could have run out


async def test_sweeps_skip_the_ticks_at_which_nothing_can_run_out_yet_a_silent_lease_goes_at_the_tick_after_its_end(
    settings: Settings, connection: Transport, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    """Leases renewed long before they end ask for no tick of their own: the registry sweeps once a second (with its
    look at the topics), not at every tick; a lease that falls silent still runs out at the first tick after its end."""
    registry = Registry(connection, options=FAST)
    sweeps: list[float] = []
    sweep = registry.expiry.sweep

    async def counted() -> None:
        sweeps.append(time.monotonic())
        await sweep()

    registry.expiry.sweep = counted  # type: ignore[method-assign]
    async with (
        registry,
        JokeService(settings=settings, ttl=10.0) as steady,
        JokeService(settings=settings, ttl=TTL) as svc,
    ):
        await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
        silence(steady)  # its lease ends ten seconds after its last message: nothing for the sweeps to do till then
        silence(svc)
        instance = svc.announcer.instance  # type: ignore[union-attr]
        lease = registry.leases.get(instance)
        assert lease is not None
        ends = lease.expires_at
        await eventually(lambda: registry.leases.get(instance) is None, timeout=TTL + 1.0)
        assert time.monotonic() - ends < FAST.sweep_interval + 0.4  # the tick after its end, give or take the loop
        sweeps.clear()
        await asyncio.sleep(2.0)
        assert 1 <= len(sweeps) <= 3, sweeps  # once a second, where every 0.1 s tick would have made 20


async def test_no_lease_runs_out_on_a_silence_the_registry_could_not_hear(
    settings: Settings, connection: Transport, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    """A registry that stops hearing its own status back (a link that loses what the broker sends stays "connected")
    sweeps as of the last time it did: a service falling silent meanwhile keeps its tools until the registry hears
    again, and runs out then."""
    deaf_since: list[float] = []
    registry = Registry(connection, options=FAST)
    registry.expiry.hearing = lambda: deaf_since[0] if deaf_since else time.monotonic()
    async with registry:
        async with JokeService(settings=settings, ttl=TTL) as svc:
            await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
            deaf_since.append(time.monotonic())
            silence(svc)
            await asyncio.sleep(TTL + 0.8)  # its lease ran out after the registry last heard the broker
            assert await has_tools(config_client, "tell-joke")
            deaf_since.clear()  # hearing again within `DEAF_AFTER`: no pause, the silence it heard counts
            await eventually(lambda: _empty(config_client), timeout=1.0)


async def test_many_instances_are_one_service_live_while_any_lease_is(
    settings: Settings, config_client: ConfigClient, registry: Registry, registry_client: RegistryClient
) -> None:
    first, second = JokeService(settings=settings, ttl=TTL), JokeService(settings=settings, ttl=TTL)
    await first.start()
    await second.start()
    try:
        await eventually(lambda: _instances(registry_client, "tell-joke", 2), timeout=1.0)
        await registry.settle()
        version = (await config_client.config())[0]
        silence(first)
        await eventually(lambda: _instances(registry_client, "tell-joke", 1), timeout=TTL + 1.0)
        await registry.settle()
        assert await has_tools(config_client, "tell-joke")
        assert (await config_client.config())[0] == version + 1  # only the record's instance list changed
        silence(second)
        await eventually(lambda: _empty(config_client), timeout=TTL + 1.0)
    finally:
        await first.stop()
        await second.stop()


async def test_the_size_gauges_follow_instances_that_join_and_services_that_expire(
    settings: Settings,
    connection: Transport,
    config_store: ConfigStoreService,
) -> None:
    """Sweeps with nothing running out skip the per-service count (it costs 30 ms at 100,000 leases); the gauges still
    move."""
    metrics = RegistryMetrics(CollectorRegistry())
    gauge = metrics.registry.get_sample_value
    async with Registry(connection, options=FAST, metrics=metrics):
        first, second = JokeService(settings=settings, ttl=TTL), JokeService(settings=settings, ttl=TTL)
        async with first:
            await eventually(
                lambda: gauge("toolreg_registry_live_services") == 1 and gauge("toolreg_registry_instances") == 1
            )
            async with second:  # the same service again: no merge, no store write, one more lease
                await eventually(lambda: gauge("toolreg_registry_instances") == 2, timeout=2)
                assert gauge("toolreg_registry_live_services") == 1 and gauge("toolreg_registry_live_tools") == 1
                silence(first)
                silence(second)
                await eventually(lambda: gauge("toolreg_registry_instances") == 0, timeout=TTL + 2)
                assert gauge("toolreg_registry_live_services") == 0
                # Its tool counts until the registry has deleted it from the store: a write later.
                await eventually(lambda: gauge("toolreg_registry_live_tools") == 0, timeout=2)


async def _instances(client: RegistryClient, name: str, count: int) -> bool:
    tool = await client.get(name)
    return tool is not None and tool.instances == count


async def test_a_static_tool_is_never_overwritten_and_the_duplicate_is_a_conflict(
    settings: Settings, config_client: ConfigClient, registry_client: RegistryClient
) -> None:
    static = ToolDescriptor(name="tell-joke", description="Written by hand", service="joke-service").to_json()
    await config_client.put([("tool", "tell-joke", static)])
    async with JokeService(settings=settings, ttl=TTL):
        await eventually(lambda: _has_conflict(registry_client, "tell-joke"), timeout=1.0)
        conflict = (await registry_client.conflicts())[0]
        assert (conflict.tool, conflict.service, conflict.held_by) == ("tell-joke", "joke-service", "static")
        assert "static" in conflict.reason
        assert (await config_client.get([("tool", "tell-joke")]))[("tool", "tell-joke")] == static
        listed = by_name((await registry_client.list()).tools)["tell-joke"]
        assert (listed.source, listed.status) == ("static", "configured")
    await eventually(lambda: _no_key(config_client, ("tool-service", "joke-service")), timeout=1.0)
    assert (await config_client.get([("tool", "tell-joke")]))[("tool", "tell-joke")] == static
    assert await registry_client.conflicts() == []


async def _has_conflict(client: RegistryClient, tool: str) -> bool:
    return any(c.tool == tool for c in await client.conflicts())


async def _no_conflicts(client: RegistryClient) -> bool:
    return await client.conflicts() == []


async def _no_key(client: ConfigClient, key: tuple[str, str]) -> bool:
    return key not in await client.get([key])


async def test_the_first_service_keeps_a_contested_name_and_hands_it_over_one_ttl_after_it_goes(
    settings: Settings, config_client: ConfigClient, registry_client: RegistryClient
) -> None:
    joke = JokeService(settings=settings, ttl=TTL)
    await joke.start()
    await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
    async with RivalJokes(settings=settings, ttl=TTL):
        await eventually(lambda: has_tools(config_client, "rival-only"), timeout=1.0)
        assert (await tools_in_store(config_client))["tell-joke"]["service"] == "joke-service"
        conflicts = await registry_client.conflicts()
        assert [(c.tool, c.service, c.held_by) for c in conflicts] == [("tell-joke", "rival-jokes", "joke-service")]
        stopping = time.monotonic()  # its withdraw goes out first; closing its consumers takes a while longer
        await joke.stop()
        await eventually(lambda: _no_key(config_client, ("tool", "tell-joke")), timeout=1.0)  # nobody serves it now
        conflicts = await eventually(lambda: _kept_for(registry_client, "joke-service"), timeout=1.0)
        assert [(c.tool, c.held_by) for c in conflicts] == [("tell-joke", "joke-service")]
        # Generous upper bound: on 2 busy cores the hand-over has come later than ttl + 1 s; the promise is the lower
        # bound.
        await eventually(lambda: _tool_service(config_client, "tell-joke", "rival-jokes"), timeout=TTL + 3.0)
        assert time.monotonic() - stopping > TTL - 0.1  # not before the owner's ttl was over
        await eventually(
            lambda: _no_conflicts(registry_client), timeout=1.0
        )  # cleared once the registry hears its write back


async def test_a_restarting_owner_gets_its_name_back_and_the_refused_rival_is_told(
    settings: Settings, config_client: ConfigClient, registry: Registry, registry_client: RegistryClient
) -> None:
    """Without a trust policy, the rival used to take the name in the moment between the owner's withdraw and its
    return."""
    joke = JokeService(settings=settings, ttl=TTL)
    await joke.start()
    await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
    with structlog.testing.capture_logs() as logs:
        async with RivalJokes(settings=settings, ttl=TTL) as rival:
            await eventually(lambda: has_tools(config_client, "rival-only"), timeout=1.0)
            await joke.stop()
            await asyncio.sleep(TTL / 2)  # the rival re-announces meanwhile: still refused
            assert rival.announcer is not None
            await rival.announcer._send("announce")
            await registry.settle()
            assert not await _tool_service(config_client, "tell-joke", "rival-jokes")
            async with JokeService(settings=settings, ttl=TTL):  # the owner is back, as a new instance
                await eventually(lambda: _tool_service(config_client, "tell-joke", "joke-service"), timeout=1.0)
                await asyncio.sleep(TTL)  # past the reservation: the owner holds it because it is live
                assert await _tool_service(config_client, "tell-joke", "joke-service")
                await _conflicts_become(registry_client, [("tell-joke", "joke-service")])
    told = [entry for entry in logs if entry["event"] == "service.refused" and entry["service"] == "rival-jokes"]
    assert told and "tool/tell-joke belongs to service 'joke-service'" in told[0]["reason"]
    listed = [r for r in await registry_client.rejections() if r.service == "rival-jokes"]
    assert listed and listed[0].reason.startswith("conflict: tool/tell-joke")


async def _conflicts_become(client: RegistryClient, expected: list[tuple[str, str]], timeout: float = 2.0) -> None:
    """Wait for the conflicts to be `expected` (tool, held by); fail showing them with their reasons."""

    async def matches() -> bool:
        return [(c.tool, c.held_by) for c in await client.conflicts()] == expected

    async def shown() -> str:
        return f"conflicts {[(c.tool, c.held_by, c.reason) for c in await client.conflicts()]}, expected {expected}"

    await eventually(matches, timeout=timeout, explain=shown)


async def _kept_for(client: RegistryClient, service: str) -> list[Any]:
    conflicts = await client.conflicts()
    return conflicts if any(f"kept for service {service!r}" in c.reason for c in conflicts) else []


async def _tool_service(client: ConfigClient, name: str, service: str) -> bool:
    return (await tools_in_store(client)).get(name, {}).get("service") == service


async def test_an_unchanged_digest_writes_nothing(
    settings: Settings, connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    async with JokeService(settings=settings, ttl=0.6):
        await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
        await registry.settle()
        version, writes = (await config_client.config())[0], registry.store_writes
        probes = await connection.publisher(connection.topics.tool_probe)
        await probes.send(Probe(reason="test").to_json())  # every live service re-announces
        await asyncio.sleep(1.0)  # and heartbeats every 0.2 s
        await registry.settle()
        assert ((await config_client.config())[0], registry.store_writes) == (version, writes)


async def test_a_burst_of_announcements_is_a_few_store_versions(
    connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await asyncio.gather(
        *(publisher.send(announcement(f"burst-{n}", (f"tool-{n}",), ttl=30).to_json()) for n in range(20))
    )
    await eventually(lambda: _count_tools(config_client, 20), timeout=2.0)
    await registry.settle()
    # Leading-edge batching: the first message is written at once, what came meanwhile rides in the next write.
    version = (await config_client.config())[0]
    assert 1 <= version <= 3 and registry.store_writes == version, (version, registry.store_writes)


async def _count_tools(client: ConfigClient, count: int) -> bool:
    return len(await client.list("tool")) == count


async def test_a_thousand_malformed_messages_are_rejected_and_the_registry_keeps_serving(
    settings: Settings,
    connection: Transport,
    config_client: ConfigClient,
    registry: Registry,
    registry_client: RegistryClient,
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    garbage = [
        b"\x00\xff",
        b"{}",
        b"[]",
        b"null",
        b'{"kind": "announce"}',
        b"{" * 5000,
        json.dumps({"kind": "heartbeat"}).encode(),
    ]
    await asyncio.gather(*(publisher.send(garbage[n % len(garbage)] + str(n).encode() * (n % 3)) for n in range(1000)))
    await eventually(lambda: registry.rejection_log.total >= 1000, timeout=10.0)
    rejections = await registry_client.rejections()
    # the same garbage again is one entry with a count: the log is not flushed by repeats
    assert len(rejections) < len(garbage) * 3 and all(r.reason for r in rejections)
    assert sum(r.count for r in rejections) == 1000 and max(r.count for r in rejections) > 100
    async with JokeService(settings=settings, ttl=TTL):
        await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
        assert "tell-joke" in by_name((await registry_client.list()).tools)


async def test_bad_announcements_of_every_kind_are_listed_with_their_reason(
    connection: Transport, config_client: ConfigClient, registry: Registry, registry_client: RegistryClient
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    good = announcement("replayed", ("ok",), ttl=30)
    await publisher.send(good.to_json())
    await publisher.send(good.to_json())  # the same sequence again
    await publisher.send(announcement("outsider", ("x",), namespace="other").to_json())
    await publisher.send(announcement("old", ("y",), ttl=1, sent_at=time.time() - 10).to_json())
    await publisher.send(b"x" * 70_000)
    await eventually(lambda: registry.rejection_log.total >= 4, timeout=2.0)
    reasons = [r.reason for r in await registry_client.rejections()]
    assert any("sequence 1 is not after 1" in r for r in reasons)
    assert any("outside the allowed namespaces" in r for r in reasons)
    assert any("stale" in r for r in reasons)
    assert any("70000 bytes" in r for r in reasons)
    await eventually(lambda: has_tools(config_client, "ok"), timeout=1.0)
    assert set(await config_client.list("tool")) == {"ok"}


async def test_a_heartbeat_from_an_unknown_instance_is_probed_once_per_interval(
    connection: Transport, registry: Registry
) -> None:
    seen: list[Probe] = []

    async def on_probe(message: Any) -> None:
        seen.append(Probe.model_validate_json(message.data))

    await connection.subscribe(connection.topics.tool_probe, on_probe)
    await asyncio.sleep(registry.options.probe_interval)  # let the start-up probe's spacing pass
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    for sequence in range(1, 6):
        await publisher.send(announcement("ghost", kind="heartbeat", instance="ghost-7", sequence=sequence).to_json())
    await eventually(lambda: any(p.instance == "ghost-7" for p in seen), timeout=1.0)
    await asyncio.sleep(0.3)
    assert [p.instance for p in seen if p.instance == "ghost-7"] == ["ghost-7"]


async def test_malformed_queries_get_an_error_response(connection: Transport, registry: Registry) -> None:
    raw = RequestClient(connection, connection.topics.registry_request, connection.topics.registry_response)
    for garbage in (b"\xff", b"[]", b'{"operation": "explode"}', b'{"operation": "get", "name": "bad name!"}'):
        body = await raw.request(garbage, timeout=5)
        assert body["error"]["type"] == "bad-request", body
    body = await raw.request({"operation": "get"}, timeout=5)
    assert body["error"] == {"type": "bad-request", "message": "operation 'get' needs 'name'"}
    await raw.close()


@pytest.fixture
async def four_announced(
    settings: Settings, config_client: ConfigClient, registry: Registry
) -> AsyncIterator[list[DynamicToolService]]:
    """Four services with short leases, merged into the store: enough leases for self-preservation to apply."""
    services = [
        cls(settings=settings, ttl=TTL) for cls in (JokeService, EchoService, CalculatorService, CountdownService)
    ]
    for svc in services:
        await svc.start()
    try:
        await eventually(lambda: _count_tools(config_client, 4), timeout=1.0)
        yield services
    finally:
        for svc in services:
            await svc.stop()


async def test_self_preservation_holds_mass_expiry_and_releases_on_request(
    config_client: ConfigClient,
    registry: Registry,
    registry_client: RegistryClient,
    four_announced: list[DynamicToolService],
) -> None:
    services = four_announced
    with structlog.testing.capture_logs() as logs:
        for svc in services:
            silence(svc)
        await eventually(lambda: len(registry.held_services()) == 4, timeout=TTL + 1.0)
        await asyncio.sleep(TTL)  # held, not removed, however long
    assert len(await config_client.list("tool")) == 4
    warning = next(entry for entry in logs if entry["event"] == "registry.self_preservation")
    assert "toolreg release" in warning["action"] and "4 of 4" in warning["reason"]
    listing = await registry_client.list()
    assert {t.status for t in listing.tools} == {"held"}
    assert listing.held == ["calculator", "countdown", "echo", "joke-service"]
    assert sorted(await registry_client.release()) == listing.held
    await eventually(lambda: _empty(config_client), timeout=1.0)
    assert registry.held_services() == []


async def test_self_preservation_ends_when_heartbeats_resume(
    config_client: ConfigClient,
    registry: Registry,
    registry_client: RegistryClient,
    four_announced: list[DynamicToolService],
) -> None:
    services = four_announced
    for svc in services:
        silence(svc)
    await eventually(lambda: len(registry.held_services()) == 4, timeout=TTL + 1.0)
    survivor = services[0]

    async def keep_beating() -> None:
        while True:
            await heartbeat(survivor)
            await asyncio.sleep(TTL / 3)

    beating = asyncio.create_task(keep_beating())
    try:
        await eventually(lambda: registry.held_services() == [], timeout=1.0)
        assert (await registry_client.get("tell-joke")).status == "live"  # type: ignore[union-attr]
        # the others were not heard from: they expire normally one ttl later
        await eventually(lambda: _tool_names(config_client, {"tell-joke"}), timeout=TTL + 1.0)
        await asyncio.sleep(TTL)
        assert await _tool_names(config_client, {"tell-joke"})
    finally:
        beating.cancel()


async def _tool_names(client: ConfigClient, names: set[str]) -> bool:
    return set(await client.list("tool")) == names


async def test_a_registry_restart_keeps_live_and_static_tools_and_drops_the_dead_after_grace(
    settings: Settings, connection: Transport, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    ttl = 1.5
    first = Registry(connection, options=FAST)
    await first.start()
    static = ToolDescriptor(name="by-hand", description="Static", service="somewhere").to_json()
    await config_client.put([("tool", "by-hand", static)])
    joke, echo = JokeService(settings=settings, ttl=ttl), EchoService(settings=settings, ttl=ttl, workspace="alpha")
    rival = RivalJokes(settings=settings, ttl=ttl)
    await joke.start()
    await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
    await echo.start()
    await rival.start()
    await eventually(lambda: has_tools(config_client, "echo", workspace="alpha"), timeout=1.0)
    await eventually(lambda: has_tools(config_client, "rival-only"), timeout=1.0)
    await first.settle()
    await first.stop()
    version = (await config_client.config())[0]

    silence(echo)  # dies while no registry runs
    second = Registry(connection, options=FAST)
    await second.start()
    try:
        assert (await config_client.config())[0] == version  # start-up wrote nothing
        await asyncio.sleep(0.3)  # live services answered the probe: still nothing to write
        await second.settle()
        assert (await config_client.config())[0] == version
        assert set(await config_client.list("tool")) == {"by-hand", "tell-joke", "rival-only"}
        assert (await tools_in_store(config_client))["tell-joke"]["service"] == "joke-service"  # first holder still
        assert [(c.tool, c.held_by) for c in second.conflicts()] == [("tell-joke", "joke-service")]
        alpha = by_name(await second.list_tools("alpha"))
        assert alpha["echo"].status == "grace"
        assert (
            alpha["echo"].last_heartbeat_age is None
            and "not heard from since the registry started" in alpha["echo"].detail
        )
        await eventually(lambda: _gone_from(config_client, "echo", "alpha"), timeout=ttl + 1.0)
        assert set(await config_client.list("tool")) == {"by-hand", "tell-joke", "rival-only"}
        assert (await config_client.get([("tool", "by-hand")]))[("tool", "by-hand")] == static
    finally:
        await second.stop()
        for svc in (joke, echo, rival):
            await svc.stop()


async def test_a_static_tool_whose_service_went_away_is_listed_as_unavailable_with_why(
    settings: Settings, config_client: ConfigClient, registry_client: RegistryClient
) -> None:
    by_hand = ToolDescriptor(
        name="joke-by-hand", description="Wired by hand to an announced service", service="joke-service"
    )
    async with JokeService(settings=settings, ttl=TTL):
        await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
        await config_client.put([("tool", "joke-by-hand", by_hand.to_json())])
        tool = await registry_client.get("joke-by-hand")
        assert tool is not None and (tool.source, tool.status, tool.detail) == ("static", "configured", "")
    await eventually(lambda: _no_key(config_client, ("tool-service", "joke-service")), timeout=1.0)
    tool = await registry_client.get("joke-by-hand")  # still in the store, but agents skip it: say so
    assert tool is not None and (tool.source, tool.service, tool.status) == ("static", "joke-service", "unavailable")
    assert "no tool-service/joke-service in the store" in tool.detail and "agents skip it" in tool.detail


async def _gone_from(client: ConfigClient, name: str, workspace: str) -> bool:
    return not await has_tools(client, name, workspace=workspace)


async def test_an_operator_edit_of_an_announced_tool_survives_the_service_leaving(
    settings: Settings, config_client: ConfigClient, registry: Registry
) -> None:
    async with JokeService(settings=settings, ttl=TTL):
        await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
        mine = ToolDescriptor(name="tell-joke", description="Edited by an operator", service="joke-service").to_json()
        await config_client.put([("tool", "tell-joke", mine)])
    await eventually(lambda: _no_key(config_client, ("tool-service", "joke-service")), timeout=1.0)
    assert (await config_client.get([("tool", "tell-joke")]))[("tool", "tell-joke")] == mine


async def test_registry_start_fails_in_one_line_when_the_store_is_silent(connection: Transport) -> None:
    from discovery.registry.service import RegistryError

    registry = Registry(connection, options=RegistryOptions(store_timeout=0.3))
    try:
        await registry.start()
    except RegistryError as exc:
        assert "\n" not in str(exc) and "toolreg up" in str(exc)
    else:
        await registry.stop()
        raise AssertionError("the registry started without a config store")


async def test_with_a_trust_policy_only_signed_and_allowed_announcements_are_merged(
    settings: Settings, connection: Transport, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    from discovery.registry.trust import TrustPolicy, trusted_key
    from toolservice_base.signing import Ed25519PrivateKey, public_key_text

    key = Ed25519PrivateKey.generate()
    policy = TrustPolicy()
    policy.add(trusted_key("jokes", public_key_text(key.public_key()), ["joke-*"], ["tell-*"]))
    registry = Registry(connection, options=RegistryOptions(sweep_interval=0.1, trust=policy))
    await registry.start()
    try:
        async with (
            JokeService(settings=settings, ttl=TTL, signing_key=key) as joke,
            EchoService(settings=settings, ttl=TTL),
        ):
            await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=1.0)
            await eventually(lambda: any("unsigned" in r.reason for r in registry.rejections()), timeout=1.0)
            # A forged, unsigned withdraw of the signed instance changes nothing.
            publisher = await connection.publisher(connection.topics.tool_descriptors)
            forged = announcement("joke-service", kind="withdraw", instance=joke.announcer.instance, sequence=10**9)  # type: ignore[union-attr]
            await publisher.send(forged.to_json())
            await eventually(lambda: sum("unsigned" in r.reason for r in registry.rejections()) >= 2, timeout=1.0)
            await asyncio.sleep(TTL)  # the real instance's later heartbeats are still accepted
            await registry.settle()
            assert set(await config_client.list("tool")) == {"tell-joke"}
            assert (await registry.list_tools())[0].status == "live"
    finally:
        await registry.stop()


async def test_an_operator_write_landing_between_the_registrys_read_and_write_is_never_clobbered(
    settings: Settings, config_client: ConfigClient, registry: Registry
) -> None:
    operator = ToolDescriptor(
        name="tell-joke", description="Written by an operator mid-merge", service="joke-service"
    ).to_json()
    read = registry._config.get
    raced: list[bool] = []

    async def read_then_operator_writes(keys: Any, *, workspace: str | None = None) -> dict[tuple[str, str], str]:
        found = await read(keys, workspace=workspace)
        if not raced and ("tool", "tell-joke") in list(keys):
            raced.append(True)
            await config_client.put([("tool", "tell-joke", operator)])  # a real write, through the real store
        return found

    registry._config.get = read_then_operator_writes  # type: ignore[method-assign]
    async with JokeService(settings=settings, ttl=TTL):
        await eventually(lambda: any(c.tool == "tell-joke" for c in registry.conflicts()), timeout=2.0)
        await registry.settle()
        got = await config_client.get([("tool", "tell-joke"), ("tool-service", "joke-service")])
        assert got[("tool", "tell-joke")] == operator and ("tool-service", "joke-service") in got
        assert raced == [True]


async def test_the_registry_starts_and_stops_with_async_with(
    connection: Transport, config_store: ConfigStoreService
) -> None:
    async with Registry(connection, options=FAST) as registry:
        assert registry.readiness() is None
    assert registry.readiness() == "not running"


async def test_the_page_follows_static_tools_by_what_changed_and_lists_what_a_full_read_gives(
    config_client: ConfigClient, registry: Registry, config_store: ConfigStoreService
) -> None:
    def static(name: str, revision: int) -> tuple[str, str, str]:
        return ("tool", name, ToolDescriptor(name=name, description=f"{name} {revision}", service="gone").to_json())

    await config_client.put([static(f"s{n}", 0) for n in range(5)])
    overview = registry.overview
    asked: list[str] = []
    answer = config_store.answer

    async def counted(request: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(request.operation)
        return await answer(request, *args, **kwargs)

    config_store.answer = counted  # type: ignore[method-assign]
    await overview.snapshot()
    for step in range(6):
        if step % 2:
            await config_client.delete([("tool", f"s{step}")])
        else:
            await config_client.put([static(f"s{step}", step), static(f"new{step}", step)])
        await eventually(lambda: overview.config_version == config_store.store.version)
        page = await overview.snapshot()
        _, items = await config_client.read_types(("tool", "tool-service"))
        assert sorted(t.name for t in page.tools if t.source == "static") == sorted(items["tool"])
        assert {t: dict(held) for t, held in overview._static["default"][1].items()} == items
    assert asked.count("changes") == 5  # each page after a change asked what changed (s5 never was: no change)
