"""The chain rules of the MCP fronts' audit records: a front signs and chains what it publishes, and a verifier reading
the topic in order tells its records from forged, unsigned, missing, replayed and late ones."""

from __future__ import annotations

import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from discovery.audit_chain import AuditChain, AuditVerifier, Gap
from discovery.mcp.auth import AuditTrail, Caller
from discovery.mcp.auth import audit as front_audit
from discovery.registry.callers import CallerBook
from toolservice_base import MemoryBroker, Settings, open_transport
from toolservice_base.schemas import AuditRecord
from toolservice_base.signing import key_id

KEY = Ed25519PrivateKey.generate()
KID = key_id(KEY.public_key())
TRUSTED = {KID: KEY.public_key()}


def call(subject: str = "agent-7", tool: str = "calculate", at: float | None = None) -> AuditRecord:
    return AuditRecord(
        at=time.time() if at is None else at,
        front="unsealed",
        workspace="default",
        subject=subject,
        tool=tool,
        outcome="ok",
        duration_ms=1.5,
    )


def published(chain: AuditChain, count: int) -> list[bytes]:
    """What the front puts on the topic for `count` calls."""
    return [chain.seal(call(tool=f"t{n}")).to_json().encode() for n in range(count)]


def verdicts(verifier: AuditVerifier, messages: list[bytes]) -> list[str]:
    return [verifier.check_bytes(m).verdict for m in messages]


def test_a_fronts_records_verify_and_a_restarted_front_starts_a_new_chain_that_verifies_too() -> None:
    before, after = AuditChain("front-a", KEY), AuditChain("front-b", KEY)  # the same front, restarted
    verifier = AuditVerifier(TRUSTED)
    assert verdicts(verifier, published(before, 3) + published(after, 2)) == ["good"] * 5
    assert verifier.gaps() == ([], []) and verifier.dropped == 0
    assert [c.last for c in verifier.chains.values()] == [3, 2]


def test_a_record_made_by_anyone_else_is_forged_or_unsigned_however_like_a_real_one_it_looks() -> None:
    real = AuditChain("front-a", KEY).seal(call())
    outsider = AuditChain("front-a", Ed25519PrivateKey.generate()).seal(call(subject="ceo@corp"))
    messages = [
        real.model_copy(update={"subject": "ceo@corp"}).to_json().encode(),  # the front's signature, another subject
        outsider.to_json().encode(),  # signed and chained, by a key no policy trusts
        AuditChain("front-a", None).seal(call(subject="ceo@corp")).to_json().encode(),  # a front without a key
        b"{not json",
    ]
    verifier = AuditVerifier(TRUSTED)
    checked = [verifier.check_bytes(m) for m in messages]
    assert [c.verdict for c in checked] == ["forged", "forged", "unsigned", "forged"]
    assert "does not match" in checked[0].reason and "no trusted front" in checked[1].reason
    assert verdicts(verifier, [real.to_json().encode()]) == ["good"]  # the genuine one still is


def test_a_record_missing_from_the_middle_of_a_chain_is_a_gap_and_the_records_after_it_still_verify() -> None:
    messages = published(AuditChain("front-a", KEY), 6)
    del messages[2:4]  # records 3 and 4 never reach the topic
    verifier = AuditVerifier(TRUSTED)
    assert verdicts(verifier, messages) == ["good"] * 4
    assert verifier.gaps() == ([Gap(KID, "front-a", 3, 4)], [])


def test_a_replayed_record_is_told_from_a_late_one_and_a_second_history_is_broken() -> None:
    chain = AuditChain("front-a", KEY)
    one, two, three = published(chain, 3)
    verifier = AuditVerifier(TRUSTED)
    assert verdicts(verifier, [one, three, one, two]) == ["good", "good", "replayed", "reordered"]
    assert verifier.gaps() == ([], [])  # the late record filled its gap
    chain.sequence = 2  # the key signs another record 3: only a leaked key or a broken front can
    assert verdicts(verifier, [chain.seal(call()).to_json().encode()]) == ["broken"]


def test_a_chain_that_began_before_the_oldest_record_kept_lost_its_start_to_retention_not_to_a_thief() -> None:
    old = AuditChain("front-a", KEY, started=time.time() - 3600)
    aged = published(old, 5)[3:]  # records 1-3 went with the topic's retention
    late = AuditChain("front-b", KEY)
    verifier = AuditVerifier(TRUSTED)
    assert verdicts(verifier, aged + published(late, 3)[1:]) == ["good"] * 4
    missing, trimmed = verifier.gaps()
    assert trimmed == [Gap(KID, "front-a", 1, 3)]
    assert missing == [Gap(KID, "front-b", 1, 1)]  # began after the oldest record kept: its first one is missing


def test_records_a_front_dropped_are_said_by_the_next_one_and_not_a_gap() -> None:
    chain = AuditChain("front-a", KEY)
    messages = [chain.seal(call()).to_json().encode(), chain.seal(call(), dropped=7).to_json().encode()]
    verifier = AuditVerifier(TRUSTED)
    assert verdicts(verifier, messages) == ["good", "good"]
    assert verifier.dropped == 7 and verifier.gaps() == ([], [])


async def test_a_front_whose_queue_overflowed_says_how_many_it_dropped_and_its_chain_has_no_gap(
    monkeypatch: pytest.MonkeyPatch, memory_broker: MemoryBroker
) -> None:
    """The front seals records as it sends them: the ones its full queue dropped never had a place in the chain."""
    monkeypatch.setattr(front_audit, "QUEUE", 10)
    trail = AuditTrail("default", key=KEY)
    async with await open_transport(Settings(pulsar_url=memory_broker.url)) as connection:
        async with trail.publishing(connection):
            for n in range(15):  # all at once, before the sender runs: the oldest 5 are dropped
                trail.record(Caller(f"agent-{n}"), "calculate", "ok", time.monotonic())
        reader = await connection.reader(connection.topics.mcp_audit, "earliest")
        messages = []
        while await reader.has_message_available():
            envelope = await reader.read_next(timeout=1)
            assert envelope is not None
            messages.append(envelope.data)
    verifier = AuditVerifier(TRUSTED)
    assert verdicts(verifier, messages) == ["good"] * 10
    assert verifier.dropped == 5 and verifier.gaps() == ([], [])
    assert AuditRecord.model_validate_json(messages[0]).subject == "agent-5"


def test_the_page_counts_only_a_trusted_fronts_records_once_each_and_the_rest_apart() -> None:
    book = CallerBook(fronts=TRUSTED)
    real = published(AuditChain("front-a", KEY), 2)
    forged = [AuditChain("front-x", None).seal(call(subject=f"ceo-{n}@corp")).to_json().encode() for n in range(50)]
    for message in [*real, *forged, real[0], b"x" * 100_000]:
        book.add_bytes(message)
    assert [(v.subject, v.calls) for v in book.views()] == [("agent-7", 2)]
    assert book.unverified == 52
    untrusting = CallerBook()  # no audit front in the policy: nothing is a caller
    for message in real:
        untrusting.add_bytes(message)
    assert untrusting.views() == [] and untrusting.unverified == 2
