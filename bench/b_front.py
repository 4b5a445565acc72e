"""13. The MCP front over streamable HTTP: `toolreg mcp --http` in front of an echo service on the bus, against a
bare streamable-HTTP server of the official SDK with the same tool, driven by the same SDK client, same run.

Ours: `toolreg mcp --http 127.0.0.1:PORT` in a process of its own, an echo service (`bench.serve`) in another;
each `tools/call` crosses the front, the broker and the service and back. Reference: `bench.front_reference`, the
SDK's low-level `Server` answering `echo` from memory in a process of its own. The client is the SDK's `Client`
(streamable HTTP, the protocol it negotiates) in this process: sequential calls in interleaved rounds (p50, p99),
then calls/s with `SESSIONS` sessions each keeping `IN_FLIGHT` calls going, in interleaved bursts (the median
burst of each). The difference is the price of the
front: its guards, the audit record, the bus round trip and the service.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from mcp import Client

from .common import Progress, Stack, Workdirs, free_port, spawn, summary_ms

NAME = "front"
ROUNDS = 5
SESSIONS = 4
IN_FLIGHT = 8
TEXT = "hello"
RATE_TARGET = 0.9
"""calls/s through the front at least this share of the bare SDK server's."""


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    count = 100 if quick else 500
    burst = 400 if quick else 4000
    stack = Stack(work.make(NAME)).start()
    try:
        stack.processes["echo"] = spawn(["-m", "bench.serve", "--id", "echo"], stack.env(), stack.workdir / "echo.log")
        front_port, reference_port = free_port(), free_port()
        stack.processes["front"] = spawn(
            ["-m", "discovery.cli", "mcp", "--http", f"127.0.0.1:{front_port}"], stack.env(), stack.workdir / "mcp.log"
        )
        stack.processes["reference"] = spawn(
            ["-m", "bench.front_reference", "--port", str(reference_port)], stack.env(), stack.workdir / "ref.log"
        )
        front_url = f"http://127.0.0.1:{front_port}/mcp"
        reference_url = f"http://127.0.0.1:{reference_port}/mcp"
        await _until_listed(front_url)
        await _until_listed(reference_url)
        async with Client(front_url) as front, Client(reference_url) as reference:
            await _sequential(front, 20)  # warm-up, both
            await _sequential(reference, 20)
            ours: list[float] = []
            theirs: list[float] = []
            for number in range(1, ROUNDS + 1):
                progress.update(f"round {number}/{ROUNDS}: the front and the bare SDK server", force=True)
                ours += await _sequential(front, count // ROUNDS)
                theirs += await _sequential(reference, count // ROUNDS)
        front_rates: list[float] = []
        reference_rates: list[float] = []
        for number in range(1, ROUNDS + 1):  # interleaved too: the machine's other load falls on both alike
            progress.update(f"burst {number}/{ROUNDS}: {SESSIONS} sessions x {IN_FLIGHT} in flight, each", force=True)
            front_rates.append(await _rate(front_url, burst // ROUNDS))
            reference_rates.append(await _rate(reference_url, burst // ROUNDS))
        front_rate, reference_rate = statistics.median(front_rates), statistics.median(reference_rates)
    finally:
        stack.stop()
    o, r = summary_ms(ours), summary_ms(theirs)
    progress.done(
        f"front p50 {o['p50_ms']:.2f} ms, {front_rate:.0f} calls/s; bare SDK server p50 {r['p50_ms']:.2f} ms, "
        f"{reference_rate:.0f} calls/s ({front_rate / reference_rate:.2f}x)"
    )
    return _result(o, r, len(ours), front_rate, reference_rate)


async def _until_listed(url: str, timeout: float = 60.0) -> None:
    """Once the server at `url` answers and lists `echo` (the front: once the service's announcement reached it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with Client(url) as client:
                if any(tool.name == "echo" for tool in (await client.list_tools()).tools):
                    return
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not list echo within {timeout:g} s")
        await asyncio.sleep(0.2)


async def _sequential(client: Client, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        result = await client.call_tool("echo", {"text": TEXT})
        samples.append(time.perf_counter() - t0)
        assert not result.is_error and result.content[0].text == TEXT, result  # type: ignore[union-attr]
    return samples


async def _rate(url: str, total: int) -> float:
    """Calls per second: `SESSIONS` clients, each with `IN_FLIGHT` calls at a time, `total` calls in all."""
    async with Client(url) as a, Client(url) as b, Client(url) as c, Client(url) as d:
        clients = [a, b, c, d][:SESSIONS]
        per_session = total // len(clients)

        async def session(client: Client) -> None:
            gate = asyncio.Semaphore(IN_FLIGHT)

            async def one() -> None:
                async with gate:
                    result = await client.call_tool("echo", {"text": TEXT})
                    assert not result.is_error, result

            await asyncio.gather(*(one() for _ in range(per_session)))

        await asyncio.gather(*(client.call_tool("echo", {"text": TEXT}) for client in clients))  # each session up
        t0 = time.perf_counter()
        await asyncio.gather(*(session(client) for client in clients))
        return per_session * len(clients) / (time.perf_counter() - t0)


def _result(
    ours: dict[str, float], reference: dict[str, float], count: int, front_rate: float, reference_rate: float
) -> dict[str, Any]:
    return {
        "name": NAME,
        "title": "The MCP front over streamable HTTP (echo through the bus)",
        "rows": [
            {
                "figure": f"{count} sequential calls, p50",
                "ours": ours["p50_ms"],
                "reference": reference["p50_ms"],
                "unit": "ms",
            },
            {
                "figure": f"{count} sequential calls, p99",
                "ours": ours["p99_ms"],
                "reference": reference["p99_ms"],
                "unit": "ms",
            },
            {
                "figure": f"calls/s, {SESSIONS} sessions x {IN_FLIGHT} in flight",
                "ours": round(front_rate, 1),
                "reference": round(reference_rate, 1),
                "unit": "calls/s",
                "target": f">= {RATE_TARGET}x",
                "met": front_rate >= RATE_TARGET * reference_rate,
            },
        ],
        "reference_is": "a bare streamable-HTTP server of the official MCP SDK (low-level Server, echo from memory), "
        "same client, same run",
        "data": {"front_calls_per_s": front_rate, "reference_calls_per_s": reference_rate},
    }
