"""A damaged config store is never opened, never silently replaced by an empty one (no broker needed).

Each test damages a real SQLite store the way disks, copies and hurried
operators do, then opens it as `toolreg up` does: the open must fail with one
line naming the file and the command that recovers it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from discovery.store import backup as store_backup
from discovery.store.check import StoreDamaged, marker_path, read_marker
from discovery.store.sqlite import ConfigStore

NOTES = 3000  # ~1.2 MB: many pages, so damage in the middle hits data, not just the header


def filled(path: Path, notes: int = NOTES) -> int:
    """A store holding `notes` items, closed cleanly (so its marker is current); returns its version."""
    store = ConfigStore(path)
    for start in range(0, notes, 500):
        store.put(
            "default",
            [
                ("note", f"n{i:05d}", json.dumps({"n": i, "text": "x" * 300}))
                for i in range(start, min(start + 500, notes))
            ],
        )
    version = store.version
    store.close()
    return version


def refusal(path: Path) -> str:
    with pytest.raises(StoreDamaged) as caught:
        ConfigStore(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and "toolreg store restore" in message
    return message


def garble_middle(path: Path, size: int = 16 * 4096) -> None:
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        handle.write(os.urandom(size))


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "config.sqlite"


def test_a_clean_close_leaves_a_marker_of_what_the_store_held(store_path: Path) -> None:
    version = filled(store_path)
    marker = read_marker(store_path)
    assert marker is not None and (marker.version, marker.items) == (version, NOTES)
    store = ConfigStore(store_path)  # and a whole store opens again
    assert store.version == version and len(store.list("default", "note")) == NOTES
    store.close()


def test_a_zero_byte_store_that_had_data_is_refused_not_served_empty(store_path: Path) -> None:
    version = filled(store_path)
    store_path.write_bytes(b"")
    message = refusal(store_path)
    assert "is empty" in message and f"version {version} with {NOTES} item(s)" in message
    assert store_path.stat().st_size == 0  # nothing was written into it either


def test_a_missing_store_file_is_refused_and_not_recreated(store_path: Path) -> None:
    filled(store_path)
    store_path.unlink()
    assert "is missing" in refusal(store_path)
    assert not store_path.exists()


def test_a_truncated_store_is_refused(store_path: Path) -> None:
    filled(store_path)
    with open(store_path, "r+b") as handle:
        handle.truncate(os.path.getsize(store_path) // 2)
    assert "corrupt" in refusal(store_path)


def test_a_store_with_a_garbled_page_is_refused(store_path: Path) -> None:
    filled(store_path)
    garble_middle(store_path)
    assert "corrupt" in refusal(store_path)


def test_an_older_copy_or_another_store_in_its_place_is_refused(store_path: Path, tmp_path: Path) -> None:
    copied = filled(store_path, notes=500)
    older = tmp_path / "older.sqlite"
    shutil.copy(store_path, older)
    later = filled(store_path, notes=1000)  # moves on past the copy
    assert later > copied
    shutil.copy(older, store_path)
    assert f"is at version {copied}, but it had version {later}" in refusal(store_path)

    other = tmp_path / "other" / "config.sqlite"
    filled(other, notes=1500)  # a different store, even one further along
    shutil.copy(other, store_path)
    assert "is another store" in refusal(store_path)


def test_no_false_alarm_for_a_new_store_or_one_that_never_held_anything(store_path: Path) -> None:
    ConfigStore(store_path).close()  # a fresh data directory
    store_path.write_bytes(b"")  # empty again: nothing was ever in it, so nothing is missing
    store = ConfigStore(store_path)
    assert store.version == 0
    store.close()


def test_backup_and_restore_round_trip(store_path: Path) -> None:
    version = filled(store_path)
    backup = store_backup.take_backup(store_path)
    assert backup.path.parent == store_path.parent / "backups" and f"-v{version}." in backup.path.name
    assert (backup.facts.version, backup.facts.items) == (version, NOTES)

    store = ConfigStore(store_path)
    store.put("default", [("note", "after-backup", "{}")])
    last_seen = store.version
    store.close()
    garble_middle(store_path)
    refusal(store_path)

    restored = store_backup.restore(store_path, backup.path)
    assert restored.replaced is not None and restored.replaced.exists()  # the damaged file is kept, not deleted
    assert restored.facts.version > last_seen  # readers that saw `last_seen` see a new version and reload
    store = ConfigStore(store_path)
    try:
        assert store.version == restored.facts.version
        assert len(store.list("default", "note")) == NOTES and not store.get("default", [("note", "after-backup")])
    finally:
        store.close()
    marker = read_marker(store_path)
    assert marker is not None and marker.version == restored.facts.version


def test_restore_checks_the_copy_first_and_leaves_the_store_alone_if_it_is_damaged(
    store_path: Path, tmp_path: Path
) -> None:
    filled(store_path)
    bad = store_backup.take_backup(store_path, tmp_path / "bad.sqlite").path
    garble_middle(bad)
    before = store_path.read_bytes()
    with pytest.raises(StoreDamaged, match="corrupt"):
        store_backup.restore(store_path, bad)
    with pytest.raises(StoreDamaged, match="no config store"):
        store_backup.restore(store_path, _empty_sqlite(tmp_path / "empty.sqlite"))
    assert store_path.read_bytes() == before


def test_a_backup_of_a_corrupt_store_is_refused_and_does_not_rotate_good_ones_out(store_path: Path) -> None:
    filled(store_path)
    good = store_backup.take_backup(store_path)
    garble_middle(store_path)
    with pytest.raises(StoreDamaged, match="corrupt"):
        store_backup.take_backup(store_path)
    assert store_backup.backups_of(store_path) == [good.path]
    assert not list(good.path.parent.glob("*.partial"))


def test_prune_keeps_the_newest(store_path: Path) -> None:
    filled(store_path, notes=10)
    taken = [store_backup.take_backup(store_path).path for _ in range(4)]
    removed = store_backup.prune(store_path, keep=2)
    assert removed == taken[:2] and store_backup.backups_of(store_path) == taken[2:]


def _empty_sqlite(path: Path) -> Path:
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    assert not marker_path(path).exists()
    return path
