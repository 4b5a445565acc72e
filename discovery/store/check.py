"""Is this SQLite file the store we had, whole? Checked before a single request is served.

Two things can go wrong with `config.sqlite` that SQLite alone does not
report when the file is opened:

- **corruption** (a bad disk, a copy taken mid-write, a truncated file):
  SQLite opens it and answers some queries, wrongly or partly. `PRAGMA
  integrity_check` reads every page and index (about 0.1 s for an 80 MB
  store on 2 cores) and says so before anything is served;
- **lost data** (the file replaced by an empty or older one, or by another
  store): a 0-byte file is a perfectly valid empty database. So the store
  keeps a *marker* beside it, `config.sqlite.meta`, with its id, version and
  item count, written on every clean close and every second while it
  changes. A file whose version is behind the marker, or whose id differs,
  is missing data it is known to have had.

Either way the store is not opened (`StoreDamaged`, one line naming the file
and how to recover), never silently replaced by an empty one.

A file the machine will not let us open or write (a read-only mount, a
permission, a full disk) is not damage, and restoring a backup over it would
roll back every write since: SQLite's words for it ("unable to open database
file", "disk I/O error") are checked against the file system
(`access_problem`) and reported as `StoreAccessError`, with the fix.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from discovery.disk_access import AccessProblem, of_os_error, probe
from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger

log = get_logger("discovery.store")

MARKER_SUFFIX = ".meta"
BACKUP_DIR = "backups"
CORRUPTION_CODES = frozenset(
    {"SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_CORRUPT_INDEX", "SQLITE_CORRUPT_SEQUENCE", "SQLITE_CORRUPT_VTAB"}
)
ACCESS_CODES = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_PERM", "SQLITE_FULL")
"""SQLite's errors that may be the file system refusing us (checked with a probe), not the file being broken."""


class StoreDamaged(ToolDiscoveryError):
    """The store file is corrupt or is missing data it is known to have had; it must not be served."""


class StoreAccessError(ToolDiscoveryError):
    """The store cannot be opened or written (read-only mount, permissions, full disk); its data is not damaged."""

    def __init__(self, problem: AccessProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem


def store_files(db_path: Path) -> list[Path]:
    """The files SQLite writes for the store: the file, its WAL and shared-memory index."""
    return [db_path, db_path.with_name(db_path.name + "-wal"), db_path.with_name(db_path.name + "-shm")]


def access_problem(exc: BaseException, db_path: Path) -> AccessProblem | None:
    """The file-system problem behind `exc`, if that is what it is; None for corruption and everything else.

    SQLite's own code narrows it down (a full disk it names outright); the
    cause of a read-only or unopenable file is asked of the file system.
    """
    if isinstance(exc, OSError):
        return of_os_error(exc, db_path.parent)
    if not isinstance(exc, sqlite3.Error) or is_corruption(exc):
        return None
    name = getattr(exc, "sqlite_errorname", "") or ""
    if not name.startswith(ACCESS_CODES):
        return None
    found = probe(db_path.parent, store_files(db_path))
    if found is None and name.startswith("SQLITE_FULL"):
        return AccessProblem(errno.ENOSPC, db_path.parent)
    return found


def access_error(
    problem: AccessProblem, what: str = "the config store", *, verb: str = "write", running: bool = False
) -> StoreAccessError:
    return StoreAccessError(problem, problem.says(what, verb=verb, running=running))


@dataclass(frozen=True)
class StoreFacts:
    """What a store file holds, read in one transaction: enough to compare it with its marker."""

    store_id: str | None
    version: int
    items: int


@dataclass(frozen=True)
class StoreMarker:
    """The last known state of a store, kept beside it (`<file>.meta`)."""

    store_id: str
    version: int
    items: int
    written_at: float

    @classmethod
    def of(cls, facts: StoreFacts) -> "StoreMarker":
        return cls(store_id=facts.store_id or "", version=facts.version, items=facts.items, written_at=time.time())


def marker_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + MARKER_SUFFIX)


def backup_dir(db_path: Path) -> Path:
    return db_path.parent / BACKUP_DIR


