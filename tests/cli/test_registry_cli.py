"""The registry with real processes: `toolreg serve`, `toolreg registry`, kill -9, SIGTERM, a broker restart.

The broker and the config store run in the test process (fixtures); services
and, where a crash is the point, the registry run as `toolreg` subprocesses.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support import atoolreg, eventually, toolreg_background, toolreg_env
from support.store import has_tools, lacks_tools, tool_names

from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, Transport, topics
from toolservice_base.examples.joke import JokeService
from toolservice_base.schemas import ToolDescriptor

TTL = 2.0
JOKE = "toolservice_base.examples.joke:JokeService"
ECHO = "toolservice_base.examples.echo:EchoService"
CALCULATOR = "toolservice_base.examples.calculator:CalculatorService"
COUNTDOWN = "toolservice_base.examples.countdown:CountdownService"
START = 15.0  # generous: a subprocess has to import Python, pydantic and pulsar-client first


class Processes:
    """`toolreg` subprocesses of one test, all killed at the end whatever happens."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def run(self, *args: str, name: str) -> subprocess.Popen[bytes]:
        process = toolreg_background(*args, env=self.env, log=self.logs / f"{name}.log")
        self.started.append(process)
        return process

    def serve(self, target: str, name: str, ttl: float = TTL) -> subprocess.Popen[bytes]:
        return self.run("serve", target, "--ttl", str(ttl), name=name)

    def log(self, name: str) -> list[dict[str, Any]]:
        entries = []
        for line in (self.logs / f"{name}.log").read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
        return entries

    def event_time(self, name: str, event: str) -> float:
        entry = next(e for e in self.log(name) if e.get("event") == event)
        return datetime.fromisoformat(entry["timestamp"]).timestamp()

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.fixture
def procs(broker: EmbeddedBroker, settings: Settings, tmp_path: Path) -> Iterator[Processes]:
    logs = tmp_path / "logs"
    logs.mkdir()
    processes = Processes(toolreg_env(broker.url or "", settings.data_dir), logs)
    yield processes
    processes.stop_all()


async def tools_json(procs: Processes, *extra: str) -> dict[str, dict[str, Any]]:
    result = await atoolreg("tools", "--json", *extra, env=procs.env)
    assert result.returncode == 0, result.stderr
    return {tool["name"]: tool for tool in json.loads(result.stdout)}


def kill9(process: subprocess.Popen[bytes]) -> float:
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    return time.monotonic()


async def test_a_served_service_is_listed_within_a_second_and_kill_9_removes_it_within_ttl_plus_one(
    procs: Processes, config_client: ConfigClient, registry: Registry
) -> None:
    service = procs.serve(JOKE, "joke")
    await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=START, interval=0.01)
    listed_at = time.time()
    assert listed_at - procs.event_time("joke", "service.listening") < 1.0
    tool = (await tools_json(procs))["tell-joke"]
    assert (tool["service"], tool["source"], tool["status"], tool["instances"]) == (
        "joke-service",
        "announced",
        "live",
        1,
    )
    await asyncio.sleep(TTL)  # alive past one ttl: heartbeats work across processes
    assert await has_tools(config_client, "tell-joke")

    killed = kill9(service)
    await eventually(lambda: lacks_tools(config_client, "tell-joke"), timeout=TTL + 1.0)
    assert time.monotonic() - killed < TTL + 1.0
    assert await config_client.list("tool-service") == [] and await config_client.list("discovery") == []


async def test_sigterm_withdraws_and_removes_within_a_second(
    procs: Processes, config_client: ConfigClient, registry: Registry
) -> None:
    service = procs.serve(JOKE, "joke", ttl=30)
    await eventually(lambda: has_tools(config_client, "tell-joke"), timeout=START)
    service.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    await eventually(lambda: lacks_tools(config_client, "tell-joke"), timeout=1.0)
    assert time.monotonic() - stopped < 1.0
    service.wait(10)  # and it exits by itself (its exit status is pulsar-client's business: see the report)


async def test_two_instances_killing_one_keeps_the_tool_killing_both_removes_it(
    procs: Processes, config_client: ConfigClient, registry: Registry
) -> None:
    first, second = procs.serve(JOKE, "joke-1"), procs.serve(JOKE, "joke-2")
    await eventually(lambda: _instances(registry, 2), timeout=START)
    kill9(first)
    await eventually(lambda: _instances(registry, 1), timeout=TTL + 1.0)
    await asyncio.sleep(TTL / 2)
    assert await has_tools(config_client, "tell-joke")
    killed = kill9(second)
    await eventually(lambda: lacks_tools(config_client, "tell-joke"), timeout=TTL + 1.0)
    assert time.monotonic() - killed < TTL + 1.0


