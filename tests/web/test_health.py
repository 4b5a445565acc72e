"""Health and metrics endpoints on running processes, and the counters behind them.

Every endpoint is fetched over real HTTP from a worker thread (the probe
handlers need the event loop free to answer), against a real broker.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support import eventually, toolreg_background, toolreg_env
from support.registry import FAST, announcement, silence

from discovery.broker import EmbeddedBroker
from discovery.registry.metrics import ANNOUNCEMENT_KINDS, REJECTION_REASONS, RegistryMetrics, rejection_reason
from discovery.registry.service import Registry
from discovery.registry.trust import TrustPolicy, trusted_key
from discovery.registry.validation import AnnouncementValidator, Rejected
from discovery.store.metrics import CONFIG_OPERATIONS, ConfigStoreMetrics
from discovery.store.service import ConfigStoreService
from discovery.web.health import HealthError, HealthServer, metrics_address
from toolservice_base import ConfigClient, ConfigConflict, RequestClient, SettingsError, Transport, topics
from toolservice_base.examples.calculator import CalculatorService
from toolservice_base.examples.joke import JokeService
from toolservice_base.metrics import ServiceMetrics
from toolservice_base.schemas import MAX_MESSAGE_BYTES
from toolservice_base.signing import Ed25519PrivateKey, public_key_text, sign


def fetch(url: str, accept: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


async def get(url: str) -> tuple[int, Any]:
    status, content_type, body = await asyncio.to_thread(fetch, url)
    return status, json.loads(body) if content_type == "application/json" else body


def sample(text: str, name: str, **labels: str) -> float | None:
    """One sample's value from a Prometheus text page, or None if it is not there."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def scrape(server: HealthServer) -> str:
    status, body = await get(f"{server.url}/metrics")
    assert status == 200
    return body


# --- settings -------------------------------------------------------------------


def test_metrics_address_is_off_by_default_and_loopback_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLREG_METRICS_PORT", raising=False)
    monkeypatch.delenv("TOOLREG_METRICS_HOST", raising=False)
    assert metrics_address(None) is None
    assert metrics_address(9000) == ("127.0.0.1", 9000)
    monkeypatch.setenv("TOOLREG_METRICS_PORT", "9464")
    assert metrics_address(None) == ("127.0.0.1", 9464)
    assert metrics_address(9000) == ("127.0.0.1", 9000), "the flag wins over the environment"
    monkeypatch.setenv("TOOLREG_METRICS_HOST", "0.0.0.0")
    assert metrics_address(None) == ("0.0.0.0", 9464)
    monkeypatch.setenv("TOOLREG_METRICS_PORT", "nine")
    with pytest.raises(SettingsError, match="TOOLREG_METRICS_PORT='nine' is not a whole number \\(a port\\)"):
        metrics_address(None)
    monkeypatch.delenv("TOOLREG_METRICS_PORT")
    with pytest.raises(HealthError, match="0-65535"):
        metrics_address(70000)


async def test_a_taken_port_is_a_one_line_error() -> None:
    first = HealthServer(port=0).start()
    try:
        with pytest.raises(HealthError, match=f"cannot serve health and metrics on 127.0.0.1:{first.port}"):
            HealthServer(port=first.port).start()
    finally:
        first.stop()


# --- the server itself -------------------------------------------------------------


async def test_routes_and_readiness_follow_the_checks() -> None:
    state = {"reason": "warming up"}
    server = HealthServer(port=0, registry=CollectorRegistry())
    server.add_check("thing", lambda: state["reason"])
    server.add_check("broken", lambda: 1 / 0 if state["reason"] == "explode" else None)
    server.start()
    try:
        assert await get(f"{server.url}/healthz") == (200, {"status": "ok"})
        assert await get(f"{server.url}/readyz") == (
            503,
            {"status": "not ready", "checks": {"thing": "warming up", "broken": "ok"}},
        )
        state["reason"] = None  # type: ignore[assignment]
        assert await get(f"{server.url}/readyz") == (
            200,
            {"status": "ready", "checks": {"thing": "ok", "broken": "ok"}},
        )
        state["reason"] = "explode"
        status, body = await get(f"{server.url}/readyz")
        assert status == 503 and body["checks"]["broken"].startswith("check failed: ZeroDivisionError")
        status, body = await get(f"{server.url}/nope")
        assert status == 404 and "/healthz" in body["error"]
        _, content_type, _ = await asyncio.to_thread(
            fetch, f"{server.url}/metrics", "application/openmetrics-text; version=1.0.0"
        )
        assert content_type.startswith("application/openmetrics-text")
    finally:
        server.stop()


async def test_no_checks_means_not_ready() -> None:
    server = HealthServer(port=0, registry=CollectorRegistry()).start()
    try:
        assert (await get(f"{server.url}/readyz"))[0] == 503
    finally:
        server.stop()


