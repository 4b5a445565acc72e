"""`toolreg tools --watch` and `toolreg tools --strict`, as real `toolreg` processes against a registry on pulsar-lite.

Services are stood in for by announcements published on `tool-descriptors`
(what a service sends), so each step (an instance more, a tool gone, every
lease silent at once) happens exactly when the test says.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support import atoolreg, eventually, toolreg_env
from support.registry import FAST, announcement

from discovery.broker import EmbeddedBroker
from discovery.registry.client import RegistryClient
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import Publisher, Settings, Transport

ROW = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\s+(ADDED|MODIFIED|DELETED)\s+(.*)$")
WAIT = 15.0
"""Seconds to wait for a line: a `toolreg` process imports Python, pydantic and pulsar-client before its first one."""


class Watch:
    """A running `toolreg tools --watch ...`, read line by line as it prints."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self.notices: list[str] = []

    async def line(self, timeout: float = WAIT) -> str:
        assert self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        assert raw, f"the watch ended (exit {await self.process.wait()}): {await self._stderr()}"
        self.lines.append(raw.decode().rstrip("\n"))
        return self.lines[-1]

    async def until(self, found: Callable[[str], bool], timeout: float = WAIT) -> str:
        async with asyncio.timeout(timeout):
            while not found(line := await self.line(timeout)):
                pass
        return line

    async def quiet(self, seconds: float) -> bool:
        """True if nothing is printed for `seconds`."""
        try:
            await self.line(seconds)
        except TimeoutError:
            return True
        return False

    async def notice(self, text: str, timeout: float = WAIT) -> str:
        """The next `toolreg:` line on stderr containing `text` (log lines are skipped)."""
        assert self.process.stderr is not None
        async with asyncio.timeout(timeout):
            while True:
                raw = await self.process.stderr.readline()
                assert raw, "stderr ended"
                line = raw.decode().rstrip("\n")
                if line.startswith("toolreg: "):
                    self.notices.append(line)
                    if text in line:
                        return line

    async def stop(self, sig: signal.Signals = signal.SIGINT) -> tuple[int, str]:
        self.process.send_signal(sig)
        code = await asyncio.wait_for(self.process.wait(), WAIT)
        return code, await self._stderr()

    async def _stderr(self) -> str:
        assert self.process.stderr is not None
        return (await self.process.stderr.read()).decode()


