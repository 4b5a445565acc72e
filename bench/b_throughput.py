"""4. Registry throughput: the highest heartbeat rate taken in with no false expiry and no drop.

2,000 simulated instances (400 services x 5) with ttl 3 s heartbeat from a
process of their own at rising rates; the registry runs alone (`toolreg
registry`). A step passes when every heartbeat sent was taken in (the
registry's own counter) and no lease expired. On a non-persistent topic the
broker drops what a consumer has no permits for, so a registry whose receive
loop falls behind shows up here as drops, not as latency.

Reference, same run: the same publisher blasting a scratch topic at full
speed into a bare pulsar-client consumer: the broker's raw consume rate.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .common import Progress, Stack, Workdirs, spawn, stop_process, wait_for_line
from .regload import CpuMeter, populate, settle
from .simproc import SimProcess

NAME = "throughput"
TARGET = 10_000
SCRATCH = "non-persistent://tg/bench/raw-consume"


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    stack = Stack(work.make(NAME), split_registry=True).start()
    sim: SimProcess | None = None
    try:
        services, per = (100, 5) if quick else (400, 5)
        sim = await SimProcess.start(stack.url, stack.data_dir, services=services, instances=per, tools=5, ttl=3)
        await populate(stack, sim, services * per)
        steps = await _steps(stack, sim, quick, progress)
        reference = await _raw_rate(stack, work, 1.5 if quick else 3.0)
        progress.done(f"{len(steps)} steps; raw consume {reference['consumed_per_s']:,.0f}/s")
    finally:
        if sim is not None:
            await sim.close()
        stack.stop()
    passed = [s for s in steps if s["clean"]]
    best = max((s["taken_in_per_s"] for s in passed), default=0.0)
    first_fail = next((s for s in steps if not s["clean"]), None)
    notes = []
    if first_fail is not None:
        notes.append(
            f"at {first_fail['rate']:,} hb/s asked: {first_fail['dropped']:,} dropped, {first_fail['expiries']:,} expired, "
            f"registry CPU {first_fail['cpu_share']:.0%}, sender reached {first_fail['sent_per_s']:,.0f}/s"
        )
    return {
        "name": NAME,
        "title": "Registry throughput",
        "rows": [
            {"figure": "highest sustained heartbeat rate, 0 drops, 0 false expiries", "ours": round(best), "unit": "hb/s",
             "reference": round(reference["consumed_per_s"]), "target": f">= {TARGET:,} hb/s", "met": best >= TARGET},
        ],
        "reference_is": "bare pulsar-client consumer (sync API) taking the same heartbeat bytes from a scratch topic while "
                        "the same publisher sends as fast as it can: the broker's raw consume rate on this machine",
        "notes": notes,
        "data": {"instances": services * per, "ttl_s": 3, "steps": steps, "raw": reference},
    }


async def _steps(stack: Stack, sim: SimProcess, quick: bool, progress: Progress) -> list[dict[str, Any]]:
    assert stack.metrics_port is not None
    rates = (2_000, 5_000) if quick else (2_000, 5_000, 10_000, 12_500, 15_000, 20_000)
    seconds = 1.5 if quick else 4.0
    meter = CpuMeter(stack.registry_pid)
    steps = []
    before = await settle(stack.metrics_port)
    for rate in rates:
        progress.update(f"{rate:,} hb/s for {seconds:g} s", force=True)
        meter.read()
        sent = await sim.step(rate, seconds)
        cpu = meter.read()
        after = await settle(stack.metrics_port, quiet=0.3)
        taken = after.heartbeats - before.heartbeats
        rejected = after.rejections - before.rejections
        expiries = after.expiries - before.expiries
        dropped = int(sent["sent"] - sent["failed"] - taken - rejected)
        step = {
            "rate": rate, "sent": sent["sent"], "send_failed": sent["failed"], "sent_per_s": round(sent["sent"] / sent["seconds"], 1),
            "taken_in": int(taken), "taken_in_per_s": round(taken / sent["seconds"], 1), "rejected": int(rejected),
            "dropped": dropped, "expiries": int(expiries), "held": int(after.held), **cpu,
        }
        step["clean"] = dropped <= 0 and expiries == 0 and rejected == 0 and after.held == 0 and sent["failed"] == 0
        steps.append(step)
        before = after
        if not step["clean"]:
            break
    return steps


async def _raw_rate(stack: Stack, work: Workdirs, seconds: float) -> dict[str, Any]:
    log = stack.workdir / "raw-consumer.log"
    consumer = spawn(["-m", "bench.raw", "consumer", stack.url, SCRATCH, str(seconds)], stack.env(), log)
    blaster: SimProcess | None = None
    try:
        wait_for_line(log, "raw consumer ready", consumer)
        blaster = await SimProcess.start(stack.url, stack.data_dir, services=400, instances=5, tools=1, ttl=3, prefix="raw", topic=SCRATCH)
        sent = await blaster.step(1_000_000, seconds + 0.5)
        await asyncio.to_thread(consumer.wait, 30)
        result = json.loads(log.read_text().splitlines()[-1])
    finally:
        if blaster is not None:
            await blaster.close()
        stop_process(consumer)
    return {
        "sent": sent["sent"], "sent_per_s": round(sent["sent"] / sent["seconds"], 1), "received": result["received"],
        "consumed_per_s": round(result["received"] / result["seconds"], 1) if result["seconds"] else 0.0,
    }
