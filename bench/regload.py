"""A registry in a process of its own, loaded by simulated instances: what throughput, scale and fleet share.

The registry's /metrics counters say exactly what it took in (valid
heartbeats, rejections, expiries), so "dropped" is arithmetic, not a guess:
sent - failed to send - taken in - rejected. psutil reads its CPU time and
RSS by pid. Two ways to load it: `heartbeat_step` (a few seconds at one rate,
judged clean or not) and `steady_window` (a long window beside bare
consumers of the same stream, the reference).
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.error
from dataclasses import dataclass
from typing import Any

import psutil

from toolservice_base import ConfigClient, topics

from .common import Progress, Stack, read_metrics, sampled, spawn, stop_process, wait_for_line
from .simproc import SimProcess


@dataclass(frozen=True)
class Counters:
    heartbeats: float
    announces: float
    rejections: float
    expiries: float
    instances: float
    held: float
    tools: float = 0.0
    """Tools the registry has merged into the store for live services."""
    merges: float = 0.0
    """Batches the registry has written to the store (each one store version at most)."""

    @classmethod
    def read(cls, port: int) -> "Counters":
        m = read_metrics(port)
        return cls(
            heartbeats=m.get('toolreg_registry_announcements_total{kind="heartbeat"}', 0.0),
            announces=m.get('toolreg_registry_announcements_total{kind="announce"}', 0.0),
            rejections=sum(v for k, v in m.items() if k.startswith("toolreg_registry_rejections_total")),
            expiries=m.get("toolreg_registry_expiries_total", 0.0),
            instances=m.get("toolreg_registry_instances", 0.0),
            held=m.get("toolreg_registry_held_instances", 0.0),
            tools=m.get("toolreg_registry_live_tools", 0.0),
            merges=m.get("toolreg_registry_merge_seconds_count", 0.0),
        )


async def read_counters(port: int, patience: float = 60.0) -> Counters:
    """The registry's counters. A 503 (its event loop did not answer within the health server's 2 s) or no
    answer within 5 s means it was busy, which is what overload looks like: ask again for up to `patience` s."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return await asyncio.to_thread(Counters.read, port)
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() > deadline:
                raise
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


async def settle(port: int, quiet: float = 0.5, timeout: float = 30.0) -> Counters:
    """Wait until the registry's counters stop moving for `quiet` seconds (its backlog is taken in)."""
    deadline = time.monotonic() + timeout
    last = await read_counters(port)
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        now = await read_counters(port)
        if (now.heartbeats, now.announces, now.rejections) != (last.heartbeats, last.announces, last.rejections):
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return now
    return last


async def populate(stack: Stack, sim: SimProcess, expected: int, timeout: float = 60.0) -> Counters:
    """Announce every simulated instance and wait until the registry holds a lease for each.

    Apache Pulsar drops a non-persistent message when the consumer has no
    permits left, so a burst of announcements can lose a few (measured: 1 or 2
    of 2,000). Services recover as in production: a heartbeat from an instance
    the registry does not know makes it probe, and the simulator announces again.
    """
    assert stack.metrics_port is not None
    await sim.announce()
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    while True:
        counters = await read_counters(stack.metrics_port)
        if counters.instances >= expected:
            return counters
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"bench: the registry holds {counters.instances:g} of {expected} simulated instances after {timeout:g}s"
            )
        if time.monotonic() - quiet_since > 1.0:
            await sim.announce()  # again: the ones the registry holds renew, the lost ones arrive
            quiet_since = time.monotonic()
        await asyncio.sleep(0.1)


class CpuMeter:
    """CPU seconds and RSS of one process between two reads."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self._cpu = self._cpu_now()
        self._at = time.perf_counter()

    def _cpu_now(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def read(self) -> dict[str, Any]:
        cpu, at = self._cpu_now(), time.perf_counter()
        share = (cpu - self._cpu) / (at - self._at) if at > self._at else 0.0
        self._cpu, self._at = cpu, at
        return {"cpu_share": round(share, 4), "rss_mb": round(self.process.memory_info().rss / 2**20, 1)}


def load_average() -> float:
    """The machine's 1-minute load average: others share its cores, and a figure taken under load says so."""
    return round(os.getloadavg()[0], 2)


