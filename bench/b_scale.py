"""6. Scale: 2,000 instances of 400 services (5 tools each), heartbeat every 5 s, for 60 s.

The registry runs alone (`toolreg registry`); the instances are simulated
from a process of their own. Over the window: the registry's CPU share and
RSS (psutil, by pid), and the store's version bumps: nothing changes, so
there must be none (an unchanged digest means no write).

Reference, same window: a bare pulsar-client consumer on its own
subscription to the same topic, so it receives exactly the same 400
messages/s: the CPU any consumer of this stream must spend; and the same
consumer on pulsar.asyncio, what any event-loop process must spend.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from toolservice_base import ConfigClient, open_transport, topics

from .common import Progress, Stack, Workdirs, spawn, stop_process, wait_for_line
from .regload import CpuMeter, populate, read_counters, settle
from .simproc import SimProcess

NAME = "scale"
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
            sim = await SimProcess.start(stack.url, stack.data_dir, services=SERVICES, instances=INSTANCES, tools=TOOLS, ttl=TTL)
            progress.update(f"announcing {SERVICES * INSTANCES:,} instances", force=True)
            t0 = time.perf_counter()
            await populate(stack, sim, SERVICES * INSTANCES)
            version = await _stable_version(config)
            populated_s = time.perf_counter() - t0
            tools_listed = len(await config.list("tool"))
            return await _window(stack, sim, config, window, version, populated_s, tools_listed, progress)
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


async def _window(stack: Stack, sim: SimProcess, config: ConfigClient, window: float, version: int, populated_s: float,
                  tools_listed: int, progress: Progress) -> dict[str, Any]:
    assert stack.metrics_port is not None
    # The reference consumers outlive the window, so they are still there to be measured at its end.
    log, async_log = stack.workdir / "raw-consumer.log", stack.workdir / "raw-async-consumer.log"
    raw = spawn(["-m", "bench.raw", "consumer", stack.url, topics.DEFAULT.tool_descriptors, str(window + 10)], stack.env(), log)
    raw_async = spawn(["-m", "bench.raw", "async-consumer", stack.url, topics.DEFAULT.tool_descriptors, str(window + 10)], stack.env(), async_log)
    try:
        wait_for_line(log, "raw consumer ready", raw)
        wait_for_line(async_log, "raw consumer ready", raw_async)
        before = await read_counters(stack.metrics_port)
        registry, reference, async_reference = CpuMeter(stack.registry_pid), CpuMeter(raw.pid), CpuMeter(raw_async.pid)
        rate = SERVICES * INSTANCES / (TTL / 3)
        step = asyncio.create_task(sim.step(rate, window))
        peak_rss, samples = 0.0, []
        started = time.monotonic()
        while not step.done():
            await asyncio.sleep(min(5.0, window / 4))
            peak_rss = max(peak_rss, registry.process.memory_info().rss / 2**20)
            progress.update(f"{time.monotonic() - started:4.0f}/{window:g} s at {rate:g} hb/s")
        sent = await step
        ours, ref, async_ref = registry.read(), reference.read(), async_reference.read()
        samples.append(ours)
        after = await settle(stack.metrics_port, quiet=0.3)
        bumps = await config.version() - version
    finally:
        stop_process(raw)
        stop_process(raw_async)
    per_minute = bumps * 60 / window
    dropped = int(sent["sent"] - (after.heartbeats - before.heartbeats) - (after.rejections - before.rejections))
    progress.done(f"registry CPU {ours['cpu_share']:.1%}, RSS {max(peak_rss, ours['rss_mb']):.0f} MB, {bumps} version bumps")
    return {
        "name": NAME,
        "title": "Scale",
        "rows": [
            {"figure": f"registry CPU share, {SERVICES * INSTANCES:,} instances, {rate:g} hb/s", "ours": round(ours["cpu_share"] * 100, 2),
             "reference": round(ref["cpu_share"] * 100, 2), "unit": "% of a core"},
            {"figure": "registry CPU share vs a bare pulsar.asyncio consumer", "ours": round(ours["cpu_share"] * 100, 2),
             "reference": round(async_ref["cpu_share"] * 100, 2), "unit": "% of a core"},
            {"figure": "registry RSS, peak", "ours": round(max(peak_rss, ours["rss_mb"]), 1), "reference": ref["rss_mb"], "unit": "MB"},
            {"figure": "store version bumps per minute, nothing changing", "ours": round(per_minute, 2), "reference": 0,
             "target": "0", "met": bumps == 0},
            {"figure": "heartbeats dropped / false expiries", "ours": f"{dropped} / {int(after.expiries - before.expiries)}",
             "reference": "0 / 0", "target": "0 / 0", "met": dropped <= 0 and after.expiries == before.expiries},
        ],
        "reference_is": "a bare pulsar-client consumer (sync API) on its own subscription to the same topic in the same window: "
                        "the CPU and memory any process must spend just receiving this stream; also the same consumer on "
                        "pulsar.asyncio, the floor for a process on an event loop",
        "data": {"window_s": window, "services": SERVICES, "instances": SERVICES * INSTANCES, "tools": SERVICES * TOOLS,
                 "tools_in_store": tools_listed, "heartbeat_rate": rate, "populate_and_merge_s": round(populated_s, 2),
                 "registry": {**ours, "peak_rss_mb": round(peak_rss, 1)}, "raw_consumer": ref, "raw_asyncio_consumer": async_ref, "sent": sent,
                 "version_bumps": bumps, "dropped": dropped, "expiries": int(after.expiries - before.expiries)},
    }
