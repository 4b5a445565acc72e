"""Each announced tool's calls/s, errors/s and p95, from the counters its instances' heartbeats carry (`tool-stats`).

Rates are counter differences between an instance's last two heartbeats over
the time between them (their `sent-at`), summed over live instances; a
counter that went down (counting started again) gives no rate for that pair;
p95 is the highest of the instances' window p95s (an upper bound). A property
that is garbage is ignored, never a reason to refuse its heartbeat; the
figures go with the lease.
"""

from __future__ import annotations

import time
from functools import partial

from support import eventually
from support.registry import announcement

from discovery.registry.service import Registry
from discovery.registry.usage import CallSample, InstanceCalls, ToolUsage, tool_usage
from toolservice_base import Transport
from toolservice_base.call_stats import TOOL_STATS
from toolservice_base.schemas import Announcement
from toolservice_base.transport import Publisher


def instance(*samples: tuple[float, dict[str, tuple[int, int, float | None]]]) -> InstanceCalls:
    calls = InstanceCalls()
    for at, tools in samples:
        calls.add(CallSample(at, tools))
    return calls


def test_rates_are_counter_differences_over_the_time_between_two_heartbeats() -> None:
    one = instance((100.0, {"add": (10, 1, 5.0)}), (102.0, {"add": (30, 5, 7.5)}))
    assert tool_usage([one]) == {"add": ToolUsage(calls_per_s=10.0, errors_per_s=2.0, p95_ms=7.5)}
    first_only = instance((100.0, {"add": (10, 1, 5.0)}))
    assert tool_usage([first_only]) == {"add": ToolUsage(p95_ms=5.0)}, "one heartbeat: no rate yet, its window's p95"
    assert tool_usage([instance((100.0, {"add": (0, 0, None)}))]) == {}, "one heartbeat, no calls: nothing known"
    quiet = instance((100.0, {"add": (10, 1, 5.0)}), (101.0, {"add": (10, 1, None)}))
    assert tool_usage([quiet]) == {"add": ToolUsage(calls_per_s=0.0, errors_per_s=0.0)}, "idle: 0/s, and no p95"
    only_three = instance(
        (100.0, {"add": (1, 0, None)}), (102.0, {"add": (1, 0, None)}), (103.0, {"add": (4, 0, None)})
    )
    assert tool_usage([only_three])["add"].calls_per_s == 3.0, "the last two heartbeats only"


def test_a_counter_that_went_down_gives_no_rate_for_that_pair() -> None:
    restarted = instance((100.0, {"add": (500, 10, 3.0)}), (101.0, {"add": (4, 0, 2.0)}))
    assert tool_usage([restarted]) == {"add": ToolUsage(p95_ms=2.0)}
    errors_back = instance((100.0, {"add": (500, 10, None)}), (101.0, {"add": (600, 2, None)}))
    assert tool_usage([errors_back]) == {}, "errors went down too: no rate, and no p95 to show"
    steady = instance((100.0, {"add": (0, 0, None)}), (101.0, {"add": (7, 1, None)}))
    assert tool_usage([restarted, steady])["add"] == ToolUsage(calls_per_s=7.0, errors_per_s=1.0, p95_ms=2.0), (
        "the others still count"
    )
    backwards = instance((101.0, {"add": (0, 0, None)}), (100.0, {"add": (7, 0, None)}))
    assert tool_usage([backwards]) == {}, "no time between them (a clock set back): no rate"


def test_instances_are_summed_and_p95_is_the_highest_of_theirs() -> None:
    a = instance(
        (100.0, {"add": (10, 1, 5.0), "sub": (0, 0, None)}), (102.0, {"add": (30, 5, 7.5), "sub": (2, 0, 1.0)})
    )
    b = instance((100.5, {"add": (100, 0, 2.0)}), (101.5, {"add": (104, 0, 9.0)}))
    assert tool_usage([a, b]) == {
        "add": ToolUsage(calls_per_s=14.0, errors_per_s=2.0, p95_ms=9.0),
        "sub": ToolUsage(calls_per_s=1.0, errors_per_s=0.0, p95_ms=1.0),
    }
    assert tool_usage([]) == {} and tool_usage([InstanceCalls()]) == {}


TOOLS = ("add", "sub")


