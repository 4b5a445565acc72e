"""Helpers shared by the tests (imported as `support`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from toolservice_base import DynamicToolService

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T] | T],
    timeout: float = 5.0,
    interval: float = 0.02,
    explain: Callable[[], Awaitable[object] | object] | None = None,
) -> T:
    """Poll `check` until it returns something truthy; fail with its last value, or with what `explain` says then."""
    deadline = time.monotonic() + timeout
    while True:
        result = await _value(check)
        if result:
            return result
        if time.monotonic() > deadline:
            said = f"last value: {result!r}" if explain is None else await _value(explain)
            raise AssertionError(f"condition not met within {timeout}s; {said}")
        await asyncio.sleep(interval)


async def _value(call: Callable[[], Any]) -> Any:
    result = call()
    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
        result = await result
    return result


def toolreg_env(url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    env.update(
        PULSAR_URL=url,
        TOOLREG_BROKER="pulsar-lite",
        TOOLREG_DATA_DIR=str(data_dir),
        TOOLREG_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def toolreg(
    *args: str, env: dict[str, str], input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would (`python -m discovery.cli` = the `toolreg` script)."""
    return subprocess.run(
        [sys.executable, "-m", "discovery.cli", *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def atoolreg(
    *args: str, env: dict[str, str], input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`toolreg` as a subprocess without blocking the event loop (in-process services keep serving)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "discovery.cli",
        *args,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(input.encode() if input is not None else None), timeout)
    return subprocess.CompletedProcess(list(args), proc.returncode or 0, out.decode(), err.decode())


def toolreg_background(
    *args: str, env: dict[str, str], log: Path, program: Sequence[str] = (sys.executable, "-m", "discovery.cli")
) -> subprocess.Popen[bytes]:
    """`toolreg ARGS` in the background, logging to `log`; `program` runs it another way (with a fault injected)."""
    handle = open(log, "ab")
    try:
        return subprocess.Popen(
            [*program, *args],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    finally:
        handle.close()


def log_events(text: str, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of `text` (a process's structured log) whose `event` is `event`; other lines are skipped."""
    found = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event:
            found.append(entry)
    return found


def static_items(*services: DynamicToolService) -> list[tuple[str, str, str]]:
    """The static path: the `tool-service` and `tool` items an operator would write for `services`."""
    out = [("tool-service", s.id, s.service_descriptor.to_json()) for s in services]
    return out + [("tool", t.name, t.to_json()) for s in services for t in s.tool_descriptors]
