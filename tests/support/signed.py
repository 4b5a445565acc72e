"""Signed config writes as a hostile insider handles them: captured on their way, sent again as they were, or with
their signature's base64 re-spelt; and the guard a store with `"config-writes": "signed"` runs."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from discovery.registry.trust import TrustPolicy, operator_key
from discovery.replicas import GroupKey
from discovery.store.write_policy import ConfigWriteGuard
from toolservice_base.schemas import ConfigRequest
from toolservice_base.signing import generate_key_pair, load_private_key, public_key_text, sign_config_request

Sign = Callable[[ConfigRequest], ConfigRequest]
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def operator(tmp_path: Path, name: str) -> Ed25519PrivateKey:
    """A new operator key pair under `tmp_path` (`<name>.key`, `<name>.key.pub`); its private key."""
    return load_private_key(generate_key_pair(tmp_path / f"{name}.key")[0])


def signer(key: Ed25519PrivateKey, topicspace: str) -> Sign:
    """What `toolreg config put --signing-key` does to each write: sign it for the topicspace it goes to."""
    return lambda request: sign_config_request(request, key, topicspace)


def capturing(sign: Sign, captured: list[ConfigRequest]) -> Sign:
    """`sign`, keeping each signed request as it went on the wire: what an insider reading the queue sees."""

    def sign_and_keep(request: ConfigRequest) -> ConfigRequest:
        signed = sign(request)
        captured.append(signed)
        return signed

    return sign_and_keep


def replaying(copy: ConfigRequest) -> Sign:
    """A `ConfigClient` `sign` that sends `copy` in place of any write: a captured request sent again, exactly (under a
    request id of the replaying client's own)."""
    return lambda _: copy


def padding_bits_changed(request: ConfigRequest) -> ConfigRequest:
    """`request` with its signature's last base64 digit re-spelt so that it decodes to the same bytes (the unused low
    bits of the digit before the `=` padding changed)."""
    assert request.signature is not None
    head, _, encoded = request.signature.rpartition(":")
    data = encoded.rstrip("=")
    unused = {1: 2, 2: 4}[len(encoded) - len(data)]  # bits of the last digit that carry nothing
    last = ALPHABET[ALPHABET.index(data[-1]) ^ ((1 << unused) - 1)]
    respelt = data[:-1] + last + encoded[len(data) :]
    assert respelt != encoded and base64.b64decode(respelt) == base64.b64decode(encoded)
    return request.model_copy(update={"signature": f"{head}:{respelt}"})


def guarded_policy(path: Path, operators: dict[str, Ed25519PrivateKey], *, pin: bool = False) -> Path:
    """A trust policy at `path` with `"config-writes": "signed"` and these operator keys (no announcing keys)."""
    policy = TrustPolicy(path=path, config_writes="signed", pin_definitions=pin)
    for name, key in operators.items():
        entry = operator_key({"name": name, "public-key": _public_text(key)}, name)
        policy.operators[entry.id] = entry
    return policy.save()


def guard_for(
    topicspace: str, operators: dict[str, Ed25519PrivateKey], key: GroupKey | None = None
) -> ConfigWriteGuard:
    """The guard a store of `topicspace` runs with these operators (`discovery.cli.registry.write_guard`)."""
    entries = [operator_key({"name": n, "public-key": _public_text(k)}, n) for n, k in operators.items()]
    return ConfigWriteGuard(
        {e.id: e.public_key for e in entries}, {e.id: e.name for e in entries}, topicspace, registry=key
    )


def _public_text(key: Ed25519PrivateKey) -> str:
    return public_key_text(key.public_key())