def beat(instance_id: str, sequence: int, sent_at: float) -> Announcement:
    """A heartbeat of service `calc`, lease 30 s, so nothing runs out during the test."""
    return announcement(
        "calc", TOOLS, kind="heartbeat", instance=instance_id, sequence=sequence, sent_at=sent_at, ttl=30.0
    )


async def send(publisher: Publisher, message: Announcement, stats: str | None = None) -> None:
    await publisher.send(message.to_json(), properties={TOOL_STATS: stats} if stats is not None else None)


async def test_the_registry_keeps_heartbeat_counters_per_lease_ignores_garbage_and_drops_them_with_the_lease(
    registry: Registry, connection: Transport
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    t0 = time.time() - 5

    async def tools_usage() -> dict[str, ToolUsage | None]:
        return {tool.name: tool.usage for tool in (await registry.overview.snapshot()).tools}

    def heard(instance_id: str, sequence: int) -> bool:
        lease = registry.leases.get(instance_id)
        return lease is not None and lease.sequence == sequence

    try:
        for name in ("calc-1", "calc-2"):
            await send(publisher, announcement("calc", TOOLS, instance=name, sequence=1, sent_at=t0, ttl=30.0))
        await eventually(lambda: heard("calc-1", 1) and heard("calc-2", 1), timeout=5)
        await registry.settle()
        assert await tools_usage() == {"add": None, "sub": None}, "nothing is known before a heartbeat with counters"

        await send(publisher, beat("calc-1", 2, t0 + 1), '{"add":[10,1,5.0],"sub":[0,0,null]}')
        await send(publisher, beat("calc-1", 3, t0 + 3), '{"add":[30,5,7.5],"sub":[2,0,1.0],"not-offered":[99,0,1.0]}')
        await send(publisher, beat("calc-2", 2, t0 + 1), '{"add":[100,0,2.0]}')
        await send(publisher, beat("calc-2", 3, t0 + 2), '{"add":[104,0,9.0]}')
        await eventually(lambda: heard("calc-1", 3) and heard("calc-2", 3), timeout=5)
        both = {
            "add": ToolUsage(calls_per_s=14.0, errors_per_s=2.0, p95_ms=9.0),
            "sub": ToolUsage(calls_per_s=1.0, errors_per_s=0.0, p95_ms=1.0),
        }
        assert await tools_usage() == both
        lease = registry.leases.get("calc-1")
        assert lease is not None and lease.calls is not None and lease.calls.latest is not None
        assert set(lease.calls.latest.tools) == {"add", "sub"}, "only the tools the instance offers are kept"

        # Garbage, however bad: the heartbeat renews its lease, nothing is refused, the figures stay as they were.
        garbage = [
            "{not json",
            '{"add":[-5,0,null]}',
            '{"add":[1,9,null]}',
            "[" * 3000,
            '{"add":[1,0,1.0]}' + " " * 5000,
        ]
        for n, text in enumerate(garbage):
            before = registry.leases.get("calc-2")
            assert before is not None
            expires = before.expires_at
            await send(publisher, beat("calc-2", 4 + n, t0 + 3 + n), text)
            await eventually(partial(heard, "calc-2", 4 + n), timeout=5)
            renewed = registry.leases.get("calc-2")
            assert renewed is not None and renewed.expires_at > expires and renewed.state == "live", text[:20]
        assert registry.rejections() == [] and await tools_usage() == both

        # A heartbeat without the property (a sender of an older release) renews the lease and changes no figure.
        await send(publisher, beat("calc-2", 20, t0 + 4))
        await eventually(lambda: heard("calc-2", 20), timeout=5)
        assert await tools_usage() == both

        # The lease goes (a withdraw): its figures go with it.
        await send(
            publisher, announcement("calc", TOOLS, kind="withdraw", instance="calc-2", sequence=21, sent_at=t0 + 5)
        )
        await eventually(lambda: registry.leases.get("calc-2") is None, timeout=5)
        assert await tools_usage() == {
            "add": ToolUsage(calls_per_s=10.0, errors_per_s=2.0, p95_ms=7.5),
            "sub": ToolUsage(calls_per_s=1.0, errors_per_s=0.0, p95_ms=1.0),
        }
    finally:
        await connection.close_publisher(publisher)
