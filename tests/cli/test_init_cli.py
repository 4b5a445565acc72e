"""`toolreg init`: any topicspace prepared on Apache Pulsar, safe to run again, with the grants toolreg's processes
need; and a one-line error for every way it cannot be done.

On the run's Apache Pulsar (authentication and authorization on): the tenant and namespaces are made, `state` kept
without limit, the role may produce and consume, a second run makes nothing, and the product then works in that
topicspace under that role's token (a config store and a client, which use request, response and notify).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from apache_pulsar import KIND_GRANTS, RESERVED_SUBSCRIPTIONS, ApachePulsar
from support import atoolreg, toolreg

from discovery.broker.embedded import reserve_port
from discovery.broker.topicspace import ALL_PROCESSES, GRANTS
from discovery.broker.topicspace import RESERVED_SUBSCRIPTIONS as RESERVED
from discovery.store.service import ConfigStoreService
from toolservice_base import ConfigClient, Settings, open_transport
from toolservice_base.topics import NAMESPACES


def init_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    env.update(TOOLREG_DATA_DIR=str(tmp_path / "data"), TOOLREG_LOG_FORMAT="json", **extra)
    return env


@pytest.fixture
def fresh(apache_pulsar: ApachePulsar) -> Iterator[str]:
    name = f"init-{uuid.uuid4().hex[:10]}"
    yield name
    if name in apache_pulsar.admin("GET", "tenants"):
        apache_pulsar.delete_tenant(name)


@pytest.mark.apache_pulsar
async def test_init_prepares_any_topicspace_once_and_toolreg_then_runs_there_under_the_granted_role(
    apache_pulsar: ApachePulsar, fresh: str, tmp_path: Path
) -> None:
    role = f"toolreg-{uuid.uuid4().hex[:6]}"
    env = init_env(tmp_path, PULSAR_ADMIN_TOKEN_FILE=str(apache_pulsar.data_dir / "auth" / "admin.token"))
    argv = ("init", "--topicspace", fresh, "--admin-url", apache_pulsar.admin_url, "--role", role)
    first = await atoolreg(*argv, env=env)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert lines[0] == f"tenant {fresh}: created (cluster standalone)"
    assert {line for line in lines if line.endswith(": created")} == {
        f"namespace {fresh}/{name}: created" for name in NAMESPACES
    }
    assert f"namespace {fresh}/state: retention unlimited" in lines
    assert f"namespace {fresh}/audit: retention 30d" in lines
    assert lines[-1] == f"topicspace {fresh} ready on {apache_pulsar.admin_url}"

    assert sorted(apache_pulsar.namespaces(fresh)) == sorted(f"{fresh}/{name}" for name in NAMESPACES)
    assert apache_pulsar.admin("GET", f"namespaces/{fresh}/state/retention") == {
        "retentionTimeInMinutes": -1,
        "retentionSizeInMB": -1,
    }
    for name in NAMESPACES:
        granted = apache_pulsar.admin("GET", f"namespaces/{fresh}/{name}/permissions")
        assert {who: sorted(actions) for who, actions in granted.items()} == {role: ["consume", "produce"]}

    assert apache_pulsar.admin("GET", f"namespaces/{fresh}/audit/retention") == {
        "retentionTimeInMinutes": 30 * 24 * 60,
        "retentionSizeInMB": -1,
    }

    again = await atoolreg(*argv, "--audit-retention", "90d", env=env)
    assert again.returncode == 0, again.stderr
    assert apache_pulsar.admin("GET", f"namespaces/{fresh}/audit/retention")["retentionTimeInMinutes"] == 90 * 1440
    assert not [line for line in again.stdout.splitlines() if "created" in line], again.stdout
    assert f"tenant {fresh}: exists" in again.stdout and f"namespace {fresh}/notify: exists" in again.stdout

    settings = Settings(
        data_dir=tmp_path / "store",
        pulsar_url=apache_pulsar.url,
        broker="apache-pulsar",
        topicspace=fresh,
        auth_token=apache_pulsar.mint_token(role),
    )
    connection = await open_transport(settings)
    store = ConfigStoreService.in_data_dir(connection, settings.data_dir)
    try:
        await store.start()
        async with ConfigClient(connection, timeout=10) as client:
            await client.put([("prompt", "probe", '"hello"')])
            assert await client.list("prompt") == ["probe"]
    finally:
        await store.stop()
        await connection.close()


def test_init_grants_each_kind_what_the_deploy_script_and_the_test_broker_grant_it() -> None:
    assert {kind: dict(grants) for kind, grants in GRANTS.items() if kind != ALL_PROCESSES} == KIND_GRANTS
    assert RESERVED == RESERVED_SUBSCRIPTIONS


@pytest.mark.apache_pulsar
async def test_init_grants_a_role_per_kind_only_what_its_kind_needs_and_reserves_the_stores_subscriptions(
    apache_pulsar: ApachePulsar, fresh: str, tmp_path: Path
) -> None:
    roles = {kind: f"{kind}-{uuid.uuid4().hex[:6]}" for kind in KIND_GRANTS}
    env = init_env(tmp_path, PULSAR_ADMIN_TOKEN_FILE=str(apache_pulsar.data_dir / "auth" / "admin.token"))
    named = [arg for kind, role in roles.items() for arg in (f"--{kind}-role", role)]
    done = await atoolreg("init", "--topicspace", fresh, "--admin-url", apache_pulsar.admin_url, *named, env=env)
    assert done.returncode == 0, done.stderr
    for name in NAMESPACES:
        granted = apache_pulsar.admin("GET", f"namespaces/{fresh}/{name}/permissions")
        expected = {roles[kind]: sorted(grants[name]) for kind, grants in KIND_GRANTS.items() if name in grants}
        assert {who: sorted(actions) for who, actions in granted.items()} == expected, name
    reserved = apache_pulsar.admin("GET", f"namespaces/{fresh}/request")["auth_policies"]["subscription_auth_roles"]
    assert {sub: sorted(who) for sub, who in reserved.items()} == {sub: [roles["store"]] for sub in RESERVED}
    assert f"namespace {fresh}/state: role {roles['store']} (store) may produce and consume" in done.stdout
    assert f"namespace {fresh}/request: subscription config-store only for {roles['store']}" in done.stdout


@pytest.mark.apache_pulsar
async def test_init_without_a_superusers_token_is_one_line_naming_the_variable(
    apache_pulsar: ApachePulsar, fresh: str, tmp_path: Path
) -> None:
    env = init_env(tmp_path, PULSAR_AUTH_TOKEN=apache_pulsar.mint_token("nobody-special"))
    refused = await atoolreg("init", "--topicspace", fresh, "--admin-url", apache_pulsar.admin_url, env=env)
    assert refused.returncode == 1 and refused.stdout == ""
    line = refused.stderr.strip()
    assert "\n" not in line and line.startswith(f"toolreg: the admin API at {apache_pulsar.admin_url} refused")
    assert "HTTP 401" in line or "HTTP 403" in line
    assert "superuser" in line and "PULSAR_ADMIN_TOKEN_FILE" in line
    assert fresh not in apache_pulsar.admin("GET", "tenants")


def test_init_says_what_to_give_when_it_has_no_cluster_to_talk_to(tmp_path: Path) -> None:
    nowhere = toolreg("init", env=init_env(tmp_path))
    assert nowhere.returncode == 1
    assert nowhere.stderr.strip() == (
        "toolreg: toolreg init prepares a topicspace on an Apache Pulsar cluster: give its admin API with"
        " --admin-url (or PULSAR_ADMIN_URL), or its broker with PULSAR_URL; the embedded broker of `toolreg up`"
        " needs no init"
    )
    with reserve_port() as nothing_listens:
        port = nothing_listens.getsockname()[1]
    absent = toolreg("init", "--admin-url", f"http://127.0.0.1:{port}", env=init_env(tmp_path))
    assert absent.returncode == 1
    line = absent.stderr.strip()
    assert "\n" not in line and f"cannot reach Apache Pulsar's admin API at http://127.0.0.1:{port}" in line
    derived = toolreg("init", env=init_env(tmp_path, PULSAR_URL=f"pulsar://127.0.0.1:{port}"))
    assert "admin API at http://127.0.0.1:8080" in derived.stderr  # the broker's host, the admin API's default port


def test_init_refuses_a_topicspace_pulsar_would_refuse(tmp_path: Path) -> None:
    bad = toolreg("init", "--topicspace", "no/slash", "--admin-url", "http://127.0.0.1:1", env=init_env(tmp_path))
    assert bad.returncode == 1 and "not a valid Pulsar tenant name" in bad.stderr


def test_an_audit_retention_is_a_time_as_pulsar_admin_takes_it(tmp_path: Path) -> None:
    from discovery.broker.topicspace import retention_minutes

    assert [retention_minutes(t) for t in ("30d", "12h", "90m", "2w", "1y", "-1", "120")] == [
        43200,
        720,
        90,
        20160,
        525600,
        -1,
        2,
    ]
    bad = toolreg("init", "--admin-url", "http://127.0.0.1:1", "--audit-retention", "a month", env=init_env(tmp_path))
    assert bad.returncode == 1 and "audit retention 'a month' is not a time" in bad.stderr


@pytest.mark.apache_pulsar
async def test_init_per_service_takes_back_a_service_roles_queue_grants_and_grant_service_gives_it_its_own(
    apache_pulsar: ApachePulsar, fresh: str, tmp_path: Path
) -> None:
    store, service = f"store-{uuid.uuid4().hex[:6]}", f"jokes-{uuid.uuid4().hex[:6]}"
    env = init_env(tmp_path, PULSAR_ADMIN_TOKEN_FILE=str(apache_pulsar.data_dir / "auth" / "admin.token"))
    where = ("--topicspace", fresh, "--admin-url", apache_pulsar.admin_url)
    shared = await atoolreg("init", *where, "--store-role", store, "--service-role", service, env=env)
    assert shared.returncode == 0, shared.stderr
    assert service in apache_pulsar.admin("GET", f"namespaces/{fresh}/request/permissions")
    own = await atoolreg("init", *where, "--per-service", "--store-role", store, "--service-role", service, env=env)
    assert own.returncode == 0, own.stderr
    for name, expected in (("request", None), ("response", None), ("discovery", ["consume", "produce"])):
        granted = apache_pulsar.admin("GET", f"namespaces/{fresh}/{name}/permissions")
        assert sorted(granted[service]) == expected if expected else service not in granted, (name, granted)
    for _ in range(2):  # safe to run again
        done = await atoolreg("grant", "service", "joke-service", "--role", service, *where, env=env)
        assert done.returncode == 0, done.stderr
    assert (
        f"topic non-persistent://{fresh}/request/joke-service: role {service} (service joke-service) may consume"
        in (done.stdout)
    )
    for queue, actions in (("request/joke-service", ["consume"]), ("request/joke-service.cancel", ["consume"])):
        assert apache_pulsar.admin("GET", f"non-persistent/{fresh}/{queue}/permissions")[service] == actions
    assert apache_pulsar.admin("GET", f"non-persistent/{fresh}/response/joke-service/permissions")[service] == [
        "produce"
    ]
    for store_queue in (
        ("config",),
        ("maps", "--response-queue", f"non-persistent://{fresh}/response/config:research"),
    ):
        refused = await atoolreg("grant", "service", *store_queue, "--role", service, *where, env=env)
        line = refused.stderr.strip()
        assert refused.returncode == 1 and "\n" not in line and "the store's or the registry's queue" in line, line
