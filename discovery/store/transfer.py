"""Moving a store between backends: `toolreg store export` and `toolreg store import`.

An export is one JSON document, `{"format", "version", "items": [[workspace,
type, key, value], ...]}`, read from the SQLite file (read-only, safe while
`toolreg up` runs) or from the replicated log (as a follower: it never takes
part in the election). An import writes it into an empty store, or replaces
a store's content with `force`, and carries the version over: the store ends
at the exported version, or just past its own if that is higher, so no
reader ever sees the version go back.

Into the replicated store, an import writes through the log as a replica
would, so it needs the group stopped: it takes the lock with an `exclusive`
producer and refuses in one line if a replica holds it.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from discovery.replicas import Election, GroupKey, ReplicatedLog
from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.transport import Transport

from .log_state import StoreState
from .replicated import new_replica_id
from .sqlite import ConfigStore, Rows

EXPORT_FORMAT = 1
CHUNK_BYTES = 512 * 1024
"""Log entries an import writes stay about this size: well under the broker's message limit."""
LOCK_WAIT = 5.0
"""Seconds an import waits for the replicated store's lock before it says a group is running."""


class TransferError(ToolDiscoveryError):
    """An export or import could not be done; nothing was changed."""


def write_export(path: Path, version: int, rows: Rows) -> None:
    document = {"format": EXPORT_FORMAT, "version": version, "items": [list(row) for row in rows]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, separators=(",", ":")))
    tmp.replace(path)  # a reader never meets half a file


def read_export(path: Path) -> tuple[int, Rows]:
    try:
        document = json.loads(path.read_text())
        if int(document["format"]) > EXPORT_FORMAT:
            raise TransferError(
                f"{path} was exported by a newer version (format {document['format']}); upgrade tool-discovery to"
                " import it"
            )
        rows = [(str(w), str(t), str(k), str(v)) for w, t, k, v in document["items"]]
        return int(document["version"]), rows
    except OSError as exc:
        raise TransferError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise TransferError(f"{path} is not a store export ({exc}); make one with `toolreg store export`") from None


def sqlite_dump(path: Path) -> tuple[int, Rows]:
    """The version and items of a SQLite store, read-only (nothing is written to it, not even its marker)."""
    if not path.exists():
        raise TransferError(f"no config store at {path}; `toolreg up` creates one")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        db.execute("BEGIN")
        version = int(db.execute("SELECT value FROM meta WHERE name='version'").fetchone()[0])
        rows = [
            (r[0], r[1], r[2], r[3])
            for r in db.execute("SELECT workspace, type, key, value FROM items ORDER BY workspace, type, key")
        ]
        return version, rows
    except sqlite3.DatabaseError as exc:
        raise TransferError(f"cannot read the config store {path}: {exc}; `toolreg store check` says more") from None
    finally:
        db.close()


def sqlite_load(path: Path, version: int, rows: Rows, *, force: bool = False) -> int:
    """Write `rows` into the SQLite store at `path` (created if missing); the version it ends at."""
    store = ConfigStore(path)
    try:
        current, existing = store.dump()
        if existing and not force:
            raise TransferError(
                f"the config store {path} already holds {len(existing)} item(s); import into an empty one, or add"
                " --force to replace them"
            )
        final = max(version, current + 1)
        store.load(final, rows)
        return final
    finally:
        store.close()


async def replicated_dump(connection: Transport, key: GroupKey | None = None) -> tuple[int, Rows]:
    """The replicated store's version and items, read as a follower (snapshot, then the log to its end); `key`: the
    group key, so only what the replicas signed is read."""
    store = ConfigStore.in_memory("export")
    try:
        async with ReplicatedLog(connection, StoreState(store), key=key):
            return store.dump()
    finally:
        store.close()


async def replicated_load(
    connection: Transport, version: int, rows: Rows, *, force: bool = False, key: GroupKey | None = None
) -> int:
    """Write `rows` into the replicated store through its log, the group stopped; the version it ends at. `key`: the
    group key the entries are signed with (the replicas refuse unsigned ones)."""
    store = ConfigStore.in_memory("import")
    async with AsyncExitStack() as stack:
        stack.callback(store.close)
        election = Election(connection, connection.topics.state_lock, new_replica_id(), key=key)
        # With --force the import replaces the whole state: it may (and after lost history, must) start from a log
        # missing entries.
        replicated = ReplicatedLog(connection, StoreState(store), election=election, require_whole=not force, key=key)
        await stack.enter_async_context(replicated)
        await stack.enter_async_context(election)
        try:
            await replicated.wait_writable(LOCK_WAIT)
        except TimeoutError:
            raise TransferError(
                f"a replica of the store holds {connection.topics.state_lock}: stop the group (`toolreg replicas` lists"
                " it) before importing, or write through it with `toolreg config put`"
            ) from None
        current, existing = store.dump()
        if existing and not force:
            raise TransferError(
                f"the replicated store already holds {len(existing)} item(s); add --force to replace them"
            )
        wanted = {(w, t, k) for w, t, k, _ in rows}
        payloads = list(_payloads(rows, [(w, t, k) for w, t, k, _ in existing if (w, t, k) not in wanted]))
        first = max(current + 1, version - len(payloads) + 1)
        for offset, payload in enumerate(payloads):
            await replicated.append(payload, version=first + offset)
        if payloads:
            await replicated.write_snapshot()  # the next replica starts from it, not from the import's entries
        return replicated.version


def _payloads(rows: Rows, deletes: list[tuple[str, str, str]]) -> Iterator[dict[str, Any]]:
    """Log payloads (one workspace each, about `CHUNK_BYTES`) that put `rows` and delete `deletes`."""
    by_workspace: dict[str, tuple[list[list[str]], list[list[str]]]] = defaultdict(lambda: ([], []))
    for workspace, item_type, key, value in rows:
        by_workspace[workspace][0].append([item_type, key, value])
    for workspace, item_type, key in deletes:
        by_workspace[workspace][1].append([item_type, key])
    for workspace, (puts, removals) in sorted(by_workspace.items()):
        chunk: dict[str, Any] = {"workspace": workspace, "puts": [], "deletes": []}
        size = 0
        for kind, entries in (("deletes", removals), ("puts", puts)):
            for entry in entries:
                cost = sum(len(part) for part in entry) + 16
                if size and size + cost > CHUNK_BYTES:
                    yield chunk
                    chunk, size = {"workspace": workspace, "puts": [], "deletes": []}, 0
                chunk[kind].append(entry)
                size += cost
        if chunk["puts"] or chunk["deletes"]:
            yield chunk
