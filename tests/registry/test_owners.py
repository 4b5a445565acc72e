"""Who owns which key: the index the writer keeps as it commits, and the layer a batch plans over (pure, no broker).

The merge rules ask, for each service they plan, who owns each key it wants and which tools clients already
know by a name it would take. Asked of every service on every write, that was a pass over the fleet per
batch; the index answers it from what the writer committed, and a batch's plans never touch it until their
write is in.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from discovery.registry import merge
from discovery.registry.book import ServiceBook
from discovery.registry.leases import LeaseTable, ServiceKey
from discovery.registry.merge import Offer
from discovery.registry.metrics import RegistryMetrics
from discovery.registry.owners import Owners
from discovery.registry.writer import BATCH_MAX, StoreWriter
from toolservice_base.names import client_name as real_client_name
from toolservice_base.schemas import ToolDescriptor, ToolServiceDescriptor, descriptor_digest


def test_the_index_follows_each_service_s_owned_keys() -> None:
    owners = Owners()
    owners.update("ws", "s1", {}, {("tool", "a.search"): "h", ("tool-service", "s1"): "h"})
    owners.update("ws", "s2", {}, {("tool", "b"): "h"})
    assert owners.owner("ws", ("tool", "a.search")) == "s1" and owners.tools == 2
    assert owners.names("ws")["a_search"] == {"a.search"}
    owners.update("ws", "s1", {("tool", "a.search"): "h", ("tool-service", "s1"): "h"}, {("tool-service", "s1"): "h"})
    assert (
        owners.owner("ws", ("tool", "a.search")) is None and "a_search" not in owners.names("ws") and owners.tools == 1
    )
    owners.update("ws", "s2", {("tool", "b"): "h"}, {})  # gone
    assert dict(owners.of("ws")) == {("tool-service", "s1"): "s1"} and owners.tools == 0
    assert owners.owner("other", ("tool", "b")) is None


def test_a_key_taken_over_stays_with_its_new_owner_when_the_old_one_lets_go() -> None:
    owners = Owners()
    owners.update("ws", "old", {}, {("tool", "t"): "h"})
    owners.update("ws", "new", {}, {("tool", "t"): "h2"})
    owners.update("ws", "old", {("tool", "t"): "h"}, {})
    assert owners.owner("ws", ("tool", "t")) == "new" and owners.tools == 1


def test_a_batch_plans_over_a_layer_and_leaves_the_index_as_it_was() -> None:
    owners = Owners()
    owners.update("ws", "s1", {}, {("tool", "a"): "h", ("tool", "b"): "h"})
    layer = owners.layer("ws")
    del layer[("tool", "a")]
    layer[("tool", "c")] = "s2"
    layer[("tool", "b")] = "s3"
    assert ("tool", "a") not in layer and layer.get(("tool", "a")) is None and layer[("tool", "b")] == "s3"
    assert sorted(layer) == [("tool", "b"), ("tool", "c")] and len(layer) == 2
    layer[("tool", "a")] = "s4"
    assert len(layer) == 3 and layer[("tool", "a")] == "s4"
    with pytest.raises(KeyError):
        del layer[("tool", "nothing")]
    assert dict(owners.of("ws")) == {("tool", "a"): "s1", ("tool", "b"): "s1"}


def test_client_names_over_a_layer_see_the_index_and_the_batch() -> None:
    owners = Owners()
    owners.update("ws", "s1", {}, {("tool", "acme.search"): "h"})
    layer = owners.layer("ws")
    names = merge.ClientNames({}, layer)
    assert names.first("acme_search", "s2", {}) == ("acme.search", "s1")
    layer[("tool", "web.fetch")] = "s3"
    names = merge.ClientNames({}, layer)
    assert names.first("web_fetch", "s2", {}) == ("web.fetch", "s3")
    del layer[("tool", "acme.search")]  # released in this batch: no longer in the way
    assert merge.ClientNames({}, layer).first("acme_search", "s2", {}) is None


class DictStore:
    """The calls the writer makes of a config client, on a dict (conditional, one version per write)."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str, str], str] = {}
        self.writes: list[list[tuple[str, str, str]]] = []

    async def get(self, keys: Any, *, workspace: str | None = None) -> dict[tuple[str, str], str]:
        return {key: value for key in keys if (value := self.items.get((workspace or "default", *key))) is not None}

    async def apply(self, *, puts: Any = (), deletes: Any = (), expect: Any = (), workspace: str) -> int:
        puts = list(puts)
        self.writes.append(puts)
        for item_type, key, value in puts:
            self.items[(workspace, item_type, key)] = value
        for item_type, key in deletes:
            self.items.pop((workspace, item_type, key), None)
        return len(self.writes)

    async def put(self, items: Any, *, workspace: str | None = None) -> int:
        return await self.apply(puts=items, workspace=workspace or "default")


