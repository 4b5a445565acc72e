"""Trust across restarts, with `toolreg up` as a real process on a real broker.

- Turning a trust policy on removes the services it refuses within one ttl:
  their leases run out while they are still sending, which is not the
  silence self-preservation protects against.
- A signed announce captured before its instance withdrew cannot bring the
  tool back after the registry restarts, though it is still inside the skew
  window: the restarted registry remembers the withdrawn instance.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from support import atoolreg, eventually, log_events, toolreg_background, toolreg_env
from support.store import tool_names

from discovery.broker import EmbeddedBroker
from discovery.registry.client import RegistryClient
from discovery.registry.protocol import ToolStatus
from discovery.registry.trust import TrustPolicy, trusted_key
from toolservice_base import ConfigClient, Settings, Transport, topics
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService
from toolservice_base.examples.joke import JokeService
from toolservice_base.signing import Ed25519PrivateKey, generate_key_pair, load_private_key, public_key_text

START = 20.0  # a `toolreg` process imports Python, pydantic and pulsar-client first


class Up:
    """`toolreg up` (and `toolreg serve`) subprocesses of one test, all killed at the end whatever happens."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.started: list[subprocess.Popen[bytes]] = []

    def run(self, *args: str, name: str) -> subprocess.Popen[bytes]:
        process = toolreg_background(*args, env=self.env, log=self.logs / f"{name}.log")
        self.started.append(process)
        return process

    def events(self, name: str, event: str) -> list[dict[str, Any]]:
        return log_events((self.logs / f"{name}.log").read_text(), event)

    async def started_registry(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        process = self.run("up", *args, name=name)
        await eventually(
            lambda: self.events(name, "registry.started") or process.poll() is not None, timeout=START, interval=0.05
        )
        assert process.poll() is None, (self.logs / f"{name}.log").read_text()
        return process

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        process.send_signal(signal.SIGTERM)
        process.wait(15)

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.fixture
def up(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Up]:
    """The config store and registry run inside `toolreg up`, on the test's broker, data in their own directory."""
    logs = tmp_path / "logs"
    logs.mkdir()
    processes = Up(toolreg_env(broker.url or "", tmp_path / "toolreg"), logs)
    yield processes
    processes.kill_all()


@pytest.fixture
async def store(connection: Transport) -> AsyncIterator[ConfigClient]:
    """A client of the store inside `toolreg up` (it answers once `up` runs)."""
    client = ConfigClient(connection, timeout=5)
    await client.start()
    yield client
    await client.close()


def policy_trusting(path: Path, key: Ed25519PrivateKey) -> Path:
    policy = TrustPolicy()
    policy.add(trusted_key("jokes", public_key_text(key.public_key()), ["joke-*"], ["tell-*"]))
    return policy.save(path)


async def tools_json(up: Up) -> dict[str, dict[str, Any]]:
    result = await atoolreg("tools", "--json", env=up.env)
    assert result.returncode == 0, result.stderr
    return {tool["name"]: tool for tool in json.loads(result.stdout)}


async def test_turning_a_trust_policy_on_removes_the_unsigned_services_within_one_ttl(
    up: Up, settings: Settings, connection: Transport, store: ConfigClient, tmp_path: Path
) -> None:
    ttl = 3.0
    key = Ed25519PrivateKey.generate()
    policy = policy_trusting(tmp_path / "trust.json", key)
    first = await up.started_registry("up-open")
    signed = JokeService(settings=settings, ttl=ttl, signing_key=key)
    unsigned = [cls(settings=settings, ttl=ttl) for cls in (CalculatorService, CountdownService, EchoService)]
    services = [signed, *unsigned]
    with structlog.testing.capture_logs() as logs:
        try:
            for service in services:
                await service.start()
            everything = {"tell-joke", "calculate", "countdown", "echo"}
            await eventually(lambda: _is(store, everything), timeout=5.0)

            up.stop(first)
            await up.started_registry("up-trusted", "--trust-policy", str(policy))
            started = time.time()
            # Three of four leases run out together, but their holders are heard (and refused): not held.
            refused = await eventually(lambda: _statuses(connection, "refused", 3), timeout=ttl / 2)
            assert sorted(refused) == ["calculate", "countdown", "echo"]
            assert all("unsigned announcement" in tool.detail for tool in refused.values())
            await eventually(lambda: _is(store, {"tell-joke"}), timeout=ttl + 2.0, interval=0.05)
            removed = time.time() - started
            listed = await tools_json(up)
            assert list(listed) == ["tell-joke"] and listed["tell-joke"]["status"] == "live"
            await asyncio.sleep(ttl)  # and they stay away
            assert await tool_names(store) == {"tell-joke"}
        finally:
            for service in services:
                await service.stop()
    assert up.events("up-trusted", "registry.self_preservation") == []
    expired = {entry["service"]: entry for entry in up.events("up-trusted", "service.expired")}
    assert sorted(expired) == ["calculator", "countdown", "echo"]
    assert all("unsigned" in entry["refused"] for entry in expired.values())
    print(f"\nunsigned services removed {removed:.2f}s after `toolreg up --trust-policy` started (ttl {ttl:g}s)")
    assert removed < ttl + 1.0
    # each refused service was told, in its own log
    told = {entry["service"] for entry in logs if entry["event"] == "service.refused"}
    assert told == {"calculator", "countdown", "echo"}


async def _statuses(connection: Transport, status: str, count: int) -> dict[str, ToolStatus]:
    """The tools the registry inside `toolreg up` lists with `status`, once there are `count` of them (else nothing);
    asked over the broker, so no subprocess start eats into the ttl."""
    client = RegistryClient(connection, timeout=2)
    await client.start()
    try:
        listing = await client.list()
    finally:
        await client.close()
    found = {tool.name: tool for tool in listing.tools if tool.status == status}
    return found if len(found) >= count else {}


async def _is(client: ConfigClient, names: set[str]) -> bool:
    return await tool_names(client) == names


async def test_a_captured_signed_announce_replayed_after_a_registry_restart_does_not_bring_the_tool_back(
    up: Up, connection: Transport, store: ConfigClient, tmp_path: Path
) -> None:
    private, _ = generate_key_pair(tmp_path / "jokes.key")
    policy = policy_trusting(tmp_path / "trust.json", load_private_key(private))
    recorded: list[bytes] = []

    async def record(message: Any) -> None:
        recorded.append(message.data)

    await connection.subscribe(topics.DEFAULT.tool_descriptors, record)
    first = await up.started_registry("up-1", "--trust-policy", str(policy))
    service = up.run(
        "serve", "toolservice_base.examples.joke:JokeService", "--ttl", "20", "--signing-key", str(private), name="joke"
    )
    await eventually(lambda: _is(store, {"tell-joke"}), timeout=START)
    captured = next(data for data in recorded if json.loads(data)["kind"] == "announce")

    service.send_signal(signal.SIGTERM)  # withdraws
    service.wait(15)
    await eventually(lambda: _is(store, set()), timeout=2.0)
    up.stop(first)
    await up.started_registry("up-2", "--trust-policy", str(policy))

    sent_at = json.loads(captured)["sent-at"]
    assert time.time() - sent_at < 20, "the replay must be inside the window the skew check leaves open"
    replayer = await connection.publisher(topics.DEFAULT.tool_descriptors)
    await replayer.send(captured)
    await asyncio.sleep(1.5)  # far more than a merge takes (~50 ms)
    assert await tool_names(store) == set()
    assert "tell-joke" not in await tools_json(up)
    refused = await _rejections_of(up, json.loads(captured)["instance"])
    assert len(refused) == 1 and "withdrew" in refused[0]["reason"], refused


async def _rejections_of(up: Up, instance: str) -> list[dict[str, Any]]:
    result = await atoolreg("rejections", "--json", env=up.env)
    assert result.returncode == 0, result.stderr
    return [r for r in json.loads(result.stdout) if r["instance"] == instance]
