"""`toolreg store check|backup|restore|export|import`: look after the config store.

They work on the file under the data directory, not through the broker, so
they work when nothing else does. `check` tells damage (exit 1: restore a
backup) from a store the machine will not let us open or write, a read-only
mount, a permission or a full disk (exit `ACCESS_EXIT`: fix that, and do not
restore anything, the data is whole). `check` and `backup` are safe while
`toolreg up` runs (SQLite's WAL mode lets them read beside it); `restore`
refuses to run then, because `toolreg up` holds the file open.

`export` and `import` move a store between the SQLite file and the store
replicated on Apache Pulsar (`--store pulsar`), the version carried over.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from discovery.disk_access import probe
from discovery.store import backup as store_backup
from discovery.store.check import (
    StoreAccessError,
    StoreDamaged,
    StoreFacts,
    access_error,
    access_problem,
    check_open_store,
    marker_path,
    store_files,
)
from discovery.store.settings import StoreSettings
from discovery.store.sqlite import STORE_FILE

from .common import CommandError, UpLock, fail, settings_of, store_choice
from .parsing import subcommands

if TYPE_CHECKING:
    from discovery.replicas import GroupKey
    from toolservice_base.transport import Transport

T = TypeVar("T")

ACCESS_EXIT = 3
"""`toolreg store check`: the store cannot be opened or written (read-only mount, permissions, full disk); 1 is for
damage."""


def store_path(args: argparse.Namespace) -> Path:
    return settings_of(args).data_dir / STORE_FILE


def _check(path: Path) -> str:
    """The verdict on the store as one line; `StoreDamaged` for damage, `StoreAccessError` for a store the machine will
    not let us use.

    The store must also be writable, as `toolreg up` needs it: a whole store
    on a read-only mount is still reported, with its facts, and why it cannot run.
    """
    if not path.exists():
        raise StoreDamaged(f"no config store at {path}; `toolreg up` creates one (or `toolreg store restore PATH`)")
    try:
        facts = _checked(sqlite3.connect(path), path)
    except sqlite3.Error as exc:
        problem = access_problem(exc, path)
        if problem is None:
            raise StoreDamaged(f"config store {path} cannot be read: {exc}") from None
        if problem.code != errno.EROFS or _unmerged_log(path):
            raise access_error(problem, verb="open") from None
        # Nothing can write on a read-only mount: the file can be read as it lies, and its data vouched for.
        facts = _checked(sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True), path)
        raise StoreAccessError(problem, f"{_whole(path, facts)}, but {problem.says('the config store')}") from None
    problem = probe(path.parent, store_files(path))
    if problem is not None:
        raise StoreAccessError(problem, f"{_whole(path, facts)}, but {problem.says('the config store')}")
    return _whole(path, facts)


def _checked(db: sqlite3.Connection, path: Path) -> StoreFacts:
    try:
        return check_open_store(db, path)
    finally:
        db.close()


def _unmerged_log(path: Path) -> bool:
    """A write-ahead log with data in it: reading the file without it would show an older store."""
    wal = store_files(path)[1]
    return wal.exists() and wal.stat().st_size > 0


def _whole(path: Path, facts: StoreFacts) -> str:
    return (
        f"{path}: whole (integrity check passed), version {facts.version}, {facts.items} item(s), store id"
        f" {(facts.store_id or 'none')[:8]}"
    )


@contextlib.contextmanager
def _file_system(path: Path) -> Iterator[None]:
    """A file system that refuses the command (read-only, full) is said in one line, not a traceback, and not as
    damage."""
    try:
        yield
    except (OSError, sqlite3.Error) as exc:
        problem = access_problem(exc, path)
        if problem is None:
            raise
        raise access_error(problem) from None


async def cmd_store_check(args: argparse.Namespace) -> int:
    try:
        print(await asyncio.to_thread(_check, store_path(args)))
    except StoreAccessError as exc:
        fail(str(exc))
        return ACCESS_EXIT
    return 0


async def cmd_store_backup(args: argparse.Namespace) -> int:
    source = store_path(args)
    if not source.exists():
        raise StoreDamaged(f"no config store at {source} to back up")
    destination = Path(args.path) if args.path else None
    with _file_system(source):
        backup = await asyncio.to_thread(store_backup.take_backup, source, destination)
    print(
        f"backed up {source} (version {backup.facts.version}, {backup.facts.items} item(s)) to {backup.path} "
        f"in {backup.seconds * 1000:.0f} ms"
    )
    return 0


async def cmd_store_restore(args: argparse.Namespace) -> int:
    target = store_path(args)
    with _file_system(target):
        lock = UpLock(target.parent)
        try:
            lock.acquire("stop it before restoring its store")
            restored = await asyncio.to_thread(store_backup.restore, target, Path(args.path), force=args.force)
        finally:
            with contextlib.suppress(OSError):  # a lock file a full disk could not take
                lock.release()
    facts = restored.facts
    print(
        f"restored {target} from {args.path}: {facts.items} item(s), now at version {facts.version} "
        "(past every version the replaced store had, so readers reload)"
    )
    if restored.replaced is not None:
        print(f"the replaced file is kept as {restored.replaced}")
    print(f"marker {marker_path(target)} updated; start `toolreg up` to serve it")
    return 0


async def cmd_store_export(args: argparse.Namespace) -> int:
    from discovery.store import transfer

    backend = store_choice(args)
    if backend == "sqlite":
        _hint_replicated(args)
        version, rows = await asyncio.to_thread(transfer.sqlite_dump, store_path(args))
    else:
        version, rows = await _on_broker(args, lambda connection: transfer.replicated_dump(connection, _key(args)))
    await asyncio.to_thread(transfer.write_export, Path(args.path), version, rows)
    print(f"exported {len(rows)} item(s) at version {version} from the {backend} store to {args.path}")
    return 0


def _hint_replicated(args: argparse.Namespace) -> None:
    """`store export` of a SQLite file that is not there, on a machine pointed at a cluster (PULSAR_URL): the store
    meant is likely the replicated one, so say how to name it rather than only that no file exists."""
    settings = settings_of(args)
    path = store_path(args)
    chosen = getattr(args, "store", None) or StoreSettings.variable("backend").read()
    if settings.pulsar_url and not chosen and not path.exists():
        raise CommandError(
            f"no SQLite config store at {path}; PULSAR_URL is set, so for the store replicated on Apache Pulsar"
            " add --store pulsar (or set TOOLREG_STORE=pulsar), or give --data-dir where `toolreg up` keeps its file"
        )


async def cmd_store_import(args: argparse.Namespace) -> int:
    from discovery.store import transfer

    backend = store_choice(args)
    version, rows = await asyncio.to_thread(transfer.read_export, Path(args.path))
    if backend == "sqlite":
        target = store_path(args)
        with _file_system(target):
            lock = UpLock(target.parent)
            try:
                lock.acquire("stop it before importing into its store")
                final = await asyncio.to_thread(transfer.sqlite_load, target, version, rows, force=args.force)
            finally:
                with contextlib.suppress(OSError):  # a lock file a full disk could not take
                    lock.release()
    else:
        final = await _on_broker(
            args,
            lambda connection: transfer.replicated_load(connection, version, rows, force=args.force, key=_key(args)),
        )
    print(f"imported {len(rows)} item(s) from {args.path} into the {backend} store, now at version {final}")
    return 0


def _key(args: argparse.Namespace) -> GroupKey | None:
    """The replicas' group key (TOOLREG_GROUP_KEY), which a replicated export checks and an import signs with."""
    from discovery.replicas import group_key_from
    from discovery.replicas.settings import ReplicaSettings

    return group_key_from(ReplicaSettings.from_env().group_key_file)


