"""Config items in SQLite: `(workspace, type, key) -> value` and one version.

Every write operation is one transaction that also bumps the version, so a
reader that sees version N sees every write N covers. A write that changes
nothing (same value, missing key) does not bump it: readers reload only on
real change.

Opening checks the file first (`check`): a corrupt file, or one missing
data its marker says it had, raises `StoreDamaged` instead of being served;
a file the machine will not let us write (read-only, full disk) raises
`StoreAccessError`, which is not damage.

`ConfigStore.in_memory()` is the same store with no file: the replicated
backend (`replicated`) keeps its state there, rebuilt from the log, and
writes each `Write` to the log before it answers.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.schemas import (
    ToolDescriptor,
    ToolServiceDescriptor,
    check_tool_against_service,
    validate_config_item,
)

from .changes import Changed, ChangeFeed, ChangeWindow
from .check import (
    StoreDamaged,
    StoreFacts,
    StoreMarker,
    access_error,
    access_problem,
    check_before_open,
    check_open_store,
    how_to_recover,
    read_facts,
    write_marker,
)

STORE_FILE = "config.sqlite"
"""The store's file in the data directory."""

Changes = dict[str, list[str]]
Items = list[tuple[str, str, str]]
Keys = list[tuple[str, str]]
Expectations = list[tuple[str, str, str | None]]
Pairs = list[tuple[str, str]]
Names = list[str]
Page = list[tuple[str, str | None]]
Rows = list[tuple[str, str, str, str]]
"""Items of every workspace, `(workspace, type, key, value)`: what a snapshot holds."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    workspace TEXT NOT NULL,
    type TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (workspace, type, key)
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta (name, value) VALUES ('version', 0);
CREATE TABLE IF NOT EXISTS store_info (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StoreError(ToolDiscoveryError, ValueError):
    """A write was refused; nothing was stored."""


class ExpectationFailed(StoreError):
    """A write's precondition (`expect`) did not hold; nothing was stored."""


@dataclass(frozen=True)
class Write:
    """What one write changed, as a log replays it: the version it made and its effective puts and deletes.

    Only what really changed is listed (a put of the value already there is
    not), so replaying a `Write` on a store at `version - 1`, or any earlier
    state of the same log, gives the same items.
    """

    version: int
    workspace: str
    puts: Items = field(default_factory=list)
    deletes: Keys = field(default_factory=list)


