"""The config store service and `toolreg` facing a damaged store: error answers, automatic backups, `toolreg store`.

The service runs on a real broker; `toolreg` runs as a subprocess, as an
operator would run it.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from pathlib import Path

import pytest
from support import eventually, toolreg, toolreg_env

from discovery.broker import EmbeddedBroker
from discovery.store import backup as store_backup
from discovery.store.check import read_marker
from discovery.store.service import ConfigStoreService
from discovery.store.sqlite import ConfigStore
from toolservice_base import ConfigClient, ConfigError, Settings, Transport


def fill(path: Path, notes: int) -> None:
    store = ConfigStore(path)
    for start in range(0, notes, 500):
        store.put(
            "default",
            [
                ("note", f"n{i:05d}", json.dumps({"n": i, "text": "x" * 1000}))
                for i in range(start, min(start + 500, notes))
            ],
        )
    store.close()


def marker_version(path: Path) -> int | None:
    marker = read_marker(path)
    return marker.version if marker is not None else None


def garble_middle(path: Path, size: int = 64 * 4096) -> None:
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        handle.write(os.urandom(size))


async def test_every_request_a_damaged_store_cannot_serve_gets_an_error_answer(
    connection: Transport, settings: Settings
) -> None:
    path = settings.data_dir / "config.sqlite"
    fill(path, notes=8000)  # ~9 MB, well past SQLite's 2 MB page cache: the reads below go to the file
    service = ConfigStoreService(connection, ConfigStore(path))
    await service.start()
    client = ConfigClient(connection, timeout=5)
    try:
        assert len(await client.list("note")) == 8000
        garble_middle(path)  # the disk goes bad under a running store

        with pytest.raises(ConfigError) as caught:  # an answer, not a timeout (`RequestTimeout` would be silence)
            await client.getvalues("note")
        assert caught.value.code == "store-error"
        assert "damaged" in str(caught.value) and "toolreg store restore" in str(caught.value)
        # From now on nothing is half-served: even a read that would still work is refused, at once.
        for call in (
            client.get([("note", "n00001")]),
            client.list("note"),
            client.put([("note", "new", "{}")]),
            client.config(),
        ):
            with pytest.raises(ConfigError) as refused:
                await asyncio.wait_for(call, 2)
            assert refused.value.code == "store-error"
        assert service.readiness() is not None and "damaged" in service.readiness()  # type: ignore[operator]
    finally:
        await client.close()
        await service.stop()


async def test_the_store_backs_itself_up_keeps_the_newest_and_keeps_its_marker_current(
    connection: Transport, settings: Settings
) -> None:
    path = settings.data_dir / "config.sqlite"
    fill(path, notes=10)
    service = ConfigStoreService(connection, ConfigStore(path), backup_versions=2, backup_keep=2, mark_interval=0.05)
    await service.start()
    client = ConfigClient(connection, timeout=5)
    try:
        await eventually(lambda: len(store_backup.backups_of(path)) == 1, timeout=3.0)  # one at start
        for i in range(6):
            await client.put([("note", f"later-{i}", "{}")])
            # Running, not only at a clean close: after a kill -9 the marker is at most `mark_interval` behind.
            await eventually(lambda: marker_version(path) == service.store.version)
        await eventually(
            lambda: store_backup.version_of_backup(store_backup.backups_of(path)[-1]) == service.store.version,
            timeout=3.0,
        )
        kept = store_backup.backups_of(path)
        assert len(kept) == 2
        for backup in kept:
            assert store_backup.inspect_copy(backup).items >= 10  # each one whole and checked
    finally:
        await client.close()
        await service.stop()


def test_toolreg_up_stops_in_one_line_on_a_store_missing_its_data(broker: EmbeddedBroker, tmp_path: Path) -> None:
    data = tmp_path / "data"
    fill(data / "config.sqlite", notes=100)
    store_backup.take_backup(data / "config.sqlite")
    (data / "config.sqlite").write_bytes(b"")
    done = toolreg("up", env=toolreg_env(broker.url or "", data), timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("toolreg:")]
    assert len(errors) == 1
    assert str(data / "config.sqlite") in errors[0] and "is empty, but it had" in errors[0]
    assert f"toolreg store restore {store_backup.backups_of(data / 'config.sqlite')[-1]}" in errors[0]


def test_toolreg_store_check_backup_and_restore(broker: EmbeddedBroker, tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = toolreg_env(broker.url or "", data)
    store = data / "config.sqlite"
    fill(store, notes=100)

    checked = toolreg("store", "check", env=env)
    assert checked.returncode == 0 and "whole" in checked.stdout and "100 item(s)" in checked.stdout

    copy = tmp_path / "kept.sqlite"
    backed_up = toolreg("store", "backup", str(copy), env=env)
    assert backed_up.returncode == 0, backed_up.stderr
    assert str(copy) in backed_up.stdout and store_backup.inspect_copy(copy).items == 100

    garble_middle(store, size=8 * 4096)
    damaged = toolreg("store", "check", env=env)
    assert damaged.returncode == 1 and damaged.stderr.count("\n") == 1 and "corrupt" in damaged.stderr

    with open(data / "up.lock", "a+") as held:  # as a running `toolreg up` holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        refused = toolreg("store", "restore", str(copy), env=env)
    assert (
        refused.returncode == 1 and "already running" in refused.stderr and "stop it before restoring" in refused.stderr
    )

    restored = toolreg("store", "restore", str(copy), env=env)
    assert restored.returncode == 0, restored.stderr
    assert "100 item(s)" in restored.stdout and "kept as" in restored.stdout
    assert toolreg("store", "check", env=env).returncode == 0
    assert [p.name for p in data.glob("config.sqlite.replaced-*")]  # the damaged file is kept for a post-mortem
