"""12. An MCP server through the sidecar: `echo` of `@modelcontextprotocol/server-everything`, called through the bus
against the same tool called directly with the official MCP SDK's client, same run.

Ours: `toolreg announce --mcp -- node server-everything stdio` in a process of its own (it starts its own copy of
the server), and `ToolSet.invoke("echo", ...)` from this process: the request crosses the broker to the sidecar,
which calls the server over stdio and sends the answer back. Reference: the SDK's `Client` starting the same server
over stdio and calling `echo`, as an MCP host does. Sequential calls (p50, p99), interleaved rounds; then calls/s
with 32 calls in flight on each path, and on the SDK's fastest call (`ClientSession.call_tool`, without
`Client`'s input-required and re-list rounds). The difference is the price of putting the server on the bus.

The CPU each process on a path spends per call (all its threads, and its main thread alone, from `/proc`) is read
over each path's burst: the caller, the broker, the sidecar and its server against the SDK's client and its
server. Under `python -m bench --profile DIR` an extra, untimed burst through the bus is sampled with py-spy in the
caller (`sidecar-caller.txt`) and the sidecar (`sidecar.txt`); `python -m bench.profile_summary DIR/sidecar.txt
--thread MainThread --layers`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from agent_bridge import ToolSet
from toolservice_base import open_transport

from .b_death import Watch
from .common import CpuPerCall, Progress, Stack, Workdirs, profiling, sampled, spawn, summary_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import mcp_servers  # noqa: E402  (scripts/ is not a package)

NAME = "sidecar"
ROUNDS = 5
IN_FLIGHT = 32
ARGUMENTS = {"message": "hello"}
RATE_TARGET = 0.8
"""calls/s through the bus at least this share of the SDK's `Client` calling the server directly."""


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    count = 100 if quick else 500
    burst = 320 if quick else 3200
    server = mcp_servers.everything().command("stdio")
    stack = Stack(work.make(NAME)).start()
    try:
        stack.processes["sidecar"] = spawn(
            ["-m", "discovery.cli", "announce", "--mcp", "--", *server], stack.env(), stack.workdir / "sidecar.log"
        )
        connection = await open_transport(stack.settings)
        direct = StdioServerParameters(command=server[0], args=server[1:])
        try:
            async with (
                ToolSet(settings=stack.settings, connection=connection) as tools,
                Client(direct, mode="auto", cache=None) as client,
            ):
                await Watch(tools).listed(["echo"])
                await _bus(tools, 20)  # warm-up, both paths
                await _sdk(client, 20)
                bus: list[float] = []
                sdk: list[float] = []
                for number in range(1, ROUNDS + 1):
                    progress.update(f"round {number}/{ROUNDS}: ToolSet.invoke and the SDK's call_tool", force=True)
                    bus += await _bus(tools, count // ROUNDS)
                    sdk += await _sdk(client, count // ROUNDS)
                progress.update(f"{burst} calls, {IN_FLIGHT} in flight, each path", force=True)
                bus_meter, sdk_meter = _meters(stack)
                with bus_meter.over(burst):
                    bus_rate = await _rate(lambda: tools.invoke("echo", ARGUMENTS), burst)
                with sdk_meter.over(burst):
                    sdk_rate = await _rate(lambda: client.call_tool("echo", ARGUMENTS), burst)
                # The SDK's fastest call: its session's, without `Client`'s input-required and re-list rounds.
                session_rate = await _rate(lambda: client.session.call_tool("echo", ARGUMENTS), burst)
                if profiling():  # an extra, untimed burst with py-spy on the caller (this process) and the sidecar
                    progress.update(f"profiled: {burst} calls, {IN_FLIGHT} in flight", force=True)
                    with sampled(os.getpid(), "sidecar-caller"), sampled(stack.processes["sidecar"].pid, "sidecar"):
                        await _rate(lambda: tools.invoke("echo", ARGUMENTS), burst)
        finally:
            await connection.close()
    finally:
        stack.stop()
    bus_s, sdk_s = summary_ms(bus), summary_ms(sdk)
    progress.done(
        f"bus p50 {bus_s['p50_ms']:.2f} ms, {bus_rate:.0f} calls/s; MCP SDK p50 {sdk_s['p50_ms']:.2f} ms, "
        f"{sdk_rate:.0f} calls/s"
    )
    result = _result(bus_s, sdk_s, len(bus), bus_rate, sdk_rate)
    result["rows"].append(
        {
            "figure": f"calls/s, {IN_FLIGHT} in flight, vs the SDK's ClientSession.call_tool",
            "ours": round(bus_rate, 1),
            "reference": round(session_rate, 1),
            "unit": "calls/s",
        }
    )
    result["data"]["sdk_session_calls_per_s"] = session_rate
    bus_cpu, sdk_cpu = bus_meter.figures(), sdk_meter.figures()
    bus_main, sdk_main = bus_meter.main_thread_figures(), sdk_meter.main_thread_figures()
    result["data"]["cpu_us_per_call"] = {"bus": bus_cpu, "mcp_sdk": sdk_cpu}
    result["data"]["main_thread_cpu_us_per_call"] = {"bus": bus_main, "mcp_sdk": sdk_main}
    progress.done(f"CPU per call, us: through the bus {bus_cpu}; the SDK directly {sdk_cpu}")
    progress.done(f"of it, each main thread's: through the bus {bus_main}; the SDK directly {sdk_main}")
    return result


def _meters(stack: Stack) -> tuple[CpuPerCall, CpuPerCall]:
    """CPU per call of each process on the bus's path (the caller, this process; the broker; the sidecar and the
    server it started) and on the SDK's (this process and the server its client started)."""
    me, sidecar = psutil.Process(), stack.processes["sidecar"].pid
    servers = {child.pid for child in me.children() if "node" in child.name()}
    started = [child.pid for child in psutil.Process(sidecar).children() if "node" in child.name()]
    bus = {"caller": me.pid, "sidecar": sidecar, "server": started[0]}
    if stack.broker is not None and stack.broker.pid is not None:
        bus["broker"] = stack.broker.pid
    return CpuPerCall(bus), CpuPerCall({"caller": me.pid, "server": servers.pop()})


async def _bus(tools: ToolSet, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        answer = await tools.invoke("echo", ARGUMENTS)
        samples.append(time.perf_counter() - t0)
        assert answer == "Echo: hello", answer
    return samples


async def _sdk(client: Client, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        result = await client.call_tool("echo", ARGUMENTS)
        samples.append(time.perf_counter() - t0)
        assert not result.is_error
    return samples


async def _rate(call: Any, total: int) -> float:
    """Calls per second with `IN_FLIGHT` at a time, `total` in all."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        async with gate:
            await call()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return total / (time.perf_counter() - t0)


def _result(
    bus: dict[str, float], sdk: dict[str, float], count: int, bus_rate: float, sdk_rate: float
) -> dict[str, Any]:
    return {
        "name": NAME,
        "title": "An MCP server through the sidecar (server-everything's echo)",
        "rows": [
            {
                "figure": f"{count} sequential calls, p50",
                "ours": bus["p50_ms"],
                "reference": sdk["p50_ms"],
                "unit": "ms",
            },
            {
                "figure": f"{count} sequential calls, p99",
                "ours": bus["p99_ms"],
                "reference": sdk["p99_ms"],
                "unit": "ms",
            },
            {
                "figure": f"calls/s, {IN_FLIGHT} in flight",
                "ours": round(bus_rate, 1),
                "reference": round(sdk_rate, 1),
                "unit": "calls/s",
                "target": f">= {RATE_TARGET}x",
                "met": bus_rate >= RATE_TARGET * sdk_rate,
            },
        ],
        "reference_is": (
            "the official MCP SDK's Client calling the same server-everything echo over stdio, same run, interleaved"
        ),
        "data": {"bus": bus, "mcp_sdk": sdk, "bus_calls_per_s": bus_rate, "sdk_calls_per_s": sdk_rate},
    }
