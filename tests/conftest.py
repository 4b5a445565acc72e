"""Fixtures: a real pulsar-lite broker per test (it starts in ~30 ms), and the
processes of the product on top of it. Nothing here mocks the broker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from discovery.configsvc import ConfigStoreService
from discovery.registry import Registry
from discovery.registry_client import RegistryClient
from toolservice_base import ConfigClient, Connection, DynamicToolService, EmbeddedBroker, Settings, configure_logging
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService
from toolservice_base.examples.joke import JokeService
from registry_support import FAST

configure_logging("warning", json=True)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A fresh broker on a free loopback port, data under the test's temp dir."""
    embedded = EmbeddedBroker(tmp_path / "broker")
    embedded.start()
    yield embedded
    embedded.stop()


@pytest.fixture
def settings(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", pulsar_url=broker.url)


@pytest.fixture
async def connection(settings: Settings) -> AsyncIterator[Connection]:
    conn = await Connection.open(settings)
    yield conn
    await conn.close()


@pytest.fixture
async def config_store(connection: Connection, settings: Settings) -> AsyncIterator[ConfigStoreService]:
    """The config store service, with its SQLite file under the test's data dir."""
    service = ConfigStoreService.in_data_dir(connection, settings.data_dir)
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def config_client(connection: Connection, config_store: ConfigStoreService) -> AsyncIterator[ConfigClient]:
    client = ConfigClient(connection, timeout=5)
    await client.start()
    yield client
    await client.close()


@pytest.fixture
async def running(settings: Settings) -> AsyncIterator[dict[str, DynamicToolService]]:
    """The four example services, started without announcing (wired by hand), by id."""
    services = [cls(settings=settings, announce=False) for cls in (JokeService, CalculatorService, CountdownService, EchoService)]
    for service in services:
        await service.start()
    yield {s.id: s for s in services}
    for service in services:
        await service.stop()


@pytest.fixture
async def registry(connection: Connection, config_store: ConfigStoreService) -> AsyncIterator[Registry]:
    """A registry with a fast sweep, on the test's store."""
    reg = Registry(connection, options=FAST)
    await reg.start()
    yield reg
    await reg.stop()


@pytest.fixture
async def registry_client(connection: Connection, registry: Registry) -> AsyncIterator[RegistryClient]:
    client = RegistryClient(connection, timeout=5)
    await client.start()
    yield client
    await client.close()