async def heartbeat_step(stack: Stack, sim: SimProcess, meter: CpuMeter, rate: float, seconds: float) -> dict[str, Any]:
    """Heartbeats at `rate` for `seconds`; what the registry took in, dropped and expired, and its CPU meanwhile.

    Clean: every heartbeat sent was taken in, none refused, no lease expired or held, no send failed.
    """
    assert stack.metrics_port is not None
    before = await settle(stack.metrics_port)
    meter.read()
    psutil.cpu_percent()
    sent = await sim.step(rate, seconds)
    cpu = meter.read()
    machine = psutil.cpu_percent() / 100 * (psutil.cpu_count() or 1)
    after = await settle(stack.metrics_port, quiet=0.3)
    taken = after.heartbeats - before.heartbeats
    rejected = after.rejections - before.rejections
    expiries = after.expiries - before.expiries
    dropped = int(sent["sent"] - sent["failed"] - taken - rejected)
    step = {
        "rate": rate,
        "sent": sent["sent"],
        "send_failed": sent["failed"],
        "sent_per_s": round(sent["sent"] / sent["seconds"], 1),
        "taken_in": int(taken),
        "taken_in_per_s": round(taken / sent["seconds"], 1),
        "rejected": int(rejected),
        "dropped": dropped,
        "expiries": int(expiries),
        "held": int(after.held),
        **cpu,
        "machine_cores_busy": round(machine, 2),
        "load_average": load_average(),
    }
    step["clean"] = dropped <= 0 and expiries == 0 and rejected == 0 and after.held == 0 and sent["failed"] == 0
    return step


REFERENCES = ("consumer", "async-consumer")
"""`bench.raw` modes: a bare pulsar-client consumer (sync API) and the same on pulsar.asyncio."""


async def steady_window(
    stack: Stack,
    sim: SimProcess,
    config: ConfigClient,
    rate: float,
    seconds: float,
    progress: Progress,
    references: tuple[str, ...] = REFERENCES,
) -> dict[str, Any]:
    """Heartbeats at `rate` for `seconds` with nothing else changing, beside bare consumers of the same stream.

    Each reference (a `bench.raw` consumer mode) is a process of its own on
    its own subscription to `tool-descriptors`, so it receives exactly what
    the registry receives: the CPU and memory any consumer of this stream
    spends. Returns the registry's CPU share and peak RSS, each reference's,
    what was sent, dropped and expired, and the store's version bumps (none
    are due: nothing changes).
    """
    assert stack.metrics_port is not None
    version = await config.version()
    consumers: dict[str, Any] = {}
    try:
        for mode in references:  # they outlive the window, so they are still there to be measured at its end
            log = stack.workdir / f"raw-{mode}.log"
            consumers[mode] = (
                spawn(
                    ["-m", "bench.raw", mode, stack.url, topics.DEFAULT.tool_descriptors, str(seconds + 10)],
                    stack.env(),
                    log,
                ),
                log,
            )
        for proc, log in consumers.values():
            wait_for_line(log, "raw consumer ready", proc)
        load_before = load_average()
        before = await read_counters(stack.metrics_port)
        registry = CpuMeter(stack.registry_pid)
        meters = {mode: CpuMeter(proc.pid) for mode, (proc, _) in consumers.items()}
        psutil.cpu_percent()
        step = asyncio.create_task(sim.step(rate, seconds))
        peak_rss = 0.0
        started = time.monotonic()
        with sampled(registry.process.pid, f"registry-steady-{rate:g}"):
            while not step.done():
                await asyncio.wait({step}, timeout=min(5.0, seconds / 4))
                peak_rss = max(peak_rss, registry.process.memory_info().rss / 2**20)
                progress.update(f"{time.monotonic() - started:4.0f}/{seconds:g} s at {rate:,.0f} hb/s")
        sent = await step
        ours = registry.read()
        refs = {mode: meter.read() for mode, meter in meters.items()}
        machine = psutil.cpu_percent() / 100 * (psutil.cpu_count() or 1)
        after = await settle(stack.metrics_port, quiet=0.3)
        bumps = await config.version() - version
    finally:
        for proc, _ in consumers.values():
            stop_process(proc)
    taken = after.heartbeats - before.heartbeats
    return {
        "seconds": seconds,
        "rate": rate,
        "registry": ours,
        "peak_rss_mb": round(max(peak_rss, ours["rss_mb"]), 1),
        "references": refs,
        "sent": sent,
        "dropped": int(sent["sent"] - sent["failed"] - taken - (after.rejections - before.rejections)),
        "expiries": int(after.expiries - before.expiries),
        "held": int(after.held),
        "version_bumps": bumps,
        "machine_cores_busy": round(machine, 2),
        "load_average": [load_before, load_average()],
    }
