"""The replicated registry: one active registry per topicspace, with warm standbys.

The broker elects the active replica (`discovery.replicas`: the store's
group under `toolreg up --store pulsar`, the registry group of `toolreg
registry`); `ActiveRegistry` is what each replica runs. While standby it
listens to the announcements (`heard`), so the `Registry` it starts on a
promotion takes every recorded lease over warm: each ends when it would have
at the registry it replaces, with no ttl of grace, and no live service loses
its tools across a failover. On a demotion it steps down without writing
(`step_down`): another replica is active, and what this one still had
pending comes from a view that stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from discovery.errors import RegistryUnavailable
from toolservice_base.configclient import Requests
from toolservice_base.errors import TransportError
from toolservice_base.logs import get_logger
from toolservice_base.schemas import ConfigRequest
from toolservice_base.search import Match
from toolservice_base.tasks import cancel_and_wait
from toolservice_base.transport import Transport

from .expiry import Hearing
from .heard import HeardLeases
from .options import RegistryOptions
from .overview import Overview, RegistrySnapshot, ReplicaView
from .service import DESCRIPTOR_LINGER, DESCRIPTOR_PERMITS, Registry

if TYPE_CHECKING:
    from discovery.replicas.status import ReplicaStatus

__all__ = ["ActiveRegistry"]

log = get_logger("discovery.registry")


class ActiveRegistry:
    """The registry of the active replica: a fresh `Registry` on each promotion, stopped on demotion.

    While standby it listens to the announcements (`listen`, `HeardLeases`),
    so the registry it starts on a promotion takes every recorded lease over
    warm: each ends when it would have at the registry it replaces, with no
    ttl of grace, and no live service loses its tools across a failover.
    """

    def __init__(
        self,
        connection: Transport,
        options: RegistryOptions,
        replicas: Callable[[], list[ReplicaStatus]] | None = None,
        *,
        requests: Requests | None = None,
        sign: Callable[[ConfigRequest], ConfigRequest] | None = None,
    ) -> None:
        """`requests`: the config store of this process, which the registry then asks directly, never the queues
        (where a frozen, deposed replica may still take requests); `sign`: how the registry signs its writes to a store
        elsewhere whose trust policy covers the config queue."""
        self._connection = connection
        self._options = options
        self._requests = requests
        self._sign = sign
        self.registry: Registry | None = None
        self.replicas = replicas
        """The group this registry runs in (`ReplicatedStore.replicas`, `Membership.replicas`), for the page; None: not
        replicated."""
        self.hearing: Hearing | None = None
        """When this replica last heard its own status back (`Membership.heard_itself_at`): no lease expires on a
        silence after it (`Expiry`). None: not replicated, the connection's state alone says whether it hears."""
        self._ear: HeardLeases | None = None
        self._relistening: asyncio.Task[None] | None = None

    async def listen(self) -> None:
        """Hear the announcements while standby (for a registry that may be elected): call before joining the group."""
        self._ear = HeardLeases(
            self._connection,
            capacity=self._options.max_instances,
            receiver_queue=DESCRIPTOR_PERMITS,
            linger=DESCRIPTOR_LINGER,
        )
        await self._ear.start()

    async def start(self) -> None:
        if (
            self._relistening is not None
        ):  # demoted and promoted again before the ear was back: this registry starts cold
            await cancel_and_wait(self._relistening)
            self._relistening = None
        registry = Registry(
            self._connection,
            options=self._options,
            heard=self._ear,
            requests=self._requests,
            sign=self._sign,
        )
        registry.expiry.hearing = self.hearing
        try:
            await registry.start()
        except (
            BaseException
        ):  # whatever it had opened is closed before the failure goes on (`Registry.stop` is safe at any point)
            await registry.stop(flush=False)
            raise
        self.registry = registry
        if self._ear is not None:  # the registry hears for itself now
            await self._ear.stop()

    async def stop(self) -> None:
        """Stop, writing what the registry still has pending (briefly): for a registry that ends its own term; and stop
        listening."""
        registry, self.registry = self.registry, None
        if registry is not None:
            await registry.stop()
        if self._relistening is not None:
            await cancel_and_wait(self._relistening)
            self._relistening = None
        if self._ear is not None:
            await self._ear.stop()

    async def step_down(self) -> None:
        """Stop without writing anything more: this replica is no longer active, or is about to let go of the lock.

        Another replica may be active already (this one was frozen and
        replaced), serving the same config queues: what this registry still
        had pending comes from a view that stopped when the process did, and
        written there it would withdraw live tools. The active registry has
        its own view; nothing is lost. Then it listens again, as a standby;
        in the background, as a demotion must not wait on the broker.
        """
        registry, self.registry = self.registry, None
        if registry is not None:
            await registry.stop(flush=False)
        if self._ear is not None and self._relistening is None:
            self._relistening = asyncio.create_task(self._listen_again(self._ear), name="registry:listen-again")

    async def _listen_again(self, ear: HeardLeases) -> None:
        try:
            await ear.start()
        except TransportError as exc:  # a promotion that comes first starts cold, as any registry can
            log.warning("registry.standby_not_listening", reason=str(exc))
        finally:
            self._relistening = None

    def readiness(self) -> str | None:
        return None if self.registry is None else self.registry.readiness()

    def _overview(self) -> Overview:
        if self.registry is None:
            raise RegistryUnavailable("this replica is a standby: the active replica runs the registry and its page")
        return self.registry.overview

    async def search(self, query: str, limit: int, among: RegistrySnapshot) -> list[Match]:
        """The page's search: the active registry's (`Overview.search`); a standby has none."""
        return await self._overview().search(query, limit, among)

    async def snapshot(self) -> RegistrySnapshot:
        """The page's view: the active registry's overview; a standby has none to show."""
        snapshot = await self._overview().snapshot()
        if self.replicas is None:
            return snapshot
        group = [
            ReplicaView(id=r.id, group=r.group, role=r.role, pid=r.pid, host=r.host, version=r.version, since=r.since)
            for r in self.replicas()
        ]
        return snapshot.model_copy(update={"replicas": group})
