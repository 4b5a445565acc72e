"""`toolreg announce --mcp` as operators run it, and the MCP servers nobody here wrote that it brings in.

`sidecar` starts the command as its own process on the test's broker and returns once it says it announces;
`everything` is `@modelcontextprotocol/server-everything` from npm; `story` and `example` are the official Python
SDK's own example servers (its source distribution's `examples/stories/*/server.py` and `examples/mcpserver/*.py`),
all fetched once into the cache by `scripts/mcp_servers.py`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import mcp_servers
import psutil
import pytest

from toolservice_base import Settings

ROOT = Path(__file__).resolve().parents[2]
ANNOUNCED_WITHIN = 60.0
"""Seconds a sidecar has to print its `announcing` line (the first start of a Node.js server included)."""


def everything() -> mcp_servers.Everything:
    try:
        return mcp_servers.everything()
    except SystemExit as exc:  # the script's one-line refusals (no npm, no Node.js package for this platform)
        pytest.fail(str(exc), pytrace=False)


def examples() -> Path:
    try:
        return mcp_servers.sdk_examples()
    except SystemExit as exc:
        pytest.fail(str(exc), pytrace=False)


def story(name: str, *args: str) -> list[str]:
    """One of the SDK's example stories as a command (run it with `cwd=examples()`); `--http --port N` serves HTTP."""
    return [sys.executable, "-m", f"stories.{name}.server", *args]


def example(name: str) -> list[str]:
    """One of the SDK's `examples/mcpserver/*.py` (FastMCP) as a stdio command; they leave starting to their user."""
    path = examples() / "mcpserver" / f"{name}.py"
    return [sys.executable, "-c", f"import runpy; runpy.run_path({str(path)!r})['mcp'].run()"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def env_of(settings: Settings, **extra: str) -> dict[str, str]:
    env = settings.child_env(TOOLREG_LOG_FORMAT="json", PYTHONUNBUFFERED="1", **extra)
    if settings.auth_token:
        env["PULSAR_AUTH_TOKEN"] = settings.auth_token
    return env


@dataclass
class Sidecar:
    process: asyncio.subprocess.Process
    said: str
    log: Path

    def server_pids(self) -> list[int]:
        """The MCP server command's processes (the sidecar's children)."""
        return [child.pid for child in psutil.Process(self.process.pid).children(recursive=True)]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@asynccontextmanager
async def sidecar(
    settings: Settings, log: Path, *args: str, ttl: float = 3.0, env: dict[str, str] | None = None
) -> AsyncIterator[Sidecar]:
    """`toolreg announce --ttl TTL ARGS` until the exit (then SIGTERM: it must say it withdrew); `env` adds to its
    environment."""
    with open(log, "ab") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "discovery.cli",
            "announce",
            "--ttl",
            f"{ttl:g}",
            *args,
            env=env_of(settings, **(env or {})),
            cwd=str(examples()),
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )
    assert process.stdout is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), ANNOUNCED_WITHIN)).decode()
        assert line.startswith("announcing "), f"{line!r}; see {log}"
        yield Sidecar(process, line, log)
        process.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(process.stdout.read(), 20)).decode()
        assert "withdrawn " in rest, f"{rest!r}; see {log}"
        assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def refused(
    settings: Settings, log: Path, *args: str, timeout: float = 30.0, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """`toolreg announce ARGS` that is expected to stop by itself: (exit code, stdout, stderr); `env` adds to its
    environment."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "discovery.cli",
        "announce",
        *args,
        env=env_of(settings, **{"TOOLREG_LOG_LEVEL": "error", **(env or {})}),
        cwd=str(log.parent),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@asynccontextmanager
async def http_story(name: str, port: int, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """One of the SDK's stories served over streamable HTTP on 127.0.0.1:`port`, ready when this yields."""
    with open(log, "ab") as output:
        process = await asyncio.create_subprocess_exec(
            *story(name, "--http", "--port", str(port)), cwd=str(examples()), stdout=output, stderr=output
        )
    try:
        for _ in range(200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"the story {name} did not listen on {port}; see {log}")
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
