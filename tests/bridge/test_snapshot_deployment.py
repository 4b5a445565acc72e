"""A snapshot belongs to one deployment: the broker the bridge reached and the topicspace, besides the workspace.

One data directory is shared by every agent run from it (`./.toolreg` by default). A snapshot's items name their
queues in full, so a bridge of one deployment that loaded another's snapshot would send its calls to the other
deployment's services, and they would answer. So a snapshot is found by its deployment, checked against it when
read, and another deployment's is never used: the bridge says it found one and did not use it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support import static_items

from agent_bridge import BridgeUnavailable, ToolSet
from agent_bridge.snapshot import Deployment, read_snapshot, snapshot_path, write_snapshot
from discovery.broker.embedded import reserve_port
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, Transport
from toolservice_base.examples.joke import JokeService


@pytest.fixture
async def snapshot_of_tg(
    connection: Transport, settings: Settings, config_client: ConfigClient, config_store: ConfigStoreService
) -> AsyncIterator[Path]:
    """The joke service's items in the store of topicspace tg, a bridge's snapshot of them, and the store stopped."""
    joke = JokeService(settings=settings, announce=False)
    await config_client.put(static_items(joke))
    async with ToolSet(connection=connection, settings=settings) as tools:
        assert tools.names() == ["tell-joke"]
    assert tools.snapshot_path.exists()
    await config_store.stop()
    yield tools.snapshot_path


async def test_a_bridge_of_another_topicspace_does_not_use_the_snapshot_and_says_which_it_left(
    settings: Settings, snapshot_of_tg: Path
) -> None:
    elsewhere = dataclasses.replace(settings, topicspace="nosuch")
    with pytest.raises(BridgeUnavailable) as caught:
        await ToolSet(settings=elsewhere, store_timeout=0.3).start()
    message = str(caught.value)
    assert "\n" not in message
    assert f"no snapshot of workspace 'default' for topicspace nosuch on {settings.pulsar_url}" in message
    assert f"not used, being of another deployment: {snapshot_of_tg.name}, topicspace tg on" in message


async def test_a_bridge_of_another_broker_does_not_use_the_snapshot(tmp_path: Path, snapshot_of_tg: Path) -> None:
    with reserve_port() as nothing_listens:
        port = nothing_listens.getsockname()[1]
    other = Settings(data_dir=snapshot_of_tg.parent, pulsar_url=f"pulsar://127.0.0.1:{port}", broker="pulsar-lite")
    with pytest.raises(BridgeUnavailable, match="cannot reach the broker.*not used, being of another deployment"):
        await ToolSet(settings=other, store_timeout=0.3).start()


async def test_the_same_deployment_is_served_from_its_snapshot_and_told_which_how_old_and_from_where(
    settings: Settings, snapshot_of_tg: Path
) -> None:
    async with ToolSet(settings=settings, store_timeout=0.3) as tools:
        assert tools.source == "snapshot" and tools.names() == ["tell-joke"]
        assert tools.snapshot is not None and tools.snapshot.path == snapshot_of_tg
        said = tools.snapshot.describe(now=tools.snapshot.saved_at + 7200)
    assert str(snapshot_of_tg) in said and "taken 2.0 h ago" in said
    assert f"topicspace tg on {settings.pulsar_url}" in said and "config version 1" in said


async def test_a_file_holding_another_deployments_snapshot_under_this_ones_name_is_not_read(
    settings: Settings, snapshot_of_tg: Path
) -> None:
    """The name only finds a snapshot; what it says of itself decides (a copied or renamed file is not trusted)."""
    elsewhere = Deployment.of(settings.pulsar_url or "", "nosuch")
    copied = snapshot_path(settings.data_dir, "default", elsewhere)
    shutil.copyfile(snapshot_of_tg, copied)
    assert read_snapshot(copied, elsewhere, "default") is None
    with pytest.raises(BridgeUnavailable):
        await ToolSet(settings=dataclasses.replace(settings, topicspace="nosuch"), store_timeout=0.3).start()


def test_a_snapshot_records_its_deployment_and_one_address_has_one_spelling(tmp_path: Path) -> None:
    deployment = Deployment.of("PULSAR://Broker-B:6650,broker-a:6650/", "tg")
    assert deployment == Deployment.of("pulsar://broker-a:6650,broker-b:6650", "tg")
    assert deployment != Deployment.of("pulsar://broker-a:6650,broker-b:6650", "tg2")
    path = snapshot_path(tmp_path, "default", deployment)
    write_snapshot(path, deployment, "default", 3, {"tool": {}, "tool-service": {}})
    body = json.loads(path.read_text())
    assert (body["broker"], body["topicspace"], body["workspace"]) == (
        "pulsar://broker-a:6650,broker-b:6650",
        "tg",
        "default",
    )
    read = read_snapshot(path, deployment, "default")
    assert read is not None and read.version == 3 and abs(read.saved_at - time.time()) < 60


def test_a_snapshot_of_the_format_before_deployments_is_never_read(tmp_path: Path) -> None:
    deployment = Deployment.of("pulsar://127.0.0.1:6650", "tg")
    path = snapshot_path(tmp_path, "default", deployment)
    path.write_text(json.dumps({"format": 1, "workspace": "default", "version": 4, "items": {}}))
    assert read_snapshot(path, deployment, "default") is None
