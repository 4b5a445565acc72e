"""Health and metrics over HTTP (`/healthz`, `/readyz`, `/metrics`), and the registry's and store's metrics.

The server is `http.server` on a daemon thread. prometheus-client's own
`start_http_server` answers every path with the metrics page, so it cannot
carry the health routes; aiohttp would be a dependency for three routes. The
thread never touches product state directly: each probe runs its checks *on
the event loop* (`run_coroutine_threadsafe`), so checks read state without
locks, and a wedged loop shows up as a failing `/healthz`: exactly what a
liveness probe should restart.

Off by default. `--metrics-port N` (or `TOOLREG_METRICS_PORT`) turns it on,
bound to 127.0.0.1 unless `TOOLREG_METRICS_HOST` says otherwise (containers
set 0.0.0.0 so the kubelet and Prometheus can reach it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from toolservice_base.errors import ToolDiscoveryError
from toolservice_base.logs import get_logger

log = get_logger("discovery.health")

DEFAULT_METRICS_PORT = 9464
"""The conventional port: what deploy/ sets and the help suggests. Nothing listens unless asked."""
DEFAULT_METRICS_HOST = "127.0.0.1"
LOOP_TIMEOUT = 2.0
"""Seconds a probe waits for the event loop before calling the process unhealthy."""

Check = Callable[[], "str | None"]
"""Runs on the event loop; returns None when fine, else a one-line reason."""


class HealthError(ToolDiscoveryError):
    """The health server cannot be configured or bound; the message says what to fix."""


def metrics_address(port: int | None = None) -> tuple[str, int] | None:
    """Where to serve, or None for off. An explicit port wins over `TOOLREG_METRICS_PORT`; 0 picks a free one."""
    host = os.environ.get("TOOLREG_METRICS_HOST", "").strip() or DEFAULT_METRICS_HOST
    if port is None:
        raw = os.environ.get("TOOLREG_METRICS_PORT", "").strip()
        if not raw:
            return None
        try:
            port = int(raw)
        except ValueError:
            raise HealthError(f"TOOLREG_METRICS_PORT must be a port number, got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise HealthError(f"metrics port must be in 0-65535, got {port}")
    return host, port


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: HealthServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A probe that hangs up mid-answer is routine: one debug line, not a traceback on stderr."""
        log.debug("health.request_failed", client=client_address[0] if client_address else None, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "toolreg-health"

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        owner = self.server.owner
        path = urlsplit(self.path).path
        if path == "/healthz":
            self._json(*owner.liveness())
        elif path == "/readyz":
            self._json(*owner.readiness())
        elif path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(owner.registry), content_type)
        else:
            self._json(404, {"error": f"no route {path}; try /healthz, /readyz or /metrics"})

    def _json(self, status: int, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server API
        log.debug("health.request", client=self.client_address[0], line=format % args)


class HealthServer:
    """`/healthz` (the event loop answers), `/readyz` (every check passes), `/metrics`.

    Call `start()` from the event loop the checks belong to; `stop()` from
    anywhere. Checks can be added before or after `start()`.
    """

    def __init__(
        self,
        host: str = DEFAULT_METRICS_HOST,
        port: int = DEFAULT_METRICS_PORT,
        *,
        registry: CollectorRegistry = REGISTRY,
        timeout: float = LOOP_TIMEOUT,
    ) -> None:
        self.host = host
        self.requested_port = port
        self.registry = registry
        self.timeout = timeout
        self._checks: dict[str, Check] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    def add_check(self, name: str, check: Check) -> None:
        """Add a readiness check; call it on the event loop (or before `start()`)."""
        self._checks[name] = check

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the health server is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> HealthServer:
        self._loop = asyncio.get_running_loop()
        server_class = _Server6 if ":" in self.host else _Server
        try:
            self._httpd = server_class((self.host, self.requested_port), _Handler)
        except OSError as exc:
            raise HealthError(f"cannot serve health and metrics on {self.host}:{self.requested_port}: {exc.strerror}") from None
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="toolreg-health", daemon=True)
        self._thread.start()
        log.info("health.listening", url=self.url, routes=["/healthz", "/readyz", "/metrics"])
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None

    # --- called on the server thread ------------------------------------------

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the event loop and wait for it; raises TimeoutError if the loop does not answer."""
        if self._loop is None or self._loop.is_closed():
            raise RuntimeError("event loop is gone")

        async def call() -> Any:
            return fn()

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        try:
            return future.result(self.timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"event loop did not answer within {self.timeout:g}s") from None

    def liveness(self) -> tuple[int, dict[str, Any]]:
        try:
            self._on_loop(lambda: None)
        except (TimeoutError, RuntimeError) as exc:
            return 503, {"status": "unhealthy", "reason": str(exc)}
        return 200, {"status": "ok"}

    def readiness(self) -> tuple[int, dict[str, Any]]:
        def run_all() -> dict[str, str]:
            results: dict[str, str] = {}
            for name, check in list(self._checks.items()):  # on the loop: add_check cannot race it
                try:
                    results[name] = check() or "ok"
                except Exception as exc:  # a broken check must not break the probe
                    results[name] = f"check failed: {type(exc).__name__}: {exc}"
            return results

        try:
            results = self._on_loop(run_all)
        except (TimeoutError, RuntimeError) as exc:
            return 503, {"status": "not ready", "reason": str(exc)}
        ready = bool(results) and all(value == "ok" for value in results.values())
        return (200 if ready else 503), {"status": "ready" if ready else "not ready", "checks": results}


# --- the registry's metrics ---------------------------------------------------------

ANNOUNCEMENT_KINDS = ("announce", "heartbeat", "withdraw")

REJECTION_REASONS = (
    "too-large",
    "skew",
    "capacity",
    "malformed",
    "namespace",
    "stale",
    "replay",
    "unsigned",
    "untrusted",
    "store-refused",
    "other",
)
"""The `reason` label of `toolreg_registry_rejections_total`: a small fixed set, never free text."""

_REASON_MARKERS: tuple[tuple[str, str], ...] = (
    ("bytes; the limit is", "too-large"),
    ("not a valid announcement", "malformed"),
    ("outside the allowed namespaces", "namespace"),
    ("ahead of the registry's clock", "skew"),
    ("stale:", "stale"),
    ("capacity:", "capacity"),
    ("is not after", "replay"),
    ("may not announce", "untrusted"),
    ("unknown key", "untrusted"),
    ("bad signature", "untrusted"),
    ("unsigned announcement", "unsigned"),
    ("config store refused", "store-refused"),
)
"""Phrases with spaces only: names (`^[A-Za-z0-9_.-]+$`) quoted inside a reason can never match one."""


def rejection_reason(text: str) -> str:
    """Map the registry's one-line rejection reason to its metric label (`other` if unknown).

    Matches on phrases of the messages in `validation.py`, `trust.py` and
    `registry.py`; tests/test_health.py feeds it the real messages, so a
    reworded message that stops matching fails a test instead of silently
    counting as `other`.
    """
    for marker, reason in _REASON_MARKERS:
        if marker in text:
            return reason
    return "other"


MERGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class RegistryMetrics:
    """What the registry reports. Every method is a counter add or gauge set: safe on any hot path."""

    _default: RegistryMetrics | None = None
    _default_lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.live_services = Gauge(
            "toolreg_registry_live_services", "Announced services with at least one instance holding a lease.", registry=registry
        )
        self.live_tools = Gauge("toolreg_registry_live_tools", "Tools the registry has merged into the store for live services.", registry=registry)
        self.instances = Gauge("toolreg_registry_instances", "Instance leases the registry holds (live, in grace or held).", registry=registry)
        self.held_instances = Gauge(
            "toolreg_registry_held_instances",
            "Leases held by self-preservation: expired together, removal waiting for heartbeats or `toolreg release`.",
            registry=registry,
        )
        self.announcements = Counter(
            "toolreg_registry_announcements", "Valid messages read from tool-descriptors, by kind.", ["kind"], registry=registry
        )
        self.rejections = Counter("toolreg_registry_rejections", "Messages refused, by reason.", ["reason"], registry=registry)
        self.conflicts = Counter(
            "toolreg_registry_conflicts", "Announced tools refused because a static item or another service holds the name.", registry=registry
        )
        self.expiries = Counter("toolreg_registry_expiries", "Instance leases that ran out and were dropped.", registry=registry)
        self.merge_seconds = Histogram(
            "toolreg_registry_merge_seconds", "Time to merge one batch of changes into the config store.", buckets=MERGE_BUCKETS, registry=registry
        )
        self._announcements = {kind: self.announcements.labels(kind) for kind in ANNOUNCEMENT_KINDS}
        self._rejections = {reason: self.rejections.labels(reason) for reason in REJECTION_REASONS}

    @classmethod
    def default(cls) -> RegistryMetrics:
        """The process-wide instance on the default registry (created on first use)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default

    def announcement(self, kind: str) -> None:
        """A valid `announce`, `heartbeat` or `withdraw` was read."""
        self._announcements[kind].inc()

    def rejection(self, reason_text: str) -> None:
        """A message was refused; `reason_text` is the registry's one-line reason."""
        self._rejections[rejection_reason(reason_text)].inc()

    def conflict(self, count: int = 1) -> None:
        """New conflicts were found (a tool refused because its name is taken)."""
        self.conflicts.inc(count)

    def expired(self, count: int = 1) -> None:
        """`count` instance leases ran out in a sweep and were dropped (not held)."""
        if count:
            self.expiries.inc(count)

    @contextmanager
    def merge_timer(self) -> Iterator[None]:
        """Time one merge (store round trips included) into `toolreg_registry_merge_seconds`."""
        with self.merge_seconds.time():
            yield

    def set_state(self, *, services: int, tools: int, instances: int, held: int) -> None:
        """The registry's current size: call after each sweep (cheap: four gauge sets)."""
        self.live_services.set(services)
        self.live_tools.set(tools)
        self.instances.set(instances)
        self.held_instances.set(held)


