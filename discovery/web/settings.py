"""What the HTTP surface (health, metrics and, on the registry, its page) reads from the environment: where to
listen and the page's bearer token. A command's `--metrics-port` wins (`health.metrics_address`)."""

from __future__ import annotations

from dataclasses import dataclass

from toolservice_base.variables import FromEnv, setting, text, whole

DEFAULT_METRICS_HOST = "127.0.0.1"
"""Loopback: nothing off this machine reaches the port unless the operator says so (containers say 0.0.0.0)."""


@dataclass(frozen=True)
class HttpSettings(FromEnv):
    """The HTTP surface's settings; `metrics_port` None: off."""

    metrics_port: int | None = setting(
        "TOOLREG_METRICS_PORT",
        whole(" (a port)"),
        None,
        "serve /healthz, /readyz and /metrics on it (0 picks a free one); None: off",
    )
    metrics_host: str = setting(
        "TOOLREG_METRICS_HOST", text, DEFAULT_METRICS_HOST, "the address to bind that port to (containers: 0.0.0.0)"
    )
    http_token: str | None = setting(
        "TOOLREG_HTTP_TOKEN", text, None, "the bearer token the registry page asks for when served off loopback"
    )
