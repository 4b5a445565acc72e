"""Judging announcements, bounded rejection memory, probe rate limits, options (pure, no broker)."""

from __future__ import annotations

import json
import time

import pytest
from support.registry import announcement

from discovery.registry.protocol import Rejection
from discovery.registry.service import ProbeLimiter, RegistryOptions
from discovery.registry.validation import AnnouncementValidator, Rejected, RejectionLog
from toolservice_base.schemas import MAX_MESSAGE_BYTES


def raw(**kwargs: object) -> bytes:
    return announcement(**kwargs).to_json().encode()  # type: ignore[arg-type]


def test_a_valid_announce_passes_and_is_parsed() -> None:
    checked = AnnouncementValidator().check(raw(service_id="joke", tools=("tell-joke",)), time.time())
    assert checked.kind == "announce" and checked.service is not None and checked.service.id == "joke"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff\xfe garbage", "not a valid announcement"),
        (b"[1, 2, 3]", "not a valid announcement"),
        (b'{"kind": "announce"}', "instance"),
        (b'{"kind": "explode", "instance": "i", "sequence": 1, "sent-at": 1, "digest": "' + b"0" * 64 + b'"}', "kind"),
        (
            b'{"kind": "heartbeat", "instance": "bad name!", "sequence": 1, "sent-at": 1, "digest": "'
            + b"0" * 64
            + b'"}',
            "instance",
        ),
        (
            b'{"kind": "heartbeat", "instance": "i", "sequence": 1, "sent-at": Infinity, "digest": "'
            + b"0" * 64
            + b'"}',
            "sent-at",
        ),
        (
            b'{"kind": "heartbeat", "instance": "i", "sequence": -1, "sent-at": 1, "digest": "' + b"0" * 64 + b'"}',
            "sequence",
        ),
        (b"[" * 100_000 + b"]" * 100_000, None),  # too large *and* too deep
    ],
)
def test_malformed_messages_are_rejected_with_a_reason(data: bytes, reason: str | None) -> None:
    with pytest.raises(Rejected) as caught:
        AnnouncementValidator().check(data, time.time())
    assert "\n" not in caught.value.reason
    if reason:
        assert reason in caught.value.reason


def test_a_message_over_64_kib_is_rejected_before_parsing() -> None:
    body = json.loads(raw(service_id="big"))
    body["version"] = "x" * (MAX_MESSAGE_BYTES + 10)
    data = json.dumps(body).encode()
    with pytest.raises(Rejected, match=f"the limit is {MAX_MESSAGE_BYTES}") as caught:
        AnnouncementValidator().check(data, time.time())
    assert caught.value.instance == "big-1"


def test_a_digest_that_does_not_match_is_rejected() -> None:
    body = json.loads(raw(service_id="joke"))
    body["tools"][0]["description"] = "changed after the digest was taken"
    with pytest.raises(Rejected, match="digest"):
        AnnouncementValidator().check(json.dumps(body).encode(), time.time())


def test_a_bad_tool_name_is_rejected_naming_the_field() -> None:
    body = json.loads(raw(service_id="joke"))
    body["tools"][0]["name"] = "no spaces allowed"
    with pytest.raises(Rejected, match="tools.0.name") as caught:
        AnnouncementValidator().check(json.dumps(body).encode(), time.time())
    assert caught.value.service == "joke" and caught.value.instance == "joke-1"


def test_queues_outside_the_allowed_namespaces_are_rejected() -> None:
    data = raw(service_id="sneaky", namespace="public")
    with pytest.raises(Rejected, match="outside the allowed namespaces"):
        AnnouncementValidator().check(data, time.time())
    assert AnnouncementValidator(["public/request", "public/response"]).check(data, time.time()).service is not None


def test_a_stale_message_is_rejected() -> None:
    now = time.time()
    with pytest.raises(Rejected, match="stale"):
        AnnouncementValidator().check(raw(ttl=2.0, sent_at=now - 2.5), now)
    assert AnnouncementValidator().check(raw(ttl=2.0, sent_at=now - 1.5), now).kind == "announce"


