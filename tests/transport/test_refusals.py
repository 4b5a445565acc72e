"""What the transport says when the broker refuses it, or is gone: the cause the broker gave, never a bare Timeout.

A refused token makes pulsar-client retry until its operation timeout and
say "Timeout"; the transport asks the broker itself (a handshake of its own)
and names the token. A broker that really is down is still called
unreachable, by a running consumer's watch as much as by a failed call.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import eventually

from discovery.broker import EmbeddedBroker
from toolservice_base import Settings, open_transport
from toolservice_base.errors import AuthenticationFailed, TokenExpired
from toolservice_base.transport import Envelope
from toolservice_base.transport.pulsar.diagnosis import handshake, token_refused

OPERATION_TIMEOUT = 2


async def ignore(message: Envelope) -> None:
    pass


@pytest.mark.apache_pulsar
@pytest.mark.timeout(420)  # the first Apache Pulsar test of a run also waits for the broker to start
@pytest.mark.parametrize("which", ["a token signed with another key", "no token"])
async def test_a_wrong_or_missing_token_is_named_as_refused_credentials(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, which: str
) -> None:
    """Was: "accepts connections but did not complete ...; it may be refusing the token, or be overloaded" (a retriable
    guess)."""
    key = tmp_path / "other.key"
    key.write_bytes(os.urandom(32))
    token = apache_pulsar.mint_token("admin", secret_key=key) if which != "no token" else None
    settings = Settings(
        data_dir=tmp_path / "data",
        pulsar_url=apache_pulsar.url,
        broker="apache-pulsar",
        topicspace=tenant,
        auth_token=token,
        operation_timeout=OPERATION_TIMEOUT,
    )
    async with await open_transport(settings) as transport:
        started = time.monotonic()
        with pytest.raises(AuthenticationFailed) as refused:
            await transport.subscribe(transport.topics.tool_descriptors, ignore)
        took = time.monotonic() - started
    line = str(refused.value)
    assert type(refused.value) is AuthenticationFailed and not refused.value.retriable
    if token:
        assert (
            f"the broker at {apache_pulsar.url} refused the token in PULSAR_AUTH_TOKEN" in line
            and "(role admin;" in line
        )
    else:
        assert f"the broker at {apache_pulsar.url} refused the token in PULSAR_AUTH_TOKEN" in line
        assert "(none set, so no role;" in line
    assert "set PULSAR_AUTH_TOKEN or PULSAR_AUTH_TOKEN_FILE to a token of the role" in line
    assert "cannot reach" not in line and "overloaded" not in line and "\n" not in line
    assert took < OPERATION_TIMEOUT + 3, (
        f"the broker's verdict takes milliseconds once pulsar-client gives up; took {took:.1f}s"
    )


@pytest.mark.apache_pulsar
@pytest.mark.timeout(420)
async def test_the_handshake_hears_the_brokers_verdict_on_a_token(
    apache_pulsar: ApachePulsar, broker: EmbeddedBroker
) -> None:
    accepted = await handshake(apache_pulsar.url, apache_pulsar.token)
    assert accepted.accepted is True
    expired = await handshake(apache_pulsar.url, apache_pulsar.mint_token("admin", expires_in=-5))
    assert expired.accepted is False and expired.said.startswith("AuthenticationError"), expired
    assert (await handshake(apache_pulsar.url, None)).accepted is False
    assert (await handshake(broker.url, "not even a token")).accepted is True, "pulsar-lite takes any token"


def test_a_refused_token_is_told_from_an_expired_one_by_its_own_claims() -> None:
    good_once = _jwt({"sub": "svc", "exp": 1_700_000_000})
    expired = token_refused("pulsar://b:6650", good_once, "AuthenticationError: Failed to authenticate")
    assert isinstance(expired, TokenExpired) and expired.expired_at == 1_700_000_000
    assert str(expired).startswith("the token expired at 2023-11-14T22:13:20Z (role svc)")
    forged = token_refused("pulsar://b:6650", _jwt({"sub": "svc", "exp": time.time() + 3600}), "AuthenticationError: x")
    assert type(forged) is AuthenticationFailed and "refused the token in PULSAR_AUTH_TOKEN (role svc;" in str(forged)


async def test_a_broker_that_is_gone_is_still_called_unreachable_by_a_running_consumer(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", pulsar_url=broker.url, broker="pulsar-lite", operation_timeout=OPERATION_TIMEOUT
    )
    async with await open_transport(settings) as transport:
        topic = transport.topics.tool_descriptors
        await transport.subscribe(topic, ignore)
        assert transport.problem(topic) is None
        broker.kill()
        reason = await eventually(lambda: transport.problem(topic), timeout=10)
        assert reason.startswith(f"cannot reach the broker at {broker.url}"), reason
        broker.restart()
        await eventually(lambda: transport.problem(topic) is None, timeout=20)


def _jwt(claims: dict[str, object]) -> str:
    """A token with these claims and a signature nobody checks here."""

    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'HS256'})}.{part(claims)}.c2ln"