async def _instances(registry: Registry, count: int) -> bool:
    tools = {t.name: t for t in await registry.list_tools()}
    return "tell-joke" in tools and tools["tell-joke"].instances == count


async def test_the_registry_killed_and_restarted_keeps_static_and_live_tools_and_drops_the_dead(
    procs: Processes, connection: Transport, config_client: ConfigClient, config_store: ConfigStoreService
) -> None:
    static = ToolDescriptor(name="by-hand", description="Wired by hand", service="elsewhere").to_json()
    await config_client.put([("tool", "by-hand", static)])
    first_registry = procs.run("registry", name="registry-1")
    procs.serve(JOKE, "joke")
    echo = procs.serve(ECHO, "echo")
    await eventually(lambda: has_tools(config_client, "tell-joke", "echo"), timeout=START)

    missing: list[set[str]] = []

    async def watch() -> None:  # the live tool and the static one must never blink
        while True:
            names = await tool_names(config_client)
            if not {"by-hand", "tell-joke"} <= names:
                missing.append(names)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        kill9(first_registry)
        kill9(echo)  # dies while no registry runs
        await asyncio.sleep(0.5)
        procs.run("registry", name="registry-2")
        await eventually(lambda: lacks_tools(config_client, "echo"), timeout=START + TTL)
        restarted = procs.event_time("registry-2", "registry.started")

        def removal() -> list[dict[str, Any]]:  # logged once its write returned: a moment after the store shows it
            return [e for e in procs.log("registry-2") if e.get("event") == "tool.removed" and e.get("tool") == "echo"]

        removed = (await eventually(removal, timeout=5.0))[0]
        assert (
            datetime.fromisoformat(removed["timestamp"]).timestamp() - restarted < TTL + 1.0
        )  # one ttl of grace, then gone
        tools = await tools_json(procs)
        assert (tools["tell-joke"]["source"], tools["tell-joke"]["status"]) == ("announced", "live")
        assert (tools["by-hand"]["source"], "echo" in tools) == ("static", False)
    finally:
        watcher.cancel()
    assert missing == []
    assert (await config_client.get([("tool", "by-hand")]))[("tool", "by-hand")] == static


async def test_a_second_registry_on_pulsar_lite_refuses_in_one_line_naming_the_first_which_keeps_running(
    procs: Processes, config_store: ConfigStoreService
) -> None:
    first = procs.run("registry", name="first")
    await eventually(
        lambda: "registry listening" in (procs.logs / "first.log").read_text(),
        timeout=START,
        explain=lambda: (procs.logs / "first.log").read_text()[-2000:],
    )
    second = await atoolreg("registry", env=procs.env, timeout=60)
    assert second.returncode == 1
    line = second.stderr.strip().splitlines()[-1]
    assert "another registry already runs on this topicspace" in line and f"pid {first.pid}" in line
    assert first.poll() is None


async def test_a_registry_pointed_at_pulsar_lite_as_if_it_were_apache_pulsar_says_to_set_toolreg_broker(
    procs: Processes, config_store: ConfigStoreService
) -> None:
    """PULSAR_URL alone reads as Apache Pulsar; the registry group then needs what pulsar-lite lacks, and says which
    setting fixes it."""
    env = {**procs.env}
    del env["TOOLREG_BROKER"]
    done = await atoolreg("registry", env=env, timeout=60)
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert "set TOOLREG_BROKER=pulsar-lite" in line and "UnknownError" in line, line


async def test_a_broker_restart_longer_than_the_ttl_removes_no_tool_and_the_leases_renew_after_it(
    procs: Processes, broker: EmbeddedBroker, config_client: ConfigClient, registry: Registry
) -> None:
    procs.serve(JOKE, "joke")
    procs.serve(ECHO, "echo")
    await eventually(lambda: has_tools(config_client, "tell-joke", "echo"), timeout=START)
    version, _ = await config_client.snapshot([])
    expiries = _expiries(registry)
    port = broker.port
    broker.stop()
    await asyncio.sleep(2 * TTL)  # every lease runs out unheard: the registry cannot hear, so it expires none
    broker.start(port=port)
    restarted = time.monotonic()
    await eventually(
        lambda: _heard_since(procs, time.monotonic() - restarted, {"tell-joke", "echo"}), timeout=15.0, interval=0.2
    )
    assert (await config_client.snapshot([]))[0] == version  # nothing was removed and written again
    assert _expiries(registry) == expiries


