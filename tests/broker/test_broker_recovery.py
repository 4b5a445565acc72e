"""A broker crash with real processes: `toolreg up` brings its broker back on the same port, and calls resume.

Every process here is real: `toolreg up` with its embedded pulsar-lite,
`toolreg serve`, and a `ToolSet` in the test process that found the broker
through `broker.url` exactly as an agent on the machine would. Nothing is
told that the broker went away; recovery must happen unattended.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import eventually, log_events, toolreg, toolreg_background, toolreg_env

from agent_bridge import ToolSet
from discovery.broker.embedded import accepts_connections
from toolservice_base import Settings

JOKE = "toolservice_base.examples.joke:JokeService"
START = 20.0  # a subprocess imports Python, pydantic and pulsar-client first
RECOVERY = 5.0
"""A call must succeed again within this many seconds of the broker's death (measured: well under 1 s)."""


class Deployment:
    """`toolreg up` (embedded broker) and `toolreg serve` in one data directory, killed at the end whatever happens."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.env = toolreg_env("", data_dir)  # no PULSAR_URL: `toolreg up` runs the embedded broker
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        process = toolreg_background(*args, env=self.env, log=self.data_dir.parent / f"{name}.log")
        self.processes[name] = process
        return process

    async def up(self, name: str = "up", *args: str) -> subprocess.Popen[bytes]:
        process = self.start(name, "up", *args)
        await eventually(
            lambda: "ready in" in self.log_text(name) or process.poll() is not None, timeout=START, interval=0.05
        )
        assert process.poll() is None, self.log_text(name)
        return process

    def log_text(self, name: str) -> str:
        path = self.data_dir.parent / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def events(self, name: str, event: str) -> list[dict[str, Any]]:
        return log_events(self.log_text(name), event)

    @property
    def url(self) -> str:
        return (self.data_dir / "broker.url").read_text().strip()

    @property
    def broker_pid(self) -> int:
        return int((self.data_dir / "broker.pid").read_text())

    def kill_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        try:
            os.kill(self.broker_pid, signal.SIGKILL)  # a broker left behind by a killed `toolreg up`
        except (OSError, ValueError):
            pass


def kill9(pid: int) -> float:
    os.kill(pid, signal.SIGKILL)
    return time.monotonic()


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return not Path(f"/proc/{pid}/cmdline").read_bytes()  # a zombie waiting for its parent


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    running = Deployment(tmp_path / "data")
    yield running
    running.kill_all()


@pytest.fixture
async def tools(deployment: Deployment) -> AsyncIterator[ToolSet]:
    """A joke service and an agent's ToolSet that calls it; pushes only (no polling), to prove the watch recovers."""
    await deployment.up()
    deployment.start("joke", "serve", JOKE, "--ttl", "3")
    settings = Settings.from_env(data_dir=deployment.data_dir)
    async with ToolSet(settings=settings, poll_interval=3600, limits=2.0) as toolset:
        await toolset.wait_for(lambda t: "tell-joke" in t.names(), timeout=START)
        assert await call(toolset) is True
        yield toolset


async def call(toolset: ToolSet, timeout: float = 1.0) -> bool:
    try:
        answer = await asyncio.wait_for(toolset.invoke("tell-joke", {"topic": "brokers"}), timeout)
    except Exception:
        return False
    return "brokers" in answer


async def first_success_after(toolset: ToolSet, since: float, limit: float = RECOVERY) -> float:
    """Seconds from `since` (monotonic) to the end of the first successful call, calling back to back."""
    deadline = since + limit
    while time.monotonic() < deadline:
        if await call(toolset, timeout=min(1.0, max(0.05, deadline - time.monotonic()))):
            return time.monotonic() - since
        await asyncio.sleep(0.01)
    raise AssertionError(f"no call succeeded within {limit}s")


