"""`ServiceBook`: every announced service the registry knows of, between store writes, and the one owner of that map.

The intake admits a service when it first announces, the writer forgets one whose last instance went and whose
keys are gone from the store, and a start restores each from its ownership record; the query API, the page and the
writer read it. Before, the map was a raw dict handed to five rooms and changed in three, so who may add or drop a
service, and in what order services were first seen (the writer takes the oldest first), was a convention spread
over modules. Here it is the book's: rooms change it only through `admit`, `forget` and `restore`.

The book also keeps when the registry last heard anything on `tool-descriptors` (`heard`): the lease sweep takes it
as proof the broker was delivering, and the intake is only who notices it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

from .keys import Key
from .leases import ServiceKey
from .merge import OwnershipRecord
from .state import ServiceState


class ServiceBook(Mapping[ServiceKey, ServiceState]):
    """The registry's services by key, in the order each was first seen; read by every room as a `Mapping`."""

    __slots__ = ("_services", "_order", "heard_at")

    def __init__(self) -> None:
        self._services: dict[ServiceKey, ServiceState] = {}
        self._order = itertools.count(1)
        self.heard_at: float | None = None
        """When (monotonic) the last message on `tool-descriptors` came in: proof the registry heard the broker."""

    def __getitem__(self, key: ServiceKey) -> ServiceState:
        return self._services[key]

    def get(self, key: ServiceKey, default: ServiceState | None = None) -> ServiceState | None:  # type: ignore[override]
        """`Mapping.get` straight from the dict: the intake asks once per heartbeat."""
        return self._services.get(key, default)

    def __len__(self) -> int:
        return len(self._services)

    def __iter__(self) -> Iterator[ServiceKey]:
        return iter(self._services)

    def admit(self, key: ServiceKey) -> ServiceState:
        """The service `key`, added as the newest if the book did not hold it (its first announce)."""
        state = self._services.get(key)
        if state is None:
            state = self._services[key] = ServiceState(key, next(self._order))
        return state

    def restore(self, key: ServiceKey, record: OwnershipRecord, owned: dict[Key, str]) -> ServiceState:
        """The service `key` as its ownership record in the store says it was (a start, or a standby's promotion):
        what it owns (`owned`, the record's keys as read), and since when each instance has run."""
        state = ServiceState(key, next(self._order), record=record, owned=owned)
        state.since = {instance: item.since for instance, item in record.instances.items()}
        self._services[key] = state
        return state

    def forget(self, key: ServiceKey) -> None:
        """Drop `key`: its last instance went and nothing of it is left in the store (`batches`)."""
        self._services.pop(key, None)

    def heard(self, now: float) -> None:
        """A message came in on `tool-descriptors` at `now` (monotonic)."""
        self.heard_at = now
