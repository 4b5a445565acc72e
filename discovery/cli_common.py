"""What every `toolreg` command shares: one-line failures, settings, signals, the health server."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from toolservice_base import Settings, ToolDiscoveryError

from .health import HealthError, HealthServer, metrics_address


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


def start_health(port: int | None) -> HealthServer | None:
    """Serve /healthz, /readyz and /metrics if --metrics-port or TOOLREG_METRICS_PORT asks for it."""
    try:
        address = metrics_address(port)
        return HealthServer(*address).start() if address is not None else None
    except HealthError as exc:
        raise CommandError(str(exc)) from None
