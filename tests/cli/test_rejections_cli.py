"""`toolreg rejections [--workspace W]`: each refusal says the workspace its message named, and can be picked by it."""

from __future__ import annotations

import json

from support import atoolreg, eventually, toolreg_env
from support.registry import announcement

from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry
from toolservice_base import ConfigClient, Settings, Transport
from toolservice_base.schemas import ToolDescriptor


async def test_rejections_carry_their_workspace_and_workspace_picks_them(
    broker: EmbeddedBroker, settings: Settings, connection: Transport, config_client: ConfigClient, registry: Registry
) -> None:
    env = toolreg_env(broker.url or "", settings.data_dir)
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await publisher.send(b"definitely not json")  # refused before it names any workspace
    outside = announcement(
        "stray", ("stray-tool",), instance="stray-1", workspace="research", namespace="elsewhere", ttl=30
    )
    await publisher.send(outside.to_json())  # refused: its queues are outside the allowed namespaces
    static = ToolDescriptor(name="tell-joke", description="By hand", service="by-hand").to_json()
    await config_client.put([("tool", "tell-joke", static)])
    await publisher.send(
        announcement("jokes", ("tell-joke",), instance="jokes-1", ttl=30).to_json()
    )  # a conflict in default
    await eventually(lambda: len(registry.rejections()) == 3, timeout=3.0, explain=registry.rejections)

    everything = await atoolreg("rejections", "--json", env=env)
    assert everything.returncode == 0, everything.stderr
    by_service = {r.get("service"): r.get("workspace") for r in json.loads(everything.stdout)}
    assert by_service == {None: None, "stray": "research", "jokes": "default"}

    research = await atoolreg("rejections", "--workspace", "research", "--json", env=env)
    rows = json.loads(research.stdout)
    assert [(r["service"], r["instance"], r["workspace"]) for r in rows] == [("stray", "stray-1", "research")]
    assert "outside the allowed namespaces" in rows[0]["reason"]
    default = await atoolreg("rejections", "--workspace", "default", "--json", env=env)
    assert [(r["service"], r["workspace"]) for r in json.loads(default.stdout)] == [("jokes", "default")]
    assert json.loads(default.stdout)[0]["reason"].startswith("conflict:")

    table = await atoolreg("rejections", env=env)
    header, *lines = table.stdout.splitlines()
    assert header.split() == ["LAST", "COUNT", "FIRST", "SERVICE", "INSTANCE", "WORKSPACE", "REASON"]
    # LAST and FIRST are two words each ("1.2s ago"): SERVICE, INSTANCE and WORKSPACE come 6th to 8th
    assert any(
        line.split()[5:8] == ["-", "-", "-"] and "not a valid announcement" in line for line in lines
    )  # unreadable: none of them
    none = await atoolreg("rejections", "--workspace", "nowhere", env=env)
    assert none.returncode == 0 and none.stdout.strip() == "no rejected announcements in workspace 'nowhere'"
