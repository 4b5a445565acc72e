"""The config store for a client in its own process: the registry on the store's own replica.

Over the broker, a request to the config queues goes to one consumer of
their shared subscription, whichever the broker picks: a replica frozen
(SIGSTOP, a long pause) after it was replaced keeps its consumer there for
about a minute, and takes every other request. The registry the new active
replica starts must not wait on it (nor be answered by it, once resumed:
with an error, as a deposed store answers), so it asks its own store
directly: `ConfigClient(connection, requests=LocalRequests(...))`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from toolservice_base.errors import RequestTimeout
from toolservice_base.schemas import ConfigRequest

from .service import ConfigStoreService


class LocalRequests:
    """`ConfigClient` requests answered by this process's store (`ConfigStoreService.answer`), as its queues would."""

    def __init__(self, service: Callable[[], ConfigStoreService | None]) -> None:
        """`service`: the store serving now (None while none does: a standby replica, say)."""
        self._service = service

    async def start(self) -> LocalRequests:
        return self

    async def request(self, request: ConfigRequest, *, timeout: float) -> dict[str, Any]:
        service = self._service()
        if service is None:
            raise RequestTimeout("the config store of this process is not serving (it is a standby, or stopped)")
        try:
            async with asyncio.timeout(timeout):
                response = await service.answer(request, local=True)
        except TimeoutError:
            raise RequestTimeout(f"the config store of this process did not answer within {timeout:g}s") from None
        return response.to_trustgraph()

    async def close(self) -> None:
        return None