async def test_a_killed_broker_is_restarted_on_its_port_and_calls_resume_within_seconds(
    deployment: Deployment, tools: ToolSet
) -> None:
    url, old_pid = deployment.url, deployment.broker_pid
    killed = kill9(old_pid)
    recovered = await first_success_after(tools, killed)
    assert recovered < RECOVERY

    assert deployment.url == url and deployment.broker_pid != old_pid
    (died,) = deployment.events("up", "broker.died")
    assert died["status"] == "killed by SIGKILL"
    (restarted,) = deployment.events("up", "broker.restarted")
    assert restarted["url"] == url and restarted["attempt"] == 1 and 0 < restarted["downtime_ms"] < 2000
    assert deployment.processes["up"].poll() is None

    # The store, its pushes and the agent's watch came back too: a tool written now reaches the
    # ToolSet by push (it does not poll), and the registry still answers.
    put = toolreg(
        "config",
        "put",
        "tool/by-hand",
        "--value",
        json.dumps(
            {"type": "tool-service", "name": "by-hand", "description": "Wired by hand", "service": "joke-service"}
        ),
        env=deployment.env,
    )
    assert put.returncode == 0, put.stderr
    await tools.wait_for(lambda t: "by-hand" in t.names(), timeout=3.0)
    listed = toolreg("tools", "--json", env=deployment.env)
    assert listed.returncode == 0, listed.stderr
    assert {t["name"]: t["status"] for t in json.loads(listed.stdout)}["tell-joke"] == "live"


async def test_a_restarted_toolreg_up_takes_the_previous_port_and_calls_resume(
    deployment: Deployment, tools: ToolSet
) -> None:
    url = deployment.url
    kill9(deployment.processes["up"].pid)
    killed = kill9(deployment.broker_pid)  # everything `toolreg up` ran is gone, as after a power cut of that process
    await deployment.up("up-2")
    ready = time.monotonic()
    assert deployment.url == url
    (broker_line,) = [line for line in deployment.log_text("up-2").splitlines() if line.startswith("broker ")]
    assert "embedded pulsar-lite" in broker_line
    assert not [line for line in deployment.log_text("up-2").splitlines() if line.startswith("note ")]  # no port note
    assert await first_success_after(tools, ready) < RECOVERY  # the joke service and the ToolSet were never restarted
    assert ready - killed > 0  # (the time `toolreg up` itself takes to start is not the services' to recover)


async def test_toolreg_up_killed_alone_leaves_calls_working_and_its_successor_adopts_and_supervises_the_broker(
    deployment: Deployment, tools: ToolSet
) -> None:
    url, pid = deployment.url, deployment.broker_pid
    kill9(deployment.processes["up"].pid)
    deployment.processes["up"].wait(10)
    assert await call(tools)  # the broker outlives its `toolreg up`: services and agents go on

    await deployment.up("up-2")
    assert deployment.url == url and deployment.broker_pid == pid
    assert "adopted from a previous `toolreg up`" in deployment.log_text("up-2")

    killed = kill9(pid)
    assert await first_success_after(tools, killed) < RECOVERY
    assert deployment.events("up-2", "broker.restarted")
    new_pid = deployment.broker_pid
    assert new_pid != pid

    deployment.processes["up-2"].send_signal(signal.SIGTERM)
    assert deployment.processes["up-2"].wait(15) == 0
    await eventually(lambda: pid_gone(new_pid), timeout=5.0)
    assert not (deployment.data_dir / "broker.url").exists()
    assert (deployment.data_dir / "broker.port").read_text().strip() == url.rsplit(":", 1)[1]


async def test_toolreg_up_stops_with_one_line_when_its_broker_keeps_dying(deployment: Deployment) -> None:
    up = await deployment.up("up", "--no-registry")
    port = int(deployment.url.rsplit(":", 1)[1])

    def gone_or_replaced(pid: int) -> bool:
        if up.poll() is not None:
            return True
        try:
            return deployment.broker_pid != pid
        except (OSError, ValueError):  # being rewritten, or removed as `toolreg up` stops
            return False

    kills = 0
    while up.poll() is None and kills < 10:
        pid = deployment.broker_pid
        kill9(pid)
        kills += 1
        await eventually(functools.partial(gone_or_replaced, pid), timeout=15.0, interval=0.01)
    status = await asyncio.to_thread(up.wait, 30)
    assert (status, kills) == (1, 6)  # restarted five times (backing off), then a crash loop: give up
    assert len(deployment.events("up", "broker.restarted")) == 5
    errors = [line for line in deployment.log_text("up").splitlines() if line.startswith("toolreg:")]
    assert len(errors) == 1
    assert f"127.0.0.1:{port} died 6 times" in errors[0] and "broker.log" in errors[0] and "toolreg up" in errors[0]
    assert not accepts_connections(port)
