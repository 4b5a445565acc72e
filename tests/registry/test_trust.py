"""Signed announcements and the trust policy (pure: no broker needed)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from discovery.registry.trust import PolicyError, TrustPolicy, trusted_key
from toolservice_base.declaration import build_descriptors
from toolservice_base.schemas import Announcement, descriptor_digest
from toolservice_base.signing import (
    Ed25519PrivateKey,
    SigningError,
    generate_key_pair,
    load_private_key,
    public_key_text,
    sign,
    verify,
)


def announce(service_id: str = "joke-service", tool: str = "tell-joke", sequence: int = 1) -> Announcement:
    service, tools = build_descriptors({"id": service_id}, [{"name": tool, "description": "d"}])
    return Announcement(
        kind="announce",
        instance=f"{service_id}-1",
        sequence=sequence,
        sent_at=time.time(),
        digest=descriptor_digest(service, tools),
        service=service,
        tools=tools,
    )


def policy_for(key: Ed25519PrivateKey, services: list[str], tools: list[str]) -> TrustPolicy:
    policy = TrustPolicy()
    policy.add(trusted_key("team", public_key_text(key.public_key()), services, tools))
    return policy


def test_a_signature_covers_every_field() -> None:
    key = Ed25519PrivateKey.generate()
    signed = sign(announce(), key)
    assert verify(signed, key.public_key())
    for change in ({"sequence": 2}, {"ttl": 99.0}, {"sent_at": signed.sent_at + 1}, {"workspace": "other"}):
        assert not verify(signed.model_copy(update=change), key.public_key())


def test_a_signature_survives_the_wire() -> None:
    key = Ed25519PrivateKey.generate()
    signed = sign(announce(), key)
    received = Announcement.model_validate_json(signed.to_json())
    assert verify(received, key.public_key())


def test_policy_accepts_a_trusted_key_within_its_scope() -> None:
    key = Ed25519PrivateKey.generate()
    policy = policy_for(key, ["joke-*"], ["tell-*"])
    assert policy.check(sign(announce(), key), "joke-service", ["tell-joke"]) is None


@pytest.mark.parametrize(
    ("signer", "service", "tool", "reason"),
    [
        (None, "joke-service", "tell-joke", "unsigned"),
        ("rogue", "joke-service", "tell-joke", "unknown key"),
        ("team", "calculator", "tell-joke", "may not announce service 'calculator'"),
        ("team", "joke-service", "calculate", "may not announce tool 'calculate'"),
    ],
)
def test_policy_refuses_unsigned_unknown_and_out_of_scope(
    signer: str | None, service: str, tool: str, reason: str
) -> None:
    team, rogue = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    policy = policy_for(team, ["joke-*"], ["tell-*"])
    message = announce(service, tool)
    if signer:
        message = sign(message, team if signer == "team" else rogue)
    verdict = policy.check(message, service, [tool])
    assert verdict is not None and reason in verdict


def test_a_forged_signature_with_a_trusted_key_id_is_refused() -> None:
    team, rogue = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    policy = policy_for(team, ["*"], ["*"])
    forged = sign(announce(), rogue)
    team_id = next(iter(policy.keys))
    forged = forged.model_copy(update={"signature": team_id + ":" + (forged.signature or "").split(":", 1)[1]})
    assert "bad signature" in (policy.check(forged, "joke-service", ["tell-joke"]) or "")


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path: Path) -> None:
    private, public = generate_key_pair(tmp_path / "svc.key")
    assert private.stat().st_mode & 0o777 == 0o600
    key = load_private_key(private)
    assert public.read_text().strip() == public_key_text(key.public_key())
    with pytest.raises(SigningError, match="exists"):
        generate_key_pair(tmp_path / "svc.key")


def test_policy_file_round_trips_and_bad_entries_are_named(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    path = policy_for(key, ["joke-*"], ["tell-*", "pun-*"]).save(tmp_path / "trust.json")
    loaded = TrustPolicy.load(path)
    assert [(k.name, k.services, k.tools) for k in loaded.keys.values()] == [("team", ("joke-*",), ("tell-*", "pun-*"))]
    (tmp_path / "bad.json").write_text(
        json.dumps({"keys": [{"name": "x", "public-key": "nope", "services": ["*"], "tools": ["*"]}]})
    )
    with pytest.raises(PolicyError, match="entry 1"):
        TrustPolicy.load(tmp_path / "bad.json")
    with pytest.raises(PolicyError, match="toolreg trust add"):
        TrustPolicy.load(tmp_path / "missing.json")