async def test_liveness_fails_while_the_event_loop_is_blocked() -> None:
    server = HealthServer(port=0, registry=CollectorRegistry(), timeout=0.3).start()
    result: list[tuple[int, str, str]] = []
    try:
        probe = threading.Thread(target=lambda: result.append(fetch(f"{server.url}/healthz")))
        probe.start()
        time.sleep(1.0)  # noqa: ASYNC251 - a wedged loop is the point: nothing on it runs
        await asyncio.to_thread(probe.join, 10)
        status, _, body = result[0]
        assert status == 503 and "did not answer within 0.3s" in json.loads(body)["reason"]
        assert (await get(f"{server.url}/healthz"))[0] == 200, "the loop is free again"
    finally:
        server.stop()


# --- the config store ----------------------------------------------------------


async def test_config_store_readiness_follows_the_broker(
    broker: EmbeddedBroker, config_store: ConfigStoreService
) -> None:
    server = HealthServer(port=0)
    server.add_check("config-store", config_store.readiness)
    server.start()
    try:
        assert await get(f"{server.url}/readyz") == (200, {"status": "ready", "checks": {"config-store": "ok"}})
        port = broker.port
        broker.stop()

        async def not_ready() -> Any:
            status, body = await get(f"{server.url}/readyz")
            return body if status == 503 else None

        body = await eventually(not_ready, timeout=10)
        assert body["checks"]["config-store"].startswith("not connected to the broker at pulsar://127.0.0.1:")
        assert (await get(f"{server.url}/healthz"))[0] == 200, "alive without a broker: only readiness drops"
        broker.start(port=port)

        async def ready() -> bool:
            return (await get(f"{server.url}/readyz"))[0] == 200

        await eventually(ready, timeout=15)
    finally:
        server.stop()


async def test_config_store_counters_and_version_move(
    config_store: ConfigStoreService, config_client: ConfigClient, connection: Transport
) -> None:
    server = HealthServer(port=0).start()  # the default registry: what `toolreg up` serves
    try:
        before = await scrape(server)
        version = await config_client.put([("prompt", "a", "1")])
        await config_client.get([("prompt", "a")])
        with pytest.raises(ConfigConflict):
            await config_client.apply(puts=[("prompt", "a", "2")], expect=[("prompt", "a", "not-1")])
        raw = RequestClient(connection, "non-persistent://tg/request/config", "non-persistent://tg/response/config")
        try:
            answer = await raw.request({"operation": "explode"}, timeout=5)
        finally:
            await raw.close()
        assert answer["error"]["type"] == "bad-operation"  # TrustGraph's error type for an unknown operation
        after = await scrape(server)

        def delta(name: str, **labels: str) -> float:
            return (sample(after, name, **labels) or 0.0) - (sample(before, name, **labels) or 0.0)

        assert sample(after, "toolreg_config_version") == version == config_store.store.version
        assert delta("toolreg_config_requests_total", operation="put") == 2  # the write and the refused one
        assert delta("toolreg_config_requests_total", operation="get") == 1
        assert delta("toolreg_config_requests_total", operation="invalid") == 1
        assert delta("toolreg_config_conflicts_total") == 1  # a refused conditional write: counted, but not as an error
        assert sample(after, "toolreg_config_request_errors_total", type="conflict") is None
        assert delta("toolreg_config_request_errors_total", type="bad-operation") == 1
        for operation in CONFIG_OPERATIONS:
            assert sample(after, "toolreg_config_requests_total", operation=operation) is not None
    finally:
        server.stop()


