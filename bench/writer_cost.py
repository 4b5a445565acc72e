"""The registry writer's own CPU per batch, as the fleet grows: does a small change cost the whole fleet?

In one process, without a broker: a `StoreWriter` over a dict-backed store
(the writes it sends are applied to the dict, so each plan sees what the last
one wrote), the registry's real lease table and service states. The fleet is
grown to each size, then at that size it times, each a batch of a few
services as a trickle of changes makes them:

- join: new services announce (written, tools claimed);
- leave: services whose every lease ran out (tools deleted, names kept);
- gauges: what the registry recomputes for its metrics after a write.

    python -m bench.writer_cost                  # sizes 1,000 .. 20,000 services x 5 instances
    python -m bench.writer_cost --sizes 2000 20000 --batch 10

A figure that grows with the fleet is work per batch proportional to the
fleet: it is what made one registry fall behind between 50,000 and 100,000
instances (`bench/FLEET.md`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from discovery.registry.book import ServiceBook
from discovery.registry.leases import LeaseTable, ServiceKey
from discovery.registry.merge import Offer
from discovery.registry.metrics import RegistryMetrics
from discovery.registry.writer import StoreWriter
from toolservice_base.schemas import ToolDescriptor, ToolServiceDescriptor, descriptor_digest

INSTANCES = 5
TTL = 30.0


class DictStore:
    """The calls `StoreWriter` makes of a `ConfigClient`, on a dict: conditional, one version per write."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str, str], str] = {}
        self.version = 0

    async def get(self, keys: Iterable[tuple[str, str]], *, workspace: str | None = None) -> dict[tuple[str, str], str]:
        found = {}
        for key in keys:
            value = self.items.get((workspace or "default", *key))
            if value is not None:
                found[key] = value
        return found

    async def apply(self, *, puts=(), deletes=(), expect=(), workspace: str) -> int:  # type: ignore[no-untyped-def]
        for item_type, key, value in puts:
            self.items[(workspace, item_type, key)] = value
        for item_type, key in deletes:
            self.items.pop((workspace, item_type, key), None)
        self.version += 1
        return self.version

    async def put(self, items, *, workspace: str | None = None) -> int:  # type: ignore[no-untyped-def]
        return await self.apply(puts=items, workspace=workspace or "default")

    async def delete(self, keys, *, workspace: str | None = None) -> int:  # type: ignore[no-untyped-def]
        return await self.apply(deletes=keys, workspace=workspace or "default")


class Fleet:
    def __init__(self) -> None:
        self.store = DictStore()
        self.services = ServiceBook()
        self.leases = LeaseTable()
        self.announces = itertools.count(1)
        self.writer = StoreWriter(
            self.store,  # type: ignore[arg-type]
            self.services,
            self.leases,
            workspace_default="default",
            max_retry_delay=1.0,
            metrics=RegistryMetrics(CollectorRegistry()),
            on_merged=lambda: None,
        )
        self.writer.writes.conditional = True
        self.next_id = itertools.count()

    def join(self, count: int) -> list[ServiceKey]:
        keys = []
        now, wall = time.monotonic(), time.time()
        for _ in range(count):
            n = next(self.next_id)
            sid = f"svc-{n:06d}"
            service = ToolServiceDescriptor.model_validate(
                {
                    "id": sid,
                    "request-queue": f"non-persistent://tg/request/{sid}",
                    "response-queue": f"non-persistent://tg/response/{sid}",
                }
            )
            tools = [
                ToolDescriptor(name=f"{sid}.t{i}", description=f"tool {i} of {sid}", service=sid)
                for i in range(1 + n % 2)
            ]
            digest = descriptor_digest(service, tools)
            key = ServiceKey("default", sid)
            state = self.services.admit(key)
            state.offers[digest] = Offer(service, tuple(tools), digest)
            for i in range(INSTANCES):
                self.leases.renew(
                    f"{sid}-{i}", key, ttl=TTL, now=now, wall=wall, digest=digest, announced=next(self.announces)
                )
            keys.append(key)
        return keys

    def leave(self, keys: list[ServiceKey]) -> None:
        for key in keys:
            for lease in self.leases.of_service(key):
                self.leases.remove(lease.instance)

    async def merge(self, keys: list[ServiceKey]) -> float:
        started = time.perf_counter()
        await self.writer.batches.write(set(keys), set())
        return time.perf_counter() - started


def gauges(fleet: Fleet) -> float:
    """What `Registry._report_state` computes after every write."""
    started = time.perf_counter()
    _ = fleet.leases.service_count(), fleet.writer.owners.tools, len(fleet.leases), len(fleet.leases.held())
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1000, 5000, 10000, 20000], help="fleet sizes, in services"
    )
    parser.add_argument("--batch", type=int, default=10, help="services per measured batch")
    parser.add_argument("--rounds", type=int, default=20, help="batches measured per size and kind")
    args = parser.parse_args()
    fleet = Fleet()
    print(
        f"{'services':>9} {'instances':>9} {'join ms':>8} {'leave ms':>8} {'gauges ms':>9}   (p50 of {args.rounds}"
        f" batches of {args.batch})"
    )
    for size in sorted(args.sizes):
        while len(fleet.services) < size:
            await fleet.merge(fleet.join(min(500, size - len(fleet.services))))
        joins, leaves, costs = [], [], []
        for _ in range(args.rounds):
            keys = fleet.join(args.batch)
            joins.append(await fleet.merge(keys))
            fleet.leave(keys)
            leaves.append(await fleet.merge(keys))
            costs.append(gauges(fleet))
        print(
            f"{len(fleet.services):>9,} {len(fleet.leases):>9,} {statistics.median(joins) * 1e3:>8.2f} "
            f"{statistics.median(leaves) * 1e3:>8.2f} {statistics.median(costs) * 1e3:>9.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