# --- the config store's metrics -----------------------------------------------------

CONFIG_OPERATIONS = ("get", "put", "delete", "list", "getvalues", "config", "getvalues-all-ws", "getkeys-all-ws", "invalid")
"""`invalid`: a request that could not be parsed, so has no operation."""
CONFIG_ERRORS = ("bad-request", "bad-operation", "conflict", "invalid", "store-error")


class ConfigStoreMetrics:
    """Requests by operation, errors by type, and the store's version."""

    _default: ConfigStoreMetrics | None = None
    _default_lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.version = Gauge("toolreg_config_version", "The config store's version: bumped once per committed write.", registry=registry)
        self.requests = Counter("toolreg_config_requests", "Config store requests answered, by operation.", ["operation"], registry=registry)
        self.errors = Counter(
            "toolreg_config_request_errors",
            "Config store requests answered with an error: bad-request, bad-operation (unknown operation), conflict (expect failed), "
            "invalid (value refused), store-error (the SQLite file failed).",
            ["type"],
            registry=registry,
        )
        self._requests = {op: self.requests.labels(op) for op in CONFIG_OPERATIONS}
        self._errors = {kind: self.errors.labels(kind) for kind in CONFIG_ERRORS}

    @classmethod
    def default(cls) -> ConfigStoreMetrics:
        """The process-wide instance on the default registry (created on first use)."""
        with cls._default_lock:
            if cls._default is None:
                cls._default = cls()
            return cls._default

    def request(self, operation: str, error: str | None = None) -> None:
        """One answered request; `error` is the `type` of the error it was answered with, if any."""
        self._requests[operation if operation in self._requests else "invalid"].inc()
        if error is not None:
            child = self._errors.get(error)
            (child if child is not None else self.errors.labels(error)).inc()

    def set_version(self, version: int) -> None:
        self.version.set(version)
