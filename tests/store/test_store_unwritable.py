"""A store the machine will not let us write is not a damaged store.

A read-only mount, or a full disk, must be said as what it is, with its fix,
and never with the advice to restore a backup (which would roll back every
write since); the data stays whole, and the store serves again by itself once
the disk has room. Damage on the same file system is still damage. The file
systems are real: a small tmpfs, remounted read-only or filled up
(`support.mounts`), since permission bits do not stop root.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support import eventually, toolreg, toolreg_env
from support.mounts import fill, free, read_only, small_tmpfs

from discovery.store import backup as store_backup
from discovery.store.check import StoreAccessError, StoreDamaged
from discovery.store.service import ConfigStoreService
from discovery.store.sqlite import ConfigStore
from toolservice_base import ConfigClient, ConfigError, Transport

NOTES = 50
BIG = json.dumps({"text": "x" * 64 * 1024})
"""A value larger than anything the store's files already hold: writing it needs fresh space, whatever SQLite reuses."""


@pytest.fixture
def mounted(tmp_path: Path) -> Iterator[Path]:
    """A data directory on a 1 MiB file system of its own."""
    with small_tmpfs(tmp_path / "data", size="1m") as path:
        yield path


def filled(data: Path, notes: int = NOTES, padding: int = 0) -> int:
    """A store in `data` holding `notes` items (of about `padding` bytes each), closed cleanly; returns its version."""
    store = ConfigStore(data / "config.sqlite")
    store.put("default", [("note", f"n{i:03d}", json.dumps({"n": i, "pad": "x" * padding})) for i in range(notes)])
    version = store.version
    store.close()
    return version


def reopened(data: Path) -> tuple[int, list[str]]:
    store = ConfigStore(data / "config.sqlite")
    try:
        return store.version, store.list("default", "note")
    finally:
        store.close()


def not_damage(message: str, data: Path, cause: str) -> None:
    """One line naming the directory and the cause, telling the operator not to restore anything."""
    assert "\n" not in message and str(data) in message and cause in message, message
    assert "do not restore a backup" in message, message
    assert "corrupt" not in message and "damaged (" not in message and "toolreg store restore" not in message, message


def test_a_store_on_a_read_only_mount_is_refused_as_unwritable_not_as_damaged(mounted: Path) -> None:
    version = filled(mounted)
    store_backup.take_backup(mounted / "config.sqlite")  # a backup at hand: the old advice was to restore it
    with read_only(mounted):
        with pytest.raises(StoreAccessError) as caught:
            ConfigStore(mounted / "config.sqlite")
    not_damage(str(caught.value), mounted, "read-only file system")
    assert "mount or permissions" in str(caught.value)
    assert reopened(mounted) == (version, [f"n{i:03d}" for i in range(NOTES)])  # writable again, nothing lost


def test_a_store_on_a_full_disk_is_refused_as_unwritable_and_opens_whole_once_space_is_freed(mounted: Path) -> None:
    version = filled(mounted)
    fill(mounted)
    with pytest.raises(StoreAccessError) as caught:
        ConfigStore(mounted / "config.sqlite")
    not_damage(str(caught.value), mounted, "no space left on device")
    assert "free space" in str(caught.value)
    free(mounted)
    assert reopened(mounted) == (version, [f"n{i:03d}" for i in range(NOTES)])


@pytest.mark.parametrize("mount", ["read-write", "read-only"])
def test_garbage_in_the_store_file_is_still_damage(mounted: Path, mount: str) -> None:
    filled(mounted)
    with open(mounted / "config.sqlite", "r+b") as handle:  # the header and first pages: no longer a database
        handle.write(os.urandom(2 * 4096))
    if mount == "read-only":
        with read_only(mounted), pytest.raises(StoreDamaged) as caught:
            ConfigStore(mounted / "config.sqlite")
    else:
        with pytest.raises(StoreDamaged) as caught:
            ConfigStore(mounted / "config.sqlite")
    assert "corrupt" in str(caught.value) and "toolreg store restore" in str(caught.value)


