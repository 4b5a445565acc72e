"""Fleet: 100,000 instances at ttl 30 s on one registry, and where one registry stops keeping up.

The fleet: 20,000 services x 5 instances, 1 or 2 tools each (30,000 tools),
ttl 30 s, hence 10,000 heartbeats/s (one per instance every ttl/3). A tool
service serves one kind of tool (a second tool is usually a variant of it
with other config values), and a service worth running at scale runs a few
instances behind its shared subscription: five is an availability zone
spread with room to lose one. So the fleet is many small services, not a
few huge ones, which is also what loads the registry most per instance (a
lease, a service, an ownership record and its tools for every five).

One registry (`toolreg registry --max-instances 250000` in a process of its
own: by default it takes 10,000 leases), the instances simulated from a
process of their own (`bench.sim`):

1. The fleet grows in stages (25,000, 50,000, 75,000, 100,000 instances),
   each rolled out wave by wave (`bench.rollout`: waves of 2,500 announcing
   at 5,000/s, the next once the registry has merged the last), every
   instance started heartbeating meanwhile. Measured: the time until the
   store lists every tool, the store versions, heartbeats dropped and leases
   expired while it grew.
2. After each stage, a steady state: heartbeats at that fleet's rate with
   nothing changing, 20 s (60 s for the whole fleet): the registry's CPU
   share and peak RSS, heartbeats dropped, false expiries, store version
   bumps; beside a bare pulsar.asyncio consumer of the same stream (the
   reference). A stage the registry cannot take in ends the growth: that
   is where one registry breaks.
3. With the whole fleet in: the heartbeat rate stepped up (15,000 to
   40,000/s, the message load of 150,000 to 400,000 instances) until a step
   drops or expires, saturates the registry's core, or saturates the machine.

Opt-in (`python -m bench --only fleet`, about 5 minutes); `--quick` runs
5,000 instances in under a minute; `BENCH_FLEET_WAVE` sets the wave size.
`bench/FLEET.md` reads the figures and says how the registry would shard.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from discovery.registry.options import RegistryOptions
from toolservice_base import ConfigClient, open_transport

from .common import Progress, Stack, Workdirs, sampled
from .regload import CpuMeter, heartbeat_step, steady_window
from .rollout import Rollout
from .sim import tool_counts
from .simproc import SimProcess

NAME = "fleet"
TTL = 30.0
CAP = 250_000
"""The registry's `--max-instances` in this benchmark: above every fleet it runs (the default, 10,000, is not)."""
WAVE_ENV = "BENCH_FLEET_WAVE"
"""Instances per wave (default 2,500): larger waves take the fleet in sooner and load the registry in longer bursts."""
STORE_WAIT = 60.0
"""Longest wait, once a stage's waves are in, for the store to list every tool."""
SATURATED = 0.95
"""Registry CPU share (of one core) at which a step counts as saturating it: its event loop runs on one."""
MACHINE_BUSY = 0.95
"""Share of all the machine's cores busy at which a step measures the machine (sender, broker and registry share it)."""
WARNINGS = (
    "registry.self_preservation",
    "registry.sweeps_paused",
    "health.loop_wedged",
    "registry.store_unavailable",
    "announcement.rejected",
)
"""Events of the registry's log that say it fell behind; counted over the whole run."""


@dataclass(frozen=True)
class Shape:
    services: int
    per_service: int
    tools: str
    wave: int
    stages: tuple[int, ...]
    stage_window: float
    window: float
    ladder: tuple[int, ...]
    step_seconds: float

    @property
    def instances(self) -> int:
        return self.services * self.per_service

    @property
    def rate(self) -> float:
        """Heartbeats/s of the whole fleet: each instance every ttl/3."""
        return self.instances / (TTL / 3)

    @property
    def tool_count(self) -> int:
        counts = tool_counts(self.tools)
        return sum(counts[s % len(counts)] for s in range(self.services))


