"""1. Announce -> invokable: `DynamicToolService.start()` to the first successful `ToolSet.invoke`.

The ToolSet is already running (the agent is up); the store and the registry
run as `toolreg up` in their own process. Each cycle starts an echo service
in this process, polls `ToolSet.invoke` until it answers, then `stop()`s it
(what SIGTERM runs) and times until the tool is gone from the ToolSet: that
second figure feeds benchmark 2.

Reference, same cycle: `start()` returned + one call through a client that
already knows the service (no discovery at all): the moment the service is
physically invokable. The difference is what discovery costs.
"""

from __future__ import annotations

import time
from typing import Any

from agent_bridge import ToolSet
from agent_bridge.client import ToolServiceClient
from toolservice_base import Transport, open_transport

from .common import Progress, Stack, Workdirs, summary_ms
from .serve import echo_class

NAME = "propagation"
TARGET_MS = 250.0
TARGET_RATIO = 2.0
"""Announce -> invokable p50 against its reference (start() plus a direct call) on the same broker."""


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    starts = 20 if quick else 200
    progress = Progress(NAME)
    stack = Stack(work.make(NAME)).start()
    try:
        connection = await open_transport(stack.settings)
        try:
            return await _measure(stack, connection, starts, progress)
        finally:
            await connection.close()
    finally:
        stack.stop()


async def _measure(stack: Stack, connection: Transport, starts: int, progress: Progress) -> dict[str, Any]:
    service_class = echo_class("bench-echo")
    invokable, started_s, listed, physical, gone = [], [], [], [], []
    attempts = 0
    async with ToolSet(settings=stack.settings, connection=connection, poll_interval=2.0) as tools:
        direct = await ToolServiceClient(connection, service_class(settings=stack.settings).service_descriptor).start()
        try:
            for number in range(starts):
                service = service_class(settings=stack.settings, connection=connection, ttl=15)
                t0 = time.perf_counter()
                await service.start()
                t_started = time.perf_counter()
                # Reference: the service answers a client that needs no discovery.
                await direct.call("", {}, {"text": "ping"}, 5)
                physical.append(time.perf_counter() - t0)
                t_listed = None
                while True:
                    if t_listed is None and "bench-echo" in tools:
                        t_listed = time.perf_counter()
                    if t_listed is not None:
                        attempts += 1
                        if await tools.invoke("bench-echo", {"text": "hello"}) == "hello":
                            break
                    else:
                        await tools.wait_for(lambda ts: "bench-echo" in ts, timeout=10)
                t1 = time.perf_counter()
                invokable.append(t1 - t0)
                started_s.append(t_started - t0)
                listed.append((t_listed or t1) - t0)
                t2 = time.perf_counter()
                await service.stop()
                await tools.wait_for(lambda ts: "bench-echo" not in ts, timeout=10)
                gone.append(time.perf_counter() - t2)
                progress.update(f"start {number + 1}/{starts}")
        finally:
            await direct.close()
    ours = summary_ms(invokable)
    progress.done(f"{starts} starts: p99 {ours['p99_ms']:.1f} ms")
    ref = summary_ms(physical)
    return {
        "name": NAME,
        "title": "Announce -> invokable",
        "rows": [
            {
                "figure": "start() -> first ToolSet.invoke ok, p50",
                "ours": ours["p50_ms"],
                "reference": ref["p50_ms"],
                "unit": "ms",
            },
            {
                "figure": "start() -> first ToolSet.invoke ok, p50 ratio to the reference",
                "ours": round(ours["p50_ms"] / ref["p50_ms"], 2),
                "reference": 1.0,
                "unit": "x",
                "target": f"<= {TARGET_RATIO:g}x",
                "met": ours["p50_ms"] <= TARGET_RATIO * ref["p50_ms"],
            },
            {
                "figure": "start() -> first ToolSet.invoke ok, p95",
                "ours": ours["p95_ms"],
                "reference": ref["p95_ms"],
                "unit": "ms",
            },
            {
                "figure": "start() -> first ToolSet.invoke ok, p99",
                "ours": ours["p99_ms"],
                "reference": ref["p99_ms"],
                "unit": "ms",
                "target": f"< {TARGET_MS:g} ms",
                "met": ours["p99_ms"] < TARGET_MS,
            },
        ],
        "reference_is": (
            "start() + one call through a client that needs no discovery (the service is physically invokable)"
        ),
        "data": {
            "starts": starts,
            "start_to_invokable": ours,
            "start_call_returns": summary_ms(started_s),
            "start_to_listed_in_toolset": summary_ms(listed),
            "reference_start_plus_direct_call": ref,
            "invoke_attempts": attempts,
            "stop_to_gone": summary_ms(gone),
            "registry": (
                "toolreg up (own process): sweep 0.25 s; store writes and ToolSet reloads batched on the leading edge,"
                " no fixed window"
            ),
        },
    }
