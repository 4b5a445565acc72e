"""A trust policy that covers the config queue: tools written by hand need an operator's signature.

Without it a trust policy guards announcements only: an unsigned service an
operator never trusted is one `toolreg config put tool-service/...` and one
`toolreg config put tool/...` away from agents calling it (listed as
static). With `"config-writes": "signed"` the store takes writes of `tool` and
`tool-service` items only when an operator key of the policy signed them, or
the registry (its own announced tools keep flowing); without it, `toolreg up`
says the policy covers announcements only.
"""

from __future__ import annotations

import json
import time
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from support import atoolreg, eventually
from support.replicas import Cluster

from discovery.registry.trust import TrustPolicy, operator_key, trusted_key
from discovery.replicas import GroupKey
from discovery.store.write_policy import ConfigWriteGuard
from toolservice_base import ConfigClient, ConfigError, open_transport
from toolservice_base.examples.echo import EchoService
from toolservice_base.schemas import ConfigRequest
from toolservice_base.signing import generate_key_pair, load_private_key, sign_config_request

SERVICE = {"id": "rogue", "request-queue": "", "response-queue": ""}
TOOL = {"type": "tool-service", "name": "rogue-tool", "description": "whatever it wants", "service": "rogue"}


def keys(tmp_path: Path, *names: str) -> dict[str, Path]:
    return {name: generate_key_pair(tmp_path / f"{name}.key")[0] for name in names}


def guarded_policy(tmp_path: Path, operator: Path, *, signed: bool = True) -> Path:
    announcer = generate_key_pair(tmp_path / "announcer.key")[1]
    policy = TrustPolicy(path=tmp_path / "trust.json", config_writes="signed" if signed else "any")
    policy.add(trusted_key("echo", announcer.read_text().strip(), ["echo"], ["echo"]))
    alice = operator_key({"name": "alice", "public-key": Path(f"{operator}.pub").read_text().strip()}, "alice")
    policy.operators[alice.id] = alice
    return policy.save()


# --- the guard, without a broker --------------------------------------------------------------------------------------


def put_request(item_type: str = "tool", key: str = "rogue-tool") -> ConfigRequest:
    return ConfigRequest(operation="put", values=[{"type": item_type, "key": key, "value": "{}"}])


def test_the_guard_takes_an_operators_and_the_registrys_signatures_and_nothing_else(tmp_path: Path) -> None:
    found = keys(tmp_path, "alice", "mallory")
    alice, mallory = load_private_key(found["alice"]), load_private_key(found["mallory"])
    group = GroupKey.generate()
    guard = ConfigWriteGuard({operator_key_id(found["alice"]): alice.public_key()}, {}, "tg", registry=group)
    assert guard.covers(put_request()) and guard.covers(put_request("tool-service", "rogue"))
    assert not guard.covers(put_request("note", "anything")), "other types are the broker's business"
    assert "must be signed by an operator key" in (guard.refusal(put_request()) or "")
    assert guard.refusal(sign_config_request(put_request(), alice, "tg")) is None
    assert "not an operator key" in (guard.refusal(sign_config_request(put_request(), mallory, "tg")) or "")
    signed = sign_config_request(put_request(), alice, "tg")
    tampered = signed.model_copy(update={"values": put_request("tool", "b").values})
    assert "does not match" in (guard.refusal(tampered) or "")
    stale = sign_config_request(put_request(), alice, "tg", now=time.time() - 3600)
    assert "expired" in (guard.refusal(stale) or "")
    assert guard.refusal(group.sign_config(put_request(), "tg")) is None
    assert guard.refusal(group.sign_config(put_request(), "another-topicspace")) is not None
    assert guard.refusal(GroupKey.generate().sign_config(put_request(), "tg")) is not None


def operator_key_id(private: Path) -> str:
    return operator_key({"name": "k", "public-key": Path(f"{private}.pub").read_text().strip()}, "k").id


# --- toolreg up and toolreg config, on Apache Pulsar ------------------------------------------------------------------


@pytest.mark.apache_pulsar
@pytest.mark.timeout(180)
async def test_with_config_writes_signed_a_tool_written_by_hand_needs_an_operators_signature(
    cluster: Cluster, tmp_path: Path
) -> None:
    found = keys(tmp_path, "alice", "mallory")
    policy = guarded_policy(tmp_path, found["alice"])
    await cluster.start("up", "--store", "sqlite", "--trust-policy", str(policy))
    assert "config writes of tools taken only when signed by one of 1 operator key(s)" in cluster.output("up")
    env = cluster.env("operator")
    queues = {f"{way}-queue": f"non-persistent://{cluster.tenant}/{way}/rogue" for way in ("request", "response")}
    items = [("tool-service", "rogue", json.dumps({**SERVICE, **queues})), ("tool", "rogue-tool", json.dumps(TOOL))]
    done = await atoolreg("config", "put", "tool-service/rogue", "--value", items[0][2], env=env)
    said = [line for line in done.stderr.splitlines() if line.startswith("toolreg: ")]
    assert done.returncode == 1 and len(said) == 1 and "--signing-key" in said[0], done.stderr
    alice, mallory = (load_private_key(found[name]) for name in ("alice", "mallory"))
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(cluster.settings()))
        space = connection.topics.topicspace
        unsigned = await stack.enter_async_context(ConfigClient(connection, timeout=5))
        forged = await stack.enter_async_context(
            ConfigClient(connection, timeout=5, sign=lambda request: sign_config_request(request, mallory, space))
        )
        for client in (unsigned, forged):
            for item in items:
                with pytest.raises(ConfigError, match="operator key"):
                    await client.put([item])
        assert await unsigned.list("tool") == [] and await unsigned.list("tool-service") == []
        assert await unsigned.put([("note", "free", "x")]) > 0, "other types are not the policy's"
        done = await atoolreg(
            "config", "put", "tool-service/rogue", "--value", items[0][2], "--signing-key", str(found["alice"]), env=env
        )
        assert done.returncode == 0, done.stderr
        operator = await stack.enter_async_context(
            ConfigClient(connection, timeout=5, sign=lambda request: sign_config_request(request, alice, space))
        )
        await operator.put([items[1]])
        with pytest.raises(ConfigError, match="operator key"):
            await unsigned.delete([("tool", "rogue-tool")])
        # The registry's own writes (a trusted, signed announcement) still go through: it asks its store directly.
        async with EchoService(settings=cluster.settings(), signing_key=tmp_path / "announcer.key"):
            listed = await eventually(lambda: tools_listed(unsigned, "echo"), timeout=30)
        assert listed == ["echo", "rogue-tool"]


async def tools_listed(client: ConfigClient, wanted: str) -> list[str] | None:
    listed = await client.list("tool")
    return listed if wanted in listed else None


@pytest.mark.apache_pulsar
@pytest.mark.timeout(180)
async def test_without_config_writes_the_start_line_says_the_policy_covers_announcements_only(
    cluster: Cluster, tmp_path: Path
) -> None:
    policy = guarded_policy(tmp_path, keys(tmp_path, "alice")["alice"], signed=False)
    await cluster.start("up", "--store", "sqlite", "--trust-policy", str(policy))
    trust = next(line for line in cluster.output("up").splitlines() if line.startswith("trust "))
    assert "the policy covers announcements only" in trust, trust
    await eventually(lambda: "ready in" in cluster.output("up"))
