"""The registry's store writes are batched on the leading edge: a lone change waits for nothing,
what comes while a write is in flight goes into one next write, a burst is a handful of versions.

Timings are the writer's own (`StoreWriter.waits`: a change marked -> its batch taken), not wall
clock end to end, so a loaded machine does not blur them. Before leading-edge batching every write
sat out a fixed 50 ms window first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import eventually
from support.registry import announcement

from discovery.registry.service import Registry
from toolservice_base import ConfigClient, Transport

OLD_WINDOW = 0.05
"""The fixed coalescing window every write used to wait."""


async def _tools(client: ConfigClient) -> int:
    return len(await client.list("tool"))


async def test_a_lone_announcement_is_written_without_waiting(
    connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    await registry.settle()
    before = len(registry.writer.waits)
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await publisher.send(announcement("lone", ("lone-tool",), ttl=30).to_json())
    await eventually(lambda: _tools(config_client), timeout=2.0)
    await registry.settle()
    waits = list(registry.writer.waits)[before:]
    assert len(waits) == 1 and registry.store_writes == 1, waits
    # Half the old window: the old writer could not go below it, a loaded loop stays well inside it.
    assert waits[0] < OLD_WINDOW / 2, f"the writer took the change after {waits[0] * 1000:.1f} ms"


async def test_changes_during_a_write_go_into_one_next_write(
    connection: Transport, config_client: ConfigClient, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = registry.writer.writes
    original = writes.apply
    gate = asyncio.Event()
    started: list[str] = []

    async def held_apply(**kwargs: Any) -> int:
        started.append(kwargs["workspace"])
        if len(started) == 1:
            await gate.wait()  # the first write stays in flight until the test lets it go
        return await original(**kwargs)

    monkeypatch.setattr(writes, "apply", held_apply)
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await publisher.send(announcement("first", ("first-tool",), ttl=30).to_json())
    await eventually(lambda: started, timeout=2.0)  # written at once, nothing else pending

    await asyncio.gather(
        *(publisher.send(announcement(f"later-{n}", (f"later-{n}",), ttl=30).to_json()) for n in range(10))
    )
    await eventually(
        lambda: registry.writer.pending == 10, timeout=2.0, explain=lambda: f"{registry.writer.pending} pending"
    )
    assert len(started) == 1  # nothing starts while a write is in flight
    gate.set()
    await eventually(lambda: _tools(config_client), timeout=2.0)
    await registry.settle()
    assert await _tools(config_client) == 11
    assert len(started) == 2 and registry.store_writes == 2 and (await config_client.config())[0] == 2, started
    waits = list(registry.writer.waits)
    assert waits[0] < OLD_WINDOW / 2 and len(waits) == 2, waits  # the second waited for the first write only


async def test_a_burst_of_1500_services_is_a_handful_of_store_versions(
    connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    messages = [announcement(f"many-{n}", (f"many-{n}",), ttl=60).to_json() for n in range(1500)]
    await asyncio.gather(*(publisher.send(message) for message in messages))
    await eventually(lambda: _count(config_client, 1500), timeout=60.0, interval=0.2)
    await registry.settle(timeout=30.0)
    version = (await config_client.config())[0]
    assert version == registry.store_writes and version <= 10, f"{version} versions for 1,500 services"


async def _count(client: ConfigClient, count: int) -> bool:
    return await _tools(client) == count
