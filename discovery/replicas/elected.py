"""The only way the active replica writes: a `fence`-mode publisher that stops the moment its replica steps down.

Opening one fences a deposed writer's publisher on the same topic, which then
fails every send with `Fenced`, for good; a send that meets `Fenced` here
tells the election, which steps down at once. `Election.writer(topic)`
hands them out and revokes them all before anything else when it steps down.
"""

from __future__ import annotations

from typing import Protocol

from discovery.errors import NotActive
from toolservice_base.errors import Fenced, TransportClosed
from toolservice_base.transport import ExclusiveMode, ExclusivePublisher, Payload, Transport

__all__ = ["ElectedWriter", "Holder"]


class Holder(Protocol):
    """What a writer needs of its election (`Election` is one): whose it is, and where to say it was fenced."""

    @property
    def replica_id(self) -> str: ...

    def deposed(self, reason: str) -> None: ...


class ElectedWriter:
    """A `fence`-mode publisher that writes only while its election holds the lock.

    A send after the replica stepped down raises `NotActive` without
    reaching the broker; a send that meets `Fenced` makes the election step
    down at once (and raises it).
    """

    mode: ExclusiveMode = "fence"

    def __init__(self, election: Holder, publisher: ExclusivePublisher, transport: Transport) -> None:
        self._election = election
        self._publisher = publisher
        self._transport = transport
        self.topic = publisher.topic
        self._revoked = False

    async def send(self, payload: Payload, properties: dict[str, str] | None = None) -> bytes:
        if self._revoked:
            raise NotActive(
                f"replica {self._election.replica_id} is no longer active; it may not write on {self.topic}"
            )
        try:
            return await self._publisher.send(payload, properties)
        except Fenced:
            self._election.deposed(f"fenced on {self.topic}: another replica took over")
            raise
        except TransportClosed:
            if self._revoked:  # stepped down (and closed) while this send was on its way
                raise NotActive(
                    f"replica {self._election.replica_id} stepped down; its write on {self.topic} may not have been"
                    " made"
                ) from None
            raise

    @property
    def connected(self) -> bool:
        return not self._revoked and self._publisher.connected

    @property
    def fenced(self) -> bool:
        return self._publisher.fenced

    def revoke(self) -> None:
        self._revoked = True

    async def close(self) -> None:
        self._revoked = True
        await self._transport.close_publisher(self._publisher)