class Fleet:
    def __init__(self) -> None:
        self.store = DictStore()
        self.services = ServiceBook()
        self.leases = LeaseTable()
        self.writer = StoreWriter(
            self.store,
            self.services,
            self.leases,
            workspace_default="default",
            max_retry_delay=1.0,  # type: ignore[arg-type]
            metrics=RegistryMetrics(CollectorRegistry()),
            on_merged=lambda: None,
        )
        self.writer.writes.conditional = True
        self.count = 0

    def join(self, count: int) -> list[ServiceKey]:
        keys = []
        for _ in range(count):
            self.count += 1
            sid = f"svc-{self.count}"
            service = ToolServiceDescriptor.model_validate(
                {
                    "id": sid,
                    "request-queue": f"non-persistent://tg/request/{sid}",
                    "response-queue": f"non-persistent://tg/response/{sid}",
                }
            )
            tools = [ToolDescriptor(name=f"{sid}.tool", description="d", service=sid)]
            digest = descriptor_digest(service, tools)
            key = ServiceKey("default", sid)
            self.services.admit(key).offers[digest] = Offer(service, tuple(tools), digest)
            for i in range(3):
                self.leases.renew(
                    f"{sid}-{i}",
                    key,
                    ttl=30,
                    now=time.monotonic(),
                    wall=time.time(),
                    digest=digest,
                    announced=self.count,
                )
            keys.append(key)
        return keys


def test_a_small_write_costs_the_same_in_a_small_and_a_large_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work is counted, not timed: client names worked out and leases looked at for one batch of 5 services."""
    work = {"names": 0, "leases": 0}

    def counted_client_name(name: str) -> str:
        work["names"] += 1
        return real_client_name(name)

    real_of_service = LeaseTable.of_service

    def counted_of_service(self: LeaseTable, key: ServiceKey) -> list[Any]:
        found = real_of_service(self, key)
        work["leases"] += len(found)
        return found

    def whole_fleet(self: LeaseTable) -> Any:
        raise AssertionError("a write grouped every lease of the fleet")

    monkeypatch.setattr(merge, "client_name", counted_client_name)
    monkeypatch.setattr(LeaseTable, "of_service", counted_of_service)
    monkeypatch.setattr(LeaseTable, "by_service", whole_fleet)

    def batch_work(size: int) -> dict[str, int]:
        fleet = Fleet()
        while fleet.count < size:
            asyncio.run(fleet.writer.batches.write(set(fleet.join(min(BATCH_MAX, size - fleet.count))), set()))
        work.update(names=0, leases=0)
        keys = fleet.join(5)
        asyncio.run(fleet.writer.batches.write(set(keys), set()))
        for key in keys:  # and the same five go: every lease ran out
            for lease in fleet.leases.of_service(key):
                fleet.leases.remove(lease.instance)
        asyncio.run(fleet.writer.batches.write(set(keys), set()))
        assert all(key not in fleet.services for key in keys) and len(fleet.services) == size
        return dict(work)

    assert batch_work(20) == batch_work(2000)


def test_a_burst_is_written_in_batches_no_larger_than_one_write_may_be() -> None:
    fleet = Fleet()

    async def burst() -> None:
        for key in fleet.join(2 * BATCH_MAX + 10):
            fleet.writer.mark(key)
        fleet.writer.start()
        try:
            await fleet.writer.settle(timeout=30)
        finally:
            await fleet.writer.stop()

    asyncio.run(burst())
    records = [sum(1 for item_type, _, _ in puts if item_type == "discovery") for puts in fleet.store.writes]
    assert records == [BATCH_MAX, BATCH_MAX, 10], records  # the first seen first, none left behind
