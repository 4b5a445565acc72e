"""A command refused for its role says which kind of process it runs as and what that kind's role is granted, and
never tells the user to widen the grant of the role it was given (which may be another kind's).

On the run's Apache Pulsar (authorization on), a tenant granted as `toolreg
init` grants it (`ApachePulsar.grant_kinds`, one role per kind): `toolreg up`
run with the service's token is refused on the state namespace, and
`toolreg serve` with the agent's token on the request namespace.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from apache_pulsar import KIND_GRANTS, ApachePulsar
from support import atoolreg, toolreg_env

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(420)]


@pytest.mark.parametrize(
    ("command", "token_of", "kind", "namespace", "rights"),
    [
        (["up"], "service", "store", "state", "produce and consume"),
        (["serve", "toolservice_base.examples.echo:EchoService"], "agent", "service", "request", "consume"),
    ],
)
async def test_a_command_refused_for_its_role_names_its_kind_and_never_widens_another_kinds_grant(
    apache_pulsar: ApachePulsar,
    tenant: str,
    tmp_path: Path,
    command: list[str],
    token_of: str,
    kind: str,
    namespace: str,
    rights: str,
) -> None:
    suffix = uuid.uuid4().hex[:6]
    tokens = apache_pulsar.grant_kinds(tenant, {k: f"{k}-{suffix}" for k in KIND_GRANTS})
    env = toolreg_env(
        apache_pulsar.url,
        tmp_path / "data",
        TOOLREG_BROKER="apache-pulsar",
        TOOLREG_TOPICSPACE=tenant,
        PULSAR_AUTH_TOKEN=tokens[token_of],
    )
    done = await atoolreg(*command, env=env, timeout=90)
    lines = [line for line in done.stderr.splitlines() if line.startswith("toolreg: ")]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    [line] = lines
    assert f"`toolreg {command[0]}` runs as the {kind}'s role, which is granted {rights} on {tenant}/" in line, line
    assert f"refused role {token_of}-{suffix}" in line and "AuthorizationError" in line, line
    assert f"run it with a token of the {kind}'s role" in line, line
    assert f"toolreg init --topicspace {tenant} --{kind}-role ROLE" in line, line
    assert "grant-permission" not in line and f"--role {token_of}-{suffix}" not in line, line
    assert namespace in line
