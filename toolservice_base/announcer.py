"""Self-announcement: announce, heartbeat, answer probes, withdraw.

A service's presence on the `tool-descriptors` topic is a lease: it lasts
`ttl` seconds past the last message. Heartbeats every `ttl / 3` keep it alive
through two lost messages; a probe from the registry (after a restart, or when
it meets a digest it does not know) gets a full `announce` back. A probe
carrying `refused` is the registry telling this instance that something it
sent was refused, and why: it is logged (`service.refused`), nothing is sent.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Literal

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import ValidationError

from . import tracing
from .errors import TransportError
from .logs import get_logger
from .schemas import (
    Announcement,
    Probe,
    ToolDescriptor,
    ToolServiceDescriptor,
    descriptor_digest,
)
from .signing import sign
from .transport import Envelope, Publisher, Subscription, Transport, unique_name

log = get_logger("toolservice_base.announcer")


def new_instance_id(service_id: str) -> str:
    """A fresh id per process start, readable in `toolreg tools` output."""
    return f"{service_id[:100]}-{uuid.uuid4().hex[:12]}"


class Announcer:
    """Keeps one instance's lease alive on the `tool-descriptors` topic."""

    def __init__(
        self,
        connection: Transport,
        service: ToolServiceDescriptor,
        tools: list[ToolDescriptor],
        *,
        ttl: float,
        workspace: str = "default",
        version: str = "",
        signing_key: Ed25519PrivateKey | None = None,
        instance: str | None = None,
    ) -> None:
        self._connection = connection
        self._signing_key = signing_key
        self.service = service
        self.tools = tools
        self.ttl = ttl
        self.workspace = workspace
        self.version = version
        self.instance = instance or new_instance_id(service.id)
        self.digest = descriptor_digest(service, tools)
        self._sequence = 0
        self._publisher: Publisher | None = None
        self._probes: Subscription | None = None
        self._scheduler: AsyncIOScheduler | None = None
        self._send_lock = asyncio.Lock()
        self.withdrawn = False

    def _message(self, kind: Literal["announce", "heartbeat", "withdraw"]) -> Announcement:
        self._sequence += 1
        full = kind == "announce"
        return Announcement(
            kind=kind,
            instance=self.instance,
            sequence=self._sequence,
            sent_at=time.time(),
            ttl=self.ttl,
            workspace=self.workspace,
            digest=self.digest,
            service=self.service if full else None,
            tools=self.tools if full else None,
            version=self.version,
        )

    async def _send(self, kind: Literal["announce", "heartbeat", "withdraw"]) -> bool:
        if self._publisher is None:
            return False
        async with self._send_lock:  # sequence order on the wire = sequence order of numbers
            message = self._message(kind)
            if self._signing_key is not None:
                message = sign(message, self._signing_key)
            try:
                if kind == "heartbeat":
                    await self._publisher.send(message.to_json())
                else:  # announce and withdraw change the registry: a span, its traceparent on the message
                    with tracing.announcement(kind, self.service.id, self.instance) as properties:
                        await self._publisher.send(message.to_json(), properties=properties)
            except TransportError as exc:
                log.warning("announce.send_failed", kind=kind, service=self.service.id, error=str(exc))
                return False
        log.debug("announce.sent", kind=kind, service=self.service.id, instance=self.instance, sequence=message.sequence)
        return True

    async def start(self) -> None:
        """Listen for probes first, so a probe racing our start is never missed; then announce."""
        topics = self._connection.topics
        self._publisher = await self._connection.publisher(topics.tool_descriptors)
        self._probes = await self._connection.subscribe(topics.tool_probe, self._on_probe, subscription=unique_name("probe"))
        await self._send("announce")
        self._scheduler = AsyncIOScheduler()
        self._scheduler.add_job(
            self._send,
            "interval",
            args=["heartbeat"],
            seconds=self.ttl / 3,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )
        self._scheduler.start()
        log.info("service.announced", service=self.service.id, instance=self.instance, tools=[t.name for t in self.tools], ttl=self.ttl)

    async def _on_probe(self, message: Envelope) -> None:
        try:
            probe = Probe.model_validate_json(message.data)
        except (ValidationError, ValueError):
            log.debug("probe.ignored", reason="malformed")
            return
        if probe.refused is not None:  # a notice, not a request to re-announce
            if probe.instance == self.instance:
                log.warning("service.refused", service=self.service.id, instance=self.instance, reason=probe.refused)
            return
        if probe.instance in (None, self.instance) and not self.withdrawn:
            await self._send("announce")

    async def withdraw(self) -> None:
        """Tell the registry we are going, before the request consumer closes."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        if not self.withdrawn:
            self.withdrawn = True
            await self._send("withdraw")
            log.info("service.withdrawn", service=self.service.id, instance=self.instance)

    async def stop(self) -> None:
        await self.withdraw()
        if self._probes is not None:
            await self._connection.unsubscribe(self._probes)
            self._probes = None
        if self._publisher is not None:
            await self._connection.close_publisher(self._publisher)
            self._publisher = None