class ConfigStore:
    """The store behind the config service. Not thread-safe: one owner."""

    durable = True
    """Whether the store is its own durable copy (a file); False for `in_memory()`, whose durability is a log's."""

    feed: ChangeFeed
    """Which keys each recent version changed (`changes`): what lets a reader at an older version read only those."""

    last_write: Write | None = None
    """The effective changes of the latest write that moved the version (the replicated store logs them)."""

    @classmethod
    def in_memory(cls, name: str = "replicated", *, window: ChangeWindow = ChangeWindow()) -> "ConfigStore":
        """A store with no file, for state whose durable copy is elsewhere (the replicated log)."""
        store = cls.__new__(cls)
        store.path = Path(f"<{name}>")
        store.durable = False
        store._marked = None
        store._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        store._db.executescript(SCHEMA)
        store.feed = ChangeFeed(store._db, window)
        return store

    def __init__(self, path: str | Path, *, window: ChangeWindow = ChangeWindow()) -> None:
        """Open and check the store; `StoreDamaged` if its data is bad, `StoreAccessError` if the machine will not let
        us write it. `window`: how much history its change feed keeps."""
        self.path = Path(path)
        self._marked: StoreMarker | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            check_before_open(self.path)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise self._refusal(exc) from None
        try:
            check_open_store(self._db, self.path)  # first: nothing is written into a file that fails it
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
            self.feed = ChangeFeed(self._db, window)
            self._db.execute("INSERT OR IGNORE INTO store_info (name, value) VALUES ('id', ?)", (uuid.uuid4().hex,))
            self.mark()
        except (OSError, sqlite3.DatabaseError) as exc:
            self._db.close()
            raise self._refusal(exc) from None
        except BaseException:
            self._db.close()
            raise

    def _refusal(self, exc: OSError | sqlite3.Error) -> Exception:
        """What opening failed with, as one line: the file system's refusal (not damage), or damage."""
        problem = access_problem(exc, self.path)
        if problem is not None:
            return access_error(problem)
        if isinstance(exc, OSError):
            return exc
        return StoreDamaged(f"config store {self.path} is corrupt or not a store: {exc}; {how_to_recover(self.path)}")

    def close(self) -> None:
        """Close, leaving a marker of what the store held (a clean shutdown's record)."""
        if not self.durable:
            self._db.close()
            return
        try:
            self.mark()
        except (sqlite3.Error, OSError):
            pass  # a store that cannot be read now keeps its last good marker
        self._db.close()

    def facts(self) -> StoreFacts:
        """Id, version and item count, read together."""
        return read_facts(self._db)

    def mark(self) -> bool:
        """Write the marker if the version moved since the last one; True if written. Cheap when nothing changed."""
        if not self.durable:
            return False
        if self._marked is not None and self._marked.version == self.version:
            return False
        facts = self.facts()
        if self._marked is not None and (self._marked.version, self._marked.items) == (facts.version, facts.items):
            return False
        marker = StoreMarker.of(facts)
        write_marker(self.path, marker)
        self._marked = marker
        return True

    @property
    def version(self) -> int:
        return int(self._db.execute("SELECT value FROM meta WHERE name='version'").fetchone()[0])

    def _bump(self) -> int:
        self._db.execute("UPDATE meta SET value = value + 1 WHERE name='version'")
        return self.version

    def get(self, workspace: str, keys: Iterable[tuple[str, str]]) -> Items:
        found = []
        for item_type, key in keys:
            value = self._value(workspace, item_type, key)
            if value is not None:
                found.append((item_type, key, value))
        return found

    def list(self, workspace: str, item_type: str) -> Names:
        rows = self._db.execute(
            "SELECT key FROM items WHERE workspace=? AND type=? ORDER BY key", (workspace, item_type)
        )
        return [r[0] for r in rows]

    def getvalues(self, workspace: str, item_type: str) -> Pairs:
        rows = self._db.execute(
            "SELECT key, value FROM items WHERE workspace=? AND type=? ORDER BY key", (workspace, item_type)
        )
        return [(r[0], r[1]) for r in rows]

    def page(
        self,
        workspace: str,
        item_type: str,
        *,
        after: str | None,
        limit: int,
        budget: int,
        size: Callable[[str, str | None], int],
        values: bool = True,
    ) -> tuple[Page, bool]:
        """`(key, value)` of items after key `after` in key order, up to `limit` items and `budget` by `size`; and
        whether more follow.

        A page always holds at least one item if any is left, whatever its
        size: the caller bounds single items at write time. `values=False`
        reads keys only (the value is None).
        """
        column = "value" if values else "NULL"
        sql = f"SELECT key, {column} FROM items WHERE workspace=? AND type=?"
        params: tuple[str, ...] = (workspace, item_type)
        if after is not None:
            sql, params = sql + " AND key>?", (*params, after)
        cursor = self._db.execute(sql + " ORDER BY key", params)
        rows: Page = []
        used = 0
        try:
            for key, value in cursor:
                cost = size(key, value)
                if rows and (len(rows) >= limit or used + cost > budget):
                    return rows, True
                rows.append((key, value))
                used += cost
            return rows, False
        finally:
            cursor.close()

    def values_all_workspaces(self, item_type: str) -> Items:
        """`(workspace, key, value)` of every item of a type, in every workspace (TrustGraph's `getvalues-all-ws`)."""
        rows = self._db.execute(
            "SELECT workspace, key, value FROM items WHERE type=? ORDER BY workspace, key", (item_type,)
        )
        return [(r[0], r[1], r[2]) for r in rows]

    def keys_all_workspaces(self, item_type: str) -> Pairs:
        """`(workspace, key)` of every item of a type, values left out so the answer stays small (`getkeys-all-ws`)."""
        rows = self._db.execute("SELECT workspace, key FROM items WHERE type=? ORDER BY workspace, key", (item_type,))
        return [(r[0], r[1]) for r in rows]

    def workspaces(self) -> Names:
        """Every workspace holding at least one item."""
        return [r[0] for r in self._db.execute("SELECT DISTINCT workspace FROM items ORDER BY workspace")]

    def has_items(self, workspace: str) -> bool:
        return self._db.execute("SELECT 1 FROM items WHERE workspace=? LIMIT 1", (workspace,)).fetchone() is not None

    def config(self, workspace: str) -> tuple[int, dict[str, dict[str, str]]]:
        result: dict[str, dict[str, str]] = {}
        self._db.execute("BEGIN")
        try:
            for item_type, key, value in self._db.execute(
                "SELECT type, key, value FROM items WHERE workspace=? ORDER BY type, key", (workspace,)
            ):
                result.setdefault(item_type, {})[key] = value
            version = self.version
        finally:
            if self._db.in_transaction:
                self._db.execute("COMMIT")
        return version, result

    def _validate(self, workspace: str, values: Items) -> None:
        """Check every `tool` and `tool-service` value, and each tool against its service."""
        services: dict[str, ToolServiceDescriptor] = {}
        tools: list[ToolDescriptor] = []
        for item_type, key, value in values:
            try:
                parsed = validate_config_item(item_type, key, value)
            except ValueError as exc:
                raise StoreError(str(exc)) from None
            if isinstance(parsed, ToolServiceDescriptor):
                services[parsed.id] = parsed
            elif isinstance(parsed, ToolDescriptor):
                tools.append(parsed)
        for tool in tools:
            if tool.type != "tool-service" or tool.service is None:
                continue
            service = services.get(tool.service)
            if service is None:
                stored = self.get(workspace, [("tool-service", tool.service)])
                if stored:
                    try:
                        service = ToolServiceDescriptor.model_validate_json(stored[0][2])
                    except ValueError:
                        service = None
            if service is not None:
                try:
                    check_tool_against_service(tool, service)
                except ValueError as exc:
                    raise StoreError(f"tool/{tool.name}: {exc}") from None

    def _expect(self, workspace: str, expect: Expectations) -> None:
        """Raise `ExpectationFailed`, naming the key, unless every precondition holds (inside `apply`'s transaction)."""
        for item_type, key, wanted in expect:
            current = self._value(workspace, item_type, key)
            if current != wanted:
                state = "absent" if current is None else "different"
                raise ExpectationFailed(
                    f"{item_type}/{key} is {state} (expected {'absent' if wanted is None else 'a known value'})"
                )

    def _put_and_delete(self, workspace: str, puts: Items, deletes: Keys) -> tuple[Items, Keys]:
        """Write `puts` and delete `deletes` (inside `apply`'s transaction); what actually changed: a put of the value
        already there, or a delete of an absent key, changes nothing and moves no version."""
        written: Items = []
        removed: Keys = []
        for item_type, key, value in puts:
            if self._value(workspace, item_type, key) == value:
                continue
            self._db.execute(
                "INSERT INTO items (workspace, type, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (workspace, type, key) DO UPDATE SET value=excluded.value",
                (workspace, item_type, key, value),
            )
            written.append((item_type, key, value))
        for item_type, key in deletes:
            cursor = self._db.execute(
                "DELETE FROM items WHERE workspace=? AND type=? AND key=?", (workspace, item_type, key)
            )
            if cursor.rowcount:
                removed.append((item_type, key))
        return written, removed

    def apply(
        self,
        workspace: str,
        puts: Items = [],  # noqa: B006 - never mutated
        deletes: Keys = [],  # noqa: B006
        expect: Expectations = [],  # noqa: B006
        *,
        validate: bool = True,
        bump_always: bool = False,
    ) -> tuple[int, Changes]:
        """Write and delete in one transaction and at most one version bump.

        `expect` holds preconditions `(type, key, value or None for absent)`;
        if any fails, nothing is written and `Conflict` names the key. This is
        what lets the registry merge without ever clobbering an item an
        operator wrote a moment earlier.

        `validate=False` and `bump_always=True` are TrustGraph's store: any
        value is stored, and every write moves the version, changed or not.
        """
        if validate:
            self._validate(workspace, puts)
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._expect(workspace, expect)
            written, removed = self._put_and_delete(workspace, puts, deletes)
            moved = bool(written or removed) or bump_always
            version = self._bump() if moved else self.version
            if moved:
                self.feed.record(version, workspace, [(t, k) for t, k, _ in written] + removed)
            self._db.execute("COMMIT")
            if moved:
                self.last_write = Write(version, workspace, written, removed)
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        changed = {item_type for item_type, _, _ in written} | {item_type for item_type, _ in removed}
        return version, {item_type: [workspace] for item_type in sorted(changed)}

    def replay(self, write: Write) -> bool:
        """Apply a logged write as it was made, version included; False (nothing done) if the store is already past it.

        This is how a replica follows the log: entries it already has, or that
        a deposed writer sent late, are skipped, so the version never goes back.
        """
        if write.version <= self.version:
            return False
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany(
                "INSERT INTO items (workspace, type, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (workspace, type, key) DO UPDATE SET value=excluded.value",
                [(write.workspace, t, k, v) for t, k, v in write.puts],
            )
            self._db.executemany(
                "DELETE FROM items WHERE workspace=? AND type=? AND key=?",
                [(write.workspace, t, k) for t, k in write.deletes],
            )
            self._db.execute("UPDATE meta SET value=? WHERE name='version'", (write.version,))
            self.feed.record(write.version, write.workspace, [(t, k) for t, k, _ in write.puts] + write.deletes)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        return True

    def dump(self) -> tuple[int, Rows]:
        """The version and every item `(workspace, type, key, value)`, read together: what a snapshot holds."""
        self._db.execute("BEGIN")
        try:
            rows = self._db.execute(
                "SELECT workspace, type, key, value FROM items ORDER BY workspace, type, key"
            ).fetchall()
            return self.version, [(r[0], r[1], r[2], r[3]) for r in rows]
        finally:
            if self._db.in_transaction:
                self._db.execute("COMMIT")

    def load(self, version: int, items: Iterable[tuple[str, str, str, str]]) -> None:
        """Replace everything with `items` at `version` (a snapshot being restored), in one transaction."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute("DELETE FROM items")
            self._db.executemany("INSERT INTO items (workspace, type, key, value) VALUES (?, ?, ?, ?)", items)
            self._db.execute("UPDATE meta SET value=? WHERE name='version'", (version,))
            self.feed.restart(version)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        self.last_write = None

    def changes(
        self,
        workspace: str,
        since: int,
        types: Iterable[str],
        *,
        after: tuple[str, str] | None,
        limit: int,
        budget: int,
        size: Callable[[str, str | None], int],
    ) -> tuple[int, Changed, bool]:
        """The version, and the keys of `workspace` changed after `since` with their values now (None: deleted), paged
        as `page` is; `TooOld` past the feed's window (`changes.ChangeFeed.since`)."""
        version = self.version
        changed, more = self.feed.since(
            workspace,
            since,
            version,
            types,
            after=after,
            limit=limit,
            budget=budget,
            size=size,
            value=lambda t, k: self._value(workspace, t, k),
        )
        return version, changed, more

    def _value(self, workspace: str, item_type: str, key: str) -> str | None:
        row = self._db.execute(
            "SELECT value FROM items WHERE workspace=? AND type=? AND key=?", (workspace, item_type, key)
        ).fetchone()
        return None if row is None else str(row[0])

    def put(self, workspace: str, values: Items) -> tuple[int, Changes]:
        """Write all values or none; returns (version, changed types -> [workspace])."""
        return self.apply(workspace, puts=values)

    def delete(self, workspace: str, keys: Keys) -> tuple[int, Changes]:
        return self.apply(workspace, deletes=keys)