@pytest.fixture
async def watching(broker: EmbeddedBroker, settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    """Start `toolreg tools --watch` with extra arguments; every one started is killed at the end."""
    started: list[asyncio.subprocess.Process] = []

    async def start(*args: str) -> Watch:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "discovery.cli",
            "tools",
            "--watch",
            *args,
            env=toolreg_env(broker.url or "", settings.data_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        started.append(process)
        return Watch(process)

    yield start
    for process in started:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def announced(
    publisher: Publisher,
    service: str,
    tool: str,
    instance: str,
    *,
    kind: str = "announce",
    sequence: int = 1,
    ttl: float = 30.0,
    workspace: str = "default",
) -> None:
    await publisher.send(
        announcement(
            service, (tool,), instance=instance, kind=kind, sequence=sequence, ttl=ttl, workspace=workspace
        ).to_json()
    )


async def listed(client: RegistryClient, *names: str) -> bool:
    return set(names) <= {tool.name for tool in (await client.list()).tools}


def cells(line: str) -> tuple[str, list[str]]:
    """A watch row's event and its cells after the time: TOOL SERVICE SOURCE STATUS INSTANCES (WHY)."""
    match = ROW.match(line)
    assert match is not None, f"not a watch row: {line!r}"
    return match.group(2), match.group(3).split()


async def test_watch_prints_a_timestamped_row_when_a_tool_comes_changes_or_goes_and_ctrl_c_ends_it_with_0(
    connection: Transport, registry_client: RegistryClient, watching: Callable[..., Any]
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await announced(publisher, "jokes", "tell-joke", "jokes-1")
    await eventually(lambda: listed(registry_client, "tell-joke"), timeout=3.0)

    watch: Watch = await watching("--interval", "0.2")
    assert (await watch.line()).split() == ["TIME", "EVENT", "TOOL", "SERVICE", "SOURCE", "STATUS", "INSTANCES", "WHY"]
    assert cells(await watch.line()) == ("ADDED", ["tell-joke", "jokes", "announced", "live", "1"])
    assert await watch.quiet(1.0)  # polled five times meanwhile: the heartbeat's age grows, and that is no change

    await announced(publisher, "jokes", "tell-joke", "jokes-2")  # a second instance
    assert cells(await watch.line()) == ("MODIFIED", ["tell-joke", "jokes", "announced", "live", "2"])
    await announced(publisher, "echo", "echo", "echo-1")  # a tool comes
    assert cells(await watch.line()) == ("ADDED", ["echo", "echo", "announced", "live", "1"])
    for instance in ("jokes-1", "jokes-2"):  # and one goes
        await announced(publisher, "jokes", "tell-joke", instance, kind="withdraw", sequence=2)
    gone = await watch.until(lambda line: cells(line)[0] == "DELETED")
    assert cells(gone)[1] == ["tell-joke", "jokes", "announced", "-", "-"]  # no longer listed: no status, no instances
    assert all(ROW.match(line) for line in watch.lines[1:])

    code, stderr = await watch.stop(signal.SIGINT)
    assert code == 0, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr


async def test_watch_json_is_one_object_per_change_and_the_watch_outlives_a_registry_restart(
    connection: Transport, config_store: ConfigStoreService, watching: Callable[..., Any]
) -> None:
    registry = Registry(connection, options=FAST)
    await registry.start()
    try:
        publisher = await connection.publisher(connection.topics.tool_descriptors)
        await announced(publisher, "jokes", "tell-joke", "jokes-1")
        async with RegistryClient(connection, timeout=5) as client:
            await eventually(lambda: listed(client, "tell-joke"), timeout=3.0)

        watch: Watch = await watching("--json", "--interval", "0.2", "--timeout", "1")
        first = json.loads(await watch.line())
        assert (first["type"], first["object"]["name"], first["object"]["status"]) == ("ADDED", "tell-joke", "live")
        assert isinstance(first["at"], float)

        await registry.stop()
        lost = await watch.notice("stopped answering")
        assert "still watching" in lost and lost.count("\n") == 0
        registry = Registry(connection, options=FAST)
        await registry.start()
        await watch.notice("answers again")

        await announced(publisher, "echo", "echo", "echo-1")
        came = json.loads(await watch.until(lambda line: json.loads(line)["object"]["name"] == "echo"))
        assert came["type"] == "ADDED" and came["object"]["instances"] == 1
        assert all(json.loads(line)["type"] in ("ADDED", "MODIFIED", "DELETED") for line in watch.lines)

        code, stderr = await watch.stop(signal.SIGTERM)
        assert code == 0 and "Traceback" not in stderr
    finally:
        await registry.stop()


async def test_a_watch_with_no_registry_fails_in_one_line_like_toolreg_tools(
    broker: EmbeddedBroker, settings: Settings
) -> None:
    result = await atoolreg(
        "tools", "--watch", "--timeout", "0.5", env=toolreg_env(broker.url or "", settings.data_dir)
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "toolreg up" in result.stderr


async def four_falling_silent(connection: Transport) -> None:
    """Four services whose leases (3 s) all run out together: self-preservation holds their removal.

    Long enough for a `toolreg` command (about a second to start on a loaded machine) to ask before they run out."""
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    for number in range(4):
        await announced(publisher, f"svc-{number}", f"tool-{number}", f"svc-{number}-1", ttl=3.0)


async def test_strict_exits_3_while_self_preservation_holds_a_removal_and_0_once_released(
    broker: EmbeddedBroker, settings: Settings, connection: Transport, registry: Registry
) -> None:
    env = toolreg_env(broker.url or "", settings.data_dir)
    await four_falling_silent(connection)
    assert (await atoolreg("tools", "--strict", env=env)).returncode == 0  # nothing held yet
    await eventually(lambda: len(registry.held_services()) == 4, timeout=6.0)

    strict = await atoolreg("tools", "--strict", env=env)
    assert strict.returncode == 3, strict.stderr
    assert (
        "self-preservation is holding" in strict.stderr and "tool-0" in strict.stdout
    )  # the listing is printed all the same
    as_json = await atoolreg("tools", "--strict", "--json", env=env)
    assert as_json.returncode == 3 and {t["status"] for t in json.loads(as_json.stdout)} == {"held"}
    assert (await atoolreg("tools", env=env)).returncode == 0  # without --strict, holding is no failure

    assert (await atoolreg("release", env=env)).returncode == 0
    await eventually(lambda: not registry.held_services(), timeout=3.0)
    assert (await atoolreg("tools", "--strict", env=env)).returncode == 0


async def test_a_watch_says_on_stderr_when_a_hold_begins_and_when_it_ends(
    broker: EmbeddedBroker, settings: Settings, connection: Transport, registry: Registry, watching: Callable[..., Any]
) -> None:
    watch: Watch = await watching("--interval", "0.2")
    await watch.line()  # the header: it is watching
    await four_falling_silent(connection)
    held = await watch.notice("self-preservation is holding")
    assert all(f"svc-{number}" in held for number in range(4)) and "toolreg release" in held
    await watch.until(lambda line: cells(line)[1][:4] == ["tool-3", "svc-3", "announced", "held"])
    assert (await atoolreg("release", env=toolreg_env(broker.url or "", settings.data_dir))).returncode == 0
    await watch.notice("holds no removal any more")
    await watch.until(lambda line: cells(line)[0] == "DELETED" and cells(line)[1][0] == "tool-3")


async def test_strict_and_watch_do_not_combine_and_interval_needs_watch(tmp_path: Path) -> None:
    env = toolreg_env("pulsar://127.0.0.1:1", tmp_path)
    both = await atoolreg("tools", "--watch", "--strict", env=env)
    assert both.returncode == 2 and "not allowed with" in both.stderr
    alone = await atoolreg("tools", "--interval", "2", env=env)
    assert alone.returncode == 1 and "--watch" in alone.stderr and alone.stderr.count("\n") == 1
    short = await atoolreg("tools", "--watch", "--interval", "0", env=env)
    assert short.returncode == 2 and "at least 0.1" in short.stderr
