"""What every `toolreg` command shares: one-line failures, settings, signals, the health server."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from contextlib import AsyncExitStack

from toolservice_base import Settings, ToolDiscoveryError

from .health import HealthError, HealthServer, metrics_address
from .page import serve_registry_page
from .registry import Registry


class CommandError(ToolDiscoveryError):
    """A failure the user can fix; printed as one line, exit code 1."""


def fail(message: str) -> int:
    print(f"toolreg: {message}", file=sys.stderr)
    return 1


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings.from_env(data_dir=getattr(args, "data_dir", None), topicspace=getattr(args, "topicspace", None))


async def wait_for_signal() -> None:
    """Return on the first SIGTERM or SIGINT (Ctrl-C)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def start_health(stack: AsyncExitStack, port: int | None) -> HealthServer | None:
    """Serve /healthz, /readyz and /metrics if --metrics-port or TOOLREG_METRICS_PORT asks for it; stopped by `stack`."""
    try:
        address = metrics_address(port)
        return await stack.enter_async_context(HealthServer(*address)) if address is not None else None
    except HealthError as exc:
        raise CommandError(str(exc)) from None


def show_registry_page(health: HealthServer, registry: Registry) -> str:
    """Serve the registry page beside /metrics; returns the line `toolreg` prints about it."""
    return serve_registry_page(health, registry.overview)
