"""`toolreg up` on a data directory it cannot write, and under a disk that fills up while it runs.

At start: one line naming the directory, the cause (read-only file system, no
space left on device) and the fix, never a traceback, never "pulsar-lite
exited at start: no output", never the advice to restore a backup; nothing
left running and nothing lost. While running: `/readyz` says the store cannot
write, every refused write says why, `toolreg tools` shows an announced tool
that could not be written and why; all of it clears by itself once space is
freed. Real processes on real (small tmpfs) file systems: see `support.mounts`.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import atoolreg, eventually, toolreg, toolreg_env
from support.mounts import fill, free, read_only, small_tmpfs

from discovery.broker import EmbeddedBroker
from discovery.broker.embedded import CONFIG
from discovery.errors import BrokerError
from discovery.store import backup as store_backup
from discovery.store.sqlite import ConfigStore
from toolservice_base import Settings
from toolservice_base.examples.joke import JokeService


def without_broker(data: Path) -> dict[str, str]:
    """`toolreg up` as on a laptop: no PULSAR_URL, so it runs its own broker in the data directory."""
    env = toolreg_env("", data)
    env.pop("PULSAR_URL")
    return env


def stored(data: Path, notes: int = 20) -> int:
    store = ConfigStore(data / "config.sqlite")
    store.put("default", [("note", f"n{i:02d}", "{}") for i in range(notes)])
    version = store.version
    store.close()
    return version


def items_after(data: Path) -> tuple[int, int]:
    store = ConfigStore(data / "config.sqlite")
    try:
        return store.version, len(store.list("default", "note"))
    finally:
        store.close()


def the_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a `toolreg` that failed as it should: exit 1, no traceback."""
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("toolreg:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def brokers_on(data: Path) -> list[int]:
    """Pids of pulsar-lite processes keeping their data in `data`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(b"pulsar-lite" in part for part in command[:1]) and str(data).encode() in b" ".join(command):
                found.append(int(entry.name))
    return found


def test_toolreg_up_on_a_read_only_data_directory_says_so_and_not_to_restore_a_backup(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "data") as data:
        version = stored(data)
        store_backup.take_backup(
            data / "config.sqlite"
        )  # a backup at hand: restoring it would roll back every write since
        with read_only(data):
            line = the_line(toolreg("up", env=without_broker(data), timeout=60))
        assert str(data) in line and "read-only file system" in line and "mount or permissions" in line, line
        assert "do not restore a backup" in line and "toolreg store restore" not in line and "corrupt" not in line, line
        assert brokers_on(data) == []
        assert items_after(data) == (version, 20)


def test_toolreg_up_on_a_full_disk_says_so_in_one_line_and_leaves_nothing_running(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "data") as data:
        version = stored(data)
        fill(data)
        started = time.monotonic()
        line = the_line(toolreg("up", env=without_broker(data), timeout=60))
        assert time.monotonic() - started < 30  # nothing hung
        assert str(data) in line and "no space left on device" in line and "free space" in line, line
        assert "exited at start" not in line and "no output" not in line and "do not restore a backup" in line, line
        assert brokers_on(data) == []
        free(data)
        assert items_after(data) == (version, 20)


def test_the_embedded_broker_on_a_full_disk_names_the_cause_not_no_output(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "data") as data:
        broker = EmbeddedBroker(data)
        broker.config_file.write_text(CONFIG)  # as a previous run left it: rewriting it needs no new space
        fill(data)
        with pytest.raises(BrokerError) as caught:
            broker.start(timeout=10)
        message = str(caught.value)
        assert "cannot write the embedded broker's data" in message and "no space left on device" in message, message
        assert "no output" not in message
        assert not broker.alive() and brokers_on(data) == []


def readyz(base: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())
    except (urllib.error.URLError, OSError):
        return 0, {}


async def tools(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    done = await atoolreg("tools", "--json", env=env)
    assert done.returncode == 0, done.stderr
    return {tool["name"]: tool for tool in json.loads(done.stdout)}


async def test_a_disk_that_fills_up_under_toolreg_up_shows_on_readyz_in_writes_and_in_toolreg_tools(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    with small_tmpfs(tmp_path / "data", size="2m") as data:
        env = toolreg_env(broker.url or "", data)
        log = tmp_path / "up.log"
        with open(log, "wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "discovery.cli",
                "up",
                "--metrics-port",
                "0",
                env=env,
                stdout=subprocess.PIPE,
                stderr=out,
                stdin=subprocess.DEVNULL,
            )
        service = JokeService(
            settings=Settings(data_dir=tmp_path / "service", pulsar_url=broker.url, broker="pulsar-lite")
        )
        try:
            assert process.stdout is not None
            found = re.search(r"(http://\S+)/metrics", (await process.stdout.readline()).decode())
            assert found, log.read_text()[-2000:]
            base = found.group(1)
            await eventually(lambda: readyz(base)[0] == 200, timeout=30, explain=lambda: log.read_text()[-2000:])

            fill(data)
            status, body = await eventually(lambda: (answer := readyz(base))[0] == 503 and answer, timeout=10)
            assert "no space left on device" in body["checks"]["config-store"], body

            await service.start()  # announced while the store cannot write: the registry cannot merge it
            listed = await eventually(lambda: _tool(env, "tell-joke"), timeout=15)
            assert listed["status"] == "unwritten" and "no space left on device" in listed["detail"], listed

            refused = await atoolreg("config", "put", "note/x", input="{}", env=env)
            line = the_line(refused)
            assert "no space left on device" in line and "do not restore a backup" in line, line

            free(data)
            await eventually(lambda: readyz(base)[0] == 200, timeout=10, explain=lambda: readyz(base))
            live = await eventually(lambda: _tool(env, "tell-joke", status="live"), timeout=15)
            assert live["detail"] == ""
            assert (await atoolreg("config", "put", "note/x", input="{}", env=env)).returncode == 0
            assert process.returncode is None  # it ran through all of it
        finally:
            await service.stop()
            process.send_signal(signal.SIGTERM)
            try:
                assert await asyncio.wait_for(process.wait(), 30) == 0, log.read_text()[-2000:]
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()


async def _tool(env: dict[str, str], name: str, status: str | None = None) -> dict[str, Any] | None:
    tool = (await tools(env)).get(name)
    return tool if tool is not None and (status is None or tool["status"] == status) else None
