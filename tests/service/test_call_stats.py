"""A service's per-tool call counters, as its heartbeats carry them to the registry page (`tool-stats`).

Counted per declared tool: calls and errors since the instance started, and
the p95 latency of the calls since the previous heartbeat, over at most the
last 1,024 of them. The property is compact JSON, capped at 4 KiB (past that
the heartbeat goes without it), outside the signed body, and only on
heartbeats.
"""

from __future__ import annotations

import json
import time

import pytest
from support import eventually
from support.registry import descriptors

from toolservice_base import Transport
from toolservice_base.announcer import Announcer
from toolservice_base.call_stats import MAX_TOOL_STATS_BYTES, TOOL_STATS, WINDOW_LATENCIES, CallStats, parse_tool_stats
from toolservice_base.schemas import Announcement, descriptor_digest
from toolservice_base.transport import Envelope, unique_name


def test_calls_and_errors_count_per_declared_tool_since_start_and_p95_per_window() -> None:
    stats = CallStats(["add", "sub"])
    for ms in range(1, 101):  # 1 ms .. 100 ms: the nearest-rank p95 is 95 ms
        stats.record("add", ms / 1000, failed=ms % 10 == 0)
    stats.record("sub", 0.002, failed=False)
    stats.record("(other)", 0.5, failed=True)  # a tool the service does not declare: not counted, no entry made
    assert stats.take() == {"add": (100, 10, 95.0), "sub": (1, 0, 2.0)}

    # The next window: counters go on from where they were, the p95 is of this window's calls only.
    assert stats.take() == {"add": (100, 10, None), "sub": (1, 0, None)}, "a window without calls has no p95"
    stats.record("add", 0.250, failed=True)
    assert stats.take() == {"add": (101, 11, 250.0), "sub": (1, 0, None)}


def test_a_window_keeps_only_the_newest_latencies_so_memory_is_bounded() -> None:
    stats = CallStats(["busy"])
    for _ in range(10 * WINDOW_LATENCIES):
        stats.record("busy", 9.0, failed=False)  # slow calls first ...
    for _ in range(WINDOW_LATENCIES):
        stats.record("busy", 0.001, failed=False)  # ... then the newest 1,024 all fast
    assert len(stats._tools["busy"].latencies) == WINDOW_LATENCIES
    assert stats.take() == {"busy": (11 * WINDOW_LATENCIES, 0, 1.0)}, (
        "the p95 of the newest 1,024 calls; every call counted"
    )
    assert len(stats._tools["busy"].latencies) == 0, "a new window starts empty"


def test_recording_a_call_is_cheap_enough_for_every_call() -> None:
    stats = CallStats(["echo"])
    record = stats.record
    calls = 100_000
    started = time.perf_counter()
    for n in range(calls):
        record("echo", 0.0003, n % 7 == 0)
    took = time.perf_counter() - started
    print(f"CallStats.record: {took / calls * 1e9:.0f} ns per call ({calls} calls in {took * 1000:.1f} ms)")
    assert stats.take()["echo"][:2] == (calls, len(range(0, calls, 7)))
    assert took / calls < 2e-6, f"{took / calls * 1e6:.2f} µs per call"  # about 0.1 µs idle; loose for a loaded machine


def test_the_property_is_compact_json_and_left_off_past_4_kib() -> None:
    stats = CallStats(["add"])
    stats.record("add", 0.0125, failed=False)
    assert stats.property() == {TOOL_STATS: '{"add":[1,0,12.5]}'}
    crowded = CallStats([f"tool-{n:03d}-{'x' * 100}" for n in range(40)])
    assert len(json.dumps(crowded.take())) > MAX_TOOL_STATS_BYTES
    assert crowded.property() == {} and crowded.property() == {}, "too large: left off (said once), every time"


def test_a_registry_reads_only_well_formed_counters_of_the_tools_offered() -> None:
    offered = {"add", "sub"}
    assert parse_tool_stats('{"add":[5,1,3.5],"sub":[0,0,null],"gone":[9,9,1]}', offered) == {
        "add": (5, 1, 3.5),
        "sub": (0, 0, None),
    }
    for garbage in (
        "",
        "nope",
        "[1,2,3]",
        '{"add":[1,2]}',
        '{"add":{"calls":1}}',
        '{"add":[-1,0,null]}',
        '{"add":[1,0,-2]}',
        '{"add":[1.5,0,null]}',
        '{"add":[true,0,null]}',
        '{"add":[1,0,NaN]}',
        '{"add":[1,0,"fast"]}',
        '{"add":[1,2,null]}',
        "[" * 4000,
        json.dumps({"add": [1, 0, 1.0], "pad": "x" * MAX_TOOL_STATS_BYTES}),
    ):
        with pytest.raises(ValueError):
            parse_tool_stats(garbage, offered)


async def test_heartbeats_carry_the_counters_as_a_property_outside_the_signed_body(connection: Transport) -> None:
    """Only heartbeats carry them, the body has no new field (older registries forbid unknown fields), and a
    heartbeat whose counters would not fit goes without them."""
    heard: list[tuple[Announcement, Envelope]] = []

    async def hear(message: Envelope) -> None:
        heard.append((Announcement.model_validate_json(message.data), message))

    def beats(digest: str) -> list[Envelope]:
        return [message for parsed, message in heard if parsed.kind == "heartbeat" and parsed.digest == digest]

    subscription = await connection.subscribe(
        connection.topics.tool_descriptors, hear, subscription=unique_name("test-stats")
    )
    counted, crowded = descriptors("counted", ("add", "sub")), descriptors("crowded", ("one",))
    stats = CallStats(["add", "sub"])
    stats.record("add", 0.004, failed=True)
    too_many = CallStats([f"tool-{n:03d}-{'x' * 100}" for n in range(40)])
    try:
        async with (
            Announcer(connection, *counted, ttl=0.6, stats=stats),
            Announcer(connection, *crowded, ttl=0.6, stats=too_many),
        ):
            await eventually(
                lambda: len(beats(descriptor_digest(*counted))) >= 2 and beats(descriptor_digest(*crowded)), timeout=5
            )
    finally:
        await connection.unsubscribe(subscription)
    first, second = (json.loads(m.properties[TOOL_STATS]) for m in beats(descriptor_digest(*counted))[:2])
    assert first == {"add": [1, 1, 4.0], "sub": [0, 0, None]}, "counters since start, the window's p95"
    assert second == {"add": [1, 1, None], "sub": [0, 0, None]}, "no calls since the previous heartbeat: no p95"
    for parsed, message in heard:
        assert set(json.loads(message.data)) <= set(Announcement.model_fields) | {"sent-at"}, "no new field in the body"
        if parsed.kind != "heartbeat":
            assert TOOL_STATS not in message.properties, "only heartbeats carry the counters"
    assert all(TOOL_STATS not in m.properties for m in beats(descriptor_digest(*crowded))), (
        "over 4 KiB: the heartbeat goes, without them"
    )
