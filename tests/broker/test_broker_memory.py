"""The embedded broker's memory while clients come and go and services start and stop.

pulsar-lite 0.2.0 keeps every topic and every subscription name it ever saw, for good: about
16 KiB of resident memory each (measured), whether the subscription was closed or unsubscribed,
however long it then waits. A `toolreg` command, an agent or a service that starts mints names
(its own reply queue, its exclusive subscriptions), so what each cycle costs is what it names
afresh. Measured on pulsar-lite with this test (`-s` prints the figures): a short-lived client
(a transport, a config request, closed, as one `toolreg tools` is) costs 48-51 KiB: its
subscription on the shared response queue, its private reply queue and the subscription on it.
A service start and stop costs 51-55 KiB: its cancel and probe subscriptions and the one
subscription its consumer-id shift uses (`Capabilities.shift_consumer_ids`); that shift used
a fresh subscription per throwaway consumer, 490-600 KiB a start, before.

The bounds are those figures with room for the allocator's noise; a change that names something
new per client or per start crosses them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import psutil
import pytest

from discovery.broker import EmbeddedBroker
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, open_transport
from toolservice_base.examples.echo import EchoService

KIB = 1024
CLIENT_BOUND = 80 * KIB
SERVICE_BOUND = 100 * KIB

pytestmark = pytest.mark.timeout(90)


async def _short_lived_client(settings: Settings) -> None:
    """What one `toolreg` command does at the broker: connect, ask the store, go."""
    connection = await open_transport(settings)
    try:
        async with ConfigClient(connection, timeout=5) as client:
            await client.list("tool")
    finally:
        await connection.close()


async def _service_start_and_stop(settings: Settings) -> None:
    service = EchoService(settings=settings)  # a connection of its own, as a service process has
    await service.start()
    await service.stop()


async def _growth_per_cycle(
    broker: EmbeddedBroker, cycle: Callable[[], Awaitable[None]], warm_up: int, cycles: int
) -> float:
    """Bytes of broker RSS per cycle, after `warm_up` cycles (what every first one creates once)."""
    assert broker.pid is not None
    process = psutil.Process(broker.pid)
    for _ in range(warm_up):
        await cycle()
    before, started = process.memory_info().rss, time.monotonic()
    for _ in range(cycles):
        await cycle()
    growth = (process.memory_info().rss - before) / cycles
    print(
        f"\n{cycle.__name__}: {growth / KIB:.1f} KiB of broker RSS per cycle ({cycles} cycles,"
        f" {time.monotonic() - started:.1f}s)"
    )
    return growth


async def test_a_short_lived_client_costs_the_broker_only_the_names_it_needs(
    broker: EmbeddedBroker, settings: Settings, config_store: ConfigStoreService
) -> None:
    async def client() -> None:
        await _short_lived_client(settings)

    growth = await _growth_per_cycle(broker, client, warm_up=10, cycles=80)
    assert growth < CLIENT_BOUND, f"{growth / KIB:.1f} KiB per client; bound {CLIENT_BOUND / KIB:.0f} KiB"


async def test_a_service_start_and_stop_costs_the_broker_only_the_names_it_needs(
    broker: EmbeddedBroker, settings: Settings
) -> None:
    async def service() -> None:
        await _service_start_and_stop(settings)

    growth = await _growth_per_cycle(broker, service, warm_up=5, cycles=40)
    assert growth < SERVICE_BOUND, (
        f"{growth / KIB:.1f} KiB per service start and stop; bound {SERVICE_BOUND / KIB:.0f} KiB"
    )