async def _on_broker(args: argparse.Namespace, action: Callable[[Transport], Awaitable[T]]) -> T:
    from toolservice_base import open_transport

    async with AsyncExitStack() as stack:
        connection = await open_transport(settings_of(args))
        stack.push_async_callback(connection.close)
        return await action(connection)


def add_commands(subparsers: Any, common_parent: argparse.ArgumentParser) -> None:
    """Register `toolreg store ...` on the `toolreg` parser."""
    store = subparsers.add_parser(
        "store",
        parents=[common_parent],
        help="check, back up, restore, export or import the config store",
        description=(
            "check, backup and restore look after <data-dir>/config.sqlite directly, with no broker (`toolreg up`"
            " also takes backups by itself into <data-dir>/backups/). export and import move a store's items and"
            " version between that file and the store replicated on Apache Pulsar (--store pulsar, or"
            " TOOLREG_STORE=pulsar), which needs the broker."
        ),
    )
    actions = subcommands(store, dest="store_command", metavar="ACTION", required=True)
    _add_file_commands(actions, common_parent)
    _add_transfer_commands(actions, common_parent)


def _add_file_commands(actions: Any, common_parent: argparse.ArgumentParser) -> None:
    """`toolreg store check`, `backup` and `restore`: the SQLite file looked after directly, with no broker."""
    check = actions.add_parser(
        "check",
        parents=[common_parent],
        help="run the integrity check and compare with the marker",
        description=(
            "Check the store as `toolreg up` does at start; exit 1 with one line if it is damaged, "
            f"exit {ACCESS_EXIT} if it cannot be opened or written (read-only mount, permissions, full disk: "
            "not damage, do not restore a backup)."
        ),
    )
    check.set_defaults(handler=cmd_store_check)
    backup = actions.add_parser(
        "backup",
        parents=[common_parent],
        help="write a consistent, checked copy",
        description="Copy the store with SQLite's online backup API (safe while `toolreg up` runs) and check the copy.",
    )
    backup.add_argument(
        "path",
        nargs="?",
        default=None,
        metavar="PATH",
        help="file or directory to write (default: <data-dir>/backups/config-<time>-v<version>.sqlite)",
    )
    backup.set_defaults(handler=cmd_store_backup)
    restore = actions.add_parser(
        "restore",
        parents=[common_parent],
        help="replace the store with a checked copy",
        description=(
            "Replace <data-dir>/config.sqlite with PATH after checking PATH's integrity. "
            "Refused while `toolreg up` runs, and for another store's backup unless --force. "
            "The replaced file is kept beside it."
        ),
    )
    restore.add_argument("path", metavar="PATH", help="a backup, e.g. the newest file in <data-dir>/backups/")
    restore.add_argument(
        "--force",
        action="store_true",
        help="restore a backup of another store (another store id) than the one in this data directory",
    )
    restore.set_defaults(handler=cmd_store_restore)


def _add_transfer_commands(actions: Any, common_parent: argparse.ArgumentParser) -> None:
    """`toolreg store export` and `import`: the items and version as JSON, from or into either backend."""
    for name, verb, what in (
        ("export", "write", "the store's items and version to PATH (JSON)"),
        ("import", "read", "PATH into an empty store (or replace it with --force), carrying the version over"),
    ):
        action = actions.add_parser(
            name,
            parents=[common_parent],
            help=f"{verb} {what}",
            description=(
                f"{verb.capitalize()} {what}. --store (or TOOLREG_STORE) picks the SQLite file "
                "(default) or the store replicated on Apache Pulsar; importing into the replicated store needs its "
                "replicas stopped."
            ),
        )
        action.add_argument("path", metavar="PATH", help="the export file")
        action.add_argument(
            "--store",
            choices=("sqlite", "pulsar"),
            default=None,
            help="which store (default: TOOLREG_STORE, else sqlite)",
        )
        if name == "import":
            action.add_argument("--force", action="store_true", help="replace the items of a store that is not empty")
        action.set_defaults(handler=cmd_store_export if name == "export" else cmd_store_import)
