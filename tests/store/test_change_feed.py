"""The store's change feed: what changed since a version, for as long as its window holds it, and never a wrong answer.

The store's own checks (no broker); the `changes` operation over the queues is exercised end to end by the agents'
tests (tests/bridge/test_bridge_deltas.py).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from support import eventually

from discovery.store.backup import restore, take_backup
from discovery.store.changes import ChangeWindow, TooOld
from discovery.store.operations import ConfigOperations, answer_size
from discovery.store.settings import StoreSettings
from discovery.store.sqlite import ConfigStore, Write
from toolservice_base import ConfigClient, ConfigPush, Transport, watch_config
from toolservice_base.errors import ChangesUnavailable, SettingsError
from toolservice_base.schemas import ConfigRequest
from toolservice_base.transport import Envelope


def since(store: ConfigStore, version: int, *types: str, workspace: str = "w") -> dict[tuple[str, str], str | None]:
    _, changed, more = store.changes(
        workspace, version, types, after=None, limit=10_000, budget=10**9, size=answer_size
    )
    assert not more
    return {(t, k): v for t, k, v in changed}


def test_changes_name_each_key_once_with_its_value_now_and_none_for_the_deleted(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "config.sqlite")
    store.apply("w", puts=[("note", "a", "1"), ("note", "b", "1")])  # version 1
    store.apply("w", puts=[("note", "a", "2")])
    store.apply("w", deletes=[("note", "b")])
    store.apply("other", puts=[("note", "x", "1")])
    store.apply("w", puts=[("other-type", "c", "1")])
    assert since(store, 1) == {("note", "a"): "2", ("note", "b"): None, ("other-type", "c"): "1"}
    assert since(store, 1, "note") == {("note", "a"): "2", ("note", "b"): None}
    assert since(store, 0, "note") == {("note", "a"): "2", ("note", "b"): None}
    assert since(store, store.version) == {}
    store.apply("w", puts=[("note", "a", "2")])  # changes nothing: no version, nothing recorded
    assert since(store, store.version) == {}


def test_a_feed_survives_a_restart_and_a_store_from_before_the_feed_starts_one_at_its_version(tmp_path: Path) -> None:
    path = tmp_path / "config.sqlite"
    store = ConfigStore(path)
    store.apply("w", puts=[("note", "a", "1")])
    store.close()
    store = ConfigStore(path)
    assert since(store, 0) == {("note", "a"): "1"}
    store.close()
    with sqlite3.connect(path) as db:  # what an older release left: no feed at all
        db.execute("DROP TABLE changes")
        db.execute("DELETE FROM meta WHERE name='changes_floor'")
    store = ConfigStore(path)
    with pytest.raises(TooOld, match="version 0 is outside the change feed"):
        since(store, 0)
    store.apply("w", puts=[("note", "b", "1")])
    assert since(store, 1) == {("note", "b"): "1"}
    store.close()


def test_past_the_window_a_reader_is_told_to_read_everything_and_never_given_part_of_it(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path / "config.sqlite", window=ChangeWindow(keys=10))
    for n in range(30):
        store.apply("w", puts=[("note", f"k{n}", "v")])
    floor = store.feed.floor
    assert 0 < floor < 30 and store.feed._rows <= 10
    with pytest.raises(TooOld):
        since(store, floor - 1)
    assert set(since(store, floor)) == {("note", f"k{n}") for n in range(floor, 30)}
    with pytest.raises(TooOld):  # a reader ahead of the store (it was restored from an older copy)
        since(store, 31)


def test_the_bytes_bound_prunes_too() -> None:
    store = ConfigStore.in_memory(window=ChangeWindow(bytes=2_000))
    for n in range(40):
        store.apply("w", puts=[("note", "k" * 100 + str(n), "v")])
    assert store.feed._bytes <= 2_000 and store.feed.floor > 0


def test_a_replayed_write_is_recorded_and_a_restored_snapshot_starts_the_feed_again() -> None:
    store = ConfigStore.in_memory()
    store.replay(Write(1, "w", puts=[("note", "a", "1")]))
    store.replay(Write(2, "w", deletes=[("note", "a")]))
    assert since(store, 0) == {("note", "a"): None}
    store.load(7, [("w", "note", "b", "1")])
    with pytest.raises(TooOld):
        since(store, 2)
    store.replay(Write(8, "w", puts=[("note", "c", "1")]))
    assert since(store, 7) == {("note", "c"): "1"}


def test_the_changes_operation_pages_and_answers_too_old_and_trustgraphs_store_does_not_know_it() -> None:
    store = ConfigStore.in_memory()
    ops = ConfigOperations(store)
    store.apply("w", puts=[(t, f"k{n}", "v") for t in ("a", "b") for n in range(5)])
    first = ops.execute(ConfigRequest(operation="changes", workspace="w", since=0, limit=4)).response
    assert [(v.type, v.key) for v in first.values] == [("a", "k0"), ("a", "k1"), ("a", "k2"), ("a", "k3")]
    assert first.more is True
    rest = ops.execute(ConfigRequest(operation="changes", workspace="w", since=0, after="a/k3")).response
    assert [(v.type, v.key) for v in rest.values] == [("a", "k4")] + [("b", f"k{n}") for n in range(5)]
    assert rest.more is False and rest.version == 1
    only_b = ops.execute(ConfigRequest(operation="changes", workspace="w", since=0, types=["b"])).response
    assert {v.type for v in only_b.values} == {"b"}
    missing = ops.execute(ConfigRequest(operation="changes", workspace="w")).response
    assert missing.error is not None and "needs 'since'" in missing.error.message
    ahead = ops.execute(ConfigRequest(operation="changes", workspace="w", since=9)).response
    assert ahead.error is not None and ahead.error.type == "too-old" and ahead.version == 1
    trustgraph = ConfigOperations(store, "trustgraph")
    refused = trustgraph.execute(ConfigRequest(operation="changes", workspace="w", since=0)).response
    assert refused.error is not None and refused.error.type == "bad-operation"
    assert "changes" not in refused.error.message.partition("use one of")[2]  # TrustGraph's store knows no such thing


def test_a_push_names_the_keys_its_write_changed_beside_its_body_never_in_it() -> None:
    ops = ConfigOperations(ConfigStore.in_memory())
    outcome = ops.execute(
        ConfigRequest(operation="put", workspace="w", values=[{"type": "note", "key": "a", "value": "1"}])
    )
    push = outcome.push
    assert push is not None and push.keys == [("w", "note", "a", False)]
    assert push.to_trustgraph() == {
        "version": 1,
        "changes": {"note": ["w"]},
        "workspace_changes": {"created": ["w"], "deleted": []},
    }
    properties = push.properties()
    assert properties is not None
    assert type(push).model_validate(push.to_trustgraph()).with_keys(properties).keys == push.keys


@pytest.mark.contract
async def test_a_watcher_hears_the_keys_of_a_write_and_a_raw_reader_gets_todays_body(
    connection: Transport, config_client: ConfigClient
) -> None:
    pushes: list[ConfigPush] = []
    raw: list[Envelope] = []

    async def on_push(push: ConfigPush) -> None:
        pushes.append(push)

    async def on_message(message: Envelope) -> None:
        raw.append(message)

    await watch_config(connection, on_push)
    await connection.subscribe(connection.topics.config_notify, on_message)
    for n in range(100):  # until both subscriptions hear the store
        await config_client.put([("note", "warm-up", str(n))])
        if pushes and raw:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    pushes.clear()
    raw.clear()
    await config_client.apply(puts=[("note", "a", "1")])
    await config_client.apply(puts=[("note", "b", "1")], deletes=[("note", "a")])
    await eventually(lambda: len(pushes) == 2 and len(raw) == 2, timeout=5)
    assert pushes[0].keys == [("default", "note", "a", False)]
    assert pushes[1].keys == [("default", "note", "b", False), ("default", "note", "a", True)]
    assert set(json.loads(raw[1].data)) == {"version", "changes", "workspace_changes"}


def test_the_window_is_a_setting_refused_in_one_line_when_it_is_not_a_positive_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLREG_CHANGE_WINDOW_KEYS", "500")
    monkeypatch.setenv("TOOLREG_CHANGE_WINDOW_BYTES", "65536")
    assert StoreSettings.from_env().window == ChangeWindow(500, 65536)
    monkeypatch.setenv("TOOLREG_CHANGE_WINDOW_KEYS", "lots")
    with pytest.raises(SettingsError, match="^TOOLREG_CHANGE_WINDOW_KEYS='lots' is not a whole number$"):
        StoreSettings.from_env()
    monkeypatch.setenv("TOOLREG_CHANGE_WINDOW_KEYS", "0")
    with pytest.raises(SettingsError, match="must be at least 1"):
        StoreSettings.from_env()


@pytest.mark.contract
async def test_a_delta_larger_than_a_page_is_read_in_pages_at_one_version(config_client: ConfigClient) -> None:
    version = await config_client.put([("note", f"k{n:02d}", str(n)) for n in range(25)])
    await config_client.apply(puts=[("other", "x", "1")], deletes=[("note", "k03")])
    config_client.page_limit = 4
    reached, delta = await config_client.changes(version - 1, ["note"])
    assert reached == version + 1 and len(delta["note"]) == 25 and delta["note"]["k03"] is None
    assert {k: v for k, v in delta["note"].items() if v is not None} == await config_client.getvalues("note")
    with pytest.raises(ChangesUnavailable) as too_old:
        await config_client.changes(version + 5)
    assert too_old.value.code == "too-old"


def test_a_restored_backup_starts_its_feed_again_so_no_reader_gets_a_delta_across_histories(tmp_path: Path) -> None:
    path = tmp_path / "config.sqlite"
    store = ConfigStore(path)
    store.apply("w", puts=[("note", "a", "1")])
    store.close()
    copy = take_backup(path).path
    store = ConfigStore(path)
    for n in range(5):  # the history the restore throws away: readers may hold any of these versions
        store.apply("w", puts=[("note", f"lost{n}", "1")])
    store.close()
    restored = restore(path, copy)
    store = ConfigStore(path)
    assert store.version == restored.facts.version == 7 and store.feed.floor == 7
    for version in range(7):
        with pytest.raises(TooOld):
            since(store, version)
    store.apply("w", puts=[("note", "b", "1")])
    assert since(store, 7) == {("note", "b"): "1"}
    store.close()
