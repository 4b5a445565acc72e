"""Helpers for the registry tests (imported as `registry_support`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from discovery.registry.service import RegistryOptions
from toolservice_base import DynamicToolService
from toolservice_base.schemas import (
    Announcement,
    ToolDescriptor,
    ToolServiceDescriptor,
    descriptor_digest,
)

FAST = RegistryOptions(sweep_interval=0.1)

TOPICSPACE = ["tg"]
"""The topicspace of the running test (the `settings` fixture sets it): announcements name queues in it."""


def descriptors(
    service_id: str, tools: tuple[str, ...] = ("t",), namespace: str | None = None
) -> tuple[ToolServiceDescriptor, list[ToolDescriptor]]:
    namespace = namespace or TOPICSPACE[0]
    service = ToolServiceDescriptor.model_validate(
        {
            "id": service_id,
            "request-queue": f"non-persistent://{namespace}/request/{service_id}",
            "response-queue": f"non-persistent://{namespace}/response/{service_id}",
        }
    )
    return service, [
        ToolDescriptor(name=name, description=f"{name} of {service_id}", service=service_id) for name in tools
    ]


def announcement(
    service_id: str = "svc",
    tools: tuple[str, ...] = ("t",),
    *,
    kind: str = "announce",
    instance: str | None = None,
    sequence: int = 1,
    sent_at: float | None = None,
    ttl: float = 2.0,
    workspace: str = "default",
    namespace: str | None = None,
) -> Announcement:
    """A valid announcement (or heartbeat/withdraw) as a service would send it."""
    service, parsed = descriptors(service_id, tools, namespace)
    full = kind == "announce"
    return Announcement(
        kind=kind,  # type: ignore[arg-type]
        instance=instance or f"{service_id}-1",
        sequence=sequence,
        sent_at=time.time() if sent_at is None else sent_at,
        ttl=ttl,
        workspace=workspace,
        digest=descriptor_digest(service, parsed),
        service=service if full else None,
        tools=parsed if full else None,
    )


def offering(
    service_id: str,
    described: Mapping[str, str],
    *,
    kind: str = "announce",
    sequence: int = 1,
    ttl: float = 60.0,
) -> bytes:
    """The bytes of an announcement (or withdraw) of `service_id` offering the tools `described` (name ->
    description), as a service sends it; a long ttl, so no heartbeat is needed while a test runs."""
    service, _ = descriptors(service_id)
    tools = [ToolDescriptor(name=name, description=text, service=service_id) for name, text in described.items()]
    full = kind == "announce"
    message = Announcement(
        kind=kind,  # type: ignore[arg-type]
        instance=f"{service_id}-1",
        sequence=sequence,
        sent_at=time.time(),
        ttl=ttl,
        workspace="default",
        digest=descriptor_digest(service, tools),
        service=service if full else None,
        tools=tools if full else None,
    )
    return message.model_dump_json(by_alias=True).encode()


def silence(service: DynamicToolService) -> None:
    """Make a running service fall silent the way a crash looks to the registry:
    no more heartbeats, no answers to probes, and no withdraw when it stops."""
    announcer = service.announcer
    assert announcer is not None
    announcer.withdrawn = True
    if announcer._scheduler is not None:
        announcer._scheduler.shutdown(wait=False)
        announcer._scheduler = None


async def heartbeat(service: DynamicToolService) -> None:
    """One heartbeat from a silenced service (its instance is heard from again)."""
    assert service.announcer is not None
    await service.announcer._send("heartbeat")


def by_name(items: list[Any]) -> dict[str, Any]:
    return {item.name: item for item in items}
