"""7. What a hanging or endless tool costs its callers.

One tool service, in its own process, with three tools: `hang` never
returns, `ping` answers at once, `endless` streams 100-byte chunks forever.

- 70 calls to `hang` with a 2 s timeout (more than its 64 slots), then
  `ping`: sent 0.5 s into the hang (it waits for a slot) and once the 70
  callers have given up. Reference: the hanging calls' own 2 s, and a `ping`
  on the idle service.
- 320 calls to `hang` with a 20 s timeout (every slot and the whole backlog),
  then `ping`: answered `busy` at once. Reference: `ping` on the idle service.
- `endless` with a 2 s timeout: when the call returns, and when the service
  stopped producing (its generator's `finally` logs the moment). Reference:
  the 2 s asked for.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

from agent_bridge import CallLimits, RequestTimeout, ToolError, ToolServiceClient
from toolservice_base import DynamicToolService, Settings, open_transport
from toolservice_base.logs import get_logger

from .common import Progress, Stack, Workdirs, spawn, wait_for_line

NAME = "limits"
HANGING = 70
CALLER_TIMEOUT = 2.0
log = get_logger("bench.limits")


class LimitsService(DynamicToolService):
    """Run by the benchmark as `toolreg serve bench.b_limits:LimitsService`."""

    descriptor: ClassVar[dict[str, Any]] = {"id": "bench-limits"}
    tools: ClassVar[list[dict[str, Any]]] = [
        {"name": "hang", "description": "Never returns"},
        {"name": "ping", "description": "Answers at once"},
        {"name": "endless", "description": "Streams forever"},
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any], *, tool: str = "") -> Any:
        if tool == "ping":
            return "pong"
        if tool == "hang":
            await asyncio.Event().wait()
        return self._endless()

    async def _endless(self) -> AsyncIterator[str]:
        produced = 0
        try:
            while True:
                produced += 1
                yield "x" * 100
                await asyncio.sleep(0.001)
        finally:
            log.warning("bench.endless_closed", at=time.time(), produced=produced)


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    stack = Stack(work.make(NAME), registry=False).start()
    try:
        service_log = stack.workdir / "service.log"
        args = ["-m", "discovery.cli", "serve", "bench.b_limits:LimitsService", "--no-announce"]
        stack.processes["service"] = proc = spawn(args, stack.env(TOOLREG_LOG_LEVEL="info"), service_log)
        wait_for_line(service_log, "service.listening", proc)
        connection = await open_transport(stack.settings)
        descriptor = LimitsService(settings=Settings(pulsar_url=stack.url)).service_descriptor
        client = await ToolServiceClient(connection, descriptor).start()
        try:
            return await _measure(client, service_log, quick, progress)
        finally:
            await client.close()
            await connection.close()
    finally:
        stack.stop()


async def _ping(client: ToolServiceClient, timeout: float = 30.0) -> tuple[str, float]:
    started = time.perf_counter()
    try:
        answer = await client.call("", {}, {}, timeout, tool="ping")
    except (RequestTimeout, ToolError) as exc:
        answer = f"{type(exc).__name__}: {getattr(exc, 'type', '')}"
    return answer, time.perf_counter() - started


async def _measure(client: ToolServiceClient, service_log: Path, quick: bool, progress: Progress) -> dict[str, Any]:
    while (await _ping(client, 1.0))[0] != "pong":  # a request sent before the service subscribed is lost
        pass
    pings = sorted([(await _ping(client))[1] for _ in range(20 if quick else 200)])
    idle = pings[len(pings) // 2]

    started = time.perf_counter()
    hanging = [asyncio.create_task(client.call("", {}, {}, CALLER_TIMEOUT, tool="hang")) for _ in range(HANGING)]
    await asyncio.sleep(0.5)
    during = asyncio.create_task(_ping(client))
    outcomes = await asyncio.gather(*hanging, return_exceptions=True)
    timed_out = sum(isinstance(o, RequestTimeout) for o in outcomes)
    during_answer, during_s = await during
    after_answer, after_s = await _ping(client)
    progress.update(
        f"{timed_out} of {HANGING} hanging calls timed out after {time.perf_counter() - started:.2f}s; ping:"
        f" {after_answer}"
    )

    filling = [asyncio.create_task(client.call("", {}, {}, 20.0, tool="hang")) for _ in range(64 + 256)]
    await asyncio.sleep(1.0)
    busy_answer, busy_s = await _ping(client)
    for task in filling:
        task.cancel()
    await asyncio.gather(*filling, return_exceptions=True)

    wall = time.time()
    started = time.perf_counter()
    try:
        await asyncio.wait_for(
            client.call("", {}, {}, CallLimits(CALLER_TIMEOUT, max_answer_bytes=10**9), tool="endless"), 30
        )
        ended = "returned"
    except RequestTimeout:
        ended = "RequestTimeout"
    except TimeoutError:
        ended = "still running at 30 s"
    returned_s = time.perf_counter() - started
    await asyncio.sleep(2.0)
    text = await asyncio.to_thread(service_log.read_text)
    closed = [json.loads(line) for line in text.splitlines() if "bench.endless_closed" in line]
    stopped_s = closed[-1]["at"] - wall if closed else None
    stopped = "?" if stopped_s is None else f"{stopped_s:.2f}s"
    progress.done(
        f"endless stream: call ended after {returned_s:.2f}s ({ended}); service stopped producing after {stopped}"
    )

    rows = [
        {
            "figure": f"ping sent 0.5 s into {HANGING} hanging calls (2 s timeout): answered after",
            "ours": round(during_s, 3),
            "reference": CALLER_TIMEOUT - 0.5,
            "unit": "s",
        },
        {
            "figure": f"ping once the {HANGING} callers gave up",
            "ours": round(after_s * 1000, 2),
            "reference": round(idle * 1000, 2),
            "unit": "ms",
            "target": "answered",
            "met": after_answer == "pong",
        },
        {
            "figure": "ping with every slot and the backlog taken: busy after",
            "ours": round(busy_s * 1000, 2),
            "reference": round(idle * 1000, 2),
            "unit": "ms",
            "target": "busy",
            "met": "busy" in busy_answer,
        },
        {
            "figure": "endless stream, 2 s timeout: call returns after",
            "ours": round(returned_s, 3),
            "reference": CALLER_TIMEOUT,
            "unit": "s",
        },
        {
            "figure": "endless stream, 2 s timeout: service stops producing after",
            "ours": None if stopped_s is None else round(stopped_s, 3),
            "reference": CALLER_TIMEOUT,
            "unit": "s",
        },
    ]
    return {
        "name": NAME,
        "title": "Hanging and endless tools",
        "rows": rows,
        "reference_is": "the callers' own 2 s timeout; for pings, a ping on the idle service",
        "data": {
            "hanging_timed_out": timed_out,
            "during": during_answer,
            "after": after_answer,
            "busy": busy_answer,
            "endless_ended": ended,
            "endless_closed": closed[-1] if closed else None,
            "idle_ping_ms": round(idle * 1000, 3),
        },
    }
