"""Without a trust policy, a forged message cannot take over a live instance, and a service whose identity
was taken over anyway recovers by itself (issue 22, item 5).

Before: one forged announce naming a live instance, another workspace and a
huge sequence moved the instance there, and every later heartbeat of the real
instance was refused as a replay until its service restarted, its tools gone
meanwhile. Now an instance is bound to the workspace and service of its lease:
an unverified message naming it elsewhere is refused without touching its
sequence memory. What cannot be told from the real thing without a signature
(a forged heartbeat or withdraw that names the instance where it is) still gets
in, but the registry tells the instance its messages are refused, and the
announcer, seeing its identity taken over, goes on under a fresh instance id.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import structlog
from support import eventually
from support.registry import announcement, descriptors

from discovery.registry.service import Registry
from toolservice_base import ConfigClient, Settings, Transport
from toolservice_base.announcer import Announcer, bound_refusal, judge_refusal, replay_refusal, withdrawn_refusal
from toolservice_base.examples.joke import JokeService
from toolservice_base.schemas import Probe

pytestmark = pytest.mark.contract

TTL = 1.5
HUGE = 2**62


async def _live(registry: Registry, instance: str) -> bool:
    lease = registry.leases.get(instance)
    return lease is not None and lease.state == "live"


async def _tool(client: ConfigClient, workspace: str = "default") -> dict[str, Any]:
    return {name: json.loads(value) for name, value in (await client.getvalues("tool", workspace=workspace)).items()}


async def test_an_unverified_message_cannot_move_a_live_instance_or_touch_its_sequence(
    settings: Settings, connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    async with JokeService(settings=settings, ttl=TTL) as joke:
        await eventually(lambda: _tool(config_client), timeout=3.0)
        real = joke.instance
        before = await _tool(config_client)
        publisher = await connection.publisher(connection.topics.tool_descriptors)
        forged = [
            announcement("joke-service", ("tell-joke",), instance=real, sequence=HUGE, workspace="evil", ttl=30),
            announcement("joke-service", kind="heartbeat", instance=real, sequence=HUGE + 1, workspace="evil", ttl=30),
            announcement("thief", ("steal",), instance=real, sequence=HUGE + 2, ttl=30),
        ]
        for message in forged:
            await publisher.send(message.to_json())
        bound = "belongs to service 'joke-service' in workspace 'default'"
        await eventually(
            lambda: sum(r.count for r in registry.rejections() if bound in r.reason) >= 3,
            timeout=3.0,
            explain=lambda: [r.reason for r in registry.rejections()],
        )
        assert registry.validator._last_sequence[real] < HUGE  # its replay state is untouched
        await asyncio.sleep(2 * TTL)  # past its ttl: only the real instance's own heartbeats kept it
        lease = registry.leases.get(real)
        assert lease is not None and lease.service == ("default", "joke-service") and lease.state == "live", lease
        assert joke.instance == real  # it had no need to start again
        await registry.settle()
        assert await _tool(config_client) == before
        assert await config_client.list("tool", workspace="evil") == [] and ("evil", "thief") not in registry.book
        assert [(t.name, t.status, t.instances) for t in await registry.list_tools()] == [("tell-joke", "live", 1)]


@pytest.mark.parametrize("forgery", ["heartbeat", "withdraw"])
async def test_a_service_whose_identity_was_taken_over_recovers_by_itself(
    settings: Settings, connection: Transport, config_client: ConfigClient, registry: Registry, forgery: str
) -> None:
    """A forged heartbeat (huge sequence) or withdraw naming the instance where it is: no signature tells it from
    the real one, so it gets in; the real instance, told its messages are refused, starts again under a fresh id."""
    async with JokeService(settings=settings, ttl=TTL) as joke:
        await eventually(lambda: _tool(config_client), timeout=3.0)
        real = joke.instance
        before = await _tool(config_client)
        publisher = await connection.publisher(connection.topics.tool_descriptors)
        with structlog.testing.capture_logs() as logs:
            await publisher.send(
                announcement("joke-service", kind=forgery, instance=real, sequence=HUGE, ttl=TTL).to_json()
            )
            await eventually(
                lambda: joke.instance != real,
                timeout=4 * TTL,
                explain=lambda: [r.reason for r in registry.rejections()],
            )
            fresh = joke.instance
            await eventually(lambda: _live(registry, fresh), timeout=3.0)
        renewed = [e for e in logs if e["event"] == "service.instance_renewed"]
        assert [(e["previous"], e["instance"]) for e in renewed] == [(real, fresh)]
        await asyncio.sleep(2 * TTL)  # the taken-over lease runs out; the service lives on in the fresh one
        await registry.settle()
        assert registry.leases.get(real) is None
        assert [(t.name, t.status, t.instances) for t in await registry.list_tools()] == [("tell-joke", "live", 1)]
        assert await _tool(config_client) == before


async def test_an_instance_id_claimed_elsewhere_before_it_started_recovers_at_once(
    connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    """Someone claimed the id first, into another workspace with a huge sequence: the instance's own announce is
    refused, and it goes on under a fresh id instead of staying locked out until a restart."""
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await publisher.send(
        announcement("svc", ("t",), instance="victim-1", sequence=HUGE, workspace="evil", ttl=30).to_json()
    )
    await eventually(lambda: registry.leases.get("victim-1"), timeout=3.0)
    service, tools = descriptors("svc", ("t",))
    async with Announcer(connection, service, tools, ttl=TTL, instance="victim-1") as announcer:
        await eventually(lambda: announcer.instance != "victim-1", timeout=3.0)
        await eventually(lambda: config_client.list("tool"), timeout=3.0)
        assert await config_client.list("tool") == ["t"]
        assert registry.leases.get(announcer.instance).service == ("default", "svc")  # type: ignore[union-attr]


async def test_a_replay_of_its_own_message_does_not_make_a_service_start_again(
    settings: Settings, connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    recorded: list[bytes] = []

    async def record(message: Any) -> None:
        recorded.append(message.data)

    notices: list[Probe] = []

    async def notice(message: Any) -> None:
        probe = Probe.model_validate_json(message.data)
        if probe.refused is not None:
            notices.append(probe)

    await connection.subscribe(connection.topics.tool_descriptors, record)
    await connection.subscribe(connection.topics.tool_probe, notice)
    async with JokeService(settings=settings, ttl=TTL) as joke:
        await eventually(lambda: _tool(config_client), timeout=3.0)
        real = joke.instance
        await eventually(lambda: any(json.loads(data)["kind"] == "heartbeat" for data in recorded), timeout=3.0)
        publisher = await connection.publisher(connection.topics.tool_descriptors)
        with structlog.testing.capture_logs() as logs:
            await publisher.send(next(data for data in recorded if json.loads(data)["kind"] == "announce"))
            await eventually(lambda: any(n.instance == real for n in notices), timeout=3.0)
            await eventually(lambda: any(e["event"] == "service.refused_other" for e in logs), timeout=3.0)
            await asyncio.sleep(registry.options.probe_interval + 0.1)  # notices to one instance are spaced
            bound = announcement("joke-service", ("tell-joke",), instance=real, sequence=HUGE, workspace="evil")
            await publisher.send(bound.to_json())
            await eventually(lambda: sum(e["event"] == "service.refused_other" for e in logs) >= 2, timeout=3.0)
            await asyncio.sleep(TTL)
        assert joke.instance == real and not any(e["event"] == "service.instance_renewed" for e in logs)
        assert await _live(registry, real)


def test_the_announcer_tells_a_takeover_from_someone_elses_refused_message() -> None:
    """The announcer reads the registry's own wording (`replay_refusal`, ...), made in one place."""

    def verdict(refused: str, withdrawn: bool = False) -> str:
        return judge_refusal(
            refused, instance="svc-1", sequence=40, service="svc", workspace="default", withdrawn=withdrawn
        )[0]

    assert verdict(replay_refusal(41, HUGE)) == "takeover"  # remembered past anything it sent
    assert verdict(replay_refusal(7, 39)) == "not-mine"  # a replay of its own older message
    assert verdict(withdrawn_refusal("svc-1")) == "takeover"  # it never withdrew
    assert verdict(withdrawn_refusal("svc-1"), withdrawn=True) == "mine"
    assert verdict(bound_refusal("svc-1", "other", "default", "svc", "default")) == "takeover"
    assert verdict(bound_refusal("svc-1", "svc", "evil", "svc", "default")) == "takeover"
    assert verdict(bound_refusal("svc-1", "svc", "default", "svc", "evil")) == "not-mine"
    assert verdict("conflict: tool/t belongs to service 'x', which claimed it first") == "mine"
    assert verdict("not trusted: unsigned announcement (a trust policy is configured)") == "mine"