FULL = Shape(
    services=20_000,
    per_service=5,
    tools="1-2",
    wave=int(os.environ.get(WAVE_ENV, 2_500)),
    stages=(25_000, 50_000, 75_000, 100_000),
    stage_window=20.0,
    window=60.0,
    ladder=(15_000, 20_000, 25_000, 30_000, 40_000),
    step_seconds=15.0,
)
QUICK = Shape(
    services=1_000,
    per_service=5,
    tools="1-2",
    wave=1_250,
    stages=(2_500, 5_000),
    stage_window=4.0,
    window=8.0,
    ladder=(2_000, 4_000),
    step_seconds=3.0,
)


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    shape = QUICK if quick else FULL
    progress = Progress(NAME)
    stack = Stack(work.make(NAME), split_registry=True, registry_args=("--max-instances", str(CAP))).start()
    sim: SimProcess | None = None
    try:
        connection = await open_transport(stack.settings)
        config = await ConfigClient(connection, timeout=30).start()
        try:
            sim = await SimProcess.start(
                stack.url,
                stack.data_dir,
                services=shape.services,
                instances=shape.per_service,
                tools=shape.tools,
                ttl=TTL,
            )
            rollout = Rollout(
                stack, sim, config, per_service=shape.per_service, tools=shape.tools, ttl=TTL, wave=shape.wave
            )
            await rollout.begin()
            stages = await _stages(stack, sim, config, shape, rollout, progress)
            grown = await rollout.summary()
            whole = bool(stages) and stages[-1]["instances"] == shape.instances
            ladder = await _ladder(stack, sim, shape, progress) if whole else []
        finally:
            await config.close()
            await connection.close()
    finally:
        if sim is not None:
            await sim.close()
        stack.stop()
    return _result(shape, grown, stages, ladder, _warnings(stack.workdir / "registry.log"))


async def _stages(
    stack: Stack, sim: SimProcess, config: ConfigClient, shape: Shape, rollout: Rollout, progress: Progress
) -> list[dict[str, Any]]:
    """Grow to each stage, then measure it steady; stop at the first stage the registry cannot take in."""
    stages: list[dict[str, Any]] = []
    for size in shape.stages:
        last = size == shape.stages[-1]
        with sampled(stack.registry_pid, f"fleet-registry-grow-{size}"):
            if not await rollout.grow(size, progress):
                break
        listed = await rollout.listed(STORE_WAIT)
        with sampled(stack.registry_pid, f"fleet-registry-steady-{size}"):
            window = await steady_window(
                stack,
                sim,
                config,
                size / (TTL / 3),
                shape.window if last else shape.stage_window,
                progress,
                references=("async-consumer",),
            )
        stages.append(
            {"instances": size, "store_listed_after_s": listed, "rollout_s": round(rollout.seconds, 1), **window}
        )
        progress.update(
            f"{size:,} instances: registry CPU {window['registry']['cpu_share']:.0%}, RSS {window['peak_rss_mb']:.0f}"
            f" MB, {window['dropped']} dropped, {window['expiries']} expired",
            force=True,
        )
    return stages


def _warnings(log: Path) -> dict[str, int]:
    """How often the registry logged each event of `WARNINGS` (its log is JSON lines, warnings and up)."""
    found: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line).get("event")
            except ValueError:
                continue
            if event in WARNINGS:
                found[event] += 1
    return {event: found[event] for event in WARNINGS}


