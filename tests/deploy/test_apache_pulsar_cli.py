"""The product's own processes on Apache Pulsar with token authentication, as an operator runs them.

`toolreg up` (store and registry, no embedded broker), `toolreg serve` and
`toolreg call`, each a process of its own, in a fresh tenant used as the
topicspace. Without a token, or with a wrong one, each command says so in one
line and exits 1. When the broker restarts under them, nothing is restarted or
told: the service and an agent's `ToolSet` call again on their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import toolreg_background

from agent_bridge import ToolSet
from toolservice_base import Settings

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(420)]


def env_for(apache: ApachePulsar, tenant: str, data_dir: Path, token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    env.update(
        PULSAR_URL=apache.url,
        TOOLREG_TOPICSPACE=tenant,
        TOOLREG_DATA_DIR=str(data_dir),
        TOOLREG_LOG_FORMAT="json",
        TOOLREG_LOG_LEVEL="info",
        PYTHONUNBUFFERED="1",
    )
    if token is not None:
        env["PULSAR_AUTH_TOKEN"] = token
    return env


def run(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "discovery.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def wait_for(log: Path, marker: str, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker in log.read_text(errors="replace"):
            return
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"{marker!r} not in {log} within {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def product(apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """`toolreg up` and the joke service, on the test's tenant, with the broker's token."""
    env = env_for(apache_pulsar, tenant, tmp_path / "data", apache_pulsar.token)
    up = toolreg_background("up", env=env, log=tmp_path / "up.log")
    serve = None
    try:
        wait_for(tmp_path / "up.log", "ready in", up)
        serve = toolreg_background(
            "serve", "toolservice_base.examples.joke:JokeService", env=env, log=tmp_path / "serve.log"
        )
        wait_for(tmp_path / "serve.log", "service.announced", serve)
        yield env
    finally:
        if serve is not None:
            stop(serve)
        stop(up)


def test_up_serve_and_call_work_with_a_token_in_their_own_topicspace(product: dict[str, str], tenant: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        done = run("call", "tell-joke", "topic=owls", env=product)
        if done.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # the registry merges the announcement a moment after the service starts
    assert done.returncode == 0, done.stderr[-2000:]
    assert "owls" in done.stdout
    listed = run("tools", env=product)
    assert listed.returncode == 0 and "tell-joke" in listed.stdout and "live" in listed.stdout


@pytest.mark.parametrize("which", ["no token", "a wrong token"])
def test_without_the_right_token_each_command_says_so_in_one_line(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, which: str
) -> None:
    token = (
        None
        if which == "no token"
        else apache_pulsar.mint_token("admin", secret_key=_other_key(apache_pulsar, tmp_path))
    )
    env = env_for(apache_pulsar, tenant, tmp_path / "data", token)
    for command in (["config", "list", "tool"], ["up", "--no-registry"]):
        started = time.monotonic()
        done = run(*command, env=env)
        took = time.monotonic() - started
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 1, (command, done.stderr[-2000:])
        assert lines and lines[-1].startswith("toolreg: ") and "PULSAR_AUTH_TOKEN" in lines[-1], (
            command,
            done.stderr[-2000:],
        )
        assert "Traceback" not in done.stderr
        assert took < 40, f"{command} took {took:.1f}s to fail"


def test_a_topicspace_the_cluster_lacks_is_named_with_the_fix_in_one_line(
    apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    env = env_for(apache_pulsar, "no-such-tenant", tmp_path / "data", apache_pulsar.token)
    started = time.monotonic()
    done = run("config", "list", "tool", env=env)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("toolreg: "), done.stderr[-2000:]
    assert "has no namespace no-such-tenant/" in lines[0] and "TOOLREG_TOPICSPACE" in lines[0]
    assert time.monotonic() - started < 30


def _other_key(apache: ApachePulsar, tmp_path: Path) -> Path:
    """A secret key the broker does not know: tokens signed with it are refused."""
    key = tmp_path / "other.key"
    key.write_bytes(os.urandom(32))
    return key


RESUME = 20.0
"""Seconds from the restarted broker being ready to the first successful call (measured: see the closing note)."""
REGISTRY_BACK = 60.0
"""Seconds from the restarted broker being ready to the registry answering again: its election reads the lock's
markers through a reader that pulsar-client reconnects with its own back-off, which grows with the outage (up to a
minute); docs/operators.md, "Broker restarts"."""


async def test_after_the_broker_restarts_the_service_and_an_agent_call_again_unattended(
    product: dict[str, str], apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path / "agent",
        pulsar_url=apache_pulsar.url,
        broker="apache-pulsar",
        topicspace=tenant,
        auth_token=apache_pulsar.token,
    )
    async with ToolSet(
        settings=settings, poll_interval=3600, limits=2.0
    ) as tools:  # pushes only: the watch must recover
        await tools.wait_for(lambda t: "tell-joke" in t.names(), timeout=60)
        assert await _call(tools)

        away = await asyncio.to_thread(apache_pulsar.restart)  # same ports, same data; the product keeps running
        back = time.monotonic()
        while not await _call(tools):
            assert time.monotonic() - back < RESUME, f"no call succeeded within {RESUME}s of the broker's return"
            await asyncio.sleep(0.05)
        print(f"broker away {away:.1f}s; first call ok {time.monotonic() - back:.2f}s after it was ready")

        value = json.dumps(
            {"type": "tool-service", "name": "by-hand", "description": "Wired by hand", "service": "joke-service"}
        )
        put = await asyncio.to_thread(run, "config", "put", "tool/by-hand", "--value", value, env=product)
        assert put.returncode == 0, put.stderr[-2000:]
        await tools.wait_for(lambda t: "by-hand" in t.names(), timeout=10)  # the store's push reached the agent's watch
        while (listed := await asyncio.to_thread(run, "tools", "--json", env=product)).returncode != 0:
            assert time.monotonic() - back < REGISTRY_BACK, listed.stderr[-2000:]
            await asyncio.sleep(0.5)
        print(f"the registry answered {time.monotonic() - back:.1f}s after the broker was ready")
        assert {t["name"]: t["status"] for t in json.loads(listed.stdout)}["tell-joke"] == "live"


async def _call(tools: ToolSet) -> bool:
    try:
        answer = await asyncio.wait_for(tools.invoke("tell-joke", {"topic": "brokers"}), 2.5)
    except Exception:
        return False
    return "brokers" in answer
