"""`toolreg store restore` of another data directory's backup: said, and done only with --force.

A backup carries its store's id. Restoring one of another store (another deployment's, another
workspace's data directory) used to replace this store's content silently; the marker then took the
foreign id, so nothing afterwards could tell. Now it is refused in one line naming both ids, and the
store is left as it was; `--force` restores it.
"""

from __future__ import annotations

import json
from pathlib import Path

from support import toolreg, toolreg_env

from discovery.store import backup as store_backup
from discovery.store.check import read_marker
from discovery.store.sqlite import ConfigStore

NOWHERE = "pulsar://127.0.0.1:9"  # the store commands work on the file: no broker is needed


def fill(path: Path, notes: int, prefix: str) -> None:
    store = ConfigStore(path)
    store.put("default", [("note", f"{prefix}{i:03d}", json.dumps({"n": i})) for i in range(notes)])
    store.close()


def test_restoring_another_stores_backup_is_refused_without_force(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours" / "config.sqlite", tmp_path / "theirs" / "config.sqlite"
    fill(ours, 10, "ours-")
    fill(theirs, 3, "theirs-")
    foreign = store_backup.take_backup(theirs, tmp_path / "theirs-backup.sqlite")
    own = store_backup.take_backup(ours, tmp_path / "ours-backup.sqlite")
    env = toolreg_env(NOWHERE, ours.parent)
    before = store_backup.inspect_copy(ours)
    assert before.store_id and foreign.facts.store_id and before.store_id != foreign.facts.store_id

    refused = toolreg("store", "restore", str(foreign.path), env=env, timeout=30)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert "another store" in refused.stderr and "--force" in refused.stderr
    assert foreign.facts.store_id[:8] in refused.stderr and before.store_id[:8] in refused.stderr
    assert store_backup.inspect_copy(ours) == before and not list(ours.parent.glob("config.sqlite.replaced-*")), (
        "nothing changed"
    )
    marker = read_marker(ours)
    assert marker is not None and marker.store_id == before.store_id

    assert toolreg("store", "restore", str(own.path), env=env, timeout=30).returncode == 0, (
        "its own backup needs no --force"
    )

    forced = toolreg("store", "restore", "--force", str(foreign.path), env=env, timeout=30)
    assert forced.returncode == 0, forced.stderr
    after = store_backup.inspect_copy(ours)
    assert after.store_id == foreign.facts.store_id and after.items == 3
    checked = toolreg("store", "check", env=env, timeout=30)
    assert checked.returncode == 0 and "3 item(s)" in checked.stdout, checked.stderr
