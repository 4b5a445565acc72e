"""A registry with a trust policy on a real broker: rogue and out-of-scope announcers change nothing,
replays are refused, and per-instance state stops at its caps."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import eventually
from support.registry import announcement
from support.store import tools_in_store

from discovery.registry.service import Registry, RegistryOptions
from discovery.registry.trust import TrustPolicy, trusted_key
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, Transport
from toolservice_base.examples.joke import JokeService
from toolservice_base.schemas import Announcement, Probe, descriptor_digest
from toolservice_base.signing import Ed25519PrivateKey, public_key_text, sign

pytestmark = pytest.mark.contract

TEAM, CALC, ROGUE = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()


@pytest.fixture
async def guarded(connection: Transport, config_store: ConfigStoreService) -> AsyncIterator[Registry]:
    """A registry trusting `TEAM` for joke-*/tell-* and `CALC` for calc-*/calc*; `ROGUE` is unknown."""
    policy = TrustPolicy()
    policy.add(trusted_key("jokes", public_key_text(TEAM.public_key()), ["joke-*"], ["tell-*"]))
    policy.add(trusted_key("calc", public_key_text(CALC.public_key()), ["calc-*"], ["calc*"]))
    registry = Registry(connection, options=RegistryOptions(sweep_interval=0.1, trust=policy))
    await registry.start()
    yield registry
    await registry.stop()


def signed(key: Ed25519PrivateKey | None, **fields: Any) -> bytes:
    message = announcement(**{"ttl": 30.0, **fields})
    return (sign(message, key) if key is not None else message).to_json().encode()


async def test_rogue_and_out_of_scope_announcers_cannot_add_replace_or_remove_a_tool(
    settings: Settings, connection: Transport, config_client: ConfigClient, guarded: Registry
) -> None:
    recorded: list[bytes] = []

    async def record(message: Any) -> None:
        recorded.append(message.data)

    await connection.subscribe(connection.topics.tool_descriptors, record)
    probes: list[Probe] = []
    await connection.subscribe(
        connection.topics.tool_probe, lambda m: _append(probes, Probe.model_validate_json(m.data))
    )
    async with JokeService(settings=settings, ttl=2.0, signing_key=TEAM) as joke:
        await eventually(lambda: tools_in_store(config_client), timeout=2.0)
        await guarded.settle()
        original = await tools_in_store(config_client)
        writes, version = guarded.store_writes, (await config_client.config())[0]
        real = joke.announcer.instance  # type: ignore[union-attr]
        publisher = await connection.publisher(connection.topics.tool_descriptors)
        attacks = {
            # add: a new service, unsigned and signed by an unknown key
            "unsigned add": (signed(None, service_id="evil", tools=("steal",), instance="evil-1"), "unsigned"),
            "rogue add": (
                signed(ROGUE, service_id="joke-extra", tools=("tell-lies",), instance="evil-2"),
                "unknown key",
            ),
            # replace: the same service and tool name, other descriptors
            "rogue replace": (
                signed(ROGUE, service_id="joke-service", tools=("tell-joke",), instance="evil-3"),
                "unknown key",
            ),
            "unsigned replace": (
                signed(None, service_id="joke-service", tools=("tell-joke",), instance=real, sequence=10**6),
                "unsigned",
            ),
            # remove: a withdraw of the real instance
            "unsigned withdraw": (
                signed(None, service_id="joke-service", kind="withdraw", instance=real, sequence=10**6 + 1),
                "unsigned",
            ),
            "rogue withdraw": (
                signed(ROGUE, service_id="joke-service", kind="withdraw", instance=real, sequence=10**6 + 2),
                "unknown key",
            ),
            # a trusted key outside its scope
            "calc claims joke-service": (
                signed(CALC, service_id="joke-service", tools=("tell-joke",), instance="calc-9"),
                "may not announce service 'joke-service'",
            ),
            "calc claims a joke tool": (
                signed(CALC, service_id="calc-svc", tools=("tell-joke",), instance="calc-8"),
                "may not announce tool 'tell-joke'",
            ),
            "calc withdraws a joke instance": (
                signed(CALC, service_id="calc-svc", kind="withdraw", instance=real, sequence=10**6 + 3),
                "may not announce service 'joke-service'",
            ),
            "calc hijacks a joke instance": (
                signed(CALC, service_id="calc-svc", tools=("calc",), instance=real, sequence=10**6 + 4),
                f"instance {real} serves 'joke-service'",
            ),
            # an unknown instance's heartbeat needs a trusted signature too (no probe, no memory spent)
            "unsigned ghost heartbeat": (
                signed(None, service_id="ghost", kind="heartbeat", instance="ghost-1"),
                "unsigned",
            ),
        }
        before = guarded.rejection_log.total
        for data, _ in attacks.values():
            await publisher.send(data)
        await eventually(lambda: guarded.rejection_log.total >= before + len(attacks), timeout=3.0)
        entries = guarded.rejections()  # one entry per sender and reason: the two unsigned ones naming `real` share one
        for name, (data, phrase) in attacks.items():
            instance = json.loads(data)["instance"]
            assert any(r.instance == instance and phrase in r.reason for r in entries), (
                f"{name}: {[r.reason for r in entries if r.instance == instance]}"
            )
        # A replay of the service's own signed announce, byte for byte.
        first_announce = next(data for data in recorded if json.loads(data)["kind"] == "announce")
        await publisher.send(first_announce)
        await eventually(lambda: "is not after" in guarded.rejections()[-1].reason, timeout=2.0)
        await asyncio.sleep(2.5)  # more than the ttl: the real instance's heartbeats still count
        await guarded.settle()
        assert await tools_in_store(config_client) == original
        assert guarded.store_writes == writes and (await config_client.config())[0] == version
        assert [(t.name, t.status, t.instances) for t in await guarded.list_tools()] == [("tell-joke", "live", 1)]
        assert not any(p.instance == "ghost-1" for p in probes)


async def _append(items: list[Any], item: Any) -> None:
    items.append(item)


async def test_a_trusted_key_is_accepted_within_its_scope(
    connection: Transport, config_client: ConfigClient, guarded: Registry
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await publisher.send(signed(CALC, service_id="calc-svc", tools=("calc", "calc-sum"), instance="calc-1"))
    await eventually(lambda: config_client.list("tool"), timeout=2.0)
    assert await config_client.list("tool") == ["calc", "calc-sum"]
    # its own signed withdraw is honoured
    await publisher.send(signed(CALC, service_id="calc-svc", kind="withdraw", instance="calc-1", sequence=2))
    await eventually(lambda: _empty(config_client), timeout=2.0)


async def _empty(client: ConfigClient) -> bool:
    return await client.list("tool") == []


async def test_fresh_instance_ids_stop_at_the_caps_and_each_refusal_is_recorded(
    connection: Transport, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    options = RegistryOptions(sweep_interval=0.1, max_instances=5, max_instances_per_service=3)
    registry = Registry(connection, options=options)
    await registry.start()
    try:
        publisher = await connection.publisher(connection.topics.tool_descriptors)
        for number in range(6):
            await publisher.send(announcement("svc-a", ("a",), instance=f"a-{number}", ttl=30).to_json())
        for number in range(4):
            await publisher.send(announcement("svc-b", ("b",), instance=f"b-{number}", ttl=30).to_json())
        await eventually(lambda: registry.rejection_log.total >= 5, timeout=3.0)
        await registry.settle()
        assert len(registry.leases) == 5
        assert sorted(len(leases) for leases in registry.leases.by_service().values()) == [2, 3]
        reasons = [r.reason for r in registry.rejections()]
        assert sum("the limit per service is 3" in r for r in reasons) == 3
        assert sum("the limit is 5" in r for r in reasons) == 2
        # an instance already holding a lease renews past the cap
        await publisher.send(announcement("svc-a", ("a",), instance="a-0", sequence=2, ttl=30).to_json())
        await asyncio.sleep(0.2)
        assert registry.rejection_log.total == 5
        record = json.loads((await config_client.get([("discovery", "svc-a")]))[("discovery", "svc-a")])
        assert sorted(record["instances"]) == ["a-0", "a-1", "a-2"]
    finally:
        await registry.stop()


async def test_one_instance_cycling_digests_keeps_a_bounded_set_of_offers(
    connection: Transport, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    options = RegistryOptions(sweep_interval=0.1, max_instances=10, max_instances_per_service=2)
    registry = Registry(connection, options=options)
    await registry.start()
    try:
        publisher = await connection.publisher(connection.topics.tool_descriptors)
        for sequence in range(1, 41):
            await publisher.send(
                announcement("cyc", (f"t{sequence}",), instance="cyc-1", sequence=sequence, ttl=30).to_json()
            )
            if sequence % 10 == 0:
                await asyncio.sleep(0)
        await eventually(
            lambda: registry.leases.get("cyc-1") and registry.leases.get("cyc-1").announced >= 40, timeout=3.0
        )  # type: ignore[union-attr]
        state = registry.book[("default", "cyc")]
        assert len(state.offers) <= 2 * options.max_instances_per_service + 1
        await registry.settle()
        assert await config_client.list("tool") == ["t40"]
    finally:
        await registry.stop()


def test_a_captured_signed_message_cannot_be_replayed_even_after_a_restart() -> None:
    from discovery.registry.validation import AnnouncementValidator, Rejected

    policy = TrustPolicy()
    policy.add(trusted_key("jokes", public_key_text(TEAM.public_key()), ["joke-*"], ["tell-*"]))
    sent = time.time()
    data = signed(TEAM, service_id="joke-service", tools=("tell-joke",), ttl=15, sent_at=sent)
    authorize = lambda a: policy.check(a, a.service.id if a.service else None, [t.name for t in a.tools or []])  # noqa: E731
    first = AnnouncementValidator()
    assert isinstance(first.check(data, sent + 1, authorize), Announcement)
    with pytest.raises(Rejected, match="is not after"):
        first.check(data, sent + 2, authorize)
    with pytest.raises(Rejected, match="stale"):
        AnnouncementValidator().check(
            data, sent + 16, authorize
        )  # restarted registry: no memory, but the clock moved on
    future = signed(TEAM, service_id="joke-service", tools=("tell-joke",), ttl=15, sent_at=sent + 3600)
    with pytest.raises(Rejected, match="ahead of the registry's clock"):
        AnnouncementValidator().check(future, sent, authorize)  # a pre-dated recording is refused, not saved for later


async def test_the_key_a_service_was_accepted_with_is_written_into_its_item_for_callers_to_check_its_answers(
    connection: Transport, config_client: ConfigClient, guarded: Registry
) -> None:
    """`answer-key` is the registry's word: the key that signed the accepted announcement, never one the
    service's descriptor names itself."""
    message = announcement(service_id="calc-svc", tools=("calc",), instance="calc-1", ttl=30.0)
    assert message.service is not None and message.tools is not None
    claims = message.service.model_copy(update={"answer_key": public_key_text(ROGUE.public_key())})
    message = message.model_copy(update={"service": claims, "digest": descriptor_digest(claims, list(message.tools))})
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await publisher.send(sign(message, CALC).to_json().encode())
    await eventually(lambda: config_client.list("tool-service"), timeout=2.0)
    [item] = (await config_client.getvalues("tool-service")).values()
    assert json.loads(item)["answer-key"] == public_key_text(CALC.public_key())
