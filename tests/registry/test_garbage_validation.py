"""Bad input against the pure checks (no broker): every wire limit at and just past its edge,
the skew window, and hypothesis feeding the announcement validator and the request parsers."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from support.garbage import json_values, mutated, random_bytes, random_json
from support.registry import announcement

from discovery.registry.protocol import RegistryRequest
from discovery.registry.service import RegistryOptions
from discovery.registry.validation import DEFAULT_MAX_SKEW, AnnouncementValidator, Rejected
from discovery.store.service import ConfigRequest
from toolservice_base.schemas import (
    MAX_ARGUMENTS,
    MAX_CONFIG_VALUE_BYTES,
    MAX_DESCRIPTION,
    MAX_MESSAGE_BYTES,
    MAX_REQUEST_BYTES,
    MAX_TOOLS_PER_SERVICE,
    Announcement,
    descriptor_digest,
)
from toolservice_base.service import BadRequest, _parse_request

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALID = [
    announcement("svc", ("a", "b")).to_wire(),
    announcement("svc", kind="heartbeat", sequence=2).to_wire(),
    announcement("svc", kind="withdraw", sequence=3).to_wire(),
]


def document(service: dict[str, Any] | None = None, tools: list[dict[str, Any]] | None = None, **fields: Any) -> bytes:
    """An announce built from raw descriptor dicts, with a correct digest, so only the limit under test fails."""
    from toolservice_base.schemas import ToolDescriptor, ToolServiceDescriptor

    service = service or {
        "id": "svc",
        "request-queue": "non-persistent://tg/request/svc",
        "response-queue": "non-persistent://tg/response/svc",
    }
    tools = (
        tools
        if tools is not None
        else [{"type": "tool-service", "name": "t", "description": "d", "service": service["id"]}]
    )
    try:
        digest = descriptor_digest(
            ToolServiceDescriptor.model_validate(service), [ToolDescriptor.model_validate(t) for t in tools]
        )
    except ValidationError:
        digest = "0" * 64  # the descriptor itself is what must fail
    body = {
        "kind": "announce",
        "instance": "svc-1",
        "sequence": 1,
        "sent-at": time.time(),
        "ttl": 15,
        "digest": digest,
        "service": service,
        "tools": tools,
        **fields,
    }
    return json.dumps(body).encode()


def verdict(data: bytes, validator: AnnouncementValidator | None = None) -> Announcement | Rejected:
    try:
        return (validator or AnnouncementValidator()).check(data, time.time())
    except Rejected as exc:
        return exc


def assert_refused(data: bytes, phrase: str, validator: AnnouncementValidator | None = None) -> None:
    result = verdict(data, validator)
    assert isinstance(result, Rejected), f"accepted: {data[:200]!r}"
    assert phrase in result.reason, result.reason
    assert result.reason and "\n" not in result.reason


def assert_accepted(data: bytes, validator: AnnouncementValidator | None = None) -> None:
    result = verdict(data, validator)
    assert isinstance(result, Announcement), getattr(result, "reason", result)


# --- hypothesis: the validator never raises anything but a reasoned `Rejected` ---


def _judged(data: bytes) -> None:
    result = verdict(data)
    if isinstance(result, Rejected):
        assert result.reason.strip() and "\n" not in result.reason and len(result.reason) < 2000
    else:
        assert isinstance(result, Announcement)


@PROPERTY
@given(random_bytes)
def test_random_bytes_are_refused_with_a_one_line_reason(data: bytes) -> None:
    result = verdict(data)
    assert isinstance(result, Rejected) and result.reason and "\n" not in result.reason


@PROPERTY
@given(random_json)
def test_random_json_is_refused_with_a_one_line_reason(data: bytes) -> None:
    result = verdict(data)
    assert isinstance(result, Rejected) and result.reason and "\n" not in result.reason


@PROPERTY
@given(mutated(VALID))
def test_a_mutated_valid_message_is_judged_never_crashes(data: bytes) -> None:
    _judged(data)


@PROPERTY
@given(
    st.sampled_from(VALID),
    st.sampled_from(["kind", "instance", "sequence", "sent-at", "ttl", "digest", "workspace"]),
    json_values,
)
def test_a_mutated_field_that_no_longer_parses_is_refused_naming_it(
    valid: dict[str, Any], field: str, value: Any
) -> None:
    body = {**valid, field: value}
    try:
        Announcement.model_validate(body)
    except ValidationError:
        assert_refused(json.dumps(body).encode(), "not a valid announcement")
    else:
        _judged(json.dumps(body).encode())


@PROPERTY
@given(st.one_of(random_bytes, random_json, mutated([{"user": "u", "config": "{}", "arguments": '{"text": "hi"}'}])))
def test_a_tool_service_request_parses_or_is_a_bad_request(data: bytes) -> None:
    try:
        user, config, arguments = _parse_request(data)
    except BadRequest as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert isinstance(config, dict) and isinstance(arguments, dict) and isinstance(user, str)


def test_a_tool_service_request_too_large_or_too_deep_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match=f"the limit is {MAX_REQUEST_BYTES}"):
        _parse_request(b" " * (MAX_REQUEST_BYTES + 1))
    deep = json.dumps({"arguments": "[" * 100_000 + "]" * 100_000}).encode()
    with pytest.raises(BadRequest, match="nested too deeply"):
        _parse_request(deep)


@PROPERTY
@given(st.one_of(random_bytes, random_json))
def test_registry_and_config_requests_parse_or_raise_a_validation_error(data: bytes) -> None:
    for model in (RegistryRequest, ConfigRequest):
        try:
            model.model_validate_json(data)
        except ValidationError:
            pass


# --- limits: at the edge accepted, one past refused -------------------------

QUEUE = "non-persistent://tg/request/svc"


@pytest.mark.parametrize(
    ("field", "at_limit", "past_limit"),
    [
        ("instance", "i" * 128, "i" * 129),
        ("workspace", "w" * 128, "w" * 129),
        ("version", "v" * 64, "v" * 65),
    ],
)
def test_announcement_fields_at_and_past_their_limit(field: str, at_limit: str, past_limit: str) -> None:
    assert_accepted(document(**{field: at_limit}))
    assert_refused(document(**{field: past_limit}), field)


def test_names_are_128_safe_characters_at_most() -> None:
    for name, ok in [
        ("a" * 128, True),
        ("a" * 129, False),
        ("", False),
        ("tell joke", False),
        ("tell/joke", False),
        ("é", False),
        ("A.b_c-9", True),
    ]:
        tool = [{"type": "tool-service", "name": name, "description": "d", "service": "svc"}]
        (assert_accepted if ok else lambda d: assert_refused(d, "tools.0.name"))(document(tools=tool))
        service = {"id": name, "request-queue": QUEUE, "response-queue": QUEUE.replace("request", "response")}
        tool = [{"type": "tool-service", "name": "t", "description": "d", "service": name}]
        (assert_accepted if ok else lambda d: assert_refused(d, "service.id"))(document(service=service, tools=tool))


@pytest.mark.parametrize(
    ("queue", "phrase"),
    [
        ("persistent://tg/request/" + "q" * 200, None),
        ("non-persistent://tg/request/" + "q" * 200, None),
        ("non-persistent://tg/request/" + "q" * 201, "request-queue"),
        ("non-persistent://" + "t" * 129 + "/request/q", "request-queue"),
        ("non-persistent://tg/" + "n" * 129 + "/q", "request-queue"),
        ("http://tg/request/q", "request-queue"),
        ("non-persistent://tg/request", "request-queue"),
        ("non-persistent://tg/request/q/extra", "request-queue"),
        ("non-persistent://tg/discovery/q", "outside the allowed namespaces"),
        ("non-persistent://public/default/q", "outside the allowed namespaces"),
    ],
)
def test_request_queues_at_and_past_their_limits(queue: str, phrase: str | None) -> None:
    service = {"id": "svc", "request-queue": queue, "response-queue": "non-persistent://tg/response/svc"}
    if phrase is None:
        assert_accepted(document(service=service))
    else:
        assert_refused(document(service=service), phrase)


def test_the_allowed_namespaces_are_configurable_and_checked() -> None:
    service = {
        "id": "svc",
        "request-queue": "persistent://acme/tools-in/svc",
        "response-queue": "persistent://acme/tools-out/svc",
    }
    assert_refused(document(service=service), "outside the allowed namespaces")
    assert_accepted(document(service=service), AnnouncementValidator(["acme/tools-in", "acme/tools-out"]))
    assert_refused(
        document(), "outside the allowed namespaces", AnnouncementValidator(["acme/tools-in", "acme/tools-out"])
    )
    assert RegistryOptions(allowed_namespaces=("acme/tools-in",)).allowed_namespaces == ("acme/tools-in",)
    for bad in ("tg", "tg/request/x", "tg/re quest", "", "t" * 129 + "/x"):
        with pytest.raises(ValueError, match="tenant/namespace"):
            RegistryOptions(allowed_namespaces=(bad,))
    with pytest.raises(ValueError, match="at least one"):
        RegistryOptions(allowed_namespaces=())


def test_descriptions_arguments_tools_and_config_values_at_and_past_their_limits() -> None:
    def tool(name: str = "t", description: str = "d", arguments: int = 0, **extra: Any) -> dict[str, Any]:
        args = [{"name": f"a{i}", "type": "string", "description": "x"} for i in range(arguments)]
        return {
            "type": "tool-service",
            "name": name,
            "description": description,
            "service": "svc",
            "arguments": args,
            **extra,
        }

    assert_accepted(document(tools=[tool(description="d" * MAX_DESCRIPTION)]))
    assert_refused(document(tools=[tool(description="d" * (MAX_DESCRIPTION + 1))]), "tools.0.description")
    assert_accepted(document(tools=[tool(arguments=MAX_ARGUMENTS)]))
    assert_refused(document(tools=[tool(arguments=MAX_ARGUMENTS + 1)]), "tools.0.arguments")
    assert_accepted(document(tools=[tool(name=f"t{i}") for i in range(MAX_TOOLS_PER_SERVICE)]))
    assert_refused(document(tools=[tool(name=f"t{i}") for i in range(MAX_TOOLS_PER_SERVICE + 1)]), "tools")
    service = {"id": "svc", "request-queue": QUEUE, "response-queue": QUEUE, "config-params": [{"name": "style"}]}
    at_limit = "s" * (MAX_CONFIG_VALUE_BYTES - 2)  # the JSON string's two quotes count
    assert_accepted(document(service=service, tools=[tool(style=at_limit)]))
    assert_refused(document(service=service, tools=[tool(style=at_limit + "s")]), "larger than")


@pytest.mark.parametrize("kind", ["string", "number", "integer", "boolean", "object", "array"])
def test_every_allowed_argument_type_passes(kind: str) -> None:
    assert_accepted(
        document(
            tools=[
                {
                    "type": "tool-service",
                    "name": "t",
                    "description": "d",
                    "service": "svc",
                    "arguments": [{"name": "x", "type": kind, "description": "d"}],
                }
            ]
        )
    )


@pytest.mark.parametrize("kind", ["date", "String", "", "null", "any"])
def test_any_other_argument_type_is_refused(kind: str) -> None:
    assert_refused(
        document(
            tools=[
                {
                    "type": "tool-service",
                    "name": "t",
                    "description": "d",
                    "service": "svc",
                    "arguments": [{"name": "x", "type": kind, "description": "d"}],
                }
            ]
        ),
        "type",
    )


def test_a_message_of_exactly_64_kib_is_read_and_one_byte_more_is_refused_unparsed() -> None:
    body = document()
    padded = body + b" " * (MAX_MESSAGE_BYTES - len(body))
    assert len(padded) == MAX_MESSAGE_BYTES
    assert_accepted(padded)
    assert_refused(padded + b" ", f"{MAX_MESSAGE_BYTES + 1} bytes; the limit is {MAX_MESSAGE_BYTES}")
    huge = b'{"instance": "big-1", "x": "' + b"x" * (4 * 1024 * 1024) + b'"}'
    refused = verdict(huge)
    assert isinstance(refused, Rejected) and refused.instance == "big-1" and "the limit is" in refused.reason


# --- the skew window -------------------------------------------------------


def test_sent_at_in_the_future_beyond_the_skew_is_refused() -> None:
    now = time.time()
    validator = AnnouncementValidator(max_skew=10)
    assert validator.check(announcement(sent_at=now + 9, sequence=1).to_json().encode(), now).sequence == 1
    with pytest.raises(Rejected, match="ahead of the registry's clock, more than the allowed skew of 10s"):
        validator.check(announcement(sent_at=now + 11, sequence=2).to_json().encode(), now)
    # far future: a message that would stay "fresh" for years
    with pytest.raises(Rejected, match="ahead"):
        validator.check(announcement(sent_at=now + 10**9, sequence=3).to_json().encode(), now)


def test_the_past_window_is_the_shorter_of_ttl_and_skew() -> None:
    now = time.time()
    long_ttl = AnnouncementValidator(max_skew=DEFAULT_MAX_SKEW)
    assert long_ttl.check(announcement(ttl=3600, sent_at=now - DEFAULT_MAX_SKEW + 1).to_json().encode(), now)
    with pytest.raises(Rejected, match=f"the allowed skew of {DEFAULT_MAX_SKEW:g}s"):
        long_ttl.check(announcement(ttl=3600, sent_at=now - DEFAULT_MAX_SKEW - 1, sequence=2).to_json().encode(), now)
    with pytest.raises(Rejected, match="its ttl of 2s"):
        AnnouncementValidator().check(announcement(ttl=2, sent_at=now - 3).to_json().encode(), now)
    with pytest.raises(ValueError):
        AnnouncementValidator(max_skew=0)


def test_a_replay_after_the_registry_forgot_the_instance_is_refused_by_time() -> None:
    """A registry restart empties the sequence memory; the skew window still stops an old recording."""
    sent = time.time()
    recorded = announcement(ttl=15, sent_at=sent).to_json().encode()
    assert AnnouncementValidator().check(recorded, sent)
    with pytest.raises(Rejected, match="not after"):
        validator = AnnouncementValidator()
        validator.check(recorded, sent)
        validator.check(recorded, sent + 1)
    with pytest.raises(Rejected, match="stale"):
        AnnouncementValidator().check(recorded, sent + 16)  # a fresh validator: the memory is gone, the clock is not


def test_registry_options_refuse_a_bad_skew_or_caps() -> None:
    for bad in (
        {"max_clock_skew": 0},
        {"max_instances": 0},
        {"max_instances_per_service": 0},
        {"max_instances": 10, "max_instances_per_service": 11},
    ):
        with pytest.raises(ValueError):
            RegistryOptions(**bad)  # type: ignore[arg-type]
