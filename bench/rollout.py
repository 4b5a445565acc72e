"""A fleet started wave by wave against one registry, as a rollout does: what the fleet benchmark grows it with.

Each wave is `wave` instances announcing at `WAVE_RATE`/s (`bench.sim`'s
`wave`); the next goes once the registry holds every instance started so far
and has merged their tools (a rollout waits for readiness) and once the
heartbeats paused while the wave was sent are made up (`CATCH_UP`). Every
instance started heartbeats meanwhile, one every ttl/3 on average, so none
looks silent to self-preservation. A wave the registry has not taken in
after `WAVE_WAIT` ends the rollout there: the registry fell behind for good.
"""

from __future__ import annotations

import time
from typing import Any

from toolservice_base import ConfigClient

from .common import Progress, Stack
from .regload import Counters, CpuMeter, load_average, read_counters, settle
from .sim import tool_counts
from .simproc import SimProcess

WAVE_RATE = 5_000
"""Announces/s within a wave."""
WAVE_WAIT = 30.0
"""Longest wait for the registry to take a wave in (a lost announce comes back through a probe, 50/s at most)."""
CATCH_UP = 1.5
"""Heartbeats run this much faster than the fleet's rate after a wave until they make up for the pause while it
was sent: each instance stays renewed every ttl/3 on average."""


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 2)


class Rollout:
    """The fleet of `sim`, started wave by wave; `grow` to a size, `listed` until the store shows it all."""

    def __init__(
        self,
        stack: Stack,
        sim: SimProcess,
        config: ConfigClient,
        *,
        per_service: int,
        tools: str,
        ttl: float,
        wave: int,
    ) -> None:
        assert stack.metrics_port is not None
        self.port = stack.metrics_port
        self.sim, self.config = sim, config
        self.per_service, self.counts, self.period, self.wave = per_service, tool_counts(tools), ttl / 3, wave
        self.pid = stack.registry_pid
        self.rss_before = CpuMeter(self.pid).read()["rss_mb"]
        self.started = 0
        self.gave_up = False
        self.waves: list[dict[str, Any]] = []
        self.beats = {"sent": 0, "failed": 0}
        self.seconds = 0.0
        """Time spent rolling out (growing and waiting for the store), without the windows measured between."""
        self.load = [load_average()]
        self.taken = {"heartbeats": 0.0, "announces": 0.0, "expiries": 0.0, "merges": 0.0}
        """What the registry counted while the fleet rolled out (not in the windows measured between)."""
        self._version = 0

    async def begin(self) -> None:
        self._version = await self.config.version()

    async def _accounted(self, before: Counters) -> None:
        """Add what the registry counted since `before`, once its backlog is in (nothing is sent between two calls)."""
        after = await settle(self.port, quiet=0.3)
        for name in self.taken:
            self.taken[name] += getattr(after, name) - getattr(before, name)

    def tools(self) -> int:
        """Tools of the services started so far (waves start whole services: multiples of `per_service`)."""
        return sum(self.counts[s % len(self.counts)] for s in range(self.started // self.per_service))

    async def _beat(self, rate: float, seconds: float) -> None:
        sent = await self.sim.step(rate, seconds)
        self.beats["sent"] += sent["sent"]
        self.beats["failed"] += sent["failed"]

    async def grow(self, target: int, progress: Progress) -> bool:
        """Waves until `target` instances are started and taken in; False if the registry fell behind for good."""
        began, before = time.perf_counter(), await read_counters(self.port)
        wave_meter = CpuMeter(self.pid)
        while self.started < target and not self.gave_up:
            t0, at_wave, sent_before = time.perf_counter(), await read_counters(self.port), self.beats["sent"]
            answer = await self.sim.wave(WAVE_RATE, min(self.wave, target - self.started))
            self.started = int(answer["started"])
            tools, nominal = self.tools(), self.started / self.period
            held_at = merged_at = None
            while True:
                now, counters = time.perf_counter() - t0, await read_counters(self.port)
                if held_at is None and counters.instances >= self.started:
                    held_at = now
                if merged_at is None and held_at is not None and counters.tools >= tools:
                    merged_at = now
                owed = nominal * now - (self.beats["sent"] - sent_before)  # heartbeats paused while the wave was sent
                if merged_at is not None and owed <= 0:
                    break
                if now > WAVE_WAIT:
                    self.gave_up = True
                    break
                await self._beat(nominal * (CATCH_UP if owed > 0 else 1.0), 0.5)
            self.waves.append(
                {
                    "started": self.started,
                    "sent_s": answer["seconds"],
                    "taken_in_s": _rounded(held_at),
                    "merged_s": _rounded(merged_at),
                    "heartbeats_dropped": int(
                        self.beats["sent"] - sent_before - (counters.heartbeats - at_wave.heartbeats)
                    ),
                    "expiries": int(counters.expiries - at_wave.expiries),
                    "held": int(counters.held),
                    **wave_meter.read(),
                }
            )
            progress.update(
                f"{self.started:,} instances started; the last wave merged after {_rounded(merged_at)} s", force=True
            )
        self.seconds += time.perf_counter() - began
        await self._accounted(before)
        return not self.gave_up

    async def listed(self, timeout: float) -> float | None:
        """Heartbeats at the fleet's rate until the store lists every tool started; seconds that took, None if it did
        not."""
        began, wanted, before = time.perf_counter(), self.tools(), await read_counters(self.port)
        try:
            while time.perf_counter() - began < timeout:
                if (await read_counters(self.port)).tools >= wanted and len(await self.config.list("tool")) >= wanted:
                    return round(time.perf_counter() - began, 2)
                await self._beat(self.started / self.period, 1.0)
            return None
        finally:
            self.seconds += time.perf_counter() - began
            await self._accounted(before)

    async def summary(self) -> dict[str, Any]:
        """The whole rollout: store versions and write batches, messages sent and taken in, expiries, CPU, memory."""
        self.load.append(load_average())
        return {
            "started": self.started,
            "gave_up": self.gave_up,
            "waves": self.waves,
            "wave_rate": WAVE_RATE,
            "seconds": round(self.seconds, 1),
            "tools": self.tools(),
            "tools_listed": len(await self.config.list("tool")),
            "versions_total": await self.config.version() - self._version,
            "merges": int(self.taken["merges"]),
            "announces_taken_in": int(self.taken["announces"]),
            "heartbeats_sent": self.beats["sent"],
            "heartbeats_dropped": int(self.beats["sent"] - self.beats["failed"] - self.taken["heartbeats"]),
            "expiries": int(self.taken["expiries"]),
            "held": int((await read_counters(self.port)).held),
            "rss_before_mb": self.rss_before,
            "rss_mb": CpuMeter(self.pid).read()["rss_mb"],
            "load_average": self.load,
        }