def test_sequence_must_increase_per_instance() -> None:
    validator = AnnouncementValidator()
    now = time.time()
    validator.check(raw(sequence=5), now)
    for replay in (5, 4):
        with pytest.raises(Rejected, match="not after 5"):
            validator.check(raw(sequence=replay), now)
    assert validator.check(raw(sequence=6, kind="heartbeat"), now).sequence == 6
    assert validator.check(raw(sequence=1, instance="other-instance"), now).sequence == 1


def test_a_refused_message_does_not_advance_the_sequence() -> None:
    validator = AnnouncementValidator()
    now = time.time()
    validator.check(raw(sequence=1), now)
    with pytest.raises(Rejected):
        validator.check(raw(sequence=9, ttl=1.0, sent_at=now - 5), now)
    assert validator.check(raw(sequence=2), now).sequence == 2


def test_sequence_memory_is_bounded() -> None:
    validator = AnnouncementValidator(memory=10)
    now = time.time()
    for number in range(50):
        validator.check(raw(instance=f"i{number}", kind="heartbeat"), now)
    assert len(validator._last_sequence) == 10


def test_rejection_log_keeps_the_most_recent() -> None:
    log = RejectionLog(limit=3)
    for number in range(10):
        log.add(Rejection(at=number, reason=f"r{number}"))
    assert [r.reason for r in log.items()] == ["r7", "r8", "r9"] and log.total == 10


def test_repeated_rejections_of_one_sender_are_one_entry_with_count_first_and_last() -> None:
    """A refused service heartbeating every few seconds must not push every other entry out."""
    log = RejectionLog(limit=3)
    assert log.add(Rejection(at=1.0, reason="rogue", instance="other-1"))
    for second in range(2, 1000):
        new = log.add(
            Rejection(
                at=float(second), reason=f"stale: sent {30 + second % 7}.5s ago", instance="chatty-1", service="chatty"
            )
        )
        assert new is (second == 2)
    entries = {r.instance: r for r in log.items()}
    assert sorted(entries) == ["chatty-1", "other-1"] and log.total == 999
    chatty = entries["chatty-1"]
    assert (chatty.count, chatty.first, chatty.at, chatty.reason) == (998, 2.0, 999.0, "stale: sent 35.5s ago")
    assert log.add(
        Rejection(at=1000.0, reason="not trusted: unsigned announcement", instance="chatty-1")
    )  # another reason: its own entry
    # a heartbeat names no service: still the same sender as its announce, and the service is kept
    assert not log.add(
        Rejection(at=1001.0, reason="not trusted: unsigned announcement", instance="chatty-1", service="chatty")
    )
    assert not log.add(Rejection(at=1002.0, reason="not trusted: unsigned announcement", instance="chatty-1"))
    last = log.items()[-1]
    assert (last.count, last.service, last.first, last.at) == (3, "chatty", 1000.0, 1002.0)


def test_rejections_in_different_workspaces_are_never_one_entry() -> None:
    """`toolreg rejections --workspace` shows each workspace its own rows, counts and times."""
    log = RejectionLog()
    for workspace in ("default", "research", "default"):
        log.add(
            Rejection(at=1.0, reason="conflict: tool 'search' is held by static", service="search", workspace=workspace)
        )
    assert sorted((r.workspace, r.count) for r in log.items()) == [("default", 2), ("research", 1)]


def test_probes_are_spaced_per_instance_and_capped_overall() -> None:
    limiter = ProbeLimiter(interval=1.0, per_second=3)
    assert limiter.allow("a", 100.0) and not limiter.allow("a", 100.5) and limiter.allow("a", 101.0)
    assert limiter.allow("b", 101.0) and limiter.allow("c", 101.0)
    assert not limiter.allow("d", 101.0)  # bucket empty
    assert limiter.allow("d", 101.4)  # refilled
    assert limiter.allow(None, 103.0)
    assert not limiter.allow("e", 103.5)  # a broadcast probe just asked everyone


@pytest.mark.parametrize(
    "bad",
    [
        {"sweep_interval": 2.0},
        {"sweep_interval": 0},
        {"self_preservation_share": 0},
        {"self_preservation_min": 0},
    ],
)
def test_options_outside_their_range_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RegistryOptions(**bad)  # type: ignore[arg-type]
