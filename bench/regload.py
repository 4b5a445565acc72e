"""A registry in a process of its own, loaded by simulated instances: what throughput and scale share.

The registry's /metrics counters say exactly what it took in (valid
heartbeats, rejections, expiries), so "dropped" is arithmetic, not a guess:
sent - taken in - rejected. psutil reads its CPU time and RSS by pid.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psutil

from .common import Stack, read_metrics
from .simproc import SimProcess


@dataclass(frozen=True)
class Counters:
    heartbeats: float
    announces: float
    rejections: float
    expiries: float
    instances: float
    held: float

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
        )


async def read_counters(port: int) -> Counters:
    return await asyncio.to_thread(Counters.read, port)


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
            raise TimeoutError(f"bench: the registry holds {counters.instances:g} of {expected} simulated instances after {timeout:g}s")
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
