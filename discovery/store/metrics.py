"""The config store's Prometheus metrics (served on `/metrics` by `discovery.web`).

Every method is a counter add or a gauge set, safe on any hot path. Label
values come from fixed sets declared here, never from message text.
"""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from toolservice_base import schemas

# --- the config store's metrics -----------------------------------------------------

CONFIG_OPERATIONS = (*schemas.CONFIG_OPERATIONS, "invalid")
"""Every operation of the protocol, and `invalid`: a request that could not be parsed, so has no operation."""
CONFIG_ERRORS = ("bad-request", "bad-operation", "invalid", "store-error", "too-old")
CONFLICT = "conflict"
"""The answer to a write whose `expect` did not hold. Not an error: a conditional write that loses a race is
optimistic concurrency doing its job (the registry even makes one at each start, to learn that the store
honours `expect`), so it is counted in `toolreg_config_conflicts_total`, where no error alert looks."""


class ConfigStoreMetrics:
    """Requests by operation, errors by type, refused conditional writes, and the store's version."""

    _default: ConfigStoreMetrics | None = None
    _default_lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.version = Gauge(
            "toolreg_config_version", "The config store's version: bumped once per committed write.", registry=registry
        )
        self.requests = Counter(
            "toolreg_config_requests", "Config store requests answered, by operation.", ["operation"], registry=registry
        )
        self.errors = Counter(
            "toolreg_config_request_errors",
            "Config store requests answered with an error: bad-request, bad-operation (unknown operation), "
            "invalid (value refused), store-error (the SQLite file failed), too-old (a reader past the change feed's "
            "window: it reads everything instead). Refused conditional writes are not errors: "
            "see toolreg_config_conflicts_total.",
            ["type"],
            registry=registry,
        )
        self.conflicts = Counter(
            "toolreg_config_conflicts",
            "Conditional writes refused because their `expect` did not hold (a concurrent writer won; the registry's "
            "start-up probe makes one). Normal under optimistic concurrency, not an error.",
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
        """One answered request; `error` is the `type` of the error it was answered with, if any (a `conflict` is no
        error)."""
        self._requests[operation if operation in self._requests else "invalid"].inc()
        if error == CONFLICT:
            self.conflicts.inc()
        elif error is not None:
            child = self._errors.get(error)
            (child if child is not None else self.errors.labels(error)).inc()

    def set_version(self, version: int) -> None:
        self.version.set(version)
