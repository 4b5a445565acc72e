"""What every `toolreg` command shares: one-line failures, settings, signals, lazily loaded handlers.

Nothing here imports a subsystem: `toolreg trust list` must not load the
registry, the store or the web stack.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import importlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from toolservice_base import Settings, ToolDiscoveryError


class CommandError(ToolDiscoveryError):
    """A failure the user can fix; printed as one line, exit code 1."""


def fail(message: str) -> int:
    print(f"toolreg: {message}", file=sys.stderr)
    return 1


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings.from_env(data_dir=getattr(args, "data_dir", None), topicspace=getattr(args, "topicspace", None))


async def wait_for_signal(*watched: asyncio.Future[Any]) -> None:
    """Return on the first SIGTERM or SIGINT (Ctrl-C), or raise what a `watched` task raised if one ends first.

    A watched task is one the command cannot run without (the broker's
    supervisor): when it gives up, the command stops with its error.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({stopping, *watched}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopping:
                task.result()  # raises what ended it
    finally:
        stopping.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


class UpLock:
    """One `toolreg up` per data directory: a second would run a second registry."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "up.lock"
        self._file = open(self.path, "a+")

    def acquire(self, what_to_do: str = "stop it or use another --data-dir") -> None:
        """Hold the lock (and write our pid in it), or fail in one line ending with `what_to_do`."""
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            pid = self._file.read().strip() or "?"
            raise CommandError(f"`toolreg up` is already running for {self.path.parent} (pid {pid}); {what_to_do}") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(str(os.getpid()))
        self._file.flush()

    def release(self) -> None:
        self._file.close()


Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def lazy(module: str, name: str) -> Handler:
    """A command's handler, imported from `discovery.cli.<module>` only when that command runs.

    The parser names every command, but building it loads no subsystem: each
    command pays only for what it uses.
    """

    async def handler(args: argparse.Namespace) -> int:
        target: Handler = getattr(importlib.import_module(f"discovery.cli.{module}"), name)
        return await target(args)

    handler.__qualname__ = f"lazy({module}.{name})"
    return handler
