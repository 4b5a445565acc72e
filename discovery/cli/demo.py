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
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from discovery.broker import EmbeddedBroker
from discovery.broker.embedded import terminate
from discovery.registry.client import RegistryClient
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, Transport, configure_logging, open_transport
from toolservice_base.brokers import PULSAR_LITE

if TYPE_CHECKING:
    from agent_bridge import ToolSet

STEP_TIMEOUT = 20.0


def took(since: float) -> str:
    """Milliseconds from `since` (a `time.perf_counter()` reading) to now, for the end of a step's line."""
    return f"{(time.perf_counter() - since) * 1000:8.1f} ms"


def say(text: str) -> None:
    print(text, flush=True)


def step(number: int, title: str) -> None:
    say(f"\n[{number}] {title}")


def start_service(target: str, settings: Settings, log_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
    """A tool service in its own process, as `toolreg serve` runs it."""
    env = settings.child_env(TOOLREG_LOG_FORMAT="json")
    name = target.rsplit(":", 1)[-1]
    log = open(log_dir / f"{name}.log", "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "discovery.cli", "serve", target, *extra],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    finally:
        log.close()


async def until(predicate: Callable[[], Any], what: str, timeout: float = STEP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"demo: timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.005)


class Services:
    """The demo's tool services, each in a process of its own; `stop` sends them all SIGTERM, then waits for each."""

    def __init__(self, settings: Settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, target: str, *extra: str) -> subprocess.Popen[bytes]:
        process = start_service(target, self.settings, self.log_dir, *extra)
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # all at once, then wait for each
        for proc in self.processes:
            terminate(proc)


async def run_demo(data_dir: Path) -> None:
    """The six steps, each undone (in reverse) by one exit stack, however the story ends."""
    from agent_bridge import ToolSet

    started = time.perf_counter()
    async with AsyncExitStack() as stack:
        step(1, "start the embedded broker, the config store and the registry")
        settings, connection, store = await start_backend(stack, data_dir)
        services = Services(settings, data_dir)
        stack.callback(services.stop)
        tools = await stack.enter_async_context(ToolSet(settings=settings))
        say(f"    agent bridge started with {len(tools.names())} tools at config version {tools.version}")

        step(2, "a tool service starts and registers itself")
        registry = await stack.enter_async_context(RegistryClient(connection))
        joke = await services_register(services, tools, registry)

        step(3, "the agent bridge lists and invokes the tools")
        await invoke_tools(tools)

        step(4, "the joke service stops (SIGTERM): it withdraws and its tool disappears")
        await service_withdraws(joke, tools)

        step(5, "an operator wires a tool by hand; the bridge picks it up without restart")
        config = ConfigClient(connection, timeout=5)
        stack.push_async_callback(config.close)
        await wire_by_hand(services, tools, config, registry, data_dir)

        step(6, "the config store stops; a new bridge starts from its last-known-good snapshot")
        await store.stop()
        await answer_from_snapshot(settings)
    say(f"\ndone in {took(started)}; the logs (this run's in {LOG_FILE}, each service's own) are in {data_dir}")


async def start_backend(stack: AsyncExitStack, data_dir: Path) -> tuple[Settings, Transport, ConfigStoreService]:
    """Step 1: the embedded broker, a connection, the config store and the registry, each stopped by `stack`."""
    broker = EmbeddedBroker(data_dir)
    t = time.perf_counter()
    url = broker.start()
    stack.callback(broker.stop)
    settings = Settings(data_dir=data_dir, pulsar_url=url, broker=PULSAR_LITE)
    connection = await open_transport(settings)
    stack.push_async_callback(connection.close)
    store = ConfigStoreService.in_data_dir(connection, data_dir)
    await store.start()
    stack.push_async_callback(store.stop)  # a no-op once step 6 has stopped it
    registry = Registry(connection)
    await registry.start()
    stack.push_async_callback(registry.stop)
    say(f"    broker {url}, store {store.store.path.name}, registry up   {took(t)}")
    return settings, connection, store


async def services_register(services: Services, tools: ToolSet, registry: RegistryClient) -> subprocess.Popen[bytes]:
    """Step 2: the joke and calculator services announce themselves and reach the bridge; the joke service's process."""
    t = time.perf_counter()
    joke = services.start("toolservice_base.examples.joke:JokeService")
    await until(lambda: "tell-joke" in tools.names(), "tell-joke in the bridge")
    say(f"    `toolreg serve ...JokeService` -> tell-joke live in the bridge   {took(t)}")
    services.start("toolservice_base.examples.calculator:CalculatorService")
    await until(lambda: "calculate" in tools.names(), "calculate in the bridge")
    for status in (await registry.list()).tools:
        say(
            f"    registry: {status.name:<10} service={status.service:<13} source={status.source}"
            f" status={status.status} instances={status.instances}"
        )
    return joke


async def invoke_tools(tools: ToolSet) -> None:
    """Step 3: one call to each tool."""
    say(f"    tools: {', '.join(sorted(tools.names()))} (config version {tools.version})")
    t = time.perf_counter()
    answer = await tools.invoke("tell-joke", {"topic": "pulsars"})
    say(f"    tell-joke(topic=pulsars) -> {answer!r}   {took(t)}")
    t = time.perf_counter()
    answer = await tools.invoke("calculate", {"expression": "(2 + 3) * 4 / 2"})
    say(f"    calculate('(2 + 3) * 4 / 2') -> {answer}   {took(t)}")


async def service_withdraws(joke: subprocess.Popen[bytes], tools: ToolSet) -> None:
    """Step 4: SIGTERM to the joke service; it withdraws, and its tool leaves the bridge."""
    t = time.perf_counter()
    joke.send_signal(signal.SIGTERM)
    await until(lambda: "tell-joke" not in tools.names(), "tell-joke to disappear")
    say(f"    tell-joke gone from the bridge   {took(t)}; tools now: {', '.join(sorted(tools.names()))}")


COUNTDOWN_SERVICE = {
    "id": "countdown",
    "request-queue": "non-persistent://tg/request/countdown",
    "response-queue": "non-persistent://tg/response/countdown",
    "config-params": [{"name": "delay"}],
}
COUNTDOWN_TOOL = {
    "type": "tool-service",
    "name": "countdown",
    "service": "countdown",
    "delay": 0.05,
    "description": "Count down from a number to zero, streaming each number",
    "arguments": [{"name": "start", "type": "integer", "description": "The number to count down from"}],
}


async def wire_by_hand(
    services: Services, tools: ToolSet, config: ConfigClient, registry: RegistryClient, data_dir: Path
) -> None:
    """Step 5: a service that does not announce, wired by two config writes; its streamed answer."""
    services.start("toolservice_base.examples.countdown:CountdownService", "--no-announce")
    t = time.perf_counter()
    await config.put(
        [
            ("tool-service", "countdown", json.dumps(COUNTDOWN_SERVICE)),
            ("tool", "countdown", json.dumps(COUNTDOWN_TOOL)),
        ]
    )
    await until(lambda: "countdown" in tools.names(), "countdown in the bridge")
    say(f"    toolreg config put tool-service/countdown + tool/countdown -> in the bridge   {took(t)}")
    # A hand-wired service does not announce, so nothing tells the bridge it is up: wait for its log line.
    log_file = data_dir / "CountdownService.log"
    await until(
        lambda: log_file.exists() and "service.listening" in log_file.read_text(), "the countdown service to listen"
    )
    t = time.perf_counter()
    chunks = [chunk.strip() async for chunk in tools.stream("countdown", {"start": 3})]
    say(f"    countdown(start=3) streamed {[c for c in chunks if c]}   {took(t)}")
    sources = {s.name: s.source for s in (await registry.list()).tools}
    say(f"    registry lists countdown as source={sources.get('countdown')}")


async def answer_from_snapshot(settings: Settings) -> None:
    """Step 6 (the store stopped): a new bridge loads from its snapshot and answers."""
    from agent_bridge import ToolSet

    t = time.perf_counter()
    async with ToolSet(settings=settings, store_timeout=1.0) as offline:
        say(f"    store down -> bridge loaded {', '.join(sorted(offline.names()))} from its snapshot   {took(t)}")
        t = time.perf_counter()
        answer = await offline.invoke("calculate", {"expression": "6 * 7"})
        say(f"    calculate('6 * 7') -> {answer}   {took(t)}")


DEFAULT_DIR = ".toolreg-demo"


def fresh_dir(data_dir: str | None = None) -> Path:
    """The demo's directory, wiped first: the demo owns it."""
    path = Path(data_dir or DEFAULT_DIR)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path.absolute()


LOG_FILE = "demo.log"


async def cmd_demo(args: argparse.Namespace) -> int:
    """The story is the output: this process's own events (the registry's, the bridge's) go to `demo.log` beside the
    services' logs, so piped output is the story alone, not interleaved with JSON lines; `--log-level` puts them back
    on stderr."""
    path = await asyncio.to_thread(fresh_dir, args.dir)
    if getattr(args, "log_level", None) is not None:
        await run_demo(path)
        return 0
    log = await asyncio.to_thread(open, path / LOG_FILE, "a", encoding="utf-8")
    try:
        configure_logging("info", json=True, stream=log)
        await run_demo(path)
    finally:
        configure_logging("warning")  # the file is closing: nothing may be written to it any more
        log.close()
    return 0