async def test_a_store_with_its_own_metrics_registry_reports_only_there(connection: Transport, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    service = ConfigStoreService.in_data_dir(connection, tmp_path / "own")
    service.metrics = ConfigStoreMetrics(registry)
    await service.start()
    client = await ConfigClient(connection, timeout=5).start()
    try:
        await client.put([("prompt", "x", "1")])
        await client.put([("prompt", "y", "1")])
        assert registry.get_sample_value("toolreg_config_version") == 2
        assert registry.get_sample_value("toolreg_config_requests_total", {"operation": "put"}) == 2
    finally:
        await client.close()
        await service.stop()


# --- a tool service ------------------------------------------------------------


async def test_tool_service_endpoints_and_counters(connection: Transport, settings: Any) -> None:
    registry = CollectorRegistry()
    service = CalculatorService(
        connection=connection, settings=settings, announce=False, metrics=ServiceMetrics(registry)
    )
    server = HealthServer(port=0, registry=registry)
    server.add_check("service", service.readiness)
    server.start()
    try:
        assert (await get(f"{server.url}/readyz"))[1]["checks"] == {"service": "not started"}
        await service.start()
        assert await get(f"{server.url}/readyz") == (200, {"status": "ready", "checks": {"service": "ok"}})
        d = service.service_descriptor
        client = await RequestClient(connection, d.request_queue, d.response_queue).start()
        try:
            ok = await client.request(
                {"user": "", "config": "{}", "arguments": json.dumps({"expression": "2 + 3"})}, timeout=5
            )
            failed = await client.request(
                {"user": "", "config": "{}", "arguments": json.dumps({"expression": "import os"})}, timeout=5
            )
            bad = await client.request({"user": "", "config": "{}", "arguments": "not json"}, timeout=5)
        finally:
            await client.close()
        assert ok["response"] == "5" and failed["error"] and bad["error"]["type"] == "bad-request"
        text = await scrape(server)
        assert sample(text, "toolreg_tool_service_requests_total", service="calculator") == 3
        assert sample(text, "toolreg_tool_service_errors_total", service="calculator", kind="exception") == 1
        assert sample(text, "toolreg_tool_service_errors_total", service="calculator", kind="bad-request") == 1
        assert sample(text, "toolreg_tool_service_request_seconds_count", service="calculator") == 3
        assert 0 < (sample(text, "toolreg_tool_service_request_seconds_sum", service="calculator") or 0) < 5
        await service.stop()
        assert await get(f"{server.url}/readyz") == (503, {"status": "not ready", "checks": {"service": "stopping"}})
    finally:
        server.stop()
        await service.stop()


async def test_toolreg_serve_and_up_serve_the_endpoints(broker: EmbeddedBroker, tmp_path: Path) -> None:
    """The CLI wiring: `--metrics-port` on `serve`, `TOOLREG_METRICS_PORT` on `up`, as deploy/ runs them.
    Port 0 (any free port, read back from the `health.listening` log line) keeps parallel runs apart."""
    env = toolreg_env(broker.url, tmp_path / "data", TOOLREG_METRICS_PORT="0")
    up = toolreg_background("up", env=env, log=tmp_path / "up.log")
    serve = toolreg_background(
        "serve",
        "toolservice_base.examples.joke:JokeService",
        "--metrics-port",
        "0",
        env=env,
        log=tmp_path / "serve.log",
    )

    def health_url(log: Path) -> str | None:
        for line in log.read_text().splitlines():
            if '"health.listening"' in line:
                return str(json.loads(line)["url"])
        return None

    try:
        up_url = await eventually(lambda: health_url(tmp_path / "up.log"), timeout=30)
        serve_url = await eventually(lambda: health_url(tmp_path / "serve.log"), timeout=30)
        for url, check in ((up_url, "registry"), (up_url, "config-store"), (serve_url, "service")):

            async def ready(url: str = url) -> Any:
                status, body = await get(f"{url}/readyz")
                return body if status == 200 else None

            body = await eventually(ready, timeout=30)
            assert body["checks"][check] == "ok"
            status, text = await get(f"{url}/metrics")
            assert status == 200 and "process_resident_memory_bytes" in text
        _, text = await get(f"{serve_url}/metrics")
        assert sample(text, "toolreg_tool_service_requests_total", service="joke-service") == 0

        async def joke_is_live() -> bool:
            _, text = await get(f"{up_url}/metrics")
            return (
                sample(text, "toolreg_registry_live_tools") == 1 and sample(text, "toolreg_registry_live_services") == 1
            )

        await eventually(joke_is_live, timeout=15)
        _, text = await get(f"{up_url}/metrics")
        assert (sample(text, "toolreg_config_version") or 0) >= 1, "the registry's merge bumped the store"
        assert (sample(text, "toolreg_registry_announcements_total", kind="announce") or 0) >= 1
    finally:
        for proc in (serve, up):
            proc.terminate()
        for proc in (serve, up):
            proc.wait(timeout=20)


# --- the registry's metric objects and reasons --------------------------------------


def _validator_reasons() -> dict[str, str]:
    """Real rejection messages from the registry's validator and trust policy, by the label they must get."""
    validator = AnnouncementValidator()
    now = time.time()
    key = Ed25519PrivateKey.generate()
    policy = TrustPolicy()
    policy.add(trusted_key("team", public_key_text(key.public_key()), ["other-*"], ["*"]))

    def authorize(a: Any) -> str | None:
        return policy.check(a, a.service.id, [tool.name for tool in a.tools])

    def reason_of(message: Any, trust: Any = None) -> str:
        data = message if isinstance(message, bytes) else message.model_dump_json(by_alias=True).encode()
        with pytest.raises(Rejected) as caught:
            validator.check(data, now, trust)
        return caught.value.reason

    validator.check(announcement("svc", sequence=5).model_dump_json(by_alias=True).encode(), now)
    return {
        "too-large": reason_of(b" " * (MAX_MESSAGE_BYTES + 1)),
        "malformed": reason_of(b"{not json"),
        "namespace": reason_of(announcement("svc", instance="y", namespace="elsewhere")),
        "stale": reason_of(announcement("svc", instance="z", sent_at=now - 100)),
        "skew": reason_of(announcement("svc", instance="w", sent_at=now + 100)),
        "replay": reason_of(announcement("svc", sequence=5)),
        # a tool named "unsigned" must not turn an untrusted key into an "unsigned" label
        "untrusted": reason_of(sign(announcement("unsigned", ("unsigned",), instance="x-2"), key), authorize),
        "unsigned": reason_of(announcement("svc", instance="x-1"), authorize),
        "untrusted-key": reason_of(sign(announcement("svc", instance="x-3"), Ed25519PrivateKey.generate()), authorize),
    }


def test_rejection_reasons_map_real_messages_to_fixed_labels() -> None:
    for expected, text in _validator_reasons().items():
        assert text, f"no message produced for {expected}"
        assert rejection_reason(text) == expected.removesuffix("-key"), text
    assert rejection_reason("the config store refused service 'svc': bad value") == "store-refused"
    assert rejection_reason("capacity: the registry holds 10000 instance leases, the limit is 10000") == "capacity"
    assert rejection_reason("something new") == "other"


def test_registry_metrics_api_moves_its_series() -> None:
    registry = CollectorRegistry()
    metrics = RegistryMetrics(registry)
    for kind in ANNOUNCEMENT_KINDS:
        assert registry.get_sample_value("toolreg_registry_announcements_total", {"kind": kind}) == 0
    for reason in REJECTION_REASONS:
        assert registry.get_sample_value("toolreg_registry_rejections_total", {"reason": reason}) == 0
    metrics.announcement("announce")
    metrics.announcement("heartbeat")
    metrics.announcement("heartbeat")
    metrics.rejection("stale: sent 40.0s ago, more than its ttl of 15s")
    metrics.conflict()
    metrics.expired(3)
    metrics.expired(0)
    with metrics.merge_timer():
        time.sleep(0.01)
    metrics.set_state(services=2, tools=5, instances=4, held=1)
    value = registry.get_sample_value
    assert value("toolreg_registry_announcements_total", {"kind": "heartbeat"}) == 2
    assert value("toolreg_registry_announcements_total", {"kind": "announce"}) == 1
    assert value("toolreg_registry_rejections_total", {"reason": "stale"}) == 1
    assert value("toolreg_registry_conflicts_total") == 1
    assert value("toolreg_registry_expiries_total") == 3
    assert value("toolreg_registry_merge_seconds_count") == 1
    assert (value("toolreg_registry_merge_seconds_sum") or 0) >= 0.01
    assert (value("toolreg_registry_live_services"), value("toolreg_registry_live_tools")) == (2, 5)
    assert (value("toolreg_registry_instances"), value("toolreg_registry_held_instances")) == (4, 1)


# --- the registry ----------------------------------------------------------------


async def test_registry_counters_move_on_register_reject_conflict_expire(
    connection: Transport, config_store: ConfigStoreService, settings: Any
) -> None:
    prom = CollectorRegistry()
    registry = Registry(connection, options=FAST, metrics=RegistryMetrics(prom))
    await registry.start()
    joke = JokeService(connection=connection, settings=settings, ttl=1.0)
    publisher = await connection.publisher(topics.DEFAULT.tool_descriptors)

    def value(name: str, **labels: str) -> float:
        return prom.get_sample_value(name, labels) or 0.0

    try:
        await joke.start()
        await eventually(lambda: value("toolreg_registry_live_tools") == 1, timeout=10)
        assert value("toolreg_registry_live_services") == 1 and value("toolreg_registry_instances") == 1
        assert value("toolreg_registry_announcements_total", kind="announce") >= 1
        assert value("toolreg_registry_merge_seconds_count") >= 1

        await publisher.send(b"{not json")
        await eventually(lambda: value("toolreg_registry_rejections_total", reason="malformed") == 1)

        rival = announcement("rival", tools=("tell-joke",), instance="rival-1", ttl=1.0)
        await publisher.send(rival.model_dump_json(by_alias=True).encode())
        await eventually(lambda: value("toolreg_registry_conflicts_total") == 1, timeout=10)

        silence(joke)
        await eventually(lambda: value("toolreg_registry_expiries_total") >= 2, timeout=10)
        await eventually(lambda: value("toolreg_registry_live_services") == 0, timeout=10)
        assert value("toolreg_registry_instances") == 0
        # Its tool counts until the registry has deleted it from the store: a write later.
        await eventually(lambda: value("toolreg_registry_live_tools") == 0, timeout=5)
    finally:
        await connection.close_publisher(publisher)
        await joke.stop()
        await registry.stop()
