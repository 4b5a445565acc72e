"""Deltas: what one small change costs the store and a fleet of agents, at 500 and at 8,000 tools.

`toolreg up --no-registry` (the SQLite store, a process of its own), 8
agents each a `ToolSet` in a process of its own (`bench.delta_agent`), and
one tool added or removed at a time; each change is waited for until every
agent has it. Per change: the store's CPU, the agents' CPU (all 8 summed,
psutil by pid), and the lag from the write being sent to the last agent
holding its version (p50, p95).

Reference, same run: the same agents told to read every tool on each
reload, as they did before the store had a change feed (and as a store
without one still makes them).

Target: each figure grows at most 2x from 500 to 8,000 tools (goal 1.3x).

Then a rollout: 10,000 tools written 100 to a write, as fast as the store
takes them, to 20 agents that started on an empty workspace; how long until
the last agent holds them all, and how often any agent read every tool (its
first load only is the target).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from toolservice_base import ConfigClient, open_transport

from .common import Progress, Stack, Workdirs, percentile, spawn, stop_process
from .regload import load_average

NAME = "deltas"
SERVICE = "bench-delta"
AGENTS = 8
SIZES = (500, 8_000)
ROLLOUT_TOOLS, ROLLOUT_AGENTS, ROLLOUT_BATCH = 10_000, 20, 100
TARGET_RATIO, GOAL_RATIO = 2.0, 1.3


def service_item() -> str:
    return json.dumps(
        {
            "id": SERVICE,
            "request-queue": f"non-persistent://tg/request/{SERVICE}",
            "response-queue": f"non-persistent://tg/response/{SERVICE}",
        }
    )


def tool_item(name: str) -> str:
    return json.dumps(
        {
            "type": "tool-service",
            "name": name,
            "service": SERVICE,
            "description": f"Look something up in collection {name} of the archive, the way an agent would ask",
            "arguments": [{"name": "query", "type": "string", "description": "What to look up"}],
        }
    )


class Agents:
    """`count` agent processes and the versions each has said it holds."""

    def __init__(self, stack: Stack, workdir: Path, full_reads: bool, count: int = AGENTS) -> None:
        self.files = [workdir / f"agent-{n}.out" for n in range(count)]
        args = ["--full-reads"] if full_reads else []
        self.procs = [
            spawn(["-m", "bench.delta_agent", str(f), *args], stack.env(), workdir / f"agent-{n}.log")
            for n, f in enumerate(self.files)
        ]
        self._offsets = [0] * count
        self.held: list[dict[int, float]] = [{} for _ in range(count)]
        self.ready = [False] * count
        self.reads: list[tuple[int, int]] = []

    def poll(self) -> None:
        for n, path in enumerate(self.files):
            try:
                with open(path, "rb") as handle:
                    handle.seek(self._offsets[n])
                    data = handle.read()
            except FileNotFoundError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            self._offsets[n] += len(complete)
            for line in complete.decode().splitlines():
                word, *rest = line.split()
                if word == "ready":
                    self.ready[n] = True
                elif word == "reads":
                    self.reads.append((int(rest[0]), int(rest[1])))
                else:
                    self.held[n][int(word)] = float(rest[0])

    async def all_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(self.ready):
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"an agent exited with {proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.ready.count(True)} of {len(self.ready)} agents ready after {timeout:g}s")
            self.poll()
            await asyncio.sleep(0.05)

    async def last_holds(self, version: int, timeout: float = 60.0) -> float:
        """The wall clock at which the last agent held `version` (or a later one)."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            times = [min((t for v, t in held.items() if v >= version), default=None) for held in self.held]
            if all(t is not None for t in times):
                return max(t for t in times if t is not None)
            if time.monotonic() > deadline:
                raise TimeoutError(f"version {version} not reached by every agent within {timeout:g}s")
            await asyncio.sleep(0.001)

    def cpu(self) -> float:
        return sum(_cpu(p.pid) for p in self.procs)

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.to_thread(proc.wait, 20)
            except subprocess.TimeoutExpired:
                stop_process(proc)
        self.poll()


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def one_size(work: Workdirs, tools: int, changes: int, full_reads: bool, progress: Progress) -> dict[str, Any]:
    label = f"{tools}-{'full' if full_reads else 'delta'}"
    workdir = work.make(f"{NAME}-{label}")
    stack = Stack(workdir, registry=False).start()
    agents: Agents | None = None
    try:
        connection = await open_transport(stack.settings)
        config = await ConfigClient(connection, timeout=30).start()
        try:
            await config.put([("tool-service", SERVICE, service_item())])
            for start in range(0, tools, 1_000):
                await config.put(
                    [("tool", f"t-{n:05d}", tool_item(f"t-{n:05d}")) for n in range(start, min(tools, start + 1_000))]
                )
            progress.update(f"{label}: starting {AGENTS} agents", force=True)
            agents = Agents(stack, workdir, full_reads)
            await agents.all_ready()
            await asyncio.sleep(1.0)  # let the start-up settle (snapshots written, clients warm)
            store_pid = stack.processes["up"].pid
            store_before, agents_before = _cpu(store_pid), agents.cpu()
            lags: list[float] = []
            for n in range(changes):
                name = f"extra-{n // 2:04d}"
                sent = time.time()
                if n % 2 == 0:
                    version = await config.put([("tool", name, tool_item(name))])
                else:
                    version = await config.delete([("tool", name)])
                lags.append(await agents.last_holds(version) - sent)
                progress.update(f"{label}: change {n + 1}/{changes}")
            store_cpu, agents_cpu = _cpu(store_pid) - store_before, agents.cpu() - agents_before
            await agents.stop()
            full = max((f for f, _ in agents.reads), default=0)
            return {
                "tools": tools,
                "full_reads_reference": full_reads,
                "changes": changes,
                "store_cpu_ms": round(store_cpu * 1000 / changes, 2),
                "agents_cpu_ms": round(agents_cpu * 1000 / changes, 2),
                "lag_p50_ms": round(percentile(lags, 50) * 1000, 1),
                "lag_p95_ms": round(percentile(lags, 95) * 1000, 1),
                "most_full_reads_per_agent": full,
                "load_average": load_average(),
            }
        finally:
            await config.close()
            await connection.close()
    finally:
        if agents is not None:
            await agents.stop()
        stack.stop()


