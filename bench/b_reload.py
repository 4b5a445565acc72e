"""5. Reload cost: a ToolSet following a store of 10, 100 and 1,000 tools, and calls during 100 reloads.

Tools are written by hand (the static path: `toolreg up --no-registry`),
all served by one echo service process. A reload is timed from the
moment the write is sent to the moment the ToolSet has applied its version:
the push, the `config` read and the rebuild. Reloads are batched on the
leading edge, with no fixed window: a lone push is reloaded at once.

Reference, same run: one `config` read of the same store (what any reload
must at least fetch).

Then 100 reloads under load (4 callers invoking a tool without pause):
the called tool's own item, another tool, and every tenth time the
service's descriptor itself change (a new client, the old one retired
after its calls end). Every call must succeed.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from agent_bridge import ToolDiscoveryError, ToolSet
from toolservice_base import ConfigClient, open_transport

from .common import Progress, Stack, Workdirs, spawn, summary_ms, wait_for_line

NAME = "reload"
SERVICE = "bench-echo"


def service_item(params: bool = False) -> str:
    body: dict[str, Any] = {
        "id": SERVICE,
        "request-queue": f"non-persistent://tg/request/{SERVICE}",
        "response-queue": f"non-persistent://tg/response/{SERVICE}",
    }
    if params:
        body["config-params"] = [{"name": "style"}]
    return json.dumps(body)


def tool_item(name: str, revision: int = 0) -> str:
    return json.dumps(
        {
            "type": "tool-service",
            "name": name,
            "service": SERVICE,
            "description": f"Echo tool {name}, revision {revision}",
            "arguments": [{"name": "text", "type": "string", "description": "The text to return"}],
        }
    )


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    stack = Stack(work.make(NAME), registry=False).start()
    try:
        echo = stack.processes["echo"] = spawn(
            ["-m", "bench.serve", "--id", SERVICE, "--no-announce"], stack.env(), stack.workdir / "echo.log"
        )
        # Subscribed before any call: requests on a non-persistent queue nobody consumes yet are gone.
        # (With --quick the calls under load came before the service had started, and all four were lost.)
        wait_for_line(stack.workdir / "echo.log", "service.listening", echo)
        connection = await open_transport(stack.settings)
        config = await ConfigClient(connection, timeout=10).start()
        try:
            await config.put([("tool-service", SERVICE, service_item())])
            async with ToolSet(settings=stack.settings, connection=connection, store_timeout=10) as tools:
                return await _measure(config, tools, quick, progress)
        finally:
            await config.close()
            await connection.close()
    finally:
        stack.stop()


async def _applied(tools: ToolSet, version: int) -> float:
    await tools.wait_for(lambda ts: ts.version >= version, timeout=30)
    return time.perf_counter()


async def _measure(config: ConfigClient, tools: ToolSet, quick: bool, progress: Progress) -> dict[str, Any]:
    per_size = 5 if quick else 20
    sizes = (10, 100) if quick else (10, 100, 1000)
    rows: list[dict[str, Any]] = []
    data: dict[str, Any] = {}
    present = 0
    for size in sizes:
        new = [("tool", f"r-{i}", tool_item(f"r-{i}")) for i in range(present, size)]
        for start in range(0, len(new), 200):
            await config.put(new[start : start + 200])
        present = size
        await tools.wait_for(lambda ts, size=size: len(ts) >= size, timeout=60)
        reloads, fetches = [], []
        for revision in range(1, per_size + 1):
            t0 = time.perf_counter()
            version = await config.put([("tool", "r-0", tool_item("r-0", revision + size))])
            reloads.append(await _applied(tools, version) - t0)
            t1 = time.perf_counter()
            await config.config()
            fetches.append(time.perf_counter() - t1)
            progress.update(f"{size} tools: reload {revision}/{per_size}")
        ours, fetch = summary_ms(reloads), summary_ms(fetches)
        rows.append(
            {
                "figure": f"reload, {size:,} tools (one changed), p50",
                "ours": ours["p50_ms"],
                "reference": round(fetch["p50_ms"], 3),
                "unit": "ms",
            }
        )
        data[f"tools_{size}"] = {"reload": ours, "config_read": fetch}
    asked = 20 if quick else 100
    errors, calls, reloads_done = await _under_load(config, tools, asked, progress)
    failed = len(errors)
    rows.append(
        {
            "figure": f"calls failed during {asked} reloads",
            "ours": f"{failed} of {calls:,}",
            "reference": 0,
            "target": "0",
            "met": failed == 0 and reloads_done == asked,
        }
    )
    data["under_load"] = {"reloads": reloads_done, "calls": calls, "failed": failed, "first_errors": errors[:5]}
    progress.done(f"{reloads_done} reloads under load: {failed} of {calls} calls failed")
    return {
        "name": NAME,
        "title": "Reload cost",
        "rows": rows,
        "reference_is": (
            "one `config` read of the same store (what a reload must fetch); reloads are batched on the leading edge,"
            " no fixed wait"
        ),
        "data": data,
    }


async def _until_answering(tools: ToolSet, name: str, within: float = 30.0) -> None:
    """Return once `name` answers: the echo process starts beside the measurement, and a request sent
    before it has subscribed is gone (a non-persistent topic keeps nothing), which would count as a failed call."""
    deadline = time.monotonic() + within
    while True:
        try:
            await asyncio.wait_for(tools.invoke(name, {"text": "ready?"}), 1.0)
            return
        except (TimeoutError, ToolDiscoveryError):
            if time.monotonic() > deadline:
                raise


async def _under_load(
    config: ConfigClient, tools: ToolSet, count: int, progress: Progress
) -> tuple[list[str], int, int]:
    await _until_answering(tools, "r-0")
    errors: list[str] = []
    calls = 0
    stop = asyncio.Event()

    async def caller() -> None:
        nonlocal calls
        while not stop.is_set():
            try:
                await tools.invoke("r-0", {"text": "x"})
            except Exception as exc:  # counted, not raised: the figure is how many fail
                errors.append(f"{type(exc).__name__}: {exc}")
            calls += 1

    callers = [asyncio.create_task(caller()) for _ in range(4)]
    params = False
    try:
        for number in range(1, count + 1):
            if number % 10 == 0:
                params = not params
                change = [("tool-service", SERVICE, service_item(params))]
            elif number % 2:
                change = [("tool", "r-0", tool_item("r-0", 10_000 + number))]
            else:
                change = [("tool", "r-1", tool_item("r-1", 10_000 + number))]
            await _applied(tools, await config.put(change))
            progress.update(f"reload under load {number}/{count}")
    finally:
        stop.set()
        await asyncio.gather(*callers)
    if errors:
        progress.update(f"first failure: {errors[0][:120]}", force=True)
    return errors, calls, count