def test_a_backup_that_does_not_fit_leaves_no_half_copy(mounted: Path) -> None:
    filled(mounted, notes=200, padding=1000)  # ~250 KB: more than is left below
    fill(mounted, leave=96 * 1024)  # room for SQLite to open the store, not for a copy of it
    with pytest.raises(StoreAccessError) as caught:
        store_backup.take_backup(mounted / "config.sqlite")
    assert "no space left on device" in str(caught.value) and "the backup" in str(caught.value)
    assert not list(mounted.rglob("*.partial"))


def test_a_restore_that_does_not_fit_leaves_the_store_as_it_was(mounted: Path, tmp_path: Path) -> None:
    filled(mounted, notes=10)
    copy = store_backup.take_backup(
        mounted / "config.sqlite", tmp_path / "kept.sqlite"
    ).path  # the backup lives elsewhere
    store = ConfigStore(mounted / "config.sqlite")
    store.put("default", [("note", "later", "{}")])
    version = store.version
    store.close()
    fill(mounted)
    with pytest.raises(StoreAccessError) as caught:
        store_backup.restore(mounted / "config.sqlite", copy)
    assert "no space left on device" in str(caught.value)
    assert not list(mounted.glob("config.sqlite.replaced-*")) and not (mounted / "config.sqlite.restoring").exists()
    free(mounted)
    assert (
        reopened(mounted)[0] == version and "later" in reopened(mounted)[1]
    )  # the store in place is the one that was there


@pytest.fixture
async def serving(connection: Transport, mounted: Path) -> AsyncIterator[tuple[ConfigStoreService, ConfigClient]]:
    filled(mounted, notes=3)
    service = ConfigStoreService(connection, ConfigStore(mounted / "config.sqlite"), mark_interval=0.05)
    await service.start()
    client = ConfigClient(connection, timeout=5)
    await client.start()
    try:
        yield service, client
    finally:
        await client.close()
        await service.stop()


async def test_a_disk_that_fills_up_under_the_store_makes_it_not_ready_and_every_write_says_why(
    serving: tuple[ConfigStoreService, ConfigClient], mounted: Path
) -> None:
    service, client = serving
    await client.put([("note", "before", "{}")])
    await eventually(
        lambda: store_backup.backups_of(mounted / "config.sqlite"), timeout=5
    )  # the start-up backup is done
    assert service.readiness() is None

    fill(mounted)
    # Not ready before any write fails: the store watches its file system, not only its writers.
    await eventually(lambda: "no space left on device" in (service.readiness() or ""), timeout=5)
    with pytest.raises(ConfigError) as refused:  # an answer, not a timeout
        await client.put([("note", "during", BIG)])
    assert refused.value.code == "store-error"
    not_damage(str(refused.value), mounted, "no space left on device")
    assert (await client.get([("note", "before")])) == {("note", "before"): "{}"}  # reads are still served
    assert service.damaged is None

    free(mounted)
    await eventually(lambda: service.readiness() is None, timeout=5)  # by itself: nothing to restart
    await client.put([("note", "after", BIG)])
    assert set(await client.list("note")) == {
        "n000",
        "n001",
        "n002",
        "before",
        "after",
    }  # nothing lost, nothing half-written


def test_toolreg_store_check_tells_damage_from_a_disk_it_cannot_use(mounted: Path, tmp_path: Path) -> None:
    env = toolreg_env("pulsar://127.0.0.1:9", mounted)  # `store check` needs no broker
    filled(mounted)

    with read_only(mounted):
        readonly = toolreg("store", "check", env=env)
    assert readonly.returncode == 3, readonly.stderr
    assert f"whole (integrity check passed), version 1, {NOTES} item(s)" in readonly.stderr  # the data vouched for
    not_damage(readonly.stderr.strip().removeprefix("toolreg: "), mounted, "read-only file system")

    fill(mounted)
    full = toolreg("store", "check", env=env)
    assert full.returncode == 3 and full.stderr.count("\n") == 1, full.stderr
    not_damage(full.stderr.strip(), mounted, "no space left on device")
    free(mounted)

    assert toolreg("store", "check", env=env).returncode == 0
    with open(mounted / "config.sqlite", "r+b") as handle:
        handle.write(os.urandom(2 * 4096))
    damaged = toolreg("store", "check", env=env)
    assert damaged.returncode == 1 and "corrupt" in damaged.stderr and "read-only" not in damaged.stderr, damaged.stderr