async def _ladder(stack: Stack, sim: SimProcess, shape: Shape, progress: Progress) -> list[dict[str, Any]]:
    """Heartbeat rates above the fleet's, each for `step_seconds`, until a step is not clean, saturates the
    registry's core, or the sender cannot keep the pace (then the machine is measured, not the registry)."""
    meter = CpuMeter(stack.registry_pid)
    steps: list[dict[str, Any]] = []
    for rate in shape.ladder:
        progress.update(f"{rate:,} hb/s for {shape.step_seconds:g} s over {shape.instances:,} instances", force=True)
        step = await heartbeat_step(stack, sim, meter, rate, shape.step_seconds)
        steps.append(step)
        if step["sent_per_s"] < 0.9 * rate or step["machine_cores_busy"] >= MACHINE_BUSY * (psutil.cpu_count() or 1):
            step["ended"] = (
                "the machine saturated (the sender fell behind or every core was busy): not the registry's limit alone"
            )
        elif not step["clean"]:
            step["ended"] = "drops or expiries"
        elif step["cpu_share"] >= SATURATED:
            step["ended"] = "registry CPU saturated"
        if "ended" in step:
            break
    progress.done(f"{len(steps)} steps up to {steps[-1]['rate']:,} hb/s" if steps else "no steps")
    return steps


def _result(
    shape: Shape,
    grown: dict[str, Any],
    stages: list[dict[str, Any]],
    ladder: list[dict[str, Any]],
    warnings: dict[str, int],
) -> dict[str, Any]:
    fleet = f"{shape.instances:,} instances"
    whole = stages[-1] if stages and stages[-1]["instances"] == shape.instances else None
    default = RegistryOptions().max_instances
    sent_s = round(sum(wave["sent_s"] for wave in grown["waves"]), 1)
    versions = grown["versions_total"] - sum(stage["version_bumps"] for stage in stages)
    behind = f"the registry fell behind in the wave that brought the fleet to {grown['started']:,}"
    rows: list[dict[str, Any]] = [
        {
            "figure": f"grown to {fleet} in waves of {shape.wave:,}: every tool in the store after",
            "ours": (
                f"{whole['rollout_s']} s" if whole and whole["store_listed_after_s"] is not None else f"never: {behind}"
            ),
            "reference": f"{sent_s} s",
        },
        {"figure": "growth: store versions", "ours": versions, "reference": None},
        {
            "figure": "growth: heartbeats dropped / leases expired",
            "ours": f"{grown['heartbeats_dropped']:,} / {grown['expiries']:,}",
            "reference": "0 / 0",
            "target": "0 / 0",
            "met": grown["heartbeats_dropped"] <= 0 and grown["expiries"] == 0,
        },
    ]
    for stage in stages[:-1] if whole else stages:
        ours, ref = stage["registry"], stage["references"]["async-consumer"]
        rows.append(
            {
                "figure": (
                    f"steady, {stage['instances']:,} instances, {stage['rate']:,.0f} hb/s: registry CPU / RSS / dropped"
                    " / expired"
                ),
                "ours": (
                    f"{ours['cpu_share']:.1%} / {stage['peak_rss_mb']:.0f} MB / {stage['dropped']:,} /"
                    f" {stage['expiries']:,}"
                ),
                "reference": f"{ref['cpu_share']:.1%} / {ref['rss_mb']:.0f} MB / 0 / 0",
            }
        )
    # The same rows whether or not the whole fleet got in, so both brokers' results line up in RESULTS.md.
    ours, ref = (whole["registry"], whole["references"]["async-consumer"]) if whole else ({}, {})
    rows += [
        {
            "figure": f"registry CPU share, {fleet}, {shape.rate:,.0f} hb/s",
            "ours": round(ours["cpu_share"] * 100, 2) if whole else f"not reached: {behind}",
            "reference": round(ref["cpu_share"] * 100, 2) if whole else None,
            "unit": "% of a core" if whole else "",
        },
        {
            "figure": f"registry RSS, peak, {fleet}",
            "ours": whole["peak_rss_mb"] if whole else None,
            "reference": ref.get("rss_mb"),
            "unit": "MB",
        },
        {
            "figure": f"heartbeats dropped / false expiries, {fleet}, {shape.window:g} s",
            "ours": f"{whole['dropped']:,} / {whole['expiries']:,}" if whole else "not reached",
            "reference": "0 / 0",
            "target": "0 / 0",
            "met": whole is not None and whole["dropped"] <= 0 and whole["expiries"] == 0,
        },
    ]
    bumps = sum(stage["version_bumps"] for stage in stages)
    rows.append(
        {
            "figure": "store version bumps in the steady windows",
            "ours": bumps,
            "reference": 0,
            "target": "0",
            "met": bumps == 0,
        }
    )
    slope = None
    if len(stages) >= 2:
        first, last = stages[0], stages[-1]
        slope = round((last["peak_rss_mb"] - first["peak_rss_mb"]) / (last["instances"] - first["instances"]) * 1000, 2)
    rows.append(
        {"figure": "registry RSS per 1,000 instances (slope over the stages measured)", "ours": slope, "unit": "MB"}
    )
    clean = [step for step in ladder if step["clean"] and step["cpu_share"] < SATURATED]
    best = max((step["taken_in_per_s"] for step in clean), default=0.0)
    rows.append(
        {
            "figure": f"highest heartbeat rate taken in clean, {fleet}",
            "ours": round(best) if ladder else "not run: the fleet was not in",
            "unit": "hb/s" if ladder else "",
            "reference": round(max(step["sent_per_s"] for step in ladder)) if ladder else None,
            "target": f">= {shape.rate:,.0f} hb/s",
            "met": bool(ladder) and best >= shape.rate,
        }
    )
    return {
        "name": NAME,
        "title": "Fleet on one registry",
        "rows": rows,
        "reference_is": (
            "growth: the time the simulator took to send every wave (the soonest all could be listed); steady state: a "
            "bare pulsar.asyncio consumer on its own subscription to the same topic in the same window; highest rate: "
            "the highest rate the simulator sent"
        ),
        "notes": [
            (
                f"the registry runs with --max-instances {CAP:,}: by default it takes {default:,} leases and refuses"
                " the rest (capacity)"
            ),
            *_notes(grown, stages, ladder, warnings),
        ],
        "data": {
            "shape": {
                **shape.__dict__,
                "instances": shape.instances,
                "tools": shape.tool_count,
                "ttl_s": TTL,
                "rate": shape.rate,
            },
            "max_instances": CAP,
            "default_max_instances": default,
            "growth": grown,
            "stages": stages,
            "ladder": ladder,
            "registry_log": warnings,
        },
    }


