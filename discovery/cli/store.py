"""`toolreg store check|backup|restore`: look after the config store's SQLite file.

They work on the file under the data directory, not through the broker, so
they work when nothing else does. `check` and `backup` are safe while
`toolreg up` runs (SQLite's WAL mode lets them read beside it); `restore`
refuses to run then, because `toolreg up` holds the file open.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from discovery.store import backup as store_backup
from discovery.store.check import StoreDamaged, check_open_store, marker_path
from discovery.store.sqlite import STORE_FILE

from .common import UpLock, settings_of


def store_path(args: argparse.Namespace) -> Path:
    return settings_of(args).data_dir / STORE_FILE


def _check(path: Path) -> str:
    if not path.exists():
        raise StoreDamaged(f"no config store at {path}; `toolreg up` creates one (or `toolreg store restore PATH`)")
    db = sqlite3.connect(path)
    try:
        facts = check_open_store(db, path)
    except sqlite3.DatabaseError as exc:
        raise StoreDamaged(f"config store {path} cannot be read: {exc}") from None
    finally:
        db.close()
    return f"{path}: whole (integrity check passed), version {facts.version}, {facts.items} item(s), store id {(facts.store_id or 'none')[:8]}"


async def cmd_store_check(args: argparse.Namespace) -> int:
    print(await asyncio.to_thread(_check, store_path(args)))
    return 0


async def cmd_store_backup(args: argparse.Namespace) -> int:
    source = store_path(args)
    if not source.exists():
        raise StoreDamaged(f"no config store at {source} to back up")
    destination = Path(args.path) if args.path else None
    backup = await asyncio.to_thread(store_backup.take_backup, source, destination)
    print(f"backed up {source} (version {backup.facts.version}, {backup.facts.items} item(s)) to {backup.path} "
          f"in {backup.seconds * 1000:.0f} ms")
    return 0


async def cmd_store_restore(args: argparse.Namespace) -> int:
    target = store_path(args)
    lock = UpLock(target.parent)
    try:
        lock.acquire("stop it before restoring its store")
        restored = await asyncio.to_thread(store_backup.restore, target, Path(args.path))
    finally:
        lock.release()
    facts = restored.facts
    print(f"restored {target} from {args.path}: {facts.items} item(s), now at version {facts.version} "
          f"(past every version the replaced store had, so readers reload)")
    if restored.replaced is not None:
        print(f"the replaced file is kept as {restored.replaced}")
    print(f"marker {marker_path(target)} updated; start `toolreg up` to serve it")
    return 0


def add_commands(subparsers: Any, common_parent: argparse.ArgumentParser) -> None:
    """Register `toolreg store ...` on the `toolreg` parser."""
    store = subparsers.add_parser(
        "store", parents=[common_parent], help="check, back up or restore the config store's file",
        description="Look after <data-dir>/config.sqlite directly (no broker needed). `toolreg up` also takes "
        "backups by itself into <data-dir>/backups/.",
    )
    actions = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    check = actions.add_parser("check", parents=[common_parent], help="run the integrity check and compare with the marker",
                               description="Check the store as `toolreg up` does at start; exit 1 with one line if it is damaged.")
    check.set_defaults(handler=cmd_store_check)
    backup = actions.add_parser("backup", parents=[common_parent], help="write a consistent, checked copy",
                                description="Copy the store with SQLite's online backup API (safe while `toolreg up` runs) "
                                "and check the copy.")
    backup.add_argument("path", nargs="?", default=None, metavar="PATH",
                        help="file or directory to write (default: <data-dir>/backups/config-<time>-v<version>.sqlite)")
    backup.set_defaults(handler=cmd_store_backup)
    restore = actions.add_parser("restore", parents=[common_parent], help="replace the store with a checked copy",
                                 description="Replace <data-dir>/config.sqlite with PATH after checking PATH's integrity. "
                                 "Refused while `toolreg up` runs. The replaced file is kept beside it.")
    restore.add_argument("path", metavar="PATH", help="a backup, e.g. the newest file in <data-dir>/backups/")
    restore.set_defaults(handler=cmd_store_restore)
