"""Why a tool an agent cannot find may still be there: held by pinning, waiting for `toolreg approve`.

With `--pin-definitions`, a tool whose definition changed while no instance
offers the pinned one any more is left out of the store until an operator
decides, so no agent sees it. To the caller who looks it up by name it would
just be unknown; the registry lists it as `held` (`state.held_statuses`), so
`toolreg call` and the MCP front ask it, only when a name is not found, and
give its pointer to `toolreg pending` instead of "no tool".
"""

from __future__ import annotations

import asyncio
import re
import time
from contextlib import AsyncExitStack

from discovery.errors import RegistryQueryError, RegistryUnavailable
from discovery.registry.client import RegistryClient
from discovery.registry.state import HELD_BY_PIN
from toolservice_base import Settings, open_transport
from toolservice_base.errors import TransportError
from toolservice_base.logs import get_logger
from toolservice_base.schemas import NAME_PATTERN

log = get_logger("discovery.cli")

ASK_TIMEOUT = 1.0
"""Seconds to wait for the registry's answer: the lookup is on a path that is already failing."""
QUIET_AFTER_SILENCE = 30.0
"""Seconds a lookup that found no registry is not tried again (an MCP client calling unknown names in a loop)."""


class HeldLookup:
    """Asks the registry whether an unknown tool name is held; connects on first use, closed with `close`."""

    def __init__(self, settings: Settings, workspace: str, *, timeout: float = ASK_TIMEOUT) -> None:
        self._settings = settings
        self._workspace = workspace
        self._timeout = timeout
        self._stack = AsyncExitStack()
        self._client: RegistryClient | None = None
        self._silent_until = 0.0
        self._lock = asyncio.Lock()

    async def explain(self, name: str) -> str | None:
        """One line if the registry lists `name` as held by pinning in this workspace; None otherwise (or no answer)."""
        if time.monotonic() < self._silent_until or not re.fullmatch(NAME_PATTERN, name):
            return None  # (no tool has a name outside the pattern, so none is held; the registry would refuse to ask)
        try:
            client = await self._connected()
            status = await client.get(name, self._workspace)
        except (RegistryUnavailable, RegistryQueryError, TransportError, TimeoutError) as exc:
            log.debug("held.lookup_failed", tool=name, error=str(exc))
            self._silent_until = time.monotonic() + QUIET_AFTER_SILENCE
            return None
        if status is None or status.status != HELD_BY_PIN:  # (a service self-preservation holds is still in the store)
            return None
        return f"tool {name!r} is held in workspace {self._workspace!r}: {status.detail}"

    async def _connected(self) -> RegistryClient:
        async with self._lock:
            if self._client is None:
                async with asyncio.timeout(self._timeout):
                    connection = await open_transport(self._settings)
                    self._stack.push_async_callback(connection.close)
                    client = RegistryClient(connection, timeout=self._timeout)
                    self._stack.push_async_callback(client.close)
                    await client.start()
                self._client = client
            return self._client

    async def close(self) -> None:
        await self._stack.aclose()
