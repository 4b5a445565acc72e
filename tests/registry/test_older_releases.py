"""A rolling upgrade, both ways, against the real older release: the product as it was before tools could carry a
title, annotations and full schemas (commit `OLDER_RELEASE`, taken from this repository's own history and run from
a copy of its tree, on the same broker).

- A service of this release meets an older registry: that registry refuses the keys it does not know (it reads
  them as config values nobody declared), the service offers its plain descriptors (flat arguments derived from
  the schema), and its tools stay listed; the service still checks every call against its full schema. Once a
  registry of this release runs, it probes, and the full descriptors go in.
- A service of the older release meets this release's registry and agent: listed and called as before.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import eventually
from support.registry import FAST

from agent_bridge import BadArguments, ToolError, ToolSet
from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, DynamicToolService, Settings, Transport

OLDER_RELEASE = "52c0285"
"""The last commit before descriptors carried `title`, `annotations`, `input-schema` and `output-schema`."""
REPOSITORY = Path(__file__).resolve().parents[2]


class ForecastService(DynamicToolService):
    descriptor = {"id": "forecast"}
    tools = [
        {
            "name": "forecast",
            "title": "Weather forecast",
            "description": "The weather for a city",
            "annotations": {"readOnlyHint": True, "openWorldHint": True},
            "input-schema": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        }
    ]

    async def invoke(self, user: str, config: dict[str, Any], arguments: dict[str, Any]) -> str:
        return f"sunny in {arguments['city']} for {arguments.get('days', 1)} days"


@pytest.fixture(scope="module")
def older_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The older release's packages, from this repository's history, in a folder of their own."""
    if not (REPOSITORY / ".git").exists():
        pytest.skip("not a git checkout: the older release comes from the repository's history")
    known = subprocess.run(["git", "-C", str(REPOSITORY), "cat-file", "-e", f"{OLDER_RELEASE}^{{commit}}"], check=False)
    if known.returncode != 0:
        pytest.skip(f"the history does not reach {OLDER_RELEASE} (a shallow clone): `git fetch --unshallow` to run it")
    tree = tmp_path_factory.mktemp("older-release")
    archive = subprocess.run(
        ["git", "-C", str(REPOSITORY), "archive", OLDER_RELEASE, "toolservice_base", "discovery", "agent_bridge"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def older_env(tree: Path, url: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    return {
        **env,
        "PYTHONPATH": str(tree),  # ahead of this checkout's editable install
        "PULSAR_URL": url,
        "TOOLREG_BROKER": "pulsar-lite",
        "TOOLREG_DATA_DIR": str(data_dir),
        "TOOLREG_LOG_FORMAT": "json",
    }


def older_toolreg(tree: Path, url: str, where: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`toolreg ARGS` of the older release on broker `url`, its log and data under `where`; stopped after."""
    with open(where / f"older-{args[0]}.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "discovery.cli", *args],
            env=older_env(tree, url, where / "older"),
            cwd=where,  # not this checkout: its packages would come first
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        yield process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(20)


@pytest.fixture
def older_up(older_release: Path, broker: EmbeddedBroker, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`toolreg up` (config store and registry) of the older release, on the test's broker."""
    yield from older_toolreg(older_release, broker.url, tmp_path, "up")


@pytest.fixture
def older_calculator(older_release: Path, broker: EmbeddedBroker, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The older release's calculator example, announcing itself."""
    yield from older_toolreg(
        older_release, broker.url, tmp_path, "serve", "toolservice_base.examples.calculator:CalculatorService"
    )


async def stored_tool(config: ConfigClient, name: str) -> dict[str, Any] | None:
    value = (await config.get([("tool", name)])).get(("tool", name))
    return json.loads(value) if value is not None else None


async def test_a_new_service_keeps_its_tools_listed_under_an_older_registry_and_says_more_once_it_is_upgraded(
    older_up: subprocess.Popen[bytes], settings: Settings, connection: Transport, tmp_path: Path
) -> None:
    config = ConfigClient(connection, timeout=2)
    await config.start()
    try:
        await eventually(_answers(config), timeout=30)
        async with ForecastService(settings=settings, ttl=3) as service:
            listed = await eventually(lambda: stored_tool(config, "forecast"), timeout=20)
            assert "input-schema" not in listed and "title" not in listed, "the older registry writes the plain form"
            assert [a["name"] for a in listed["arguments"]] == ["city", "days"]
            assert service.announcer is not None and service.announcer.tools is not service.announcer.full_tools

            async with ToolSet(settings=settings, connection=connection, data_dir=tmp_path / "agent") as tools:
                assert await tools.invoke("forecast", {"city": "Oslo", "days": 2}) == "sunny in Oslo for 2 days"
                with pytest.raises(ToolError, match=r"arguments at \$\.days: 9 is greater than the maximum of 7"):
                    await tools.invoke("forecast", {"city": "Oslo", "days": 9})  # flat types pass; the service refuses

                older_up.send_signal(signal.SIGTERM)  # the registry is upgraded: the older one goes...
                await asyncio.to_thread(older_up.wait, 20)
                # ...and this release's store and registry take over, on the same store file
                async with ConfigStoreService.in_data_dir(connection, tmp_path / "older") as store:
                    await eventually(_answers(config), timeout=10)
                    async with Registry(connection, options=FAST):
                        full = await eventually(lambda: _has_schema(config), timeout=20)
                        assert full["title"] == "Weather forecast"
                        assert full["annotations"] == {"readOnlyHint": True, "openWorldHint": True}
                        await tools.wait_for(lambda t: "title" in t.describe()[0], timeout=10)
                        with pytest.raises(BadArguments, match=r"\$\.days"):  # now checked before it is sent
                            await tools.invoke("forecast", {"city": "Oslo", "days": 9})
                    assert store is not None
    finally:
        await config.close()


async def test_an_older_service_is_listed_and_called_by_this_release(
    settings: Settings,
    connection: Transport,
    config_store: ConfigStoreService,
    registry: Registry,
    older_calculator: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    async with ToolSet(settings=settings, connection=connection, data_dir=tmp_path / "agent") as tools:
        await tools.wait_for(lambda t: "calculate" in t, timeout=20)
        assert set(tools.describe()[0]) == {"name", "description", "parameters", "digest"}
        assert await tools.invoke("calculate", {"expression": "6*7"}) == "42"
        result = await tools.call("calculate", {"expression": "1+1"})
        assert result.text == "2" and result.structured is None


def _answers(config: ConfigClient) -> Any:
    async def check() -> bool:
        try:
            await config.list("tool")
        except Exception:
            return False
        return True

    return check


async def _has_schema(config: ConfigClient) -> dict[str, Any] | None:
    tool = await stored_tool(config, "forecast")
    return tool if tool is not None and "input-schema" in tool else None
