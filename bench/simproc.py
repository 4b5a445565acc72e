"""Driving `bench.sim` (the simulated instances) from the bench's event loop, one line each way."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from .common import ROOT, product_env


class SimProcess:
    """The simulator as a child process; every call waits for its one-line JSON answer."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(
        cls,
        url: str,
        data_dir: Path,
        *,
        services: int,
        instances: int,
        tools: int | str,
        ttl: float,
        prefix: str = "sim",
        topic: str | None = None,
    ) -> "SimProcess":
        """`tools`: per service, N or "LO-HI" (taken in turn)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.sim",
            url,
            "--services",
            str(services),
            "--instances",
            str(instances),
            "--tools",
            str(tools),
            "--ttl",
            str(ttl),
            "--prefix",
            prefix,
            *(["--topic", topic] if topic else []),
            cwd=ROOT,
            env=product_env(url, data_dir),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        sim = cls(proc)
        await sim._answer(timeout=60 + services * instances / 5_000)  # building 100,000 instances takes a few seconds
        return sim

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def _answer(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"bench.sim exited ({await self.proc.wait()})")
        return dict(json.loads(line))

    async def command(self, text: str, timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self._answer(timeout)

    async def announce(self) -> dict[str, Any]:
        return await self.command("announce", 120)

    async def wave(self, rate: float, count: int) -> dict[str, Any]:
        """The next `count` instances start (announce at `rate`/s); later steps heartbeat them too."""
        return await self.command(f"wave {rate:g} {count}", 60 + count / rate)

    async def step(self, rate: float, seconds: float) -> dict[str, Any]:
        return await self.command(f"step {rate:g} {seconds:g}", seconds + 60)

    async def close(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(b"quit\n")
                await self.proc.stdin.drain()
                await asyncio.wait_for(self.proc.wait(), 10)
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                self.proc.kill()
                await self.proc.wait()