def _expiries(registry: Registry) -> float:
    return registry.metrics.registry.get_sample_value("toolreg_registry_expiries_total") or 0.0


async def _heard_since(procs: Processes, seconds: float, names: set[str]) -> bool:
    """Every tool in `names` is live, with a heartbeat heard within the last `seconds`."""
    try:
        tools = await tools_json(procs)
    except AssertionError:  # the registry's answers may still be lost while the broker comes back
        return False
    return all(
        name in tools and tools[name]["status"] == "live" and tools[name]["last_heartbeat_age"] < seconds
        for name in names
    )


async def test_self_preservation_holds_when_most_services_die_at_once_until_toolreg_release(
    procs: Processes, config_client: ConfigClient, registry: Registry
) -> None:
    services = [procs.serve(target, target.rsplit(":", 1)[1]) for target in (JOKE, ECHO, CALCULATOR, COUNTDOWN)]
    await eventually(lambda: has_tools(config_client, "tell-joke", "echo", "calculate", "countdown"), timeout=START)
    for service in services:
        kill9(service)
    await eventually(lambda: len(registry.held_services()) == 4, timeout=TTL + 1.0)
    await asyncio.sleep(TTL / 2)
    assert len(await tool_names(config_client)) == 4
    result = await atoolreg("tools", "--json", env=procs.env)
    assert {t["status"] for t in json.loads(result.stdout)} == {"held"}
    assert "toolreg release" in result.stderr and result.stderr.count("\n") == 1

    released = await atoolreg("release", env=procs.env)
    assert released.returncode == 0 and "released 4 service(s)" in released.stdout
    done = time.monotonic()
    await eventually(lambda: lacks_tools(config_client, "tell-joke", "echo", "calculate", "countdown"), timeout=1.0)
    assert time.monotonic() - done < 1.0


async def test_conflicts_and_rejections_are_shown_by_the_cli(
    procs: Processes, settings: Settings, connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    static = ToolDescriptor(name="tell-joke", description="By hand", service="joke-service").to_json()
    await config_client.put([("tool", "tell-joke", static)])
    publisher = await connection.publisher(topics.DEFAULT.tool_descriptors)
    await publisher.send(b"definitely not json")
    async with JokeService(settings=settings, ttl=TTL):
        await eventually(lambda: registry.conflicts(), timeout=1.0)
        result = await atoolreg("conflicts", "--json", env=procs.env)
        assert result.returncode == 0, result.stderr
        assert [(c["tool"], c["service"], c["held_by"]) for c in json.loads(result.stdout)] == [
            ("tell-joke", "joke-service", "static")
        ]
        table = await atoolreg("conflicts", env=procs.env)
        assert "tell-joke" in table.stdout and "static wins" in table.stdout
        tools = await atoolreg("tools", env=procs.env)
        assert tools.stdout.splitlines()[0].split() == [
            "TOOL",
            "SERVICE",
            "SOURCE",
            "STATUS",
            "INSTANCES",
            "LAST",
            "HEARTBEAT",
            "WHY",
        ]
        assert tools.stdout.splitlines()[1].split()[:4] == ["tell-joke", "joke-service", "static", "configured"]
    rejected = await atoolreg("rejections", "--json", env=procs.env)
    assert rejected.returncode == 0 and "not a valid announcement" in json.loads(rejected.stdout)[0]["reason"]


async def test_without_a_registry_the_cli_says_what_to_run_in_one_line(procs: Processes) -> None:
    for command in (["tools"], ["tools", "--json"], ["rejections"], ["conflicts"], ["release"]):
        result = await atoolreg(*command, "--timeout", "0.5", env=procs.env)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and "toolreg up" in result.stderr and "toolreg registry" in result.stderr


async def test_without_a_broker_the_cli_says_what_to_do_in_one_line(tmp_path: Path) -> None:
    env = toolreg_env("", tmp_path)
    env.pop("PULSAR_URL")
    for command in (["tools"], ["registry"]):
        result = await atoolreg(*command, env=env)
        assert result.returncode == 1 and result.stderr.count("\n") == 1 and "toolreg up" in result.stderr


async def test_a_missing_trust_policy_stops_the_registry_with_one_line(tmp_path: Path) -> None:
    result = await atoolreg(
        "registry", "--trust-policy", str(tmp_path / "nope.json"), env=toolreg_env("pulsar://127.0.0.1:1", tmp_path)
    )
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "toolreg trust add" in result.stderr
