"""2. Death -> gone: SIGTERM (withdraw) and kill -9 (lease runs out), seen from a running ToolSet.

Every service is a process of its own (`python -m bench.serve`, which runs
`DynamicToolService.run()` as `toolreg serve` does), so SIGTERM and SIGKILL
are real signals. Removal times come from the ToolSet's own change callback.

kill -9 cannot be faster than the lease: the registry learns of the death
only when `ttl` passes without a heartbeat, and heartbeats come every ttl/3,
so kill -> gone lies between 2/3 ttl and ttl plus the sweep, the store write
and the reload. The ttl 3 s and 15 s groups run at the same time, each
killed at spread heartbeat phases, so the slow group costs ~20 s in all.

Self-preservation holds removals when most leases stop at once; a real
deployment has far more live leases than a benchmark kills, so simulated
live instances (ttl 15 s) keep the killed share a minority, as in production.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from typing import Any

from agent_bridge import ToolSet
from toolservice_base import open_transport

from .common import Progress, Stack, Workdirs, spawn, stop_process, summary_ms
from .simproc import SimProcess

NAME = "death"
TARGET_TERM_MS = 250.0
GRACE_S = 1.0


class Watch:
    """When each tool appeared in and left the ToolSet (perf_counter), from its change callback."""

    def __init__(self, tools: ToolSet) -> None:
        self.added: dict[str, float] = {name: 0.0 for name in tools.names()}
        self.removed: dict[str, float] = {}
        tools.on_change(self._changed)

    def _changed(self, added: list[str], removed: list[str], changed: list[str], version: int) -> None:
        now = time.perf_counter()
        for name in added:
            self.added[name] = now
        for name in removed:
            self.removed[name] = now

    async def listed(self, names: list[str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(name in self.added for name in names):
            if time.monotonic() > deadline:
                missing = [n for n in names if n not in self.added]
                raise TimeoutError(f"bench: {len(missing)} service(s) never listed: {missing[:5]}")
            await asyncio.sleep(0.02)

    async def gone(self, name: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while name not in self.removed:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bench: {name} still listed after {timeout:g}s")
            await asyncio.sleep(0.002)
        return self.removed[name]


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    stack = Stack(work.make(NAME)).start()
    procs: list[subprocess.Popen[bytes]] = []
    sim: SimProcess | None = None
    try:
        connection = await open_transport(stack.settings)
        try:
            sim = await SimProcess.start(
                stack.url, stack.data_dir, services=4, instances=5, tools=1, ttl=15, prefix="live"
            )
            await sim.announce()
            keepalive = asyncio.create_task(sim.step(20 / 5, 600))  # 20 instances, one heartbeat each per 5 s
            async with ToolSet(settings=stack.settings, connection=connection) as tools:
                watch = Watch(tools)
                result = await _measure(stack, watch, procs, quick, progress)
            keepalive.cancel()
            return result
        finally:
            await connection.close()
    finally:
        for proc in procs:
            stop_process(proc, timeout=5)
        if sim is not None:
            sim.proc.kill()
            await sim.proc.wait()
        stack.stop()


def _serve(stack: Stack, service_id: str, ttl: float) -> subprocess.Popen[bytes]:
    return spawn(
        ["-m", "bench.serve", "--id", service_id, "--ttl", str(ttl)], stack.env(), stack.workdir / f"{service_id}.log"
    )


async def _kill_group(
    stack: Stack, watch: Watch, procs: list[subprocess.Popen[bytes]], ttl: float, ids: list[str]
) -> list[float]:
    """kill -9 each at a different heartbeat phase (spread over ttl/3), time until it is gone."""
    interval = ttl / 3
    samples: list[float] = []

    async def one(index: int, service_id: str, proc: subprocess.Popen[bytes]) -> None:
        await asyncio.sleep(interval * index / len(ids))
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGKILL)
        samples.append(await watch.gone(service_id, ttl + 10) - t0)
        await asyncio.to_thread(proc.wait)

    group = [p for p in procs if p.args[-3] in ids]  # type: ignore[index]
    await asyncio.gather(*(one(i, sid, proc) for i, (sid, proc) in enumerate(zip(ids, group))))
    return samples


async def _term_batches(
    stack: Stack, watch: Watch, procs: list[subprocess.Popen[bytes]], batches: int, size: int, progress: Progress
) -> tuple[list[float], list[float]]:
    """Spawn `size` services at once, then SIGTERM them one by one: SIGTERM -> gone, and SIGTERM -> process exit."""
    gone, exited = [], []
    for batch in range(batches):
        ids = [f"term-{batch}-{i}" for i in range(size)]
        mine = [_serve(stack, sid, 15) for sid in ids]
        procs.extend(mine)
        await watch.listed(ids)
        for sid, proc in zip(ids, mine):
            t0 = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            gone.append(await watch.gone(sid, 10) - t0)
            await asyncio.to_thread(proc.wait, 10)
            exited.append(time.perf_counter() - t0)
            progress.update(f"SIGTERM {len(gone)}/{batches * size}")
    return gone, exited


async def _measure(
    stack: Stack, watch: Watch, procs: list[subprocess.Popen[bytes]], quick: bool, progress: Progress
) -> dict[str, Any]:
    per_group = 2 if quick else 5
    ttls = (3.0,) if quick else (3.0, 15.0)
    groups = {ttl: [f"kill{int(ttl)}-{i}" for i in range(per_group)] for ttl in ttls}
    for ttl, ids in groups.items():
        procs.extend(_serve(stack, sid, ttl) for sid in ids)
    await watch.listed([sid for ids in groups.values() for sid in ids])
    progress.update("killing (ttl " + ", ".join(f"{t:g}" for t in ttls) + " s) while SIGTERM batches run", force=True)
    kills = asyncio.gather(*(_kill_group(stack, watch, procs, ttl, ids) for ttl, ids in groups.items()))
    term_gone, term_exit = await _term_batches(stack, watch, procs, 1 if quick else 3, 4 if quick else 10, progress)
    kill_samples = dict(zip(groups, await kills))
    progress.done(f"{len(term_gone)} SIGTERM, {sum(map(len, kill_samples.values()))} kill -9")
    term = summary_ms(term_gone)
    rows: list[dict[str, Any]] = [
        {
            "figure": "SIGTERM -> gone from ToolSet, p50",
            "ours": term["p50_ms"],
            "reference": summary_ms(term_exit)["p50_ms"],
            "unit": "ms",
        },
        {
            "figure": "SIGTERM -> gone from ToolSet, p99",
            "ours": term["p99_ms"],
            "reference": summary_ms(term_exit)["p99_ms"],
            "unit": "ms",
            "target": f"< {TARGET_TERM_MS:g} ms",
            "met": term["p99_ms"] < TARGET_TERM_MS,
        },
    ]
    data: dict[str, Any] = {"sigterm_to_gone": term, "sigterm_to_process_exit": summary_ms(term_exit)}
    for ttl, samples in kill_samples.items():
        s = summary_ms(samples)
        limit_ms = (ttl + GRACE_S) * 1000
        rows.append(
            {
                "figure": f"kill -9 -> gone, ttl {ttl:g} s, max",
                "ours": s["max_ms"],
                "reference": ttl * 1000,
                "unit": "ms",
                "target": f"<= ttl + {GRACE_S:g} s",
                "met": s["max_ms"] <= limit_ms,
            }
        )
        data[f"kill9_ttl{ttl:g}"] = {**s, "ttl_s": ttl, "samples_ms": [round(x * 1000, 1) for x in sorted(samples)]}
    data["live_background_leases"] = 20
    return {
        "name": NAME,
        "title": "Death -> gone",
        "rows": rows,
        "reference_is": (
            "SIGTERM: the service process's own exit after the signal; kill -9: the lease ttl (nothing can tell "
            "a silent process from a dead one sooner)"
        ),
        "data": data,
    }
