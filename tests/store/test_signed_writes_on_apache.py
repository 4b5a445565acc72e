"""A hostile insider against three store replicas on Apache Pulsar (authorization on, a role per kind of process, a
group key, a trust policy with `config-writes signed` and pinned definitions).

The agent's role may send on the config queue. Under `config-writes signed`
it must not be able to write what the registry owns (pin a held definition,
delete the held change, approve it unsigned) nor make a signed write it captured count again: with
its signature's base64 re-spelt, exactly after a failover, to another
topicspace, or after it expired.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import atoolreg, eventually
from support.pins import ARG, LEAK, Sender, announce, service, tool
from support.registry import TOPICSPACE
from support.replicas import Cluster
from support.roles import kind_settings
from support.signed import capturing, guard_for, guarded_policy, operator, padding_bits_changed, replaying, signer

from discovery.errors import RegistryQueryError
from discovery.registry.client import RegistryClient
from discovery.registry.trust import TrustPolicy, trusted_key
from discovery.replicas import GroupKey
from discovery.store.service import ConfigStoreService
from discovery.store.sqlite import ConfigStore
from toolservice_base import ConfigClient, ConfigError, Settings, Transport, open_transport
from toolservice_base.schemas import ConfigRequest
from toolservice_base.signing import generate_key_pair, load_private_key, sign, sign_config_request

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(300)]

REPLICAS = ("a", "b", "c")
UNSIGNED = "must be signed by an operator key"
ROGUE_TOOL = {"type": "tool-service", "name": "rogue-tool", "description": "whatever it wants", "service": "rogue"}


@dataclass
class Insider:
    """The group, and each kind's settings on its topicspace (its own role's token)."""

    cluster: Cluster
    roles: dict[str, Settings]
    root: Path

    async def connect(self, stack: AsyncExitStack, kind: str) -> Transport:
        return await stack.enter_async_context(await open_transport(self.roles[kind]))

    def env(self, kind: str) -> dict[str, str]:
        return {**self.cluster.env("cli"), "PULSAR_AUTH_TOKEN": self.roles[kind].auth_token or ""}

    async def fail_over(self) -> str:
        """SIGKILL the active replica; the name of the one that takes over."""
        gone = await self.cluster.active()
        self.cluster.processes[gone].send_signal(signal.SIGKILL)
        self.cluster.processes[gone].wait(30)
        del self.cluster.processes[gone]
        return await self.cluster.active(timeout=90)


@pytest.fixture
async def insider(apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path) -> AsyncIterator[Insider]:
    """Three replicas under the store's role with a group key, on a policy with `config-writes signed` (operator
    alice), pinning, and one announcing key (`jokes`)."""
    roles = kind_settings(apache_pulsar, tenant, tmp_path, ("store", "service", "agent", "operator"))
    alice = operator(tmp_path, "alice")
    path = guarded_policy(tmp_path / "trust.json", {"alice": alice}, pin=True)
    announcer = generate_key_pair(tmp_path / "jokes.key")[1]
    policy = TrustPolicy.load(path)
    policy.add(trusted_key("jokes", announcer.read_text().strip(), ["jokes"], ["tell-*"]))
    policy.save()
    key = GroupKey.generate().save(tmp_path / "group.key", new=True)
    cluster = Cluster(apache_pulsar, tenant, tmp_path)
    before, TOPICSPACE[0] = TOPICSPACE[0], tenant
    try:
        for name in REPLICAS:
            token = str(roles["store"].auth_token)
            cluster.extra_env[name] = {"PULSAR_AUTH_TOKEN": token, "TOOLREG_GROUP_KEY": str(key)}
            await cluster.start(name, "--trust-policy", str(path))
        await cluster.active()
        yield Insider(cluster, roles, tmp_path)
    finally:
        TOPICSPACE[0] = before
        cluster.stop_all()


async def pending(insider: Insider) -> list[dict[str, object]]:
    done = await atoolreg("pending", "--json", env=insider.env("operator"), timeout=60)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


async def test_row_4_the_agents_role_cannot_pin_a_held_definition_nor_drop_it_and_after_a_failover_it_is_still_held(
    insider: Insider,
) -> None:
    jokes = load_private_key(insider.root / "jokes.key")
    svc, changed = service(), tool(arguments=(ARG, LEAK))
    async with AsyncExitStack() as stack:
        send = Sender(await insider.connect(stack, "service"))
        agent = await stack.enter_async_context(ConfigClient(await insider.connect(stack, "agent"), timeout=10))
        await send(sign(announce(svc, tool(), sequence=1), jokes))
        await eventually(lambda: agent.list("discovery-pin"), timeout=30)
        await send(sign(announce(svc, changed, sequence=2), jokes))
        held = await eventually(lambda: pending(insider), timeout=30)
        assert [row["tool"] for row in held] == ["tell-joke"]
        pinned = json.loads((await agent.get([("discovery-pin", "tell-joke")]))[("discovery-pin", "tell-joke")])
        forged = json.dumps({**pinned, "digest": held[0]["offered"]})
        with pytest.raises(ConfigError, match=UNSIGNED):
            await agent.put([("discovery-pin", "tell-joke", forged)])
        with pytest.raises(ConfigError, match=UNSIGNED):
            await agent.delete([("pending-definition", "default/tell-joke")], workspace="_toolreg")
        with pytest.raises(ConfigError, match=UNSIGNED):
            await agent.put([("discovery", "tell-joke", "{}")])
        with pytest.raises(ConfigError, match=UNSIGNED):
            await agent.put([("registry", "departed", "{}")], workspace="_toolreg")
        registry = await stack.enter_async_context(RegistryClient(await insider.connect(stack, "agent"), timeout=10))
        with pytest.raises(RegistryQueryError, match=UNSIGNED):
            await registry.approve("tell-joke")
        await insider.fail_over()
        await send(sign(announce(svc, changed, sequence=3), jokes))
        still = await eventually(lambda: pending(insider), timeout=60)
        assert [row["tool"] for row in still] == ["tell-joke"], "the held change was dropped"
        after = await agent.get([("discovery-pin", "tell-joke"), ("tool", "tell-joke")])
        assert json.loads(after[("discovery-pin", "tell-joke")])["digest"] == pinned["digest"] != held[0]["offered"]
        served = json.loads(after.get(("tool", "tell-joke"), '{"arguments": []}'))
        assert LEAK["name"] not in [a["name"] for a in served["arguments"]], "the held definition is served"
        approve = ("approve", "tell-joke", "--signing-key", str(insider.root / "alice.key"))
        done = await atoolreg(*approve, env=insider.env("operator"), timeout=60)
        assert done.returncode == 0 and "approved tell-joke" in done.stdout, done.stderr
        assert await pending(insider) == []


async def test_row_5_a_captured_signed_write_is_taken_once_respelt_after_a_failover_or_in_another_topicspace(
    insider: Insider, apache_pulsar: ApachePulsar, tmp_path: Path
) -> None:
    alice = load_private_key(tmp_path / "alice.key")
    space = insider.cluster.tenant
    queues = {f"{way}-queue": f"non-persistent://{space}/{way}/rogue" for way in ("request", "response")}
    rogue = [
        ("tool-service", "rogue", json.dumps({"id": "rogue", **queues})),
        ("tool", "rogue-tool", json.dumps(ROGUE_TOOL)),
    ]
    captured: list[ConfigRequest] = []
    async with AsyncExitStack() as stack:
        wire = await insider.connect(stack, "operator")
        alices = await stack.enter_async_context(
            ConfigClient(wire, timeout=10, sign=capturing(signer(alice, space), captured))
        )
        await alices.put(rogue)
        put = captured[0]
        await alices.delete([(t, k) for t, k, _ in rogue])

        async def replay(copy: ConfigRequest, wanted: str) -> None:
            agent = await stack.enter_async_context(
                ConfigClient(await insider.connect(stack, "agent"), timeout=10, sign=replaying(copy))
            )
            with pytest.raises(ConfigError, match=wanted):
                await agent.put([("note", "ignored", "x")])

        await replay(padding_bits_changed(put), "not in canonical base64")
        await replay(put, "already taken")
        await insider.fail_over()
        await replay(put, "already taken")
        assert await alices.list("tool") == [] and await alices.list("tool-service") == [], "a deleted tool came back"
        stale = sign_config_request(put.model_copy(update={"signature": None}), alice, space, now=time.time() - 120)
        await replay(stale, "expired")
        other = f"t-{uuid.uuid4().hex[:10]}"
        apache_pulsar.create_tenant(other)
        stack.callback(apache_pulsar.delete_tenant, other)
        elsewhere = Settings(
            data_dir=tmp_path / "other",
            pulsar_url=apache_pulsar.url,
            broker="apache-pulsar",
            topicspace=other,
            auth_token=apache_pulsar.token,
        )
        there = await stack.enter_async_context(await open_transport(elsewhere))
        guard = guard_for(other, {"alice": alice})
        store = ConfigStoreService(there, ConfigStore.in_memory("other"), write_guard=guard)
        await stack.enter_async_context(store)
        replayer = await stack.enter_async_context(ConfigClient(there, timeout=10, sign=replaying(put)))
        with pytest.raises(ConfigError, match=f"signed for topicspace '{space}'"):
            await replayer.put([("note", "ignored", "x")])
        assert await replayer.list("tool") == [], "taken in the other topicspace"
