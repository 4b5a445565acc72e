"""One HTTP surface per process: `/healthz`, `/readyz`, `/metrics` (`health`) and the registry's page (`page`)."""

from discovery.web.health import DEFAULT_METRICS_PORT, HealthError, HealthServer, metrics_address

__all__ = ["DEFAULT_METRICS_PORT", "HealthError", "HealthServer", "metrics_address"]
