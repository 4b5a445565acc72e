"""`toolreg demo`: the whole story in one command, each step timed.

Runs on an embedded broker in a fresh temporary data directory (or
`--data-dir`), with every tool service in a process of its own, the way they
run in production:

 1. broker, config store and registry start;
 2. a tool service starts and registers itself; the agent bridge sees it;
 3. the bridge lists and invokes its tools;
 4. the service stops (SIGTERM) and its tools disappear from the bridge;
 5. an operator wires a tool by hand; the bridge picks it up without restart;
 6. with the config store stopped, a new bridge answers from its snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from discovery.broker import EmbeddedBroker
from discovery.broker.embedded import terminate
from discovery.registry.client import RegistryClient
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, configure_logging, open_transport

STEP_TIMEOUT = 20.0


class Clock:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def ms(self, since: float | None = None) -> str:
        return f"{(time.perf_counter() - (since if since is not None else self.start)) * 1000:8.1f} ms"


def say(text: str) -> None:
    print(text, flush=True)


def step(number: int, title: str) -> None:
    say(f"\n[{number}] {title}")


def start_service(target: str, settings: Settings, log_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    """A tool service in its own process, as `toolreg serve` runs it."""
    env = {**os.environ, "PULSAR_URL": settings.resolve_pulsar_url(), "TOOLREG_DATA_DIR": str(settings.data_dir),
           "TOOLREG_BROKER": settings.broker or "", "TOOLREG_LOG_FORMAT": "json"}
    name = target.rsplit(":", 1)[-1]
    log = open(log_dir / f"{name}.log", "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "discovery.cli", "serve", target, *extra], env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        log.close()


async def until(predicate: Callable[[], Any], what: str, timeout: float = STEP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"demo: timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.005)


async def run_demo(data_dir: Path) -> None:
    from agent_bridge import ToolSet

    clock = Clock()
    services: list[subprocess.Popen[bytes]] = []
    async with AsyncExitStack() as stack:
        step(1, "start the embedded broker, the config store and the registry")
        broker = EmbeddedBroker(data_dir)
        t = time.perf_counter()
        url = broker.start()
        stack.callback(broker.stop)
        settings = Settings(data_dir=data_dir, pulsar_url=url, broker="pulsar-lite")
        connection = await open_transport(settings)
        stack.push_async_callback(connection.close)
        store = ConfigStoreService.in_data_dir(connection, data_dir)
        await store.start()
        store_stopped = False

        async def stop_store() -> None:
            if not store_stopped:
                await store.stop()

        stack.push_async_callback(stop_store)
        registry = Registry(connection)
        await registry.start()
        stack.push_async_callback(registry.stop)
        say(f"    broker {url}, store {store.store.path.name}, registry up   {clock.ms(t)}")

        def stop_services() -> None:
            for proc in services:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)  # all at once, then wait for each
            for proc in services:
                terminate(proc)

        stack.callback(stop_services)

        tools = ToolSet(settings=settings)
        await tools.__aenter__()
        stack.push_async_callback(tools.__aexit__, None, None, None)
        say(f"    agent bridge started with {len(tools.names())} tools at config version {tools.version}")

        step(2, "a tool service starts and registers itself")
        t = time.perf_counter()
        joke = start_service("toolservice_base.examples.joke:JokeService", settings, data_dir)
        services.append(joke)
        await until(lambda: "tell-joke" in tools.names(), "tell-joke in the bridge")
        say(f"    `toolreg serve ...JokeService` -> tell-joke live in the bridge   {clock.ms(t)}")
        calc = start_service("toolservice_base.examples.calculator:CalculatorService", settings, data_dir)
        services.append(calc)
        await until(lambda: "calculate" in tools.names(), "calculate in the bridge")
        registry_client = await RegistryClient(connection).start()
        stack.push_async_callback(registry_client.close)
        listed = (await registry_client.list()).tools
        for status in listed:
            say(f"    registry: {status.name:<10} service={status.service:<13} source={status.source} status={status.status} instances={status.instances}")

        step(3, "the agent bridge lists and invokes the tools")
        say(f"    tools: {', '.join(sorted(tools.names()))} (config version {tools.version})")
        t = time.perf_counter()
        answer = await tools.invoke("tell-joke", {"topic": "pulsars"})
        say(f"    tell-joke(topic=pulsars) -> {answer!r}   {clock.ms(t)}")
        t = time.perf_counter()
        answer = await tools.invoke("calculate", {"expression": "(2 + 3) * 4 / 2"})
        say(f"    calculate('(2 + 3) * 4 / 2') -> {answer}   {clock.ms(t)}")

        step(4, "the joke service stops (SIGTERM): it withdraws and its tool disappears")
        t = time.perf_counter()
        joke.send_signal(signal.SIGTERM)
        await until(lambda: "tell-joke" not in tools.names(), "tell-joke to disappear")
        say(f"    tell-joke gone from the bridge   {clock.ms(t)}; tools now: {', '.join(sorted(tools.names()))}")

        step(5, "an operator wires a tool by hand; the bridge picks it up without restart")
        countdown = start_service("toolservice_base.examples.countdown:CountdownService", settings, data_dir, "--no-announce")
        services.append(countdown)
        config = ConfigClient(connection, timeout=5)
        stack.push_async_callback(config.close)
        service_item = {"id": "countdown", "request-queue": "non-persistent://tg/request/countdown",
                        "response-queue": "non-persistent://tg/response/countdown", "config-params": [{"name": "delay"}]}
        tool_item = {"type": "tool-service", "name": "countdown", "service": "countdown", "delay": 0.05,
                     "description": "Count down from a number to zero, streaming each number",
                     "arguments": [{"name": "start", "type": "integer", "description": "The number to count down from"}]}
        t = time.perf_counter()
        await config.put([("tool-service", "countdown", json.dumps(service_item)), ("tool", "countdown", json.dumps(tool_item))])
        await until(lambda: "countdown" in tools.names(), "countdown in the bridge")
        say(f"    toolreg config put tool-service/countdown + tool/countdown -> in the bridge   {clock.ms(t)}")
        # A hand-wired service does not announce, so nothing tells the bridge it is up: wait for its log line.
        log_file = data_dir / "CountdownService.log"
        await until(lambda: log_file.exists() and "service.listening" in log_file.read_text(), "the countdown service to listen")
        t = time.perf_counter()
        chunks = [chunk.strip() async for chunk in tools.stream("countdown", {"start": 3})]
        say(f"    countdown(start=3) streamed {[c for c in chunks if c]}   {clock.ms(t)}")
        sources = {s.name: s.source for s in (await registry_client.list()).tools}
        say(f"    registry lists countdown as source={sources.get('countdown')}")

        step(6, "the config store stops; a new bridge starts from its last-known-good snapshot")
        await store.stop()
        store_stopped = True
        t = time.perf_counter()
        async with ToolSet(settings=settings, store_timeout=1.0) as offline:
            say(f"    store down -> bridge loaded {', '.join(sorted(offline.names()))} from its snapshot   {clock.ms(t)}")
            t = time.perf_counter()
            answer = await offline.invoke("calculate", {"expression": "6 * 7"})
            say(f"    calculate('6 * 7') -> {answer}   {clock.ms(t)}")
    say(f"\ndone in {clock.ms()}; logs of the services are in {data_dir}")


DEFAULT_DIR = ".toolreg-demo"


def fresh_dir(data_dir: str | None = None) -> Path:
    """The demo's directory, wiped first: the demo owns it."""
    path = Path(data_dir or DEFAULT_DIR)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path.absolute()


async def demo(data_dir: str | None = None) -> int:
    """Run the story in a fresh directory."""
    await run_demo(await asyncio.to_thread(fresh_dir, data_dir))
    return 0


async def cmd_demo(args: argparse.Namespace) -> int:
    if getattr(args, "log_level", None) is None:
        configure_logging("warning")  # the story is the output; --log-level info shows the events too
    return await demo(args.dir)


