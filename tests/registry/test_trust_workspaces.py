"""A trusted key's scope includes workspaces (issue 22, item 4).

Before, a key trusted for some services could publish tools into every
workspace. Now a key's entry may say which workspaces it announces into
(`toolreg trust add --workspaces PATTERN...`, `"workspaces"` in the file);
left out, it is every workspace, so a file written before means what it meant.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support import eventually
from support.registry import announcement

from discovery.registry.service import Registry, RegistryOptions
from discovery.registry.trust import EVERY_WORKSPACE, PolicyError, TrustPolicy, trusted_key
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Transport
from toolservice_base.signing import Ed25519PrivateKey, public_key_text, sign

TEAM = Ed25519PrivateKey.generate()


def team_policy(workspaces: list[str] | None) -> TrustPolicy:
    policy = TrustPolicy()
    policy.add(trusted_key("team", public_key_text(TEAM.public_key()), ["team-*"], ["*"], workspaces))
    return policy


def signed(**fields: Any) -> Any:
    return sign(announcement(**{"service_id": "team-svc", "tools": ("search",), "ttl": 30.0, **fields}), TEAM)


# --- the policy, without a broker ---------------------------------------------------------------


def test_a_key_may_announce_only_into_the_workspaces_it_is_trusted_for() -> None:
    policy = team_policy(["research", "team-*"])
    assert policy.check(signed(workspace="research"), "team-svc", ["search"]) is None
    assert policy.check(signed(workspace="team-a"), "team-svc", ["search"]) is None
    refusal = policy.check(signed(workspace="default"), "team-svc", ["search"])
    assert refusal == "key 'team' may not announce into workspace 'default'"
    # The workspace judged can be another than the message names: the one its instance's lease is in.
    assert policy.check(signed(workspace="research", kind="heartbeat"), "team-svc", [], "default") is not None


def test_a_policy_file_without_workspaces_means_every_workspace_as_it_always_did(tmp_path: Path) -> None:
    path = tmp_path / "trust.json"
    entry = {"name": "team", "public-key": public_key_text(TEAM.public_key()), "services": ["team-*"], "tools": ["*"]}
    path.write_text(json.dumps({"keys": [entry]}))
    policy = TrustPolicy.load(path)
    assert next(iter(policy.keys.values())).workspaces == EVERY_WORKSPACE
    assert policy.check(signed(workspace="anything"), "team-svc", ["search"]) is None
    policy.save(path)
    assert json.loads(path.read_text()) == {"keys": [entry]}  # saved as it was: no new key in an old file


def test_workspaces_are_stored_in_the_policy_file_and_checked_like_the_other_patterns(tmp_path: Path) -> None:
    path = team_policy(["research", "team-*"]).save(tmp_path / "trust.json")
    assert json.loads(path.read_text())["keys"][0]["workspaces"] == ["research", "team-*"]
    assert next(iter(TrustPolicy.load(path).keys.values())).workspaces == ("research", "team-*")
    assert team_policy(["*", "research"]).keys.popitem()[1].workspaces == EVERY_WORKSPACE
    for bad in ([], ["no spaces"], "research"):
        data = json.loads(path.read_text())
        data["keys"][0]["workspaces"] = bad
        path.write_text(json.dumps(data))
        with pytest.raises(PolicyError, match="'workspaces' must be a non-empty list"):
            TrustPolicy.load(path)


def test_a_key_says_what_it_may_do() -> None:
    assert team_policy(None).keys.popitem()[1].scope() == "services team-* with tools * in every workspace"
    assert (
        team_policy(["research", "team-*"]).keys.popitem()[1].scope()
        == "services team-* with tools * in workspaces research, team-*"
    )


# --- enforced by the registry, on every broker -------------------------------------------------


@pytest.fixture
async def scoped(connection: Transport, config_store: ConfigStoreService) -> AsyncIterator[Registry]:
    registry = Registry(connection, options=RegistryOptions(sweep_interval=0.1, trust=team_policy(["research"])))
    await registry.start()
    yield registry
    await registry.stop()


@pytest.mark.contract
async def test_the_registry_refuses_a_trusted_key_outside_its_workspaces(
    connection: Transport, config_client: ConfigClient, scoped: Registry
) -> None:
    publisher = await connection.publisher(connection.topics.tool_descriptors)
    await publisher.send(signed(workspace="research", instance="team-1").to_json())
    await eventually(lambda: config_client.list("tool", workspace="research"), timeout=3.0)
    before = scoped.rejection_log.total
    attacks = [
        signed(workspace="default", instance="team-2"),  # a new instance, into a workspace the key may not use
        signed(workspace="default", instance="team-1", sequence=2),  # its own instance, moved there
    ]
    for message in attacks:
        await publisher.send(message.to_json())
    await eventually(lambda: scoped.rejection_log.total >= before + len(attacks), timeout=3.0)
    reasons = {r.instance: r.reason for r in scoped.rejections()}
    assert "may not announce into workspace 'default'" in reasons["team-2"]
    assert "may not announce into workspace 'default'" in reasons["team-1"]
    await asyncio.sleep(0.3)
    await scoped.settle()
    assert await config_client.list("tool", workspace="default") == []
    assert await config_client.list("tool", workspace="research") == ["search"]
    lease = scoped.leases.get("team-1")
    assert lease is not None and lease.service == ("research", "team-svc")
