"""`toolreg registry` run twice beside one config store (TrustGraph's, say): the broker elects one, the other takes
over.

Real processes on the test run's Apache Pulsar, the config store in the
test's own process. Two registries must never both write; when the active
one is killed, the standby runs the registry and services keep their tools.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import atoolreg, eventually, toolreg_background

from discovery.store import ConfigStoreService
from toolservice_base import ConfigClient, Settings, open_transport
from toolservice_base.examples.echo import EchoService
from toolservice_base.transport import Transport

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(240)]


@pytest.fixture
def settings(apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        pulsar_url=apache_pulsar.url,
        broker="apache-pulsar",
        topicspace=tenant,
        auth_token=apache_pulsar.token,
    )


@pytest.fixture
def env(settings: Settings, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    env.update(
        PULSAR_URL=str(settings.pulsar_url),
        PULSAR_AUTH_TOKEN=settings.auth_token or "",
        TOOLREG_TOPICSPACE=settings.topicspace,
        TOOLREG_DATA_DIR=str(tmp_path / "cli"),
        TOOLREG_LOG_FORMAT="json",
        TOOLREG_LOG_LEVEL="info",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Transport]:
    connection = await open_transport(settings)
    service = ConfigStoreService.in_data_dir(connection, settings.data_dir)
    await service.start()
    try:
        yield connection
    finally:
        await service.stop()
        await connection.close()


@pytest.fixture
def registries(env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    started: dict[str, subprocess.Popen[bytes]] = {}
    try:
        yield started
    finally:
        for process in started.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in started.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


async def roles(env: dict[str, str]) -> dict[int, str]:
    done = await atoolreg("replicas", "--json", "--listen", "1.5", env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return {r["pid"]: r["role"] for r in json.loads(done.stdout) if r["group"] == "registry"}


async def test_two_registries_elect_one_and_the_standby_takes_over_when_it_dies(
    store: Transport,
    settings: Settings,
    env: dict[str, str],
    registries: dict[str, subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    for name in ("a", "b"):
        log = tmp_path / f"{name}.log"
        registries[name] = toolreg_background("registry", env=env, log=log)
        await eventually(
            lambda log=log: "registry listening" in log.read_text(),
            timeout=90,
            explain=lambda log=log: log.read_text()[-2000:],
        )

    async def both_heard() -> dict[int, str] | None:
        found = await roles(env)
        return found if len(found) == 2 else None

    seen = await eventually(both_heard, timeout=30)
    assert sorted(seen.values()) == ["active", "standby"]
    active_pid = next(pid for pid, role in seen.items() if role == "active")
    client = ConfigClient(store, timeout=5)
    await client.start()
    service = EchoService(settings=settings, ttl=3)
    try:
        await service.start()
        await eventually(lambda: _has_echo(client), timeout=30)
        os.kill(active_pid, signal.SIGKILL)

        async def new_active() -> int | None:
            actives = [pid for pid, role in (await roles(env)).items() if role == "active" and pid != active_pid]
            return actives[0] if len(actives) == 1 else None

        after = await eventually(new_active, timeout=60)
        assert after != active_pid
        # The new active registry runs: a withdrawal is merged (the tool leaves the store), which only a running
        # registry does.
        await service.stop()
        await eventually(lambda: _has_echo(client, present=False), timeout=30)
    finally:
        await client.close()
        await service.stop()


async def _has_echo(client: ConfigClient, present: bool = True) -> bool:
    found = await client.get([("tool", "echo")])
    return bool(found) == present


async def test_toolreg_registry_beside_toolreg_up_waits_as_a_standby_of_the_one_elected_registry(
    env: dict[str, str],
    registries: dict[str, subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    up_log, registry_log = tmp_path / "up.log", tmp_path / "registry.log"
    registries["up"] = toolreg_background("up", env=env, log=up_log)
    await eventually(lambda: "ready in" in up_log.read_text(), timeout=90, explain=lambda: up_log.read_text()[-2000:])
    registries["registry"] = toolreg_background("registry", env=env, log=registry_log)
    await eventually(
        lambda: "registry listening" in registry_log.read_text(),
        timeout=90,
        explain=lambda: registry_log.read_text()[-2000:],
    )

    async def both_heard() -> dict[int, str] | None:
        found = await roles(env)
        return found if len(found) == 2 else None

    seen = await eventually(both_heard, timeout=30)
    assert seen == {registries["up"].pid: "active", registries["registry"].pid: "standby"}