def _notes(
    grown: dict[str, Any], stages: list[dict[str, Any]], ladder: list[dict[str, Any]], warnings: dict[str, int]
) -> list[str]:
    notes = [
        "write-up, profile and how the registry would shard past one: bench/FLEET.md",
        (
            f"load average (1 min) while growing / in each steady window / at each ladder step: {grown['load_average']}"
            f" / {[stage['load_average'] for stage in stages]} / {[step['load_average'] for step in ladder]}"
        ),
        "registry log over the run: " + ", ".join(f"{event} x{count}" for event, count in warnings.items()),
    ]
    if grown["heartbeats_dropped"] > 0:
        first = next((wave["started"] for wave in grown["waves"] if wave["heartbeats_dropped"] > 0), 0)
        notes.append(
            f"growth: {grown['heartbeats_dropped']:,} of {grown['heartbeats_sent']:,} heartbeats dropped while waves"
            f" were merged, the first in the wave that brought the fleet to {first:,} instances; {grown['expiries']:,}"
            " leases expired"
        )
    if grown["gave_up"]:
        notes.append(
            f"growth ended at {grown['started']:,} instances: the registry had not taken its last wave in 30 s later"
            f" (its CPU meanwhile {grown['waves'][-1]['cpu_share']:.0%} of a core); the store listed"
            f" {grown['tools_listed']:,} tools"
        )
    ended = next((step for step in ladder if "ended" in step), None)
    if ended is not None:
        notes.append(
            f"ladder ended at {ended['rate']:,} hb/s asked ({ended['ended']}): {ended['dropped']:,} dropped,"
            f" {ended['expiries']:,} expired, registry CPU {ended['cpu_share']:.0%}, sender reached"
            f" {ended['sent_per_s']:,.0f}/s, machine {ended['machine_cores_busy']:.2f} cores busy"
        )
    return notes
