"""Apache Pulsar 4.0 for real: one standalone for the whole run, token authentication on.

The broker comes from scripts/apache_pulsar.py (Maven Central's server
distribution, cached and unpacked once). It starts once per session; every
test makes a fresh tenant through the admin REST API, so tests share the
broker but never a topic. Select these tests with `-m apache_pulsar`. A
broker that cannot start makes them error with the reason, never skip.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pulsar
import pytest
from apache_pulsar import PRODUCT_NAMESPACES, ApachePulsar, PulsarError

from toolservice_base import topics

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(420)]  # the first test also waits for the start

ROOT = Path(__file__).resolve().parents[2]
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
SHORT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"  # bin/pulsar-admin is a fresh JVM per call: start it faster
OPERATION_TIMEOUT = 3
"""For the tests that time how fast a refused client gives up."""
WORKING_TIMEOUT = 30
"""For the tests that expect success: a first persistent topic on a busy 2-core machine can take seconds."""


def client(broker: ApachePulsar, token: str | None, timeout: int = OPERATION_TIMEOUT) -> pulsar.Client:
    auth = {"authentication": pulsar.AuthenticationToken(token)} if token else {}
    return pulsar.Client(broker.url, logger=QUIET, operation_timeout_seconds=timeout, **auth)


def round_trip(
    broker: ApachePulsar, token: str | None, topic: str, timeout: int = WORKING_TIMEOUT
) -> list[tuple[bytes, dict[str, str]]]:
    """Produce three messages and consume them; raises what pulsar-client raises."""
    conn = client(broker, token, timeout)
    try:
        consumer = conn.subscribe(topic, f"s-{uuid.uuid4().hex[:6]}", consumer_type=pulsar.ConsumerType.Exclusive)
        producer = conn.create_producer(topic, batching_enabled=False)
        for i in range(3):
            producer.send(b"m%d" % i, properties={"id": str(i)})
        got = []
        for _ in range(3):
            message = consumer.receive(timeout_millis=5000)
            got.append((message.data(), message.properties()))
            consumer.acknowledge(message)
        return got
    finally:
        conn.close()


def failure_of(call: object) -> tuple[str, float]:
    """The exception class a broker call ends in, and how long it took to get there."""
    started = time.monotonic()
    try:
        call()  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - pulsar-client's errors are what is asserted on
        return type(exc).__name__, time.monotonic() - started
    return "no error", time.monotonic() - started


def loopback_only(pid: int) -> set[str]:
    """Addresses of the TCP sockets the process listens on (from /proc: no extra tool needed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    addresses = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addresses.add(fields[1].split(":")[0])
    return addresses


# --- the broker ---------------------------------------------------------------------------------


def test_the_broker_is_ready_listens_on_loopback_only_and_records_itself(apache_pulsar: ApachePulsar) -> None:
    assert "public/default" in apache_pulsar.namespaces("public")
    state = ApachePulsar.attach(apache_pulsar.data_dir)
    assert (state.url, state.admin_url, state.pid, state.token) == (
        apache_pulsar.url,
        apache_pulsar.admin_url,
        apache_pulsar.pid,
        apache_pulsar.token,
    )
    assert state.running()
    assert apache_pulsar.bookie_port not in (0, apache_pulsar.broker_port, apache_pulsar.web_port)
    assert loopback_only(apache_pulsar.pid) == {"0100007F"}, "every listener (broker, admin, bookie) on 127.0.0.1"


def test_a_fresh_tenant_has_the_namespaces_the_product_uses(apache_pulsar: ApachePulsar, tenant: str) -> None:
    assert set(topics.NAMESPACES) == set(PRODUCT_NAMESPACES)
    assert set(apache_pulsar.namespaces(tenant)) == {f"{tenant}/{ns}" for ns in PRODUCT_NAMESPACES}


def test_a_deleted_tenant_is_gone_with_its_topics(apache_pulsar: ApachePulsar) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    apache_pulsar.create_tenant(name)
    round_trip(apache_pulsar, apache_pulsar.token, f"persistent://{name}/request/q")
    apache_pulsar.delete_tenant(name)
    with pytest.raises(PulsarError, match="HTTP 404"):
        apache_pulsar.namespaces(name)


@pytest.mark.parametrize("kind", ["non-persistent", "persistent"])
def test_messages_flow_on_a_tenant_with_the_right_token(apache_pulsar: ApachePulsar, tenant: str, kind: str) -> None:
    got = round_trip(apache_pulsar, apache_pulsar.token, f"{kind}://{tenant}/request/echo")
    assert got == [(b"m0", {"id": "0"}), (b"m1", {"id": "1"}), (b"m2", {"id": "2"})]


# --- token authentication ------------------------------------------------------------------------


def test_without_a_token_pulsar_client_gives_up_only_at_its_operation_timeout(
    apache_pulsar: ApachePulsar, tenant: str
) -> None:
    """The broker closes an unauthenticated connection; pulsar-client retries until the
    operation timeout and then says Timeout, not "authentication failed". The admin
    REST API, by contrast, answers 401 at once: that is where a clear error comes from."""
    error, took = failure_of(
        lambda: round_trip(apache_pulsar, None, f"non-persistent://{tenant}/request/q", OPERATION_TIMEOUT)
    )
    assert error in ("Timeout", "AuthenticationError"), error
    assert took < OPERATION_TIMEOUT + 1.5
    with pytest.raises(PulsarError, match="HTTP 401"):
        apache_pulsar.admin("GET", f"namespaces/{tenant}", token="")


def test_a_token_signed_with_another_key_fails_like_no_token(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path
) -> None:
    other_key = tmp_path / "other.key"
    other_key.write_bytes(os.urandom(32))
    forged = apache_pulsar.mint_token("admin", secret_key=other_key)
    assert forged != apache_pulsar.token
    error, took = failure_of(
        lambda: round_trip(apache_pulsar, forged, f"non-persistent://{tenant}/request/q", OPERATION_TIMEOUT)
    )
    assert error in ("Timeout", "AuthenticationError"), error
    assert took < OPERATION_TIMEOUT + 1.5
    with pytest.raises(PulsarError, match="HTTP 401"):
        apache_pulsar.admin("GET", f"namespaces/{tenant}", token=forged)


def test_a_valid_token_without_permission_is_refused_at_once(apache_pulsar: ApachePulsar, tenant: str) -> None:
    stranger = apache_pulsar.mint_token(f"stranger-{uuid.uuid4().hex[:6]}")
    error, took = failure_of(lambda: round_trip(apache_pulsar, stranger, f"non-persistent://{tenant}/request/q"))
    assert error == "AuthorizationError"
    assert took < 1.5, "an authorization refusal is an answer, not a timeout"


# --- deploy/pulsar-init.sh on the real bin/pulsar-admin --------------------------------------------------


def test_the_init_script_prepares_the_cluster_and_is_idempotent(apache_pulsar: ApachePulsar) -> None:
    tenant = "tg"  # the script's tenant
    token_file = apache_pulsar.data_dir / "auth" / "admin.token"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "PULSAR_HOME": str(apache_pulsar.home),
        "PULSAR_ADMIN_URL": apache_pulsar.admin_url,
        "PULSAR_ADMIN_TOKEN_FILE": str(token_file),
        "PULSAR_EXTRA_OPTS": SHORT_JVM,
        "PULSAR_LOG_DIR": str(apache_pulsar.data_dir / "logs"),
    }
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]

    def run(**extra: str) -> list[str]:
        result = subprocess.run(
            ["sh", str(ROOT / "deploy" / "pulsar-init.sh")],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.splitlines()

    try:
        first = run(TOOLREG_ROLE="toolreg")
        assert f"tenant {tenant}: created (cluster standalone)" in first
        assert {line for line in first if line.endswith(": created")} == {
            f"namespace {tenant}/{ns}: created" for ns in PRODUCT_NAMESPACES
        }
        second = run()
        assert f"tenant {tenant}: exists" in second
        assert not [line for line in second if "created" in line], second

        assert set(apache_pulsar.namespaces(tenant)) == {f"{tenant}/{ns}" for ns in PRODUCT_NAMESPACES}
        for ns in PRODUCT_NAMESPACES:
            granted = apache_pulsar.admin("GET", f"namespaces/{tenant}/{ns}/permissions")
            assert {role: sorted(actions) for role, actions in granted.items()} == {"toolreg": ["consume", "produce"]}
        policies = apache_pulsar.admin("GET", f"namespaces/{tenant}/request")["auth_policies"]
        assert policies["subscription_auth_roles"] == {"config-store": ["toolreg"], "tool-registry": ["toolreg"]}
        role = apache_pulsar.mint_token("toolreg")
        assert len(round_trip(apache_pulsar, role, f"non-persistent://{tenant}/request/probe")) == 3
        assert (
            failure_of(lambda: round_trip(apache_pulsar, role, "non-persistent://public/default/probe"))[0]
            == "AuthorizationError"
        )
    finally:
        apache_pulsar.delete_tenant(tenant)
