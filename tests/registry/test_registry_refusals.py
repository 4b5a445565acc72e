"""A registry the broker stops letting in says why, in its log and its readiness, and keeps trying.

On Apache Pulsar (token authentication and authorization on) three things
close a running registry's consumers and producers while the broker itself
stays up: its role's permission is revoked, its token expires, or its
namespace is deleted. pulsar-client then retries in silence and a send ends
in "Timeout"; these tests hold that each is named for what it is, with the
fix, that `readiness()` turns not-ready with that reason, and that a grant
heals a running registry without a restart.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from apache_pulsar import ApachePulsar
from support import eventually
from support.registry import FAST

from discovery.registry.service import Registry
from discovery.store.service import ConfigStoreService
from toolservice_base import Settings, Transport, open_transport
from toolservice_base.errors import NamespaceMissing, NotAuthorized, TokenExpired, TransportError

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(420)]  # the first test also waits for the broker to start

ROLE_NAMESPACES = ("request", "response", "notify", "discovery")
"""What a registry's role needs (the store, on the superuser's token, keeps `state` to itself)."""
NAMED = 15.0
"""Seconds for a refusal to show in readiness: the watch asks once a handle has been down for a second (measured: 1-2
s)."""
EXPIRES_IN = 8
"""Seconds a short-lived token lives: enough for the registry to start on a loaded machine, then it expires while
running."""


@dataclass
class Running:
    """A registry running on `role`'s token, its store on the superuser's, and what the test needs to poke them."""

    registry: Registry
    transport: Transport
    tenant: str
    role: str

    @property
    def intake(self) -> str:
        return f"{self.tenant}/discovery"


async def run_registry(
    apache: ApachePulsar,
    tenant: str,
    data_dir: Path,
    stack: AsyncExitStack,
    *,
    token: str | None = None,
    role: str | None = None,
) -> Running:
    """Start a store (superuser) and a registry on `token` (default: a fresh role with produce and consume granted)."""
    if token is None:
        role = role or f"registry-{uuid.uuid4().hex[:6]}"
        for namespace in ROLE_NAMESPACES:
            apache.grant(f"{tenant}/{namespace}", role)
        token = apache.mint_token(role)
    admin = await open_transport(
        Settings(
            data_dir=data_dir, pulsar_url=apache.url, broker="apache-pulsar", topicspace=tenant, auth_token=apache.token
        )
    )
    stack.push_async_callback(admin.close)
    store = ConfigStoreService.in_data_dir(admin, data_dir)
    await store.start()
    stack.push_async_callback(store.stop)
    mine = await open_transport(
        Settings(
            data_dir=data_dir,
            pulsar_url=apache.url,
            broker="apache-pulsar",
            topicspace=tenant,
            auth_token=token,
            operation_timeout=5,
        )
    )
    stack.push_async_callback(mine.close)
    registry = Registry(mine, options=FAST)
    await registry.start()
    stack.push_async_callback(registry.stop)
    return Running(registry, mine, tenant, role or "admin")


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as opened:
        yield opened


def not_ready(registry: Registry, *needles: str) -> Callable[[], str | None]:
    """A check for `eventually`: the readiness line, once it holds every needle."""

    def check() -> str | None:
        reason = registry.readiness()
        return reason if reason is not None and all(needle in reason for needle in needles) else None

    return check


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == name]


def assert_not_misnamed(line: str) -> None:
    """The broker answered: the line must not blame the network, nor (for a permission or a namespace) the token."""
    assert "cannot reach" not in line and "Timeout" not in line and "\n" not in line, line


@pytest.mark.parametrize("revoked", ["every permission", "consume only"])
async def test_a_revoked_permission_is_named_with_the_grant_and_the_registry_recovers_when_granted(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, stack: AsyncExitStack, revoked: str
) -> None:
    """Consume alone revoked is what left /readyz ready before: the probes still went out, announcements no longer came
    in."""
    running = await run_registry(apache_pulsar, tenant, tmp_path / "data", stack)
    registry, intake = running.registry, running.intake
    publisher = await running.transport.publisher(running.transport.topics.tool_descriptors)
    assert registry.readiness() is None

    with structlog.testing.capture_logs() as logs:
        if revoked == "every permission":
            apache_pulsar.revoke(intake, running.role)
        else:
            apache_pulsar.grant(intake, running.role, ["produce"])
        reason = await eventually(
            not_ready(registry, "hear announcements", f"not authorized on {intake} for role {running.role}"),
            timeout=NAMED,
            explain=registry.readiness,
        )
        assert (
            f"pulsar-admin namespaces grant-permission {intake} --role {running.role} --actions produce,consume"
            in reason
        )
        assert_not_misnamed(reason)
        assert "credentials" not in reason and "PULSAR_AUTH_TOKEN" not in reason
        descriptors = running.transport.topics.tool_descriptors
        failed = await eventually(
            lambda: [e for e in events(logs, "registry.intake_failed") if e["topic"] == descriptors], timeout=3
        )
        assert failed[0]["cannot"] == "hear announcements" and failed[0]["reason"] == reason.split(": ", 1)[1]

        if revoked == "every permission":  # a running producer fails at once, for the same reason, instead of a Timeout
            started = time.monotonic()
            with pytest.raises(NotAuthorized) as refused:
                await publisher.send(b"{}")
            assert time.monotonic() - started < 1.0
            assert (
                refused.value.namespace == intake and refused.value.role == running.role and not refused.value.retriable
            )

        apache_pulsar.grant(intake, running.role)  # the consumer reconnects on its own: no restart
        await eventually(lambda: registry.readiness() is None, timeout=30, explain=registry.readiness)
        await eventually(lambda: events(logs, "registry.intake_restored"), timeout=3)
    await eventually(lambda: running.transport.problem(descriptors) is None, timeout=30)  # our own producer is back too
    await publisher.send(b"{}")


async def test_a_token_that_expires_while_running_is_named_with_its_time(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, stack: AsyncExitStack
) -> None:
    role = f"registry-{uuid.uuid4().hex[:6]}"
    for namespace in ROLE_NAMESPACES:
        apache_pulsar.grant(f"{tenant}/{namespace}", role)
    token = apache_pulsar.mint_token(role, expires_in=EXPIRES_IN)
    expires = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))["exp"]
    with structlog.testing.capture_logs() as logs:
        running = await run_registry(apache_pulsar, tenant, tmp_path / "data", stack, token=token, role=role)
        publisher = await running.transport.publisher(running.transport.topics.tool_descriptors)
        assert running.registry.readiness() is None, "the token is still good"

        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))
        reason = await eventually(
            not_ready(running.registry, "hear announcements", f"the token expired at {when} (role {role})"),
            timeout=EXPIRES_IN + NAMED,
            explain=running.registry.readiness,
        )
        assert "give the process a fresh token (PULSAR_AUTH_TOKEN or PULSAR_AUTH_TOKEN_FILE)" in reason
        assert_not_misnamed(reason)
        with pytest.raises(TokenExpired) as refused:
            await publisher.send(b"{}")
        assert refused.value.expired_at == expires and not refused.value.retriable
        await eventually(lambda: events(logs, "registry.intake_failed"), timeout=3)
        await eventually(
            lambda: any("token expired" in entry["reason"] for entry in events(logs, "registry.queries_failed")),
            timeout=3,
        )


@pytest.mark.parametrize("whose", ["superuser", "role"])
async def test_a_deleted_namespace_is_named_as_missing_not_as_bad_credentials(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, stack: AsyncExitStack, whose: str
) -> None:
    """To a superuser Apache Pulsar says the namespace is not found; to any other role, that it is not authorized
    there."""
    token = apache_pulsar.token if whose == "superuser" else None
    running = await run_registry(apache_pulsar, tenant, tmp_path / "data", stack, token=token)
    publisher = await running.transport.publisher(running.transport.topics.tool_descriptors)
    apache_pulsar.delete_namespace(running.intake)

    if whose == "superuser":
        reason = await eventually(
            not_ready(running.registry, f"has no namespace {running.intake}"),
            timeout=NAMED,
            explain=running.registry.readiness,
        )
        assert "deploy/pulsar-init.sh" in reason
        expected: type[TransportError] = NamespaceMissing
    else:
        reason = await eventually(
            not_ready(running.registry, f"not authorized on {running.intake}"),
            timeout=NAMED,
            explain=running.registry.readiness,
        )
        assert "create the namespace if it was deleted" in reason
        expected = NotAuthorized
    assert_not_misnamed(reason)
    assert "credentials" not in reason and "PULSAR_AUTH_TOKEN" not in reason
    with pytest.raises(expected) as refused:
        await publisher.send(b"{}")
    assert getattr(refused.value, "namespace", None) == running.intake
