"""`toolreg`'s OpenTelemetry set-up from the standard `OTEL_*` environment variables.

The libraries only ever use `opentelemetry-api`; choosing an SDK and an
exporter is the application's job, and `toolreg` is an application. With
`tool-discovery[otel]` installed (the SDK and the OTLP/HTTP exporter) and
`OTEL_TRACES_EXPORTER` or an OTLP endpoint set, `toolreg serve`, `up`,
`registry`, `call` (and `mcp`) export their spans. The SDK reads the rest
itself: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
`OTEL_EXPORTER_OTLP_*`, `OTEL_BSP_*`.

Nothing set: nothing is configured and tracing costs nothing. Set but no SDK
installed: one warning saying what to install, and the command runs untraced.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from toolservice_base.logs import get_logger
from toolservice_base.tracing import TracingEnv

log = get_logger("discovery.cli")


def exporter_names(env: TracingEnv | None = None) -> list[str]:
    """The exporters asked for: `OTEL_TRACES_EXPORTER` (comma-separated), else `otlp` when an OTLP endpoint is set."""
    env = env or TracingEnv.from_env()
    if env.sdk_disabled:
        return []
    names = [name.strip() for name in env.traces_exporter.split(",") if name.strip()]
    if not names and env.otlp_endpoint:
        names = ["otlp"]
    return [] if names == ["none"] else [name for name in names if name != "none"]


def _entry_point_name(name: str, env: TracingEnv) -> str:
    """`otlp` is the spec's name; the installed exporters register by protocol."""
    if name != "otlp":
        return name
    return "otlp_proto_grpc" if env.otlp_protocol == "grpc" else "otlp_proto_http"


def configure_tracing(default_service_name: str) -> str | None:
    """Install an SDK tracer provider as the OTEL_* variables ask; returns what was set up, or None.

    Never raises: tracing is never a reason for a command to fail.
    """
    env = TracingEnv.from_env()
    names = exporter_names(env)
    if not names:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "otel.sdk_missing",
            asked=",".join(names),
            fix="pip install 'tool-discovery[otel]' (the OpenTelemetry SDK and OTLP exporter); running untraced",
        )
        return None
    available = {point.name: point for point in entry_points(group="opentelemetry_traces_exporter")}
    exporters: list[Any] = []
    for name in names:
        point = available.get(_entry_point_name(name, env))
        if point is None:
            log.warning(
                "otel.exporter_missing",
                exporter=name,
                installed=sorted(available),
                fix="install the exporter's package or change OTEL_TRACES_EXPORTER",
            )
            continue
        try:
            exporters.append(point.load()())
        except Exception as exc:  # a misconfigured exporter must not stop the command
            log.warning("otel.exporter_failed", exporter=name, error=f"{type(exc).__name__}: {exc}")
    if not exporters:
        return None
    attributes = {} if env.service_name else {"service.name": default_service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    described = ", ".join(type(exporter).__name__ for exporter in exporters)
    log.info("otel.tracing", exporters=described, service=provider.resource.attributes.get("service.name"))
    return described
