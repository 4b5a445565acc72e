"""Many tool-service instances from one task: what a production fleet puts on `tool-descriptors`, at a fraction of the
cost.

Each instance behaves on the wire as the product's `Announcer` does: one
`announce` (built from the product's schemas, digest and all), `heartbeat`s
every ttl/3 with a strictly increasing `sequence`, and a fresh `announce`
when the registry probes it (all of them, or it alone). One publisher sends
for all, spread evenly over each heartbeat period, so 500 instances cost a
test a few percent of a core. `silence` stops a service's instances as a
crash would: no withdrawal, just no more messages.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from toolservice_base import Settings, open_transport
from toolservice_base.schemas import Announcement, Probe, ToolDescriptor, ToolServiceDescriptor, descriptor_digest
from toolservice_base.transport import Envelope, Publisher, Transport


@dataclass
class Instance:
    id: str
    service: ToolServiceDescriptor
    tools: list[ToolDescriptor]
    digest: str
    ttl: float
    sequence: int = 0
    silent: bool = False

    def message(self, kind: str) -> str:
        self.sequence += 1
        body = {"service": self.service, "tools": self.tools} if kind == "announce" else {}
        return Announcement(
            kind=kind,
            instance=self.id,
            sequence=self.sequence,
            sent_at=time.time(),
            ttl=self.ttl,
            digest=self.digest,
            **body,  # type: ignore[arg-type]
        ).to_json()


@dataclass
class Fleet:
    """`services` services of one tool each, `instances` instances of each, heartbeating on `settings`' topicspace."""

    settings: Settings
    services: int
    instances: int
    ttl: float
    prefix: str = "fleet"
    members: list[Instance] = field(default_factory=list)
    failed_sends: int = 0
    _connection: Transport | None = None
    _publisher: Publisher | None = None

    def __post_init__(self) -> None:
        topics = self.settings.topics
        for s in range(self.services):
            service_id = f"{self.prefix}-svc-{s}"
            service = ToolServiceDescriptor.model_validate(
                {
                    "id": service_id,
                    "request-queue": topics.request_queue(service_id),
                    "response-queue": topics.response_queue(service_id),
                }
            )
            tools = [
                ToolDescriptor.model_validate(
                    {
                        "type": "tool-service",
                        "name": f"{service_id}-tool",
                        "service": service_id,
                        "description": f"Tool of {service_id}",
                        "arguments": [{"name": "text", "type": "string", "description": "Some text"}],
                    }
                )
            ]
            digest = descriptor_digest(service, tools)
            self.members.extend(
                Instance(f"{service_id}-i{i}", service, tools, digest, self.ttl) for i in range(self.instances)
            )

    def tool_names(self, *, live_only: bool = True) -> set[str]:
        return {inst.tools[0].name for inst in self.members if not (live_only and inst.silent)}

    def silence(self, service_index: int) -> set[str]:
        """Stop every instance of one service (a crash: no withdrawal); the names of its tools."""
        service_id = f"{self.prefix}-svc-{service_index}"
        for inst in self.members:
            if inst.service.id == service_id:
                inst.silent = True
        return {f"{service_id}-tool"}

    async def send(self, inst: Instance, kind: str) -> None:
        assert self._publisher is not None
        try:
            await self._publisher.send(inst.message(kind))
        except Exception:
            self.failed_sends += 1  # a broker outage: the next period sends again, as the Announcer does

    async def _on_probe(self, message: Envelope) -> None:
        try:
            probe = Probe.model_validate_json(message.data)
        except ValueError:
            return
        if probe.refused is not None:
            return
        for inst in self.members:
            if not inst.silent and (probe.instance is None or probe.instance == inst.id):
                await self.send(inst, "announce")

    async def run(self, stop: asyncio.Event) -> None:
        """Announce every instance, then heartbeat each every ttl/3, spread evenly, until `stop`."""
        for inst in self.members:
            await self.send(inst, "announce")
        period = self.ttl / 3
        while not stop.is_set():
            started = time.monotonic()
            for number, inst in enumerate(self.members):
                if stop.is_set():
                    return
                if not inst.silent:
                    await self.send(inst, "heartbeat")
                due = started + period * (number + 1) / len(self.members)
                if (wait := due - time.monotonic()) > 0:
                    await asyncio.sleep(wait)


@asynccontextmanager
async def running_fleet(settings: Settings, *, services: int, instances: int, ttl: float) -> AsyncIterator[Fleet]:
    """A `Fleet` heartbeating (and answering probes) for the duration of the block."""
    fleet = Fleet(settings, services, instances, ttl)
    connection = await open_transport(settings)
    stop = asyncio.Event()
    try:
        fleet._connection = connection
        fleet._publisher = await connection.publisher(connection.topics.tool_descriptors)
        await connection.subscribe(connection.topics.tool_probe, fleet._on_probe)
        task = asyncio.create_task(fleet.run(stop))
        try:
            yield fleet
        finally:
            stop.set()
            await task
    finally:
        await connection.close()
