"""Consistent copies of the config store, and putting one back.

A copy is taken with SQLite's online backup API on a connection of its own,
so it is a consistent snapshot even while the store is being written (WAL
mode lets it read alongside the writer), and it runs in a worker thread, off
the event loop. Every copy is integrity-checked before it is kept: a damaged
store never rotates the good backups out.

Backups are `<data-dir>/backups/config-<UTC time>-v<version>.sqlite`; the
store service takes one at start and then whenever the store has changed and
`interval` has passed (or `max_versions` versions were written), keeping the
newest `keep`.

Restoring puts a checked copy in place of `config.sqlite`, keeps the file it
replaces beside it (never deleted), and moves the version past anything the
replaced store had reached, so every reader sees a new version and reloads.
A copy of another store (another store id than the data directory's file
or marker) is refused unless forced: it would replace this store's content
with another deployment's.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger

from .check import (
    StoreDamaged,
    StoreFacts,
    StoreMarker,
    access_error,
    access_problem,
    backup_dir,
    integrity_problem,
    marker_path,
    read_facts,
    read_marker,
    write_marker,
)

log = get_logger("discovery.store")

KEEP = 5
INTERVAL = 600.0
MAX_VERSIONS = 1000
STALE_PARTIAL = 3600.0
"""A `.partial` copy this old was left by a process that died mid-backup (a live backup takes seconds at most)."""


@dataclass(frozen=True)
class Backup:
    path: Path
    facts: StoreFacts
    seconds: float


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def default_backup_path(db_path: Path, version: int, folder: Path | None = None) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return (folder or backup_dir(db_path)) / f"{db_path.stem}-{stamp}-v{version}.sqlite"


def inspect_copy(path: Path) -> StoreFacts:
    """Facts of a store file that is not open elsewhere; `StoreDamaged` if it is corrupt or not a store,
    `StoreAccessError` if the file system will not let SQLite open it (which says nothing about the copy)."""
    if not path.is_file():
        raise StoreDamaged(f"{path} does not exist or is not a file")
    try:
        db = _connect(path)
        try:
            problem = integrity_problem(db)
            if problem is not None:
                raise StoreDamaged(f"{path} is corrupt: {problem}")
            facts = read_facts(db)
        finally:
            db.close()
    except sqlite3.Error as exc:
        found = access_problem(exc, path)
        if found is not None:
            raise access_error(found, f"the copy {path.name}", verb="open") from None
        raise StoreDamaged(f"{path} is unreadable: {exc}") from None
    if facts.store_id is None and facts.version == 0 and facts.items == 0:
        raise StoreDamaged(f"{path} holds no config store (no items and no version)")
    return facts


def take_backup(db_path: Path, destination: Path | None = None) -> Backup:
    """Copy the store at `db_path` consistently to `destination` (a file or folder; default: the backups folder) and
    check the copy.

    Blocking: call it in a worker thread from async code. The copy is written
    under a temporary name and renamed into place once checked, so a backup
    file that exists is a whole, checked one; a copy that failed half-way (a
    full disk) is removed. A file system that refuses the copy, or the
    store, is `StoreAccessError`.
    """
    started = time.perf_counter()
    partial: Path | None = None
    try:
        source = _connect(db_path)
        try:
            problem = integrity_problem(source)
            if problem is not None:
                raise StoreDamaged(f"config store {db_path} is corrupt, not backing it up: {problem}")
            version = read_facts(source).version
            if destination is None or destination.is_dir():
                target = default_backup_path(db_path, version, destination)
            else:
                target = destination
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            partial.unlink(missing_ok=True)
            copy = _connect(partial)
            try:
                source.backup(copy)  # one step: a consistent snapshot of one read transaction
            finally:
                copy.close()
        finally:
            source.close()
        facts = inspect_copy(partial)
        with open(partial, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(partial, target)
    except BaseException as exc:
        if partial is not None:
            partial.unlink(missing_ok=True)
        found = (
            access_problem(exc, partial if partial is not None else db_path)
            if isinstance(exc, (OSError, sqlite3.Error))
            else None
        )
        if found is not None:
            what = "the config store" if partial is None else "the backup"
            raise access_error(found, what, verb="open" if partial is None else "write") from None
        raise
    return Backup(path=target, facts=facts, seconds=time.perf_counter() - started)


def backups_of(db_path: Path) -> list[Path]:
    """Automatic backups of this store, oldest first."""
    return sorted(backup_dir(db_path).glob(f"{db_path.stem}-*.sqlite"))


def prune(db_path: Path, keep: int = KEEP) -> list[Path]:
    """Delete all but the newest `keep` automatic backups, and copies a crash left half-written; returns the backups
    deleted."""
    old = backups_of(db_path)[:-keep] if keep > 0 else []
    for path in old:
        path.unlink(missing_ok=True)
    for partial in backup_dir(db_path).glob("*.partial"):
        try:
            if time.time() - partial.stat().st_mtime > STALE_PARTIAL:
                partial.unlink()
        except OSError:
            pass
    return old


def version_of_backup(path: Path) -> int | None:
    """The version a default-named backup was taken at, from its name."""
    tail = path.stem.rpartition("-v")[2]
    return int(tail) if tail.isdigit() else None


class ForeignBackup(ToolDiscoveryError):
    """The copy to restore is of another store than the one this data directory holds; restore it only when forced."""


@dataclass(frozen=True)
class Restored:
    facts: StoreFacts
    """What the restored store holds, with its new version."""
    replaced: Path | None
    """Where the file it replaced was kept, if there was one."""


def restore(db_path: Path, source: Path, *, force: bool = False) -> Restored:
    """Put the checked copy `source` in place of the store at `db_path`. The caller holds the data directory's lock.

    The replaced file (and its WAL) is renamed, not deleted. The restored
    version is set past both the copy's and the last the replaced store was
    known to have (its marker, or the file itself if it can still be read), so
    readers never mistake the restored content for a version they have seen;
    its change feed starts there, so no reader is told what changed since a
    version of the history the restore replaced.
    A copy with another store id than this directory's (`ForeignBackup`) is
    restored only with `force`; it then keeps its own id.
    """
    facts = inspect_copy(source)
    known = _known_store_ids(db_path)
    if known and facts.store_id is not None and facts.store_id not in known and not force:
        mine = ", ".join(sorted(i[:8] for i in known))
        raise ForeignBackup(
            f"{source} is a backup of another store (id {facts.store_id[:8]}) than the one in {db_path.parent} (id"
            f" {mine}); restoring it replaces this store's content with that one's: add --force if that is what you"
            " want"
        )
    floor = _last_known_version(db_path)
    partial = db_path.with_name(db_path.name + ".restoring")
    # The copy is made in full before the store is touched: a disk that fills up half-way leaves the store as it was.
    try:
        partial.unlink(missing_ok=True)
        src, dst = _connect(source), _connect(partial)
        try:
            src.backup(dst)
            version = max(facts.version, floor) + 1
            dst.execute("UPDATE meta SET value=? WHERE name='version'", (version,))
            # The copy's change feed is another history than the one readers followed: it starts again at `version`.
            dst.execute("DROP TABLE IF EXISTS changes")
            dst.execute("DELETE FROM meta WHERE name='changes_floor'")
            dst.execute("CREATE TABLE IF NOT EXISTS store_info (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            dst.execute(
                "INSERT OR IGNORE INTO store_info (name, value) VALUES ('id', ?)", (uuid.uuid4().hex,)
            )  # a copy from before ids
            restored = read_facts(dst)
        finally:
            src.close()
            dst.close()
        with open(partial, "rb") as handle:
            os.fsync(handle.fileno())
    except BaseException as exc:
        partial.unlink(missing_ok=True)
        found = access_problem(exc, db_path) if isinstance(exc, (OSError, sqlite3.Error)) else None
        if found is not None:
            raise access_error(found, "the restored copy", verb="write") from None
        raise
    replaced = None
    if db_path.exists():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        replaced = db_path.with_name(f"{db_path.name}.replaced-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            old = db_path.with_name(db_path.name + suffix)
            if old.exists():
                os.replace(old, replaced.with_name(replaced.name + suffix))
    os.replace(partial, db_path)
    write_marker(db_path, StoreMarker.of(restored))
    return Restored(facts=restored, replaced=replaced)


def _known_store_ids(db_path: Path) -> set[str]:
    """The store ids this data directory is known to hold: its marker's, and its file's if it can be read."""
    known = {marker.store_id} if (marker := read_marker(db_path)) is not None and marker.store_id else set()
    if db_path.exists():
        db = _connect(db_path)
        try:
            store_id = read_facts(db).store_id
        except sqlite3.Error:
            store_id = None  # damaged: the marker is what we know
        finally:
            db.close()
        if store_id:
            known.add(store_id)
    return known


def _last_known_version(db_path: Path) -> int:
    known = [marker.version] if (marker := read_marker(db_path)) is not None else []
    if db_path.exists():
        db = _connect(db_path)
        try:
            known.append(read_facts(db).version)
        except sqlite3.Error:
            pass  # damaged: the marker is what we know
        finally:
            db.close()
    return max(known, default=0)


__all__ = [
    "Backup",
    "ForeignBackup",
    "Restored",
    "backups_of",
    "default_backup_path",
    "inspect_copy",
    "marker_path",
    "prune",
    "restore",
    "take_backup",
]
