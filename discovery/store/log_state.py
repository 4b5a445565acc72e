"""The replicated store's side of the log: a write as a log entry and back, the state machine a replica applies
entries to (`StoreState`: the items, and which requests the latest entries made), and the journal the active
replica's store service writes through (`LogJournal`)."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

from discovery.errors import NotActive
from discovery.replicas import Election, LogEntry, ReplicatedLog
from discovery.replicas.core import Acknowledge

from .sqlite import ConfigStore, Write
from .write_policy import SignedRequestId, Taken, TakenRequests

__all__ = ["REQUESTS_KEPT", "LogJournal", "StoreState", "entry_payload", "write_of"]

REQUESTS_KEPT = 10_000
"""Request ids a replica remembers from the log (the latest entries'): far more than are in flight at a failover."""
SIGNED_ROW = ("", "signed-request")
"""A snapshot row's workspace and type that hold a signed request taken, not an item (no item has workspace "")."""


def entry_payload(write: Write, request: str | None = None) -> dict[str, Any]:
    """A `Write` as a log entry's payload (JSON), with the id of the request that made it, if it had one, and the
    nonce and expiry of the signed request it was (`SignedRequestId`)."""
    payload: dict[str, Any] = {
        "workspace": write.workspace,
        "puts": [list(item) for item in write.puts],
        "deletes": [list(key) for key in write.deletes],
    }
    if request:
        payload["request"] = str(request)
    if isinstance(request, SignedRequestId):
        payload["signed"] = [request.nonce, request.expires]
    return payload


def write_of(entry: LogEntry) -> Write:
    """A log entry back as the `Write` it was made from; ValueError if it is not one."""
    payload = entry.payload
    try:
        puts = [(str(t), str(k), str(v)) for t, k, v in payload["puts"]]
        deletes = [(str(t), str(k)) for t, k in payload["deletes"]]
        return Write(entry.version, str(payload["workspace"]), puts, deletes)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a config store write: {exc}") from None


class StoreState:
    """The log's state machine: the config store's items, in an in-memory SQLite store; which requests the latest
    entries made (`made`), so a request the broker delivers again after a failover is not made twice; and the signed
    requests taken while their signatures are good (`signed`), so a copy is refused by whichever replica is active.

    The signed ones are kept in snapshots too (rows of `SIGNED_ROW`): a
    replica that starts from a snapshot knows them as well as one that read
    every entry.
    """

    def __init__(self, store: ConfigStore) -> None:
        self.store = store
        self.requests: OrderedDict[str, int] = OrderedDict()
        """Request id -> the version its write was made at, for the last `REQUESTS_KEPT` entries that name one."""
        self.signed = TakenRequests()

    def apply(self, entry: LogEntry) -> None:
        self.store.replay(write_of(entry))
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        request = payload.get("request")
        if isinstance(request, str) and request:
            self.requests[request] = entry.version
            if len(self.requests) > REQUESTS_KEPT:
                self.requests.popitem(last=False)
        signed = payload.get("signed")
        if isinstance(signed, list) and len(signed) == 2 and isinstance(signed[0], str):
            nonce, expires = signed
            if isinstance(expires, int | float):
                self.signed.take(
                    nonce, Taken(float(expires), entry.version, request if isinstance(request, str) else None)
                )

    def snapshot(self) -> Iterator[list[str]]:
        _, rows = self.store.dump()
        taken = [
            [*SIGNED_ROW, nonce, json.dumps([t.expires, t.version, t.request])] for nonce, t in self.signed.items()
        ]
        return chain((list(row) for row in rows), taken)

    def restore(self, version: int, items: Iterable[Any]) -> None:
        rows = [(str(w), str(t), str(k), str(v)) for w, t, k, v in items]
        self.signed = TakenRequests()
        for _, _, nonce, value in (row for row in rows if row[:2] == SIGNED_ROW):
            expires, made, request = json.loads(value)
            self.signed.take(nonce, Taken(float(expires), int(made), request))
        self.store.load(version, [row for row in rows if row[:2] != SIGNED_ROW])


class LogJournal:
    """The store service's `Journal`: a write is durable once the replicated log has persisted it."""

    def __init__(self, replicated: ReplicatedLog, election: Election, state: StoreState) -> None:
        self._log = replicated
        self._election = election
        self._state = state

    async def append(self, write: Write, request: str | None = None) -> None:
        await self._log.append(entry_payload(write, request), version=write.version)

    def must_log(self, write: Write | None) -> bool:
        return not isinstance(self._election.core.executed(write.version if write is not None else None), Acknowledge)

    def made(self, request: str) -> int | None:
        return self._state.requests.get(request)

    def taken(self, nonce: str) -> Taken | None:
        """The signed request with this nonce, if the log holds it (`write_policy.SignedLog`)."""
        return self._state.signed.get(nonce)

    def lost(self, reason: str) -> None:
        self._election.deposed(reason)

    async def confirm(self) -> str | None:
        """Whether this replica still holds the lock (`Election.confirm`), before it answers anything from its state.

        A replica cut off from the broker and replaced meanwhile learns it
        only from the broker; requests already on their way to it (a link
        that held them, then delivered them at once) would otherwise be read
        from a state the new active one has moved past: stale reads. At most
        one `held` marker per `lost_lock_grace`, shared with the writes.
        """
        try:
            await self._election.confirm()
        except NotActive as exc:
            return str(exc)
        return None
