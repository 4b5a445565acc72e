"""Audit records told from forgeries, on Apache Pulsar with authorization on and a role per kind of process.

Every agent's role may produce on the audit namespace (an MCP front is an
agent), so an agent can publish records that look exactly like a front's:
2,000 made-up subjects in a fraction of a second. A front with an audit key
signs and chains its records; `toolreg audit verify` (run with the
operator's role, which may read the trail) flags the forgeries and any
record missing from a chain, and the registry's page (run with the store's
role) counts only the front's records as callers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support import eventually
from support.registry import FAST
from support.roles import kind_settings

from discovery.audit_chain import AuditChain
from discovery.cli.main import build_parser
from discovery.mcp.auth import AuditTrail, Caller
from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from discovery.store.sqlite import ConfigStore
from discovery.web.page import render
from toolservice_base import Settings, open_transport
from toolservice_base.schemas import AuditRecord
from toolservice_base.signing import generate_key_pair, key_id, load_private_key

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(120)]

FORGED = 2000


@dataclasses.dataclass
class Deployment:
    settings: dict[str, Settings]
    """Each kind's settings, with its own role's token."""
    key: Path
    """The front's audit key (`toolreg mcp --audit-key`), trusted in `policy` with `toolreg trust add-front`."""
    policy: Path


@pytest.fixture
async def deployment(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Deployment:
    settings = kind_settings(apache_pulsar, tenant, tmp_path)
    key, public = generate_key_pair(tmp_path / "front.key")
    policy = tmp_path / "trust.json"
    assert await toolreg("trust", "add-front", "front-eu", "--public-key", str(public), "--policy", str(policy)) == 0
    for name, value in (
        ("PULSAR_URL", apache_pulsar.url),
        ("PULSAR_AUTH_TOKEN", str(settings["operator"].auth_token)),  # `audit verify` reads the trail as an operator
        ("TOOLREG_BROKER", "apache-pulsar"),
        ("TOOLREG_TOPICSPACE", tenant),
    ):
        monkeypatch.setenv(name, value)
    return Deployment(settings, key, policy)


async def toolreg(*argv: str) -> int:
    """One `toolreg` command, in this process (the same parser and handler as the console script)."""
    args = build_parser().parse_args(list(argv))
    code: int = await args.handler(args)
    return code


async def front_calls(settings: Settings, key: Path, calls: int) -> AuditTrail:
    """A front (the agent's role) with its audit key publishing `calls` calls of agent-7, as `toolreg mcp` does."""
    trail = AuditTrail("default", key=load_private_key(key))
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(settings))
        await stack.enter_async_context(trail.publishing(connection))
        for _ in range(calls):
            trail.record(Caller("agent-7", client_id="calc-agent", authenticated=True), "calculate", "ok", 0.0)
    assert trail.published == calls
    return trail


@pytest.fixture
async def page(deployment: Deployment) -> AsyncIterator[Registry]:
    """The registry (the store's role) following the audit topic, believing the policy's audit fronts."""
    fronts = {key_id(k.public_key()): k.public_key() for k in [load_private_key(deployment.key)]}
    async with AsyncExitStack() as stack:
        connection = await stack.enter_async_context(await open_transport(deployment.settings["store"]))
        await stack.enter_async_context(ConfigStoreService(connection, ConfigStore.in_memory("store")))
        registry = Registry(connection, options=dataclasses.replace(FAST, follow_audit=True, audit_fronts=fronts))
        await registry.start()
        stack.push_async_callback(registry.stop)
        yield registry


async def test_records_forged_by_an_agent_are_flagged_by_audit_verify_and_never_counted_as_callers(
    deployment: Deployment, page: Registry, capsys: pytest.CaptureFixture[str]
) -> None:
    trail = await front_calls(deployment.settings["agent"], deployment.key, 3)
    async with await open_transport(deployment.settings["agent"]) as forger:
        publisher = await forger.publisher(forger.topics.mcp_audit)
        chain = AuditChain(trail.front, Ed25519PrivateKey.generate())  # as the front's, but with a key of its own
        began = time.monotonic()
        for n in range(FORGED):
            record = AuditRecord(
                at=time.time(),
                front="",
                workspace="default",
                subject=f"ceo-{n}@corp",
                tool="calculate",
                outcome="ok",
                duration_ms=2.0,
            )
            await publisher.send(chain.seal(record).to_json().encode(), key=record.subject, confirm=n == FORGED - 1)
        with capsys.disabled():
            print(f"\n{FORGED} forged records published by the agent's role in {time.monotonic() - began:.2f} s")

    async def all_heard() -> bool:
        return (await page.overview.snapshot()).callers_unverified == FORGED

    await eventually(all_heard, timeout=20)
    snapshot = await page.overview.snapshot()
    assert [(c.subject, c.calls) for c in snapshot.callers or []] == [("agent-7", 3)]
    html = render(snapshot)
    assert f"{FORGED} unverified records ignored" in html and "ceo-" not in html

    capsys.readouterr()
    assert await toolreg("audit", "verify", "--policy", str(deployment.policy), "--show", "2") == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("forged     subject 'ceo-0@corp' tool 'calculate'"), lines
    assert "which is no trusted front's" in lines[0] and lines[2] == f"... and {FORGED - 2} more"
    assert lines[-1].startswith("audit trail NOT verified") and f"3 good record(s) of {FORGED + 3}" in lines[-1]
    assert f"{FORGED} forged" in lines[-1] and "missing" not in lines[-1], lines[-1]


async def test_a_record_missing_from_the_middle_of_a_fronts_chain_is_reported_with_its_place(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    chain = AuditChain("front-a", load_private_key(deployment.key))
    async with await open_transport(deployment.settings["agent"]) as front:
        publisher = await front.publisher(front.topics.mcp_audit)
        for n in range(1, 6):
            sealed = chain.seal(_call())
            if n != 3:  # record 3 never reaches the topic
                await publisher.send(sealed.to_json().encode(), key=sealed.subject)
    capsys.readouterr()
    assert await toolreg("audit", "verify", "--policy", str(deployment.policy)) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "missing    1 record(s) of front front-a (key 'front-eu'): sequence 3",
        f"audit trail NOT verified (persistent://{deployment.settings['agent'].topicspace}/audit/mcp-calls): 4 good"
        " record(s) of 4 from 1 front chain(s); 1 missing (1 gap)",
    ]


async def test_a_restarted_front_starts_a_new_chain_and_the_whole_trail_verifies(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    first = await front_calls(deployment.settings["agent"], deployment.key, 2)
    second = await front_calls(deployment.settings["agent"], deployment.key, 3)  # the same front, started again
    assert first.front != second.front
    capsys.readouterr()
    assert await toolreg("audit", "verify", "--policy", str(deployment.policy)) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"audit trail verified (persistent://{deployment.settings['agent'].topicspace}/audit/mcp-calls): 5 good"
        " record(s) of 5 from 2 front chain(s)"
    ]


def _call() -> AuditRecord:
    return AuditRecord(
        at=time.time(), front="", workspace="default", subject="agent-7", tool="calculate", outcome="ok", duration_ms=1
    )
