"""How fast the registry follows services: start -> listed, SIGTERM -> removed, kill -9 -> removed.

Runs an embedded broker, the config store and the registry in this process
(what `toolreg up` runs), then starts services and watches the config store:

    .venv/bin/python bench/registry_latency.py [--starts 50] [--spawns 20] [--kills 10] [--ttl 2]

- in-process: `DynamicToolService.start()` returns -> `tool/<name>` in the
  store; `stop()` (what SIGTERM runs) -> gone.
- subprocess: `toolreg serve` spawned -> listed (includes the interpreter's
  start), its own `service.listening` log line -> listed, SIGTERM -> gone,
  kill -9 -> gone (bounded by the lease: ttl after the last heartbeat).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, configure_logging, open_transport
from toolservice_base.examples.echo import EchoService

POLL = 0.002


async def wait_for(client: ConfigClient, present: bool, timeout: float = 30.0) -> float:
    """Poll the store until `tool/echo` is (or is not) there; returns the time it was seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (("tool", "echo") in await client.get([("tool", "echo")])) == present:
            return time.monotonic()
        await asyncio.sleep(POLL)
    raise TimeoutError(f"tool/echo still {'absent' if present else 'present'} after {timeout:g}s")


def summary(name: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"{name:<42} n={len(ms):<3} p50 {statistics.median(ms):7.1f} ms   p99 {p99:7.1f} ms   max {ms[-1]:7.1f} ms"


def spawn(env: dict[str, str], log: Path, ttl: float) -> subprocess.Popen[bytes]:
    with open(log, "wb") as handle:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "discovery.cli",
                "serve",
                "toolservice_base.examples.echo:EchoService",
                "--ttl",
                str(ttl),
            ],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def listening_at(log: Path) -> float:
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == "service.listening":
            return datetime.fromisoformat(entry["timestamp"]).timestamp()
    raise RuntimeError(f"no service.listening in {log}")


async def main(args: argparse.Namespace) -> None:
    configure_logging("error")
    work = Path(tempfile.mkdtemp(prefix="toolreg-bench-"))
    broker = EmbeddedBroker(work / "broker")
    url = broker.start()
    settings = Settings(data_dir=work / "data", pulsar_url=url, broker="pulsar-lite")
    connection = await open_transport(settings)
    store = ConfigStoreService.in_data_dir(connection, settings.data_dir)
    await store.start()
    registry = Registry(connection)
    await registry.start()
    client = await ConfigClient(connection, timeout=5).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    env.update(
        PULSAR_URL=url,
        TOOLREG_BROKER="pulsar-lite",
        TOOLREG_DATA_DIR=str(settings.data_dir),
        TOOLREG_LOG_FORMAT="json",
        TOOLREG_LOG_LEVEL="info",
    )
    print(
        f"broker {url}; registry defaults (sweep 0.25 s, store writes batched on the leading edge, no fixed window);"
        f" ttl {args.ttl:g} s; {os.cpu_count()} CPUs"
    )
    try:
        started, stopped = [], []
        for _ in range(args.starts):
            service = EchoService(settings=settings, ttl=args.ttl)
            t0 = time.monotonic()
            await service.start()
            started.append(await wait_for(client, True) - t0)
            t0 = time.monotonic()
            await service.stop()
            stopped.append(await wait_for(client, False) - t0)
        print(summary("in-process start() -> listed", started))
        print(summary("in-process stop() (withdraw) -> removed", stopped))

        spawned, ready, terms = [], [], []
        for number in range(args.spawns):
            log = work / f"spawn-{number}.log"
            t0, wall0 = time.monotonic(), time.time()
            process = spawn(env, log, args.ttl)
            seen = await wait_for(client, True)
            seen_wall = wall0 + (seen - t0)
            spawned.append(seen - t0)
            ready.append(seen_wall - listening_at(log))
            t0 = time.monotonic()
            process.send_signal(signal.SIGTERM)
            terms.append(await wait_for(client, False) - t0)
            process.wait(10)
        print(summary("toolreg serve spawned -> listed", spawned))
        print(summary("toolreg serve listening -> listed", ready))
        print(summary("toolreg serve SIGTERM -> removed", terms))

        kills = []
        for number in range(args.kills):
            process = spawn(env, work / f"kill-{number}.log", args.ttl)
            await wait_for(client, True)
            await asyncio.sleep(args.ttl * (0.5 + number / max(1, args.kills)))  # kill at varied heartbeat phases
            t0 = time.monotonic()
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            kills.append(await wait_for(client, False) - t0)
        print(summary(f"toolreg serve kill -9 -> removed (ttl {args.ttl:g} s)", kills))
    finally:
        await client.close()
        await registry.stop()
        await store.stop()
        await connection.close()
        await asyncio.sleep(0.05)
        broker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=50, help="in-process start/stop cycles (default 50)")
    parser.add_argument("--spawns", type=int, default=20, help="`toolreg serve` start/SIGTERM cycles (default 20)")
    parser.add_argument("--kills", type=int, default=10, help="`toolreg serve` start/kill -9 cycles (default 10)")
    parser.add_argument("--ttl", type=float, default=2.0, help="lease ttl of the services (default 2)")
    asyncio.run(main(parser.parse_args()))
