"""11. Rich results: a 1 MiB image through the bus against the same through the MCP SDK directly.

Ours: `ToolSet.call` from this process on a `DynamicToolService` in a process of its own
(`bench.image_server --bus`) answering with a 1 MiB image as an MCP `image` block: the
request and the ~1.4 MB response cross the broker, the agent checks the block (base64) and
hands it back as a typed `ImageContent`. Reference: the official SDK's `Client` calling an MCP
server on the official SDK (`bench.image_server --mcp`) over stdio, the way an MCP host runs
a local server: the same image, the same block. Sequential calls, interleaved rounds, same run.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from agent_bridge import CallLimits, ToolSet
from toolservice_base import open_transport
from toolservice_base.schemas import ImageContent

from .b_death import Watch
from .common import ROOT, Progress, Stack, Workdirs, spawn, summary_ms
from .image_server import IMAGE_BYTES, TOOL

NAME = "rich"
ROUNDS = 5


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    count = 50 if quick else 200
    stack = Stack(work.make(NAME)).start()
    try:
        stack.processes["image"] = spawn(
            ["-m", "bench.image_server", "--bus"], stack.env(), stack.workdir / "image.log"
        )
        connection = await open_transport(stack.settings)
        server = StdioServerParameters(
            command=sys.executable, args=["-m", "bench.image_server", "--mcp"], env=stack.env(), cwd=str(ROOT)
        )
        try:
            async with (
                ToolSet(
                    settings=stack.settings, connection=connection, limits=CallLimits(max_answer_bytes=4 * IMAGE_BYTES)
                ) as tools,
                Client(server, mode="legacy") as client,
            ):
                await Watch(tools).listed([TOOL])
                await _bus(tools, 10)  # warm-up, both paths
                await _sdk(client, 10)
                bus: list[float] = []
                sdk: list[float] = []
                for number in range(1, ROUNDS + 1):
                    progress.update(f"round {number}/{ROUNDS}: ToolSet.call and the SDK's call_tool", force=True)
                    bus += await _bus(tools, count // ROUNDS)
                    sdk += await _sdk(client, count // ROUNDS)
        finally:
            await connection.close()
    finally:
        stack.stop()
    progress.done(f"bus p50 {summary_ms(bus)['p50_ms']:.1f} ms, MCP SDK p50 {summary_ms(sdk)['p50_ms']:.1f} ms")
    return _result(summary_ms(bus), summary_ms(sdk), len(bus))


async def _bus(tools: ToolSet, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        result = await tools.call(TOOL)
        samples.append(time.perf_counter() - t0)
        block = result.content[0]
        assert isinstance(block, ImageContent) and len(block.data) > IMAGE_BYTES, result.text
    return samples


async def _sdk(client: Client, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        result = await client.call_tool(TOOL, {})
        samples.append(time.perf_counter() - t0)
        assert not result.is_error and result.content[0].type == "image"
    return samples


def _result(bus: dict[str, float], sdk: dict[str, float], count: int) -> dict[str, Any]:
    return {
        "name": NAME,
        "title": "Rich results (1 MiB image)",
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
                "figure": "p50 ratio, the bus to the MCP SDK over stdio",
                "ours": round(bus["p50_ms"] / sdk["p50_ms"], 2),
                "reference": 1.0,
                "unit": "x",
            },
        ],
        "reference_is": (
            "the official MCP SDK's Client calling an MCP SDK server over stdio that answers with the same 1 MiB image"
            " block, same run, interleaved"
        ),
        "data": {"bus": bus, "mcp_sdk": sdk, "image_bytes": IMAGE_BYTES},
    }
