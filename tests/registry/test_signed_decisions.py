"""Under `config-writes signed`, `toolreg approve` and `reject` are taken only when an operator signed them.

A held definition is decided on through the registry's query API, on a
queue every role that sends requests may send on (an agent's, too). Unsigned,
an insider could approve the change it wants served.
"""

from __future__ import annotations

import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.signed import guarded_policy, operator

from discovery.registry.decisions import SignedDecisions
from discovery.registry.protocol import RegistryRequest
from discovery.registry.trust import TrustPolicy
from toolservice_base.signing import DECISION_DOMAIN, sign_config_request

APPROVE = RegistryRequest(operation="approve", name="tell-joke", digest="3f2a9c1b4d5e")


def decisions(tmp_path: Path, *, signed: bool = True) -> tuple[SignedDecisions, Ed25519PrivateKey]:
    alice = operator(tmp_path, "alice")
    policy = TrustPolicy.load(guarded_policy(tmp_path / "trust.json", {"alice": alice}))
    policy.config_writes = "signed" if signed else "any"
    return SignedDecisions(policy, "tg"), alice


def test_an_unsigned_approve_or_reject_is_refused_and_an_operators_is_taken_once(tmp_path: Path) -> None:
    checks, alice = decisions(tmp_path)
    for operation in ("approve", "reject"):
        said = checks.refusal(APPROVE.model_copy(update={"operation": operation})) or ""
        assert "must be signed by an operator key" in said and "--signing-key" in said, said
    signed = sign_config_request(APPROVE, alice, "tg", domain=DECISION_DOMAIN)
    assert checks.refusal(signed) is None
    assert "a copy of a signed approve already taken" in (checks.refusal(signed) or "")
    assert checks.refusal(RegistryRequest(operation="pending")) is None, "reading is not deciding"


def test_a_decision_signed_for_another_topicspace_too_late_or_as_a_config_write_is_refused(tmp_path: Path) -> None:
    checks, alice = decisions(tmp_path)
    elsewhere = sign_config_request(APPROVE, alice, "other", domain=DECISION_DOMAIN)
    assert "signed for topicspace 'other'" in (checks.refusal(elsewhere) or "")
    late = sign_config_request(APPROVE, alice, "tg", now=time.time() - 75, domain=DECISION_DOMAIN)
    assert "expired" in (checks.refusal(late) or "")
    as_a_write = sign_config_request(APPROVE, alice, "tg")
    assert "does not match" in (checks.refusal(as_a_write) or ""), "a write's signature is not a decision's"
    altered = sign_config_request(APPROVE, alice, "tg", domain=DECISION_DOMAIN)
    assert "does not match" in (checks.refusal(altered.model_copy(update={"digest": "0000aaaa"})) or "")


def test_without_config_writes_signed_decisions_are_left_to_the_brokers_permissions(tmp_path: Path) -> None:
    checks, _ = decisions(tmp_path, signed=False)
    assert checks.refusal(APPROVE) is None
