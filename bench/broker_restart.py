"""Broker crash -> calls again: how long a kill -9 of the embedded broker costs a calling agent.

    python -m bench.broker_restart                # 5 runs of each scenario
    python -m bench.broker_restart --runs 10

Real processes, as an operator runs them: `toolreg up` (embedded pulsar-lite,
supervised), `toolreg serve` (the joke service) and, in this process, an
agent's `ToolSet` that fires a call every 20 ms (each with a 3 s limit) and
records when each one ended and whether it succeeded. Two scenarios:

- `broker`: kill -9 the broker; `toolreg up` restarts it on the same port.
  Figures: the supervisor's downtime (death noticed -> broker accepting,
  from its `broker.restarted` event) and restart -> end of the first
  successful call.
- `up`: kill -9 `toolreg up` and its broker, start `toolreg up` again (it
  takes the same port). Figures: kill -> new `toolreg up` ready (mostly
  Python start-up), its broker started -> end of the first successful call,
  and kill -> that call.

Nothing else is restarted: the service and the ToolSet recover on their own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

from agent_bridge import ToolSet
from toolservice_base import Settings, configure_logging

INTERVAL = 0.02
CALL_LIMIT = 3.0


class Deployment:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
        self.env.update(TOOLREG_DATA_DIR=str(data_dir), TOOLREG_LOG_FORMAT="json", PYTHONUNBUFFERED="1")
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.data_dir.parent / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "discovery.cli", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.data_dir.parent / f"{name}.log").read_text(errors="replace")

    async def up(self, name: str) -> subprocess.Popen[bytes]:
        process = self.start(name, "up")
        while "ready in" not in self.log(name):
            if process.poll() is not None:
                raise RuntimeError(f"toolreg up exited: {self.log(name)[-500:]}")
            await asyncio.sleep(0.01)
        return process

    def event_wall(self, name: str, event: str) -> float:
        for line in self.log(name).splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("event") == event:
                    return datetime.fromisoformat(entry["timestamp"]).timestamp()
        raise RuntimeError(f"no {event} in {name}.log")

    def event(self, name: str, event: str) -> dict[str, Any]:
        for line in self.log(name).splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("event") == event:
                    return entry
        raise RuntimeError(f"no {event} in {name}.log")

    @property
    def broker_pid(self) -> int:
        return int((self.data_dir / "broker.pid").read_text())

    def kill_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        with contextlib.suppress(OSError, ValueError):
            os.kill(self.broker_pid, signal.SIGKILL)


class Caller:
    """Fires a call every INTERVAL; keeps (ended at wall clock, succeeded) for each."""

    def __init__(self, tools: ToolSet) -> None:
        self.tools = tools
        self.results: list[tuple[float, bool]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def _one(self) -> None:
        try:
            answer = await asyncio.wait_for(self.tools.invoke("tell-joke", {"topic": "x"}), CALL_LIMIT)
            ok = "x" in answer
        except Exception:
            ok = False
        self.results.append((time.time(), ok))

    async def run(self) -> None:
        while True:
            task = asyncio.create_task(self._one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(INTERVAL)

    def first_success_after(self, wall: float) -> float | None:
        ends = [end for end, ok in self.results if ok and end >= wall]
        return min(ends) - wall if ends else None

    def failed_between(self, start: float, end: float) -> int:
        return sum(1 for at, ok in self.results if not ok and start <= at <= end)


@contextlib.asynccontextmanager
async def deployment_with_caller(root: Path) -> AsyncIterator[tuple[Deployment, Caller]]:
    deployment = Deployment(root / "data")
    try:
        await deployment.up("up")
        deployment.start("joke", "serve", "toolservice_base.examples.joke:JokeService")
        async with ToolSet(settings=Settings.from_env(data_dir=deployment.data_dir), limits=CALL_LIMIT) as tools:
            await tools.wait_for(lambda t: "tell-joke" in t.names(), timeout=30)
            caller = Caller(tools)
            task = asyncio.create_task(caller.run())
            await asyncio.sleep(1.0)
            try:
                yield deployment, caller
            finally:
                task.cancel()
                await asyncio.sleep(CALL_LIMIT)
    finally:
        deployment.kill_all()


async def broker_run(root: Path) -> dict[str, float]:
    async with deployment_with_caller(root) as (deployment, caller):
        killed = time.time()
        os.kill(deployment.broker_pid, signal.SIGKILL)
        await asyncio.sleep(CALL_LIMIT + 1)
        restarted = deployment.event_wall("up", "broker.restarted")
        first = caller.first_success_after(restarted)
        return {
            "downtime_ms": deployment.event("up", "broker.restarted")["downtime_ms"],
            "restart_to_call_ms": round(first * 1000, 1) if first is not None else float("nan"),
            "kill_to_call_ms": round((restarted + (first or 0) - killed) * 1000, 1),
            "failed_calls": caller.failed_between(killed, killed + CALL_LIMIT + 1),
        }


async def up_run(root: Path) -> dict[str, float]:
    async with deployment_with_caller(root) as (deployment, caller):
        killed = time.time()
        deployment.processes[0].kill()
        os.kill(deployment.broker_pid, signal.SIGKILL)
        await deployment.up("up-2")
        ready = time.time()
        await asyncio.sleep(CALL_LIMIT + 1)
        started = deployment.event_wall("up-2", "broker.started")
        after_start = caller.first_success_after(started)
        after_kill = caller.first_success_after(killed)
        return {
            "up_ready_ms": round((ready - killed) * 1000, 1),
            "broker_start_to_call_ms": round(after_start * 1000, 1) if after_start is not None else float("nan"),
            "kill_to_call_ms": round(after_kill * 1000, 1) if after_kill is not None else float("nan"),
            "failed_calls": caller.failed_between(killed, ready + CALL_LIMIT),
        }


async def main(runs: int) -> None:
    configure_logging("error")
    for name, scenario in (("broker", broker_run), ("up", up_run)):
        results = []
        for i in range(runs):
            with tempfile.TemporaryDirectory(prefix="toolreg-broker-restart-") as tmp:
                result = await scenario(Path(tmp))
            results.append(result)
            print(f"{name} run {i + 1}: {result}", flush=True)
        for key in results[0]:
            values = [r[key] for r in results]
            print(
                f"{name} {key}: median {statistics.median(values):g}, min {min(values):g}, max {max(values):g}",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.broker_restart", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(main(parser.parse_args().runs))
