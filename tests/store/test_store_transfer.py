"""Moving a store between the SQLite file and the replicated store: every item and the version come along."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import toolreg

from discovery.store import ConfigStore
from discovery.store.replicated import ReplicatedStore
from discovery.store.transfer import (
    TransferError,
    read_export,
    replicated_dump,
    replicated_load,
    sqlite_dump,
    sqlite_load,
    write_export,
)
from toolservice_base import MemoryBroker, Settings, open_transport


def a_store(path: Path) -> int:
    store = ConfigStore(path)
    try:
        store.put("default", [("note", "a", "1"), ("note", "b", "2")])
        store.put("research", [("note", "c", "3")])
        store.delete("default", [("note", "b")])
        return store.version
    finally:
        store.close()


async def test_sqlite_to_replicated_and_back_keeps_every_item_and_the_version(tmp_path: Path) -> None:
    version = a_store(tmp_path / "one.sqlite")
    exported = sqlite_dump(tmp_path / "one.sqlite")
    write_export(tmp_path / "export.json", *exported)
    assert read_export(tmp_path / "export.json") == exported

    memory = MemoryBroker()
    connection = await open_transport(Settings(data_dir=tmp_path / "data", pulsar_url=memory.url))
    try:
        assert await replicated_load(connection, *exported) == version
        assert await replicated_dump(connection) == exported
        async with ReplicatedStore(connection) as replica:  # a replica started afterwards serves exactly that
            assert replica.store is not None and replica.store.dump() == exported
    finally:
        await connection.close()

    assert sqlite_load(tmp_path / "two.sqlite", *exported) == version
    assert sqlite_dump(tmp_path / "two.sqlite") == exported


async def test_an_import_never_overwrites_a_store_unless_told_and_then_replaces_it(tmp_path: Path) -> None:
    a_store(tmp_path / "full.sqlite")
    with pytest.raises(TransferError, match="already holds 2 item"):
        sqlite_load(tmp_path / "full.sqlite", 1, [("default", "note", "z", "9")])
    version = sqlite_load(tmp_path / "full.sqlite", 1, [("default", "note", "z", "9")], force=True)
    assert sqlite_dump(tmp_path / "full.sqlite") == (version, [("default", "note", "z", "9")])
    assert version > 3, "the version went back: readers would miss the change"

    memory = MemoryBroker()
    connection = await open_transport(Settings(data_dir=tmp_path / "data", pulsar_url=memory.url))
    try:
        await replicated_load(connection, 5, [("default", "note", "a", "1"), ("default", "note", "b", "2")])
        with pytest.raises(TransferError, match="add --force"):
            await replicated_load(connection, 6, [("default", "note", "z", "9")])
        final = await replicated_load(connection, 6, [("default", "note", "z", "9")], force=True)
        assert await replicated_dump(connection) == (final, [("default", "note", "z", "9")])
    finally:
        await connection.close()


async def test_an_import_into_a_running_replicated_store_is_refused_in_one_line(tmp_path: Path) -> None:
    memory = MemoryBroker()
    settings = Settings(data_dir=tmp_path / "data", pulsar_url=memory.url)
    running = await open_transport(settings)
    importer = await open_transport(settings)
    try:
        async with ReplicatedStore(running):
            with pytest.raises(TransferError, match="stop the group") as caught:
                await replicated_load(importer, 1, [("default", "note", "a", "1")])
            assert "\n" not in str(caught.value)
    finally:
        await importer.close()
        await running.close()


def test_toolreg_store_export_and_import_between_data_directories(tmp_path: Path) -> None:
    version = a_store(tmp_path / "from" / "config.sqlite")
    env_from = {"TOOLREG_DATA_DIR": str(tmp_path / "from"), "PATH": "/usr/bin:/bin"}
    env_to = {"TOOLREG_DATA_DIR": str(tmp_path / "to"), "PATH": "/usr/bin:/bin"}
    done = toolreg("store", "export", str(tmp_path / "x.json"), env=env_from)
    assert done.returncode == 0, done.stderr
    assert f"at version {version}" in done.stdout
    assert json.loads((tmp_path / "x.json").read_text())["version"] == version
    done = toolreg("store", "import", str(tmp_path / "x.json"), env=env_to)
    assert done.returncode == 0 and f"now at version {version}" in done.stdout, done.stderr
    again = toolreg("store", "import", str(tmp_path / "x.json"), env=env_to)
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "--force" in again.stderr
    bad = toolreg("store", "import", str(tmp_path / "from" / "config.sqlite"), env=env_to)
    assert bad.returncode == 1 and "not a store export" in bad.stderr
