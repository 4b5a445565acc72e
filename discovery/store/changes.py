"""The store's change feed: which keys each version changed, kept for a bounded window.

A reader at version v asks what changed since v and gets the keys changed
after v with their values now (or none: deleted), instead of reading every
item again. The feed is a table beside the items, written in the same
transaction as the write it records, so it is exactly as durable as the items
(the SQLite file, or the in-memory state a replicated store rebuilds from its
log, whose replays record here too).

The window is bounded by keys and by bytes (`ChangeWindow`): past either,
the oldest versions are dropped whole, down to three quarters of the bound
(so pruning costs one pass per quarter window, not one per write), and
`floor` moves up. A reader older than `floor` is told to read everything.
A store that had no feed (made by an older release) starts its feed at the
version it is at: from there it answers deltas like any other.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE IF NOT EXISTS changes (
    version INTEGER NOT NULL,
    workspace TEXT NOT NULL,
    type TEXT NOT NULL,
    key TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS changes_by_workspace ON changes (workspace, version);
CREATE INDEX IF NOT EXISTS changes_by_version ON changes (version);
INSERT OR IGNORE INTO meta (name, value) SELECT 'changes_floor', value FROM meta WHERE name='version';
"""
ROW_OVERHEAD = 32
"""Bytes a recorded key costs beyond its names (version, row and index entries), for the bytes bound."""
KEEP = 0.75
"""Pruning keeps this share of each bound, so it runs once per quarter window."""

Changed = list[tuple[str, str, str | None]]
"""`(type, key, value now or None: deleted)`, in type and key order."""


@dataclass(frozen=True)
class ChangeWindow:
    """How much history the feed keeps: at most `keys` changed keys and about `bytes` of them, whichever is hit
    first."""

    keys: int = 100_000
    bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.keys < 1 or self.bytes < 1:
            raise ValueError(f"a change window keeps at least one key and one byte, not {self.keys} and {self.bytes}")


class TooOld(Exception):
    """The feed cannot say what changed since that version: it is older than the window, or newer than the store."""


class ChangeFeed:
    """The `changes` table of one store's connection. Every call runs inside the caller's transaction, if any."""

    def __init__(self, db: sqlite3.Connection, window: ChangeWindow) -> None:
        self._db = db
        self.window = window
        db.executescript(SCHEMA)
        row = db.execute(
            f"SELECT count(*), coalesce(sum(length(workspace) + length(type) + length(key) + {ROW_OVERHEAD}), 0)"
            " FROM changes"
        ).fetchone()
        self._rows, self._bytes = int(row[0]), int(row[1])

    @property
    def floor(self) -> int:
        """The feed holds every change made after this version."""
        return int(self._db.execute("SELECT value FROM meta WHERE name='changes_floor'").fetchone()[0])

    def record(self, version: int, workspace: str, keys: Iterable[tuple[str, str]]) -> None:
        """Note that `version` changed `keys` of `workspace`; prune the oldest versions if the window is full."""
        rows = [(version, workspace, t, k) for t, k in keys]
        if not rows:
            return
        self._db.executemany("INSERT INTO changes (version, workspace, type, key) VALUES (?, ?, ?, ?)", rows)
        self._rows += len(rows)
        self._bytes += sum(len(w) + len(t) + len(k) + ROW_OVERHEAD for _, w, t, k in rows)
        if self._rows > self.window.keys or self._bytes > self.window.bytes:
            self._prune()

    def _prune(self) -> None:
        """Drop the oldest versions, whole, until the feed is within `KEEP` of both bounds."""
        excess_rows = self._rows - int(self.window.keys * KEEP)
        excess_bytes = self._bytes - int(self.window.bytes * KEEP)
        cut, rows, size = None, 0, 0
        for version, count, used in self._db.execute(
            f"SELECT version, count(*), sum(length(workspace) + length(type) + length(key) + {ROW_OVERHEAD})"
            " FROM changes GROUP BY version ORDER BY version"
        ):
            cut, rows, size = version, rows + count, size + used
            if rows >= excess_rows and size >= excess_bytes:
                break
        if cut is None:
            return
        self._db.execute("DELETE FROM changes WHERE version <= ?", (cut,))
        self._db.execute("UPDATE meta SET value = max(value, ?) WHERE name='changes_floor'", (cut,))
        self._rows -= rows
        self._bytes -= size

    def restart(self, version: int) -> None:
        """Forget the history: the items were replaced whole (a snapshot restored), so the feed starts at
        `version`."""
        self._db.execute("DELETE FROM changes")
        self._db.execute("UPDATE meta SET value=? WHERE name='changes_floor'", (version,))
        self._rows = self._bytes = 0

    def since(
        self,
        workspace: str,
        since: int,
        current: int,
        types: Iterable[str],
        *,
        after: tuple[str, str] | None,
        limit: int,
        budget: int,
        size: Callable[[str, str | None], int],
        value: Callable[[str, str], str | None],
    ) -> tuple[Changed, bool]:
        """The keys of `workspace` changed after version `since` (of `types`; none given: every type), with their
        values now, after `after` in `(type, key)` order, up to `limit` and about `budget`; and whether more follow.

        `TooOld` if `since` is below the window or above `current`: the
        reader's state is not one this feed can bring up to date.
        """
        if since < self.floor or since > current:
            raise TooOld(
                f"version {since} is outside the change feed (versions {self.floor} to {current}); read everything"
            )
        sql = "SELECT DISTINCT type, key FROM changes WHERE workspace=? AND version>?"
        params: list[object] = [workspace, since]
        wanted = sorted(set(types))
        if wanted:
            sql += f" AND type IN ({', '.join('?' * len(wanted))})"
            params += wanted
        if after is not None:
            sql += " AND (type, key) > (?, ?)"
            params += list(after)
        changed: Changed = []
        used = 0
        cursor = self._db.execute(sql + " ORDER BY type, key", params)
        try:
            for item_type, key in cursor:
                now = value(item_type, key)
                cost = size(key, now)
                if changed and (len(changed) >= limit or used + cost > budget):
                    return changed, True
                changed.append((item_type, key, now))
                used += cost
            return changed, False
        finally:
            cursor.close()
