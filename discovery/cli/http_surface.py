"""The HTTP surface of a long-running command: /healthz, /readyz, /metrics and the registry page."""

from __future__ import annotations

from contextlib import AsyncExitStack

from discovery.web.health import HealthError, HealthServer, metrics_address
from discovery.web.page import SnapshotSource, serve_registry_page
from discovery.web.settings import HttpSettings

from .common import CommandError


async def start_health(
    stack: AsyncExitStack, port: int | None, settings: HttpSettings | None = None
) -> HealthServer | None:
    """Serve /healthz, /readyz and /metrics if --metrics-port or TOOLREG_METRICS_PORT asks for it; stopped by
    `stack`. `settings`: the environment's, read by a command before it reaches for the broker (read now if None)."""
    try:
        address = metrics_address(port, settings)
        return await stack.enter_async_context(HealthServer(*address)) if address is not None else None
    except HealthError as exc:
        raise CommandError(str(exc)) from None


def show_registry_page(health: HealthServer, overview: SnapshotSource) -> str:
    """Serve the registry page beside /metrics; returns the line `toolreg` prints about it."""
    return serve_registry_page(health, overview)
