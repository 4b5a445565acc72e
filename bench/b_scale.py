"""6. Scale: 2,000 instances of 400 services (5 tools each), heartbeat every 5 s, for 60 s.

The registry runs alone (`toolreg registry`); the instances are simulated
from a process of their own. Over the window: the registry's CPU share and
RSS (psutil, by pid), and the store's version bumps: nothing changes, so
there must be none (an unchanged digest means no write).

Reference, same window: a bare pulsar-client consumer on its own
subscription to the same topic, so it receives exactly the same 400
messages/s: the CPU any consumer of this stream must spend; the same consumer on
pulsar.asyncio, what any event-loop process must spend through that API; and
on a message listener, what the registry's transport is built on (the target).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from toolservice_base import ConfigClient, open_transport

from .common import Progress, Stack, Workdirs
from .regload import populate, steady_window
from .simproc import SimProcess

NAME = "scale"
REFERENCES = ("consumer", "async-consumer", "listener-consumer", "batch-consumer")
"""`bench.raw` consumers beside the registry: sync API, pulsar.asyncio, a message listener (the target's), and
batches taken with `batch_receive` (the fastest path the client offers a stream's consumer)."""
TARGET_CPU_RATIO = 1.2
"""The registry's CPU at 2,000 instances against a bare consumer on the client's message listener."""
SERVICES, INSTANCES, TOOLS, TTL = 400, 5, 5, 15.0


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    window = 8.0 if quick else 60.0
    stack = Stack(work.make(NAME), split_registry=True).start()
    sim: SimProcess | None = None
    try:
        connection = await open_transport(stack.settings)
        config = await ConfigClient(connection, timeout=10).start()
        try:
            sim = await SimProcess.start(
                stack.url, stack.data_dir, services=SERVICES, instances=INSTANCES, tools=TOOLS, ttl=TTL
            )
            progress.update(f"announcing {SERVICES * INSTANCES:,} instances", force=True)
            t0 = time.perf_counter()
            await populate(stack, sim, SERVICES * INSTANCES)
            await _stable_version(config)
            populated_s = time.perf_counter() - t0
            tools_listed = len(await config.list("tool"))
            return await _window(stack, sim, config, window, populated_s, tools_listed, progress)
        finally:
            await config.close()
            await connection.close()
    finally:
        if sim is not None:
            await sim.close()
        stack.stop()


async def _stable_version(config: ConfigClient, quiet: float = 1.5, timeout: float = 60.0) -> int:
    """The store's version once the registry has stopped writing (the population is merged)."""
    deadline = time.monotonic() + timeout
    version, since = await config.version(), time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        now = await config.version()
        if now != version:
            version, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return version
    return version


async def _window(
    stack: Stack,
    sim: SimProcess,
    config: ConfigClient,
    window: float,
    populated_s: float,
    tools_listed: int,
    progress: Progress,
) -> dict[str, Any]:
    rate = SERVICES * INSTANCES / (TTL / 3)
    measured = await steady_window(stack, sim, config, rate, window, progress, references=REFERENCES)
    ours, ref, async_ref, listener_ref, batch_ref = (
        measured["registry"],
        measured["references"]["consumer"],
        measured["references"]["async-consumer"],
        measured["references"]["listener-consumer"],
        measured["references"]["batch-consumer"],
    )
    peak_rss, bumps, dropped, expiries = (
        measured["peak_rss_mb"],
        measured["version_bumps"],
        measured["dropped"],
        measured["expiries"],
    )
    per_minute = bumps * 60 / window
    progress.done(f"registry CPU {ours['cpu_share']:.1%}, RSS {peak_rss:.0f} MB, {bumps} version bumps")
    return {
        "name": NAME,
        "title": "Scale",
        "rows": [
            {
                "figure": f"registry CPU share, {SERVICES * INSTANCES:,} instances, {rate:g} hb/s",
                "ours": round(ours["cpu_share"] * 100, 2),
                "reference": round(ref["cpu_share"] * 100, 2),
                "unit": "% of a core",
            },
            {
                "figure": "registry CPU share vs a bare pulsar.asyncio consumer",
                "ours": round(ours["cpu_share"] * 100, 2),
                "reference": round(async_ref["cpu_share"] * 100, 2),
                "unit": "% of a core",
            },
            {
                "figure": "registry CPU share vs a bare listener consumer",
                "ours": round(ours["cpu_share"] * 100, 2),
                "reference": round(listener_ref["cpu_share"] * 100, 2),
                "unit": "% of a core",
                "target": f"<= {TARGET_CPU_RATIO:g}x",
                "met": ours["cpu_share"] <= TARGET_CPU_RATIO * listener_ref["cpu_share"],
            },
            {
                "figure": "registry CPU share vs a bare consumer taking batches (batch_receive, 20 ms)",
                "ours": round(ours["cpu_share"] * 100, 2),
                "reference": round(batch_ref["cpu_share"] * 100, 2),
                "unit": "% of a core",
            },
            {"figure": "registry RSS, peak", "ours": peak_rss, "reference": ref["rss_mb"], "unit": "MB"},
            {
                "figure": "store version bumps per minute, nothing changing",
                "ours": round(per_minute, 2),
                "reference": 0,
                "target": "0",
                "met": bumps == 0,
            },
            {
                "figure": "heartbeats dropped / false expiries",
                "ours": f"{dropped} / {expiries}",
                "reference": "0 / 0",
                "target": "0 / 0",
                "met": dropped <= 0 and expiries == 0,
            },
        ],
        "reference_is": (
            "a bare pulsar-client consumer (sync API) on its own subscription to the same topic in the same window: "
            "the CPU and memory any process must spend just receiving this stream; also the same consumer on "
            "pulsar.asyncio, on a message listener (the target's reference), and taking batches with batch_receive "
            "(the fastest path the client offers a stream's consumer)"
        ),
        "data": {
            "window_s": window,
            "services": SERVICES,
            "instances": SERVICES * INSTANCES,
            "tools": SERVICES * TOOLS,
            "tools_in_store": tools_listed,
            "heartbeat_rate": rate,
            "populate_and_merge_s": round(populated_s, 2),
            "registry": {**ours, "peak_rss_mb": peak_rss},
            "raw_consumer": ref,
            "raw_asyncio_consumer": async_ref,
            "raw_listener_consumer": listener_ref,
            "raw_batch_consumer": batch_ref,
            "sent": measured["sent"],
            "version_bumps": bumps,
            "dropped": dropped,
            "expiries": expiries,
            "load_average": measured["load_average"],
        },
    }