def read_marker(db_path: Path) -> StoreMarker | None:
    """The marker, or None if there is none. An unreadable marker is logged and ignored (the integrity check still
    runs)."""
    path = marker_path(db_path)
    try:
        raw = json.loads(path.read_text())
        return StoreMarker(
            store_id=str(raw["store_id"]),
            version=int(raw["version"]),
            items=int(raw["items"]),
            written_at=float(raw["written_at"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("config.marker_unreadable", path=str(path), error=str(exc))
        return None


def write_marker(db_path: Path, marker: StoreMarker) -> None:
    """Replace the marker atomically: a crash leaves the old one or the new one, never half of either."""
    path = marker_path(db_path)
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "w") as handle:
            json.dump(asdict(marker), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk leaves no half-written marker behind
        raise


def is_corruption(exc: sqlite3.Error) -> bool:
    """SQLite's own verdict that the file (not the query or the disk's free space) is broken."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name in CORRUPTION_CODES or "malformed" in str(exc) or "not a database" in str(exc)


def integrity_problem(db: sqlite3.Connection) -> str | None:
    """None if `PRAGMA integrity_check` passes, else its first finding as one line.

    Only corruption is a finding; any other SQLite error (the file cannot be
    opened, the disk is full) is raised for the caller to tell apart.
    """
    try:
        rows = db.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.DatabaseError as exc:
        if is_corruption(exc):
            return str(exc)
        raise
    if [tuple(row) for row in rows] == [("ok",)]:
        return None
    first = str(rows[0][0]).replace("*** in database main ***", "").strip().splitlines()
    return f"{first[0] if first else 'integrity check failed'} ({len(rows)} finding(s))"


def read_facts(db: sqlite3.Connection) -> StoreFacts:
    """Id, version and item count in one read transaction; an empty or foreign file has version 0."""
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not {"items", "meta"} <= tables:
        return StoreFacts(store_id=None, version=0, items=0)
    in_transaction = db.in_transaction
    if not in_transaction:
        db.execute("BEGIN")
    try:
        row = db.execute("SELECT value FROM meta WHERE name='version'").fetchone()
        items = int(db.execute("SELECT count(*) FROM items").fetchone()[0])
        store_id = None
        if "store_info" in tables:
            found = db.execute("SELECT value FROM store_info WHERE name='id'").fetchone()
            store_id = str(found[0]) if found else None
    finally:
        if not in_transaction:
            db.execute("COMMIT")
    return StoreFacts(store_id=store_id, version=int(row[0]) if row else 0, items=items)


def newest_backup(db_path: Path) -> Path | None:
    backups = sorted(backup_dir(db_path).glob(f"{db_path.stem}-*.sqlite"))
    return backups[-1] if backups else None


def how_to_recover(db_path: Path, *, running: bool = False) -> str:
    """The one-line remedy: the newest automatic backup if there is one. `running`: said by a store that is serving."""
    first = "stop `toolreg up`, then " if running else ""
    newest = newest_backup(db_path)
    if newest is not None:
        return f"to recover, {first}run `toolreg store restore {newest}` (the newest backup in {backup_dir(db_path)})"
    return (
        f"no backup in {backup_dir(db_path)}: {first}restore one you keep elsewhere with `toolreg store restore PATH`, "
        f"or start empty by moving {db_path.name} and {marker_path(db_path).name} away"
    )


def check_before_open(db_path: Path) -> None:
    """A store file that is gone although its marker says it held data: refuse before SQLite creates an empty one."""
    if db_path.exists():
        return
    marker = read_marker(db_path)
    if marker is not None and (marker.version or marker.items):
        raise StoreDamaged(
            f"config store {db_path} is missing, but it had version {marker.version} with {marker.items} item(s) "
            f"(per {marker_path(db_path).name}); {how_to_recover(db_path)}"
        )


def check_open_store(db: sqlite3.Connection, db_path: Path) -> StoreFacts:
    """Raise `StoreDamaged` unless the opened file is whole and holds at least what its marker says it had.

    A SQLite error that is not corruption propagates: the caller asks `access_problem` what it is.
    """
    problem = integrity_problem(db)
    if problem is not None:
        raise StoreDamaged(f"config store {db_path} is corrupt: {problem}; {how_to_recover(db_path)}")
    try:
        facts = read_facts(db)
    except sqlite3.DatabaseError as exc:
        if not is_corruption(exc):
            raise
        raise StoreDamaged(f"config store {db_path} is unreadable: {exc}; {how_to_recover(db_path)}") from None
    marker = read_marker(db_path)
    if marker is None or (marker.version == 0 and marker.items == 0):
        return facts  # nothing is known to have been in it
    where = f"config store {db_path}"
    known = f"version {marker.version} with {marker.items} item(s) (per {marker_path(db_path).name})"
    if facts.version == 0 and facts.items == 0:
        raise StoreDamaged(f"{where} is empty, but it had {known}; {how_to_recover(db_path)}")
    if facts.store_id != marker.store_id:
        raise StoreDamaged(
            f"{where} is another store (id {(facts.store_id or 'none')[:8]}, expected {marker.store_id[:8]}) than the"
            f" one that had {known}; {how_to_recover(db_path)}"
        )
    if facts.version < marker.version:
        raise StoreDamaged(f"{where} is at version {facts.version}, but it had {known}; {how_to_recover(db_path)}")
    if facts.version == marker.version and facts.items != marker.items:
        raise StoreDamaged(
            f"{where} holds {facts.items} item(s) at version {facts.version}, but it had {known};"
            f" {how_to_recover(db_path)}"
        )
    return facts
