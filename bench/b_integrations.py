"""What the agent-framework adapters add to a call: each adapter's entry point vs `ToolSet.invoke`, same run, same tool.

    python -m bench.b_integrations            # 5 rounds x 400 calls per way, about half a minute on 2 cores
    python -m bench.b_integrations --quick    # 5 rounds x 100

One stack (`toolreg up` + registry), one `ToolSet`, two tools: `bench-echo`,
an echo `DynamicToolService` in its own process (a real round trip over the
broker), and `local-echo`, an in-process tool type (`factories=`), so that
what remains of a call is the bridge's and the adapter's own work. Each
adapter is called the way its framework calls it:

- pydantic-ai: `LiveToolset.call_tool` (what pydantic-ai's tool manager awaits);
  `get_tools` per step is timed on its own;
- LangChain: `StructuredTool.ainvoke(tool_call)` (what LangGraph's `ToolNode`
  awaits: LangChain's own tool-run machinery included), and the adapter's coroutine alone;
- OpenAI Agents SDK: `FunctionTool.on_invoke_tool(ToolContext, json)` (what the SDK's runner awaits).

The ways take turns within each round (calls drift on a shared machine);
samples are pooled per way. Overhead = the way's p50 minus `ToolSet.invoke`'s
p50 on the same tool. Not part of `python -m bench`; needs the three
frameworks (`pip install -e '.[test]'`, or the extras `pydantic-ai`,
`langchain`, `openai-agents`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agent_bridge import ToolSet
from toolservice_base import ConfigClient, configure_logging, open_transport

from . import report
from .common import Progress, Stack, Workdirs, spawn, summary_ms

NAME = "integrations"
ROUNDS = 5
TEXT = "hello, tool"
REMOTE, LOCAL = "bench-echo", "local-echo"
LOCAL_TYPE = "bench-local"

Call = Callable[[], Awaitable[Any]]


class LocalEcho:
    """An in-process tool: no broker, no service, nothing but the call path above it."""

    async def invoke(self, **arguments: Any) -> str:
        return str(arguments.get("text", ""))


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    progress = Progress(NAME)
    stack = Stack(work.make(NAME), registry=True).start()
    try:
        stack.processes["echo"] = spawn(["-m", "bench.serve", "--id", REMOTE], stack.env(), stack.workdir / "echo.log")
        connection = await open_transport(stack.settings)
        config = ConfigClient(connection, timeout=10)
        try:
            await config.start()
            local = {
                "type": LOCAL_TYPE,
                "name": LOCAL,
                "description": "Return the text it is given, in process",
                "arguments": [{"name": "text", "type": "string", "description": "The text to return"}],
            }
            await config.put([("tool", LOCAL, json.dumps(local))])
            async with ToolSet(
                settings=stack.settings, connection=connection, factories={LOCAL_TYPE: lambda tool, ctx: LocalEcho()}
            ) as tools:
                await tools.wait_for(lambda t: REMOTE in t and LOCAL in t, timeout=60)
                return await _measure(tools, quick, progress)
        finally:
            await config.close()
            await connection.close()
    finally:
        stack.stop()


async def _ways(tools: ToolSet, name: str) -> dict[str, Call]:
    """Each way to make the same call, as its framework makes it."""
    from agents.tool_context import ToolContext
    from pydantic_ai import RunContext
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    from agent_bridge.integrations.langchain import as_langchain_tools
    from agent_bridge.integrations.openai_agents import as_function_tools
    from agent_bridge.integrations.pydantic_ai import LiveToolset

    arguments = {"text": TEXT}
    live = LiveToolset(tools)
    run_context: RunContext[None] = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    pydantic_tool = (await live.get_tools(run_context))[name]
    [langchain_tool] = [t for t in as_langchain_tools(tools) if t.name == name]
    coroutine = langchain_tool.coroutine
    assert coroutine is not None
    [function_tool] = [t for t in as_function_tools(tools) if t.name == name]
    raw = json.dumps(arguments)
    tool_context: ToolContext[None] = ToolContext(
        context=None, tool_name=name, tool_call_id="call-1", tool_arguments=raw
    )
    tool_call = {"name": name, "args": arguments, "id": "call-1", "type": "tool_call"}
    return {
        "ToolSet.invoke": lambda: tools.invoke(name, arguments),
        "pydantic-ai LiveToolset.call_tool": lambda: live.call_tool(name, arguments, run_context, pydantic_tool),
        "LangChain StructuredTool.ainvoke(tool call)": lambda: langchain_tool.ainvoke(tool_call),
        "LangChain adapter coroutine alone": lambda: coroutine(arguments),
        "OpenAI Agents FunctionTool.on_invoke_tool": lambda: function_tool.on_invoke_tool(tool_context, raw),
    }


async def _timed(call: Call, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


async def _get_tools_us(tools: ToolSet, count: int) -> float:
    """`LiveToolset.get_tools` per step while the set is unchanged (pydantic-ai asks at every step), p50 in µs."""
    from pydantic_ai import RunContext
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    from agent_bridge.integrations.pydantic_ai import LiveToolset

    live = LiveToolset(tools)
    ctx: RunContext[None] = RunContext(deps=None, model=TestModel(), usage=RunUsage())
    return statistics.median(await _timed(lambda: live.get_tools(ctx), count)) * 1e6


async def _measure(tools: ToolSet, quick: bool, progress: Progress) -> dict[str, Any]:
    per_round = 100 if quick else 400
    rows: list[dict[str, Any]] = []
    data: dict[str, Any] = {}
    for name, where in ((LOCAL, "in-process tool"), (REMOTE, "echo service over the broker")):
        ways = await _ways(tools, name)
        samples: dict[str, list[float]] = {way: [] for way in ways}
        for call in ways.values():
            await _timed(call, 50)  # warm-up: lazy set-up on every path
        for number in range(1, ROUNDS + 1):
            progress.update(f"{where}: round {number}/{ROUNDS}, {per_round} calls per way", force=True)
            order = list(ways) if number % 2 else list(reversed(ways))
            for way in order:
                samples[way] += await _timed(ways[way], per_round)
        summaries = {way: summary_ms(s) for way, s in samples.items()}
        p50_us = {way: statistics.median(s) * 1e6 for way, s in samples.items()}
        base = p50_us["ToolSet.invoke"]
        data[name] = {"summaries": summaries, "p50_us": {way: round(v, 2) for way, v in p50_us.items()}}
        for way, p50 in p50_us.items():
            if way == "ToolSet.invoke":
                rows.append({"figure": f"{where}: {way}, p50", "ours": round(p50, 1), "unit": "µs"})
            else:
                rows.append(
                    {
                        "figure": f"{where}: {way}, p50 (overhead)",
                        "ours": f"{p50:,.1f} µs ({p50 - base:+,.1f} µs)",
                        "reference": f"{base:,.1f} µs",
                    }
                )
    steps = 2000 if quick else 10000
    get_tools = await _get_tools_us(tools, steps)
    rows.append(
        {
            "figure": "pydantic-ai LiveToolset.get_tools per step, set unchanged (2 tools), p50",
            "ours": round(get_tools, 1),
            "unit": "µs",
        }
    )
    progress.done(f"{len(rows)} figures")
    return {
        "name": NAME,
        "title": "Agent-framework adapters",
        "rows": rows,
        "reference_is": "ToolSet.invoke on the same tool, in the same rounds (p50)",
        "data": {"tools": data, "calls_per_way": ROUNDS * per_round, "get_tools_p50_us": get_tools},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.b_integrations", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{ROUNDS} rounds x 100 calls per way instead of x 400")
    args = parser.parse_args(argv)
    configure_logging("error")
    work = Workdirs()
    started = time.monotonic()
    try:
        result = asyncio.run(run(work, args.quick))
    finally:
        work.cleanup()
    print(report.table([result]))
    print(
        f"\n{result['data']['calls_per_way']} sequential calls per way and tool, in {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
