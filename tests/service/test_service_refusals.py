"""A tool service the broker stops letting consume its request queue is not ready, says why, and recovers on a grant.

On Apache Pulsar with authorization on, revoking a role's consume
permission closes the service's request consumer while its response
producer stays connected: the service would look ready while no request
reached it. `readiness()` (what `/readyz` serves) must name the refusal
with the fix, and turn ready again when the grant comes back.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import eventually

from toolservice_base import Settings, open_transport
from toolservice_base.examples.echo import EchoService

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(300)]

NAMED = 15.0
"""Seconds for a refusal to show in readiness: the transport asks the broker once a handle has been down for a
second."""


async def test_a_revoked_consume_permission_makes_the_service_not_ready_with_the_grant_and_a_grant_heals_it(
    apache_pulsar: ApachePulsar,
    tenant: str,
    tmp_path: Path,
) -> None:
    role = f"service-{uuid.uuid4().hex[:6]}"
    for namespace in ("request", "response", "discovery"):
        apache_pulsar.grant(f"{tenant}/{namespace}", role)
    settings = Settings(
        data_dir=tmp_path,
        pulsar_url=apache_pulsar.url,
        broker="apache-pulsar",
        topicspace=tenant,
        auth_token=apache_pulsar.mint_token(role),
        operation_timeout=5,
    )
    connection = await open_transport(settings)
    try:
        async with EchoService(settings=settings, connection=connection) as service:
            assert service.readiness() is None
            requests = f"{tenant}/request"
            apache_pulsar.grant(requests, role, ["produce"])  # consume revoked; the response producer is untouched
            reason = await eventually(
                lambda: (
                    (line := service.readiness()) and f"not authorized on {requests} for role {role}" in line and line
                ),
                timeout=NAMED,
                explain=service.readiness,
            )
            assert "grant-permission" in reason and "\n" not in reason, reason
            apache_pulsar.grant(requests, role)
            await eventually(lambda: service.readiness() is None, timeout=30, explain=service.readiness)
    finally:
        await connection.close()
