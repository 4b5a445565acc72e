"""The registry's Prometheus metrics (served on `/metrics` by `discovery.web`).

Every method is a counter add or a gauge set, safe on any hot path. Label
values come from fixed sets declared here, never from message text.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

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
    "rejected-definition",
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
    ("which an operator rejected", "rejected-definition"),
)
"""Phrases with spaces only: names (`^[A-Za-z0-9_.-]+$`) quoted inside a reason can never match one."""


def rejection_reason(text: str) -> str:
    """Map the registry's one-line rejection reason to its metric label (`other` if unknown).

    Matches on phrases of the messages in `validation.py`, `trust.py` and
    `intake.py`; tests/web/test_health.py feeds it the real messages, so a
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
            "toolreg_registry_live_services",
            "Announced services with at least one instance holding a lease.",
            registry=registry,
        )
        self.live_tools = Gauge(
            "toolreg_registry_live_tools",
            "Tools the registry has merged into the store and owns (announced tools; removed once their service is gone"
            " and the store written).",
            registry=registry,
        )
        self.instances = Gauge(
            "toolreg_registry_instances",
            "Instance leases the registry holds (live, in grace or held).",
            registry=registry,
        )
        self.held_instances = Gauge(
            "toolreg_registry_held_instances",
            "Leases held by self-preservation: expired together, removal waiting for heartbeats or `toolreg release`.",
            registry=registry,
        )
        self.announcements = Counter(
            "toolreg_registry_announcements",
            "Valid messages read from tool-descriptors, by kind.",
            ["kind"],
            registry=registry,
        )
        self.rejections = Counter(
            "toolreg_registry_rejections", "Messages refused, by reason.", ["reason"], registry=registry
        )
        self.conflicts = Counter(
            "toolreg_registry_conflicts",
            "Announced tools refused because a static item or another service holds the name.",
            registry=registry,
        )
        self.expiries = Counter(
            "toolreg_registry_expiries", "Instance leases that ran out and were dropped.", registry=registry
        )
        self.merge_seconds = Histogram(
            "toolreg_registry_merge_seconds",
            "Time to merge one batch of changes into the config store.",
            buckets=MERGE_BUCKETS,
            registry=registry,
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
