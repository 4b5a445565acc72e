"""7. With TrustGraph 2.11: start -> the tool is in a stock TrustGraph processor's config handler, and back.

    python -m bench --only trustgraph [--quick]

The store and the registry run as `toolreg up` in their own process. In this
process, a stock TrustGraph `AsyncProcessor` (trustgraph-base 2.11.1 from
PyPI, its own Pulsar backend) registers the config handler TrustGraph's
agent registers (`tool` + `tool-service`) and records when a tool reaches it.

- our service -> TrustGraph: `DynamicToolService.start()` in this process,
  and `toolreg serve` as a new process, to the tool in the handler (then
  stop/SIGTERM to the tool gone from it);
- TrustGraph's service -> us: a stock TrustGraph `DynamicToolService` runs
  here; `toolreg announce` is started beside it as a new process, timed to
  the first successful `ToolSet.invoke`.

References: an operator's hand-written `put` of the same two items to the
handler (what TrustGraph's config path costs with no discovery at all), and
`toolreg serve` of one of our services to the first `ToolSet.invoke` (the
sidecar's figure without the sidecar).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from trustgraph.base import AsyncProcessor
from trustgraph.base import DynamicToolService as TrustGraphToolService

from agent_bridge import ToolSet
from toolservice_base import ConfigClient, Transport, open_transport, topics
from toolservice_base.examples.echo import EchoService

from .common import Progress, Stack, Workdirs, spawn, stop_process, summary_ms, until

NAME = "trustgraph"
logging.getLogger("trustgraph").setLevel(
    logging.CRITICAL
)  # its receiver loops log a traceback for a consumer closed on stop
ECHO = "toolservice_base.examples.echo:EchoService"


class Watcher(AsyncProcessor):
    """A stock TrustGraph processor holding, per workspace, the tool names its last config call handed it."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.tools: dict[str, set[str]] = {}
        self.register_config_handler(self.on_tools_config, types=["tool", "tool-service"])

    async def on_tools_config(self, workspace: str, config: dict[str, dict[str, str]], version: int) -> None:
        self.tools[workspace] = set(config.get("tool", {}))

    def has(self, name: str) -> bool:
        return name in self.tools.get("default", set())


