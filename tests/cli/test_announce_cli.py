"""`toolreg announce`, the sidecar: the same validation, signing and trust as `toolreg serve`."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from support import atoolreg, eventually, toolreg, toolreg_background, toolreg_env

from discovery.broker import EmbeddedBroker
from discovery.registry.service import Registry, RegistryOptions
from discovery.registry.trust import TrustPolicy, trusted_key
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Transport, topics
from toolservice_base.signing import Ed25519PrivateKey, public_key_text

SERVICE = {
    "id": "lookup",
    "request-queue": topics.DEFAULT.request_queue("lookup"),
    "response-queue": topics.DEFAULT.response_queue("lookup"),
}
TOOLS = [
    {
        "name": "lookup",
        "description": "Look someone up",
        "arguments": [{"name": "who", "type": "string", "description": "Whom"}],
    }
]


def files(tmp_path: Path, service: object = SERVICE, tools: object = TOOLS) -> tuple[str, str]:
    service_file, tools_file = tmp_path / "svc.json", tmp_path / "tools.json"
    service_file.write_text(service if isinstance(service, str) else json.dumps(service))
    tools_file.write_text(tools if isinstance(tools, str) else json.dumps(tools))
    return str(service_file), str(tools_file)


@pytest.mark.parametrize(
    ("service", "tools", "extra", "says"),
    [
        ("{nope", TOOLS, [], "is not JSON"),
        (SERVICE, [], [], "lists no tools"),
        ([SERVICE], TOOLS, [], "--service must hold a JSON object"),
        ({**SERVICE, "request-queue": "http://example.com/q"}, TOOLS, [], "request-queue"),
        (SERVICE, [{"name": "lookup", "description": "x", "colour": "red"}], [], "colour is not a config param"),
        (SERVICE, [{"name": "bad name!", "description": "x"}], [], "name"),
        (SERVICE, TOOLS, ["--ttl", "0"], "--ttl must be more than 0"),
        (SERVICE, TOOLS, ["--workspace", "no spaces"], "workspace"),
        (SERVICE, TOOLS, ["--signing-key", "/nonexistent/key"], "key"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_anything_is_sent(
    broker: EmbeddedBroker, tmp_path: Path, service: object, tools: object, extra: list[str], says: str
) -> None:
    service_file, tools_file = files(tmp_path, service, tools)
    result = toolreg(
        "announce",
        "--service",
        service_file,
        "--tools",
        tools_file,
        *extra,
        env=toolreg_env(broker.url, tmp_path),
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("toolreg: ") and says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_a_missing_file_is_named(broker: EmbeddedBroker, tmp_path: Path) -> None:
    result = toolreg(
        "announce",
        "--service",
        str(tmp_path / "nowhere.json"),
        "--tools",
        str(tmp_path / "t.json"),
        env=toolreg_env(broker.url, tmp_path),
        timeout=30,
    )
    assert result.returncode == 1 and "nowhere.json" in result.stderr


@pytest.fixture
async def guarded(
    connection: Transport, config_store: ConfigStoreService, tmp_path: Path
) -> AsyncIterator[tuple[Registry, Path]]:
    """A registry that trusts one key for the `lookup` service and tool; the key's PEM file beside it."""
    key = Ed25519PrivateKey.generate()
    pem = tmp_path / "lookup.key"
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    policy = TrustPolicy()
    policy.add(trusted_key("lookup-team", public_key_text(key.public_key()), ["lookup"], ["lookup"]))
    registry = Registry(connection, options=RegistryOptions(sweep_interval=0.1, trust=policy))
    await registry.start()
    yield registry, pem
    await registry.stop()


async def test_a_signed_sidecar_passes_the_trust_policy_and_an_unsigned_one_does_not(
    broker: EmbeddedBroker, config_client: ConfigClient, guarded: tuple[Registry, Path], tmp_path: Path
) -> None:
    registry, pem = guarded
    service_file, tools_file = files(tmp_path)
    env = toolreg_env(broker.url, tmp_path / "sidecar")
    unsigned = toolreg_background(
        "announce", "--service", service_file, "--tools", tools_file, env=env, log=tmp_path / "unsigned.log"
    )
    try:
        await eventually(
            lambda: [r for r in registry.rejections() if r.service == "lookup" and "unsigned" in r.reason], timeout=15
        )
        assert await config_client.list("tool") == []
    finally:
        unsigned.send_signal(signal.SIGTERM)
        unsigned.wait(10)
    signed = toolreg_background(
        "announce",
        "--service",
        service_file,
        "--tools",
        tools_file,
        "--signing-key",
        str(pem),
        "--service-version",
        "2.11.1",
        env=env,
        log=tmp_path / "signed.log",
    )
    try:
        await eventually(lambda: _listed(config_client), timeout=15)
        [status] = await registry.list_tools()
        assert (status.name, status.source, status.version) == ("lookup", "announced", "2.11.1")
    finally:
        signed.send_signal(signal.SIGTERM)
        assert signed.wait(10) == 0
    await eventually(lambda: _gone(config_client), timeout=5)
    assert "signed; SIGTERM or Ctrl-C withdraws" in (tmp_path / "signed.log").read_text()


async def test_the_signing_key_can_come_from_the_environment(
    broker: EmbeddedBroker, config_client: ConfigClient, guarded: tuple[Registry, Path], tmp_path: Path
) -> None:
    _, pem = guarded
    service_file, tools_file = files(tmp_path)
    env = toolreg_env(broker.url, tmp_path / "sidecar", TOOLREG_SIGNING_KEY=str(pem))
    sidecar = toolreg_background(
        "announce", "--service", service_file, "--tools", tools_file, env=env, log=tmp_path / "env.log"
    )
    try:
        await eventually(lambda: _listed(config_client), timeout=15)
    finally:
        sidecar.send_signal(signal.SIGTERM)
        sidecar.wait(10)
    result = await atoolreg("announce", "--help", env=env)
    assert "TOOLREG_SIGNING_KEY" in result.stdout


async def _listed(config: ConfigClient) -> bool:
    return await config.list("tool") == ["lookup"]


async def _gone(config: ConfigClient) -> bool:
    return await config.list("tool") == []