async def rollout(work: Workdirs, quick: bool, progress: Progress) -> dict[str, Any]:
    """`ROLLOUT_TOOLS` tools written `ROLLOUT_BATCH` to a write to `ROLLOUT_AGENTS` agents started on none."""
    count = ROLLOUT_TOOLS // (10 if quick else 1)
    workdir = work.make(f"{NAME}-rollout")
    stack = Stack(workdir, registry=False).start()
    agents: Agents | None = None
    try:
        connection = await open_transport(stack.settings)
        config = await ConfigClient(connection, timeout=30).start()
        try:
            await config.put([("tool-service", SERVICE, service_item())])
            progress.update(f"rollout: starting {ROLLOUT_AGENTS} agents", force=True)
            agents = Agents(stack, workdir, False, ROLLOUT_AGENTS)
            await agents.all_ready()
            await asyncio.sleep(1.0)
            store_pid = stack.processes["up"].pid
            store_before, agents_before = _cpu(store_pid), agents.cpu()
            started = time.time()
            version = 0
            for start in range(0, count, ROLLOUT_BATCH):
                names = [f"r-{n:05d}" for n in range(start, min(count, start + ROLLOUT_BATCH))]
                version = await config.put([("tool", name, tool_item(name)) for name in names])
                progress.update(f"rollout: {start + len(names):,} of {count:,} tools written")
            written = time.time() - started
            reached = await agents.last_holds(version, timeout=300) - started
            store_cpu, agents_cpu = _cpu(store_pid) - store_before, agents.cpu() - agents_before
            await agents.stop()
            return {
                "tools": count,
                "agents": ROLLOUT_AGENTS,
                "writes": -(-count // ROLLOUT_BATCH),
                "written_s": round(written, 2),
                "last_agent_has_all_s": round(reached, 2),
                "store_cpu_s": round(store_cpu, 2),
                "agents_cpu_s": round(agents_cpu, 2),
                "most_full_reads_per_agent": max((f for f, _ in agents.reads), default=0),
                "delta_reads_per_agent": max((d for _, d in agents.reads), default=0),
                "load_average": load_average(),
            }
        finally:
            await config.close()
            await connection.close()
    finally:
        if agents is not None:
            await agents.stop()
        stack.stop()


def _ratio(small: dict[str, Any], large: dict[str, Any], key: str) -> float:
    return round(large[key] / small[key], 2) if small[key] else float("inf")


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    changes = {False: 10 if quick else 100, True: 4 if quick else 20}  # by delta; by full reads (the reference)
    measured: dict[str, dict[str, Any]] = {}
    for full_reads in (False, True):
        for tools in SIZES:
            key = f"{tools}-{'full' if full_reads else 'delta'}"
            measured[key] = await one_size(work, tools, changes[full_reads], full_reads, progress)
    rolled = await rollout(work, quick, progress)
    small, large = measured[f"{SIZES[0]}-delta"], measured[f"{SIZES[1]}-delta"]
    rows: list[dict[str, Any]] = []
    for key, figure, unit in (
        ("store_cpu_ms", "store CPU per change", "ms"),
        ("agents_cpu_ms", f"agents' CPU per change (all {AGENTS})", "ms"),
        ("lag_p50_ms", "last agent has it, p50", "ms"),
    ):
        for tools in SIZES:
            rows.append(
                {
                    "figure": f"{figure}, {tools:,} tools",
                    "ours": measured[f"{tools}-delta"][key],
                    "reference": measured[f"{tools}-full"][key],
                    "unit": unit,
                }
            )
        ratio = _ratio(small, large, key)
        rows.append(
            {
                "figure": f"{figure}: {SIZES[1]:,} tools against {SIZES[0]:,}",
                "ours": ratio,
                "reference": _ratio(measured[f"{SIZES[0]}-full"], measured[f"{SIZES[1]}-full"], key),
                "unit": "x",
                "target": f"<= {TARGET_RATIO:g}x (goal {GOAL_RATIO:g}x)",
                "met": ratio <= TARGET_RATIO,
            }
        )
    rows.append(
        {
            "figure": "reads of every tool per agent (its first load included)",
            "ours": max(m["most_full_reads_per_agent"] for k, m in measured.items() if k.endswith("delta")),
            "reference": max(m["most_full_reads_per_agent"] for k, m in measured.items() if k.endswith("full")),
            "target": "1",
            "met": all(m["most_full_reads_per_agent"] == 1 for k, m in measured.items() if k.endswith("delta")),
        }
    )
    rows.append(
        {
            "figure": f"rollout of {rolled['tools']:,} tools ({rolled['writes']} writes) to {ROLLOUT_AGENTS} agents:"
            " the last agent has them all",
            "ours": rolled["last_agent_has_all_s"],
            "reference": rolled["written_s"],
            "unit": "s",
        }
    )
    rows.append(
        {
            "figure": "rollout: reads of every tool per agent (its first load, of none, included)",
            "ours": rolled["most_full_reads_per_agent"],
            "target": "1",
            "met": rolled["most_full_reads_per_agent"] == 1,
        }
    )
    progress.done(
        f"store {small['store_cpu_ms']} -> {large['store_cpu_ms']} ms, agents {small['agents_cpu_ms']} ->"
        f" {large['agents_cpu_ms']} ms, lag {small['lag_p50_ms']} -> {large['lag_p50_ms']} ms"
    )
    return {
        "name": NAME,
        "title": "Deltas: one small change at 500 and 8,000 tools, 8 agents",
        "rows": rows,
        "reference_is": (
            "the same agents reading every tool on each reload (what they did before the store's change feed, and"
            " what a store without one makes them do), same run; for the rollout, how long the writes took"
        ),
        "data": {"measured": measured, "rollout": rolled, "python": sys.version.split()[0]},
    }
