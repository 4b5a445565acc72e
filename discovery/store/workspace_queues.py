"""The config store's per-workspace queues (`request/config:<workspace>`), opened and closed as workspaces come and go.

TrustGraph's API gateway asks a workspace's own queue, the workspace taken
from the queue's name, not from the request; the store answers there as
TrustGraph's does, beside its system queue. Which workspaces exist changes
with writes (`Outcome.opened`, `Outcome.closed`), but a request is not kept
waiting while a queue is opened at the broker: the change is queued here and
one task opens and closes the queues in the order the workspaces came and
went. What a request on any of them does is the store's (`service`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from toolservice_base.errors import TransportError
from toolservice_base.logs import get_logger
from toolservice_base.rpc import RequestServer
from toolservice_base.tasks import cancel_and_wait
from toolservice_base.topics import Topics
from toolservice_base.transport import Envelope, Transport

log = get_logger("discovery.store")

Handler = Callable[[Envelope, Any, str], Awaitable[None]]
"""Serve one request that came on a workspace's queue: (message, reply, the workspace)."""


def workspace_queues(topics: Topics, workspace: str) -> tuple[str, str]:
    """A workspace's own request and response queues, named as TrustGraph names them (`<base>:<workspace>`)."""
    return f"{topics.config_request}:{workspace}", f"{topics.config_response}:{workspace}"


class WorkspaceQueues:
    """One request server per workspace answered on its own queue, and the task that opens and closes them."""

    def __init__(
        self,
        connection: Transport,
        handle: Handler,
        *,
        subscription: str,
        too_large: Callable[[str], dict[str, Any]],
    ) -> None:
        self._connection = connection
        self._handle = handle
        self._subscription = subscription
        self._too_large = too_large
        self._servers: dict[str, RequestServer] = {}
        self._changes: asyncio.Queue[tuple[bool, str]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    @property
    def workspaces(self) -> list[str]:
        """Workspaces answered on their own queue now."""
        return sorted(self._servers)

    async def start(self, workspaces: list[str]) -> None:
        """Open the queues of the workspaces there are now, then follow the changes (`came`, `went`)."""
        for workspace in workspaces:
            await self._open(workspace)
        self._task = asyncio.create_task(self._follow(), name="config-workspace-queues")

    def came(self, workspace: str) -> None:
        """A write made `workspace`: open its queue, after the changes before it."""
        self._changes.put_nowait((True, workspace))

    def went(self, workspace: str) -> None:
        """A write emptied `workspace`: close its queue, after the changes before it."""
        self._changes.put_nowait((False, workspace))

    async def close(self) -> None:
        """Stop following changes and close every queue. Safe twice, and after a start that failed half-way."""
        await cancel_and_wait(self._task)
        self._task = None
        for workspace in list(self._servers):
            await self._close(workspace)

    async def _open(self, workspace: str) -> None:
        if workspace in self._servers:
            return
        request_queue, response_queue = workspace_queues(self._connection.topics, workspace)

        async def on_request(message: Envelope, reply: Any) -> None:
            await self._handle(message, reply, workspace)

        server = RequestServer(
            self._connection,
            request_queue,
            response_queue,
            on_request,
            subscription=self._subscription,
            too_large=self._too_large,
        )
        await server.start()
        self._servers[workspace] = server
        log.info("config.workspace_queue_opened", workspace=workspace, queue=request_queue)

    async def _close(self, workspace: str) -> None:
        server = self._servers.pop(workspace, None)
        if server is not None:
            await server.stop(timeout=2.0)
            log.info("config.workspace_queue_closed", workspace=workspace)

    async def _follow(self) -> None:
        """Open and close workspace queues in the order workspaces came and went, off the request path."""
        while True:
            opening, workspace = await self._changes.get()
            try:
                if opening:
                    await self._open(workspace)
                else:
                    await self._close(workspace)
            except TransportError as exc:
                log.warning("config.workspace_queue_failed", workspace=workspace, opening=opening, error=str(exc))