class Upper(TrustGraphToolService):
    async def invoke(self, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return str(arguments.get("text", "")).upper()


async def run(work: Workdirs, quick: bool) -> dict[str, Any]:
    starts = 10 if quick else 50
    progress = Progress(NAME)
    workdir = work.make(NAME)
    stack = Stack(workdir).start()
    try:
        connection = await open_transport(stack.settings)
        watcher = Watcher(id="bench-watcher", pulsar_host=stack.url, config_timeout=5)
        try:
            await watcher.start()
            figures = {
                "start_to_handler": await _in_process(stack, watcher, starts, progress),
                "serve_to_handler": await _serve(stack, watcher, workdir, starts, progress),
                "put_to_handler": await _hand_put(connection, watcher, starts, progress),
                **await _sidecar(stack, connection, workdir, starts, progress),
            }
        finally:
            await watcher.stop()
            await connection.close()
    finally:
        stack.stop()
    progress.done(
        f"{starts} starts each: start() -> TrustGraph handler p99 {figures['start_to_handler']['up']['p99_ms']:.1f} ms"
    )
    return _result(starts, figures)


async def _in_process(stack: Stack, watcher: Watcher, starts: int, progress: Progress) -> dict[str, Any]:
    up, down = [], []
    for number in range(starts):
        service = EchoService(settings=stack.settings, ttl=15)
        t0 = time.perf_counter()
        await service.start()
        up.append(await until(lambda: watcher.has("echo"), "echo in the TrustGraph handler") - t0)
        t1 = time.perf_counter()
        await service.stop()
        down.append(await until(lambda: not watcher.has("echo"), "echo gone from the TrustGraph handler") - t1)
        progress.update(f"start() {number + 1}/{starts}")
    return {"up": summary_ms(up), "down": summary_ms(down)}


async def _serve(stack: Stack, watcher: Watcher, workdir: Path, starts: int, progress: Progress) -> dict[str, Any]:
    up, down = [], []
    for number in range(starts):
        t0 = time.perf_counter()
        proc = spawn(["-m", "discovery.cli", "serve", ECHO], stack.env(), workdir / "serve.log")
        try:
            up.append(await until(lambda: watcher.has("echo"), "echo (toolreg serve) in the TrustGraph handler") - t0)
        finally:
            t1 = time.perf_counter()
            await asyncio.to_thread(stop_process, proc)
        down.append(await until(lambda: not watcher.has("echo"), "echo gone after SIGTERM") - t1)
        progress.update(f"toolreg serve {number + 1}/{starts}")
    return {"up": summary_ms(up), "down": summary_ms(down)}


async def _hand_put(connection: Transport, watcher: Watcher, starts: int, progress: Progress) -> dict[str, Any]:
    """Reference: the same two items written by hand, then deleted."""
    echo = EchoService(announce=False, connection=connection)
    items = [
        ("tool-service", "echo", echo.service_descriptor.to_json()),
        ("tool", "echo", echo.tool_descriptors[0].to_json()),
    ]
    client = await ConfigClient(connection, timeout=5).start()
    up = []
    try:
        for number in range(starts):
            t0 = time.perf_counter()
            await client.put(items)
            up.append(await until(lambda: watcher.has("echo"), "a hand-written echo in the handler") - t0)
            await client.delete([(t, k) for t, k, _ in items])
            await until(lambda: not watcher.has("echo"), "the hand-written echo gone")
            progress.update(f"hand put {number + 1}/{starts}")
    finally:
        await client.close()
    return {"up": summary_ms(up)}


async def _sidecar(
    stack: Stack, connection: Transport, workdir: Path, starts: int, progress: Progress
) -> dict[str, Any]:
    service_file, tools_file = workdir / "upper.json", workdir / "upper-tools.json"
    service_file.write_text(
        json.dumps(
            {
                "id": "upper",
                "request-queue": topics.DEFAULT.request_queue("upper"),
                "response-queue": topics.DEFAULT.response_queue("upper"),
            }
        )
    )
    tools_file.write_text(
        json.dumps(
            [
                {
                    "name": "upper",
                    "description": "Upper-case the text",
                    "arguments": [{"name": "text", "type": "string", "description": "The text"}],
                }
            ]
        )
    )
    upper = Upper(id="bench-upper", pulsar_host=stack.url, topic="upper", config_timeout=5)
    await upper.start()
    sidecar, native = [], []
    try:
        async with ToolSet(settings=stack.settings, connection=connection, poll_interval=2.0) as tools:
            for number in range(starts):
                args = ["-m", "discovery.cli", "announce", "--service", str(service_file), "--tools", str(tools_file)]
                sidecar.append(
                    await _spawn_until_invokable(stack, workdir / "announce.log", args, tools, "upper", "HELLO")
                )
                args = ["-m", "discovery.cli", "serve", ECHO]
                native.append(await _spawn_until_invokable(stack, workdir / "serve.log", args, tools, "echo", "hello"))
                progress.update(f"toolreg announce / serve {number + 1}/{starts}")
    finally:
        await upper.stop()
    return {"announce_to_invokable": {"up": summary_ms(sidecar)}, "serve_to_invokable": {"up": summary_ms(native)}}


async def _spawn_until_invokable(
    stack: Stack, log: Path, args: list[str], tools: ToolSet, name: str, expected: str
) -> float:
    t0 = time.perf_counter()
    proc = spawn(args, stack.env(), log)
    try:
        while True:
            await tools.wait_for(lambda t: name in t.names(), timeout=30)
            if await tools.invoke(name, {"text": "hello"}) == expected:
                elapsed = time.perf_counter() - t0
                break
    finally:
        await asyncio.to_thread(stop_process, proc)
    await tools.wait_for(lambda t: name not in t.names(), timeout=30)
    return elapsed


def _result(starts: int, f: dict[str, Any]) -> dict[str, Any]:
    def row(figure: str, ours: dict[str, float], reference: dict[str, float] | None, q: str) -> dict[str, Any]:
        return {"figure": figure, "ours": ours[q], "reference": reference[q] if reference else None, "unit": "ms"}

    put = f["put_to_handler"]["up"]
    return {
        "name": NAME,
        "title": "With TrustGraph 2.11",
        "rows": [
            row("start() -> TrustGraph handler, p50", f["start_to_handler"]["up"], put, "p50_ms"),
            row("start() -> TrustGraph handler, p99", f["start_to_handler"]["up"], put, "p99_ms"),
            row("toolreg serve -> TrustGraph handler, p50", f["serve_to_handler"]["up"], put, "p50_ms"),
            row("toolreg serve -> TrustGraph handler, p99", f["serve_to_handler"]["up"], put, "p99_ms"),
            row(
                "toolreg announce (TrustGraph service) -> ToolSet.invoke, p50",
                f["announce_to_invokable"]["up"],
                f["serve_to_invokable"]["up"],
                "p50_ms",
            ),
            row(
                "toolreg announce (TrustGraph service) -> ToolSet.invoke, p99",
                f["announce_to_invokable"]["up"],
                f["serve_to_invokable"]["up"],
                "p99_ms",
            ),
        ],
        "reference_is": (
            "handler rows: a hand-written put of the same items -> handler; announce rows: toolreg serve of our echo ->"
            " ToolSet.invoke"
        ),
        "data": {"starts": starts, "trustgraph_base": metadata.version("trustgraph-base"), **f},
    }
