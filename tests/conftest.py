"""Fixtures: a real broker per test, and the processes of the product on top of it.

`settings` (and so `connection` and everything built on it) is parametrised by
`broker_kind`: every test runs on a real pulsar-lite broker (it starts in
~30 ms); modules marked `contract` also run on a real Apache Pulsar 4.0
standalone (one per run, started on first use by scripts/apache_pulsar.py,
token authentication on, a fresh tenant as the topicspace of each test) and
on the in-memory transport, which must behave the same. Nothing here mocks a
broker.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from apache_pulsar import ApachePulsar
from support import registry as registry_support
from support.registry import FAST
from support.replicas import Cluster

from discovery.broker import EmbeddedBroker
from discovery.registry.client import RegistryClient
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import (
    ConfigClient,
    DynamicToolService,
    MemoryBroker,
    Settings,
    Transport,
    configure_logging,
    open_transport,
)
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.countdown import CountdownService
from toolservice_base.examples.echo import EchoService
from toolservice_base.examples.joke import JokeService
from toolservice_base.topics import DEFAULT_TOPICSPACE

configure_logging("warning", json=True)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A fresh broker on a free loopback port, data under the test's temp dir."""
    embedded = EmbeddedBroker(tmp_path / "broker")
    embedded.start()
    yield embedded
    embedded.stop()


REAL_BROKERS = ["pulsar-lite"]
CONTRACT_BROKERS = [*REAL_BROKERS, "memory", "apache-pulsar"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "broker_kind" in metafunc.fixturenames:
        contract = metafunc.definition.get_closest_marker("contract") is not None
        every_real = metafunc.definition.get_closest_marker("brokers") is not None
        metafunc.parametrize(
            "broker_kind",
            CONTRACT_BROKERS if contract else [*REAL_BROKERS, "apache-pulsar"] if every_real else REAL_BROKERS,
        )


APACHE_GROUP = "apache-pulsar"
"""The `xdist_group` of every test that reaches Apache Pulsar: `make test` runs the suite on several workers
(`--dist loadgroup`), and this group on one of them, so the run still starts one Apache Pulsar, and a test that
restarts it never pulls the broker from under another test."""


def reaches_apache_pulsar(item: pytest.Item) -> bool:
    """Whether a test uses the run's Apache Pulsar or starts one: the fixture (directly or through `tenant`,
    `cluster`), an `apache-pulsar` parameter (`settings` asks for the fixture only when the test runs), or the
    marker a module that starts its own standalone carries."""
    if item.get_closest_marker("apache_pulsar") is not None or "apache_pulsar" in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "apache-pulsar" in callspec.params.values()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if reaches_apache_pulsar(item):
            item.add_marker(pytest.mark.xdist_group(APACHE_GROUP))


@pytest.fixture(scope="session")
def apache_pulsar() -> Iterator[ApachePulsar]:
    """One Apache Pulsar standalone for the whole run, token authentication on; its start is in the first user's
    time."""
    broker = ApachePulsar(auth=True)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def tenant(apache_pulsar: ApachePulsar) -> Iterator[str]:
    """A fresh tenant with the product's namespaces: one test's topicspace on the shared broker."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    apache_pulsar.create_tenant(name)
    yield name
    apache_pulsar.delete_tenant(name)


@pytest.fixture
def cluster(apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path) -> Iterator[Cluster]:
    """`toolreg up --store pulsar` replicas as processes on the run's Apache Pulsar, in a fresh tenant; every one
    still running is stopped after the test (`support.replicas.Cluster`)."""
    group = Cluster(apache_pulsar, tenant, tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


@pytest.fixture
def memory_broker() -> MemoryBroker:
    """An in-process broker, found by its `memory://` URL."""
    return MemoryBroker()


@pytest.fixture
def settings(broker_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    if broker_kind == "memory":
        memory: MemoryBroker = request.getfixturevalue("memory_broker")
        chosen = Settings(data_dir=tmp_path / "data", pulsar_url=memory.url)
    elif broker_kind == "apache-pulsar":
        apache: ApachePulsar = request.getfixturevalue("apache_pulsar")
        space: str = request.getfixturevalue("tenant")
        chosen = Settings(
            data_dir=tmp_path / "data",
            pulsar_url=apache.url,
            broker="apache-pulsar",
            topicspace=space,
            auth_token=apache.token,
        )
    else:
        broker: EmbeddedBroker = request.getfixturevalue("broker")
        chosen = Settings(data_dir=tmp_path / "data", pulsar_url=broker.url, broker="pulsar-lite")
    registry_support.TOPICSPACE[0] = chosen.topicspace
    yield chosen
    registry_support.TOPICSPACE[0] = DEFAULT_TOPICSPACE  # the next test may build announcements without a broker


@pytest.fixture
async def connection(settings: Settings) -> AsyncIterator[Transport]:
    conn = await open_transport(settings)
    yield conn
    await conn.close()


@pytest.fixture
async def config_store(connection: Transport, settings: Settings) -> AsyncIterator[ConfigStoreService]:
    """The config store service, with its SQLite file under the test's data dir."""
    service = ConfigStoreService.in_data_dir(connection, settings.data_dir)
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def config_client(connection: Transport, config_store: ConfigStoreService) -> AsyncIterator[ConfigClient]:
    client = ConfigClient(connection, timeout=5)
    await client.start()
    yield client
    await client.close()


@pytest.fixture
async def running(settings: Settings) -> AsyncIterator[dict[str, DynamicToolService]]:
    """The four example services, started without announcing (wired by hand), by id."""
    services = [
        cls(settings=settings, announce=False)
        for cls in (JokeService, CalculatorService, CountdownService, EchoService)
    ]
    for service in services:
        await service.start()
    yield {s.id: s for s in services}
    for service in services:
        await service.stop()


@pytest.fixture
async def registry(connection: Transport, config_store: ConfigStoreService) -> AsyncIterator[Registry]:
    """A registry with a fast sweep, on the test's store."""
    reg = Registry(connection, options=FAST)
    await reg.start()
    yield reg
    await reg.stop()


@pytest.fixture
async def registry_client(connection: Transport, registry: Registry) -> AsyncIterator[RegistryClient]:
    client = RegistryClient(connection, timeout=5)
    await client.start()
    yield client
    await client.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that times out says what each of its event loop's tasks was awaiting: pytest-timeout's own report shows
    only the loop waiting in select(), which names no await."""
    report: pytest.TestReport = yield
    if call.when == "call" and report.failed and "Timeout (>" in str(report.longrepr):
        report.sections.append(("asyncio tasks at the timeout", _pending_tasks(item)))
    return report


def _pending_tasks(item: pytest.Item) -> str:
    request = getattr(item, "_request", None)
    try:
        loop = request.getfixturevalue("_function_scoped_runner").get_loop() if request is not None else None
    except Exception as error:  # the runner is pytest-asyncio's; a test without it has no loop to show
        return f"no event loop to show: {error!r}"
    if loop is None:
        return "no event loop to show"
    lines: list[str] = []
    for task in asyncio.all_tasks(loop):
        lines.append(f"{task.get_name()}:")
        awaited: Any = task.get_coro()
        while awaited is not None:  # Task.get_stack() gives a suspended coroutine's outer frame only
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return "\n".join(lines) or "no pending task"
