"""One config store per topicspace: a SQLite store says it is there, and will not start beside another.

Two stores on one topicspace share the config queues' subscription, so the
broker hands requests to each in turn: reads alternate found and missing,
versions go 1, 9, 2, 10. So a SQLite store publishes a status in the config
store's group (`Membership`, `store="sqlite"`) like a replica does; before it
serves it asks who is there (`look_around`) and refuses in one line naming
the store already answering (`AnotherStore`); one heard while it runs is
logged and fails its `/readyz`. The replicated store does the same from its
own membership (`ReplicatedStore`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Self

from discovery.replicas import GroupKey, Membership
from toolservice_base.transport import Transport

from .replicated import GROUP, RIVAL_WAIT, another_store, new_replica_id


class StorePresence:
    """A SQLite store's status in its topicspace's config store group, and the rival stores it hears.

    `look`: ask who is there before returning from `async with` (and refuse
    if another store answers). Skip it only where nobody else can be (a
    broker this process just started).
    """

    def __init__(
        self,
        connection: Transport,
        *,
        version: Callable[[], int] = lambda: 0,
        key: GroupKey | None = None,
        look: bool = True,
        wait: float = RIVAL_WAIT,
    ) -> None:
        self.replica_id = new_replica_id()
        self._members = Membership(connection, self.replica_id, GROUP, version=version, key=key, store="sqlite")
        self._look = look
        self._wait = wait
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Self:
        self._members.set_role("active")  # it serves from the moment it starts: no election
        async with AsyncExitStack() as stack:
            members = await stack.enter_async_context(self._members)
            if self._look and (rivals := await members.look_around(self._wait)):
                raise another_store(rivals[0], members.topic)
            members.joined()
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def readiness(self) -> str | None:
        """None while no other config store is heard on the topicspace; else the line naming it."""
        rivals = self._members.rivals()
        return str(another_store(rivals[0], self._members.topic)) if rivals else None
