"""The one place the product reads its environment.

A process finds its broker in this order: an explicit URL, `PULSAR_URL`,
then the `broker.url` file that `toolreg up` writes under the data directory.
That file is what lets every command on a laptop find the embedded broker
without the user exporting anything.

The broker's kind decides which workarounds the transport turns on
(`transport.Capabilities`): the embedded broker's URL file says pulsar-lite;
a `PULSAR_URL` broker is Apache Pulsar unless `TOOLREG_BROKER` says
`pulsar-lite`; a `memory://` URL is the in-process broker.

What is not about reaching the broker is read here too, each variable by a
small function called at the moment it is needed (a process, or a test, may
set it after import): logging, the trust policy's file, and the standard
`OTEL_*` variables `toolreg` decides its tracing by. Every variable read here
is described in docs/operators.md (tests/deploy/test_deploy.py checks).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import NoBrokerError, ToolDiscoveryError
from .topics import DEFAULT_TOPICSPACE, Topics, check_topicspace

DEFAULT_DATA_DIR = ".toolreg"
BROKERS = ("apache-pulsar", "pulsar-lite")
BROKER_URL_FILE = "broker.url"


def _read_token() -> str | None:
    token = os.environ.get("PULSAR_AUTH_TOKEN")
    if token:
        return token.strip()
    path = os.environ.get("PULSAR_AUTH_TOKEN_FILE")
    if path:
        try:
            return Path(path).read_text().strip() or None
        except OSError as exc:
            raise NoBrokerError(
                f"cannot read PULSAR_AUTH_TOKEN_FILE {path!r}: {exc.strerror}; fix the path or unset it"
            ) from exc
    return None


@dataclass(frozen=True)
class Settings:
    """Where the data lives and how to reach the broker."""

    data_dir: Path = field(default_factory=lambda: Path(DEFAULT_DATA_DIR))
    pulsar_url: str | None = None
    auth_token: str | None = None
    signing_key_file: Path | None = None
    broker: str | None = None
    """`apache-pulsar` or `pulsar-lite`; None: decided from where the URL came from (see the module)."""
    topicspace: str = DEFAULT_TOPICSPACE
    operation_timeout: int = 10
    """Seconds pulsar-client waits for the broker on one operation (subscribe, create a producer)."""
    store: str | None = None
    """`toolreg up`'s config store backend (TOOLREG_STORE): `sqlite` (the default) or `pulsar` (replicated on Apache
    Pulsar)."""

    def __post_init__(self) -> None:
        check_topicspace(self.topicspace)
        if self.broker is not None and self.broker not in BROKERS:
            raise NoBrokerError(f"TOOLREG_BROKER={self.broker!r} is not a broker kind; use one of {', '.join(BROKERS)}")

    @classmethod
    def from_env(
        cls, data_dir: str | Path | None = None, pulsar_url: str | None = None, topicspace: str | None = None
    ) -> "Settings":
        directory = data_dir or os.environ.get("TOOLREG_DATA_DIR") or DEFAULT_DATA_DIR
        space = topicspace or os.environ.get("TOOLREG_TOPICSPACE", "").strip() or DEFAULT_TOPICSPACE
        try:
            check_topicspace(space)
        except ValueError as exc:
            raise NoBrokerError(f"{exc}; fix TOOLREG_TOPICSPACE or --topicspace") from None
        return cls(
            data_dir=Path(directory),
            pulsar_url=pulsar_url or os.environ.get("PULSAR_URL") or None,
            auth_token=_read_token(),
            signing_key_file=Path(os.environ["TOOLREG_SIGNING_KEY"]) if os.environ.get("TOOLREG_SIGNING_KEY") else None,
            broker=os.environ.get("TOOLREG_BROKER", "").strip() or None,
            topicspace=space,
            store=os.environ.get("TOOLREG_STORE", "").strip() or None,
        )

    @property
    def topics(self) -> Topics:
        return Topics(self.topicspace)

    def broker_kind(self, url: str) -> str:
        """Which broker `url` is: the transport turns on that broker's workarounds, and only those."""
        if url.startswith("memory://"):
            return "memory"
        if self.broker:
            return self.broker
        if not self.pulsar_url and self._url_file_names(url):
            return "pulsar-lite"  # the embedded broker that `toolreg up` started
        return "apache-pulsar"

    def _url_file_names(self, url: str) -> bool:
        try:
            return self.broker_url_file.read_text().strip() == url
        except OSError:
            return False

    @property
    def broker_url_file(self) -> Path:
        return self.data_dir / BROKER_URL_FILE

    def child_env(self, **extra: str) -> dict[str, str]:
        """This process's environment, pointed at the same broker, data directory and topicspace: for a child
        process (a `toolreg serve`) that must reach what this one reaches. `extra` adds or replaces variables."""
        return {
            **os.environ,
            "PULSAR_URL": self.resolve_pulsar_url(),
            "TOOLREG_DATA_DIR": str(self.data_dir),
            "TOOLREG_BROKER": self.broker or "",
            "TOOLREG_TOPICSPACE": self.topicspace,
            **extra,
        }

    def resolve_pulsar_url(self) -> str:
        """The broker to talk to, or a one-line error saying how to get one."""
        if self.pulsar_url:
            return self.pulsar_url
        try:
            url = self.broker_url_file.read_text().strip()
        except FileNotFoundError:
            url = ""
        if url:
            return url
        raise NoBrokerError(f"no broker: set PULSAR_URL, or run `toolreg up` (no {self.broker_url_file} found)")


# --- the rest of the environment: logging, trust, tracing ---------------------------

LOG_LEVEL_ENV = "TOOLREG_LOG_LEVEL"
LOG_FORMAT_ENV = "TOOLREG_LOG_FORMAT"
NO_COLOR_ENV = "NO_COLOR"
TRUST_POLICY_ENV = "TOOLREG_TRUST_POLICY"


def env(name: str) -> str | None:
    """One variable of the environment, stripped; None if unset or blank. Every other read of the environment goes
    through here."""
    return os.environ.get(name, "").strip() or None


def log_level() -> str | None:
    """`TOOLREG_LOG_LEVEL`: `debug`, `info`, `warning` or `error`, as given; None when unset or empty (info)."""
    return os.environ.get(LOG_LEVEL_ENV) or None


def log_format() -> str:
    """`TOOLREG_LOG_FORMAT`, lower-cased: `json` or `console`; "" when unset (then the stream decides: JSON off a
    terminal)."""
    return os.environ.get(LOG_FORMAT_ENV, "").lower()


def no_color() -> bool:
    """`NO_COLOR` set to anything but the empty string (no-color.org): console logs without colours, even on a
    terminal."""
    return bool(os.environ.get(NO_COLOR_ENV))


EVENT_LOOP_ENV = "TOOLREG_EVENT_LOOP"
EVENT_LOOPS = ("uvloop", "asyncio")


def event_loop() -> str:
    """`TOOLREG_EVENT_LOOP`: `uvloop` or `asyncio`; unset, uvloop where it is installed (`tool-discovery[uvloop]`), else
    asyncio.

    Raises `ToolDiscoveryError` for another value, or for `uvloop` when it is not installed.
    """
    chosen = (env(EVENT_LOOP_ENV) or "").lower()
    if chosen and chosen not in EVENT_LOOPS:
        raise ToolDiscoveryError(f"{EVENT_LOOP_ENV}={chosen!r}: use uvloop or asyncio")
    installed = importlib.util.find_spec("uvloop") is not None
    if chosen == "uvloop" and not installed:
        raise ToolDiscoveryError(
            f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed: pip install 'tool-discovery[uvloop]'"
        )
    return chosen or ("uvloop" if installed else "asyncio")


def trust_policy_file() -> str | None:
    """`TOOLREG_TRUST_POLICY`: the registry's trust policy file; None when unset or empty."""
    return os.environ.get(TRUST_POLICY_ENV) or None


TRACES_EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
OTLP_TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTLP_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_PROTOCOL"
SDK_DISABLED_ENV = "OTEL_SDK_DISABLED"
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"
TRACER_PROVIDER_ENV = "OTEL_PYTHON_TRACER_PROVIDER"


@dataclass(frozen=True)
class TracingEnv:
    """The standard `OTEL_*` variables `toolreg` chooses its tracing set-up by; the SDK reads the others itself."""

    sdk_disabled: bool = False
    """`OTEL_SDK_DISABLED` is `true` (any case): no tracing, whatever else is set."""
    traces_exporter: str = ""
    """`OTEL_TRACES_EXPORTER` as given: exporter names, comma-separated (`otlp`, `console`, `none`)."""
    otlp_endpoint: bool = False
    """`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set (not blank): that alone asks for
    `otlp`."""
    otlp_protocol: str = "http/protobuf"
    """`OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` (the default when unset or blank) or `grpc`."""
    service_name: str | None = None
    """`OTEL_SERVICE_NAME` (None when unset or empty): the SDK names the spans' service by it."""

    @classmethod
    def from_env(cls) -> "TracingEnv":
        return cls(
            sdk_disabled=os.environ.get(SDK_DISABLED_ENV, "").strip().lower() == "true",
            traces_exporter=os.environ.get(TRACES_EXPORTER_ENV, ""),
            otlp_endpoint=bool(
                os.environ.get(OTLP_TRACES_ENDPOINT_ENV, "").strip() or os.environ.get(OTLP_ENDPOINT_ENV, "").strip()
            ),
            otlp_protocol=os.environ.get(OTLP_PROTOCOL_ENV, "").strip() or "http/protobuf",
            service_name=os.environ.get(SERVICE_NAME_ENV) or None,
        )


def tracer_provider_named() -> bool:
    """`OTEL_PYTHON_TRACER_PROVIDER` is set: the OpenTelemetry API then builds its global provider from that name."""
    return os.environ.get(TRACER_PROVIDER_ENV) is not None
